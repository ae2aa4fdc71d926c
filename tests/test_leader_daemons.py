"""Two real daemon loops on two clones of one catalog, electing their leader in a real 3-member etcd
cluster (SPEC section 14). The pass is the recording one of tests/daemon_driver.py, so what is asserted
is who runs passes and when: the leader only, a standby after the leader is killed, paused past its
lease or cut off from etcd, and never the deposed one again while the other leads."""

from __future__ import annotations

import signal
import urllib.request

import pytest
import yaml

from tests.conftest import run_cli
from tests.etcd_cluster import EtcdCluster, cluster, free_ports, have_etcd  # noqa: F401  (cluster: a fixture)
from tests.gitcatalog import FLEET, CatalogRepo, DaemonProcess, git, model_yaml, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(not have_etcd(), reason="etcd-server is not installed (scripts/test.sh installs it)")]

LEASE_S = 5


def leader_section(endpoints) -> str:
    return "leader:\n  etcd:\n    endpoints: [" + ", ".join(endpoints) + f"]\n  lease_s: {LEASE_S}\n"


def clones(tmp_path, endpoints, n=2):
    origin = CatalogRepo(tmp_path / "origin")
    origin.write("fleet.yaml", leader_section(endpoints) + FLEET)
    origin.write("models/m.yaml", model_yaml("m"))
    origin.commit("a fleet with a leader", "fleet.yaml", "models/m.yaml")
    out = []
    for i in range(n):
        path = tmp_path / f"host{i}"
        git(tmp_path, "clone", "-q", str(origin.path), str(path))
        git(path, "config", "user.email", "person@example.com")
        git(path, "config", "user.name", "A Person")
        out.append(CatalogRepo(path, init=False))
    return out


def daemon(tmp_path, repo, name, metrics_port=None):
    flags = ["--interval", "1"]
    if metrics_port:
        flags += ["--metrics-address", f"127.0.0.1:{metrics_port}"]
    return DaemonProcess(repo.path, *flags, workdir=tmp_path, name=name)


def begins(d) -> list[float]:
    return [p for p in d.passes("begin")]


def who_leads(*daemons):
    leading = [d for d in daemons if d.events("leader.elected") and
               len(d.events("leader.elected")) > len(d.events("leader.lost"))]
    return leading[0] if len(leading) == 1 else None


def test_one_daemon_leads_the_other_stands_by_and_says_who(cluster, tmp_path):
    a_repo, b_repo = clones(tmp_path, cluster.endpoints)
    ports = free_ports(2)
    with daemon(tmp_path, a_repo, "a", ports[0]) as a:
        a.wait_event("leader.elected")
        a.wait_pass()
        with daemon(tmp_path, b_repo, "b", ports[1]) as b:
            b.wait_event("leader.standby")
            b.wait_event("pass.standby", count=2)
            assert b.passes("begin") == []  # it acts on nothing
            # but keeps its view of the fleet warm, read-only, each turn (the pass's stand_by, SPEC 14)
            wait_for(lambda: len(b.passes("standby")) >= 2, 10, "two standby turns of b's pass")
            assert a.passes("standby") == []
            standby = b.events("leader.standby")[-1]
            assert "pid %d" % a.pid in standby["leader"]
            metrics = {p: urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10).read().decode()
                       for p in ports}
            assert "reconciler_leader 1.0" in metrics[ports[0]]
            assert "reconciler_leader 0.0" in metrics[ports[1]]
            status = yaml.safe_load((a_repo.path / "status" / "catalog.yaml").read_text())
            assert status["leader"]["epoch"] == a.events("leader.elected")[-1]["epoch"]
            assert not (b_repo.path / "status" / "catalog.yaml").exists()  # status is the leader's
            # A manual apply while a leader holds the lease is refused, naming it; plan needs no lease.
            refused = run_cli("apply", str(b_repo.path))
            assert refused.returncode != 0 and "leads this fleet" in refused.stderr
            assert "Traceback" not in refused.stderr
            assert f"pid {a.pid}" in refused.stderr
            forced = run_cli("apply", str(b_repo.path), "--force", "--dry-run")
            # past the lease's question (the fleet's node is not reachable from here: that is the error)
            assert "leads this fleet" not in forced.stderr and "Traceback" not in forced.stderr, forced.stderr
            planned = run_cli("plan", str(b_repo.path))
            assert "leads this fleet" not in planned.stderr and "Traceback" not in planned.stderr


def test_a_killed_leader_is_replaced_and_a_paused_one_does_not_act_again(cluster, tmp_path):
    a_repo, b_repo = clones(tmp_path, cluster.endpoints)
    with daemon(tmp_path, a_repo, "a") as a, daemon(tmp_path, b_repo, "b") as b:
        wait_for(lambda: who_leads(a, b), 30, "a leader")
        first, second = (a, b) if who_leads(a, b) is a else (b, a)
        first.wait_pass()
        # SIGSTOP past the lease: the other takes over; after SIGCONT the paused one acts on nothing.
        first.signal(signal.SIGSTOP)
        try:
            second.wait_event("leader.elected", timeout=6 * LEASE_S)
            second.wait_pass(timeout=3 * LEASE_S)
        finally:
            first.signal(signal.SIGCONT)
        first.wait_event("leader.lost", timeout=3 * LEASE_S)
        after = len(first.passes("begin"))
        n = len(second.passes("begin"))
        second.wait_pass(count=n + 2, timeout=10 * LEASE_S)
        assert len(first.passes("begin")) == after
        epochs = [e["epoch"] for e in first.events("leader.elected") + second.events("leader.elected")]
        assert second.events("leader.elected")[-1]["epoch"] == max(epochs)
        # kill -9 of the leader now: the paused one, standing by again, takes over.
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait(10)
        first.wait_event("leader.elected", count=2, timeout=6 * LEASE_S)
        first.wait_pass(count=after + 1, timeout=3 * LEASE_S)
        assert first.events("leader.elected")[-1]["epoch"] > max(epochs)


def test_a_leader_cut_off_from_etcd_stops_acting_and_the_other_takes_over(cluster, tmp_path):
    proxies = [TcpProxy(p) for p in cluster.client_ports]
    try:
        a_repo, b_repo = clones(tmp_path, cluster.endpoints)
        # Host a reaches etcd through its own link (one commit of its own, on its clone only).
        a_repo.write("fleet.yaml", leader_section([p.url for p in proxies]) + FLEET)
        a_repo.commit("host a's link to etcd", "fleet.yaml")
        with daemon(tmp_path, a_repo, "a") as a:
            a.wait_event("leader.elected")
            a.wait_pass()
            with daemon(tmp_path, b_repo, "b") as b:
                b.wait_event("leader.standby")
                for p in proxies:
                    p.cut()
                lost = a.wait_event("leader.lost", timeout=3 * LEASE_S)[-1]
                assert "renew" in lost["msg"]
                cut_at = len(a.passes("begin"))
                b.wait_event("leader.elected", timeout=6 * LEASE_S)
                b.wait_pass(timeout=3 * LEASE_S)
                a.wait_event("pass.standby", timeout=3 * LEASE_S)
                assert len(a.passes("begin")) == cut_at  # reconciling stopped on the host that lost etcd
                assert a.proc.poll() is None  # and it is still there, waiting
    finally:
        for p in proxies:
            p.close()


def test_etcd_unreachable_at_start_is_a_standby_that_says_so(tmp_path):
    ports = free_ports(1)
    [repo] = clones(tmp_path, [f"http://127.0.0.1:{ports[0]}"], n=1)
    with daemon(tmp_path, repo, "a") as a:
        a.wait_event("leader.no-etcd")
        a.wait_event("pass.standby", count=2)
        assert a.passes("begin") == [] and a.proc.poll() is None
        refused = run_cli("apply", str(repo.path))
        assert refused.returncode != 0 and "cannot ask etcd who leads" in refused.stderr
        assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert "Traceback" not in a.logfile.read_text()
