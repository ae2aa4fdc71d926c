"""Two real daemons (`python3 -m reconciler run`) on two clones of one catalog, electing their leader in
a real 3-member etcd cluster on loopback, driving the namespaced test fleet over SSH (SPEC section 14).

Each scenario takes the leader away in the middle of its work (kill -9, a SIGSTOP longer than its
lease, its link to etcd cut, an etcd member restarted) and asserts that the other one finishes the
work, that each replica's rank runs exactly once (no duplicate engine), that nothing runs that the
catalog does not want (no orphan), and that the deposed leader runs no pass again while the other
leads: whatever it still had in flight is fenced by the epoch on the nodes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from tests.etcd_cluster import EtcdCluster, cluster, have_etcd  # noqa: F401  (cluster: a fixture)
from tests.fleet import fleet  # noqa: F401  (module-scoped fixture)
from tests.gitcatalog import REPO, CatalogRepo, DaemonProcess, git, marked_pids, stop_all, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.fleet,
              pytest.mark.skipif(not have_etcd(), reason="etcd-server is not installed (scripts/test.sh installs it)")]

NODES = ("l1", "l2", "l3")
LEASE_S = 5


@pytest.fixture(scope="module")
def nodes(fleet):  # noqa: F811
    for n in NODES:
        fleet.add_node(n)
    return fleet


def model_doc(replicas: int, marker: str, drain_s: float = 10) -> str:
    return yaml.safe_dump({
        "name": "echo", "source": "echo-weights", "replicas": replicas, "drain_s": drain_s,
        "profiles": [{
            "name": "cpu", "engine": "command", "port": 8310,
            "command": ["python3", "-m", "reconciler.tiny_server", "--host", "0.0.0.0", "--port", "${PORT}",
                        "--model", "${MODEL_SOURCE}"],
            "env": {"E2E_MARKER": marker, "PYTHONPATH": str(REPO)},
            "start_timeout_s": 30,
        }],
    }, sort_keys=False)


class Hosts:
    """An origin catalog, its bare upstream, and one clone per management host, each with a daemon."""

    def __init__(self, fleet, cluster, tmp_path: Path, request, endpoints=None):  # noqa: F811
        self.tmp = tmp_path
        self.marker = f"leader-{os.getpid()}-{request.node.name}"
        self.origin = CatalogRepo(tmp_path / "origin")
        doc = fleet.fleet_document(NODES)
        doc["leader"] = {"etcd": {"endpoints": endpoints or cluster.endpoints}, "lease_s": LEASE_S}
        self.origin.write("fleet.yaml", yaml.safe_dump(doc, sort_keys=False))
        self.origin.write("models/echo.yaml", model_doc(1, self.marker))
        self.origin.commit("one echo replica, two management hosts", "fleet.yaml", "models/echo.yaml")
        self.bare = tmp_path / "upstream.git"
        git(tmp_path, "clone", "-q", "--bare", str(self.origin.path), str(self.bare))
        self.daemons: list[DaemonProcess] = []
        self.repos: dict[str, CatalogRepo] = {}

    def clone(self, name: str) -> CatalogRepo:
        path = self.tmp / name
        git(self.tmp, "clone", "-q", str(self.bare), str(path))
        git(path, "config", "user.email", "person@example.com")
        git(path, "config", "user.name", "A Person")
        self.repos[name] = CatalogRepo(path, init=False)
        return self.repos[name]

    def daemon(self, name: str) -> DaemonProcess:
        repo = self.repos.get(name) or self.clone(name)
        d = DaemonProcess(repo.path, "--interval", "1", "--git-pull", workdir=self.tmp, name=name, real=True,
                          env={"XDG_STATE_HOME": str(self.tmp / f"xdg-{name}"), "E2E_MARKER": self.marker})
        self.daemons.append(d)
        return d

    def bump(self, replicas: int, drain_s: float = 10) -> None:
        self.origin.write("models/echo.yaml", model_doc(replicas, self.marker, drain_s))
        self.origin.commit(f"{replicas} echo replicas", "models/echo.yaml")
        git(self.origin.path, "push", "-q", str(self.bare), "HEAD:main")

    def replica(self, name: str, rid: str) -> dict:
        return next((r for r in self.status(name).get("replicas") or [] if r.get("id") == rid), {})

    def status(self, name: str) -> dict:
        try:
            return yaml.safe_load((self.repos[name].path / "status/models/echo.yaml").read_text()) or {}
        except (FileNotFoundError, yaml.YAMLError):
            return {}

    def wait_ready(self, name: str, count: int, timeout: float = 120.0) -> dict:
        return wait_for(lambda: (s := self.status(name)) and s.get("ready") == count == s.get("desired") and s,
                        timeout, f"{count} Ready echo replicas in {name}'s status:\n"
                        + "\n".join(d.logfile.read_text()[-3000:] for d in self.daemons))

    def engines(self) -> dict[str, int]:
        """Live engines of this test, by the rank name the node agent gave each."""
        found: dict[str, int] = {}
        for pid in marked_pids(self.marker):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            names = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LLM_RECONCILER_REPLICA=")]
            if names and os.getpgid(pid) == pid:
                found[names[0]] = found.get(names[0], 0) + 1
        return found

    def assert_exactly(self, replicas: int) -> None:
        # A replica scaled away drains before it stops: wait for that, then look.
        wanted = [f"echo-{i}.rank0" for i in range(replicas)]
        wait_for(lambda: sorted(n.split(".", 1)[1] for n in self.engines()) == wanted, 90, f"engines {wanted}")
        running = self.engines()
        assert sorted(n.split(".", 1)[1] for n in running) == [f"echo-{i}.rank0" for i in range(replicas)], running
        assert set(running.values()) == {1}, f"a duplicate engine: {running}"

    def cleanup(self) -> None:
        stop_all(self.daemons, self.marker)


@pytest.fixture
def hosts(nodes, cluster, tmp_path, request):
    h = Hosts(nodes, cluster, tmp_path, request)
    yield h
    h.cleanup()


def decisions_after(d: DaemonProcess, event: str, actions=("start", "stop", "replace", "restart")) -> list[dict]:
    """The decisions d logged with these actions after its last `event` line, that went through."""
    lines = d.events()
    marks = [i for i, e in enumerate(lines) if e.get("event") == event]
    if not marks:
        return []
    return [e for e in lines[marks[-1]:] if e.get("event") == "decision" and e.get("action") in actions and e.get("ok")]


def started(d: DaemonProcess) -> bool:
    return any(e.get("action") == "start" for e in d.events("decision"))


def test_leader_killed_mid_pass_the_standby_finishes_without_duplicates(hosts):
    a = hosts.daemon("host-a")
    a.wait_event("leader.elected", timeout=30)
    b = hosts.daemon("host-b")
    b.wait_event("leader.standby", timeout=30)
    hosts.wait_ready("host-a", 1)
    hosts.assert_exactly(1)
    starts = len([e for e in a.events("decision") if e.get("action") == "start"])
    hosts.bump(3)  # one replica per node: the three nodes full
    # Mid-pass: the first start of the bump has gone through, more are due.
    wait_for(lambda: len([e for e in a.events("decision") if e.get("action") == "start"]) > starts, 60,
             "host-a starting the bump")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    elected = b.wait_event("leader.elected", timeout=6 * LEASE_S)[-1]
    assert elected["epoch"] > a.events("leader.elected")[-1]["epoch"]
    b.wait_event("leader.fenced", timeout=30)
    hosts.wait_ready("host-b", 3)
    hosts.assert_exactly(3)
    catalog_status = hosts.repos["host-b"].path / "status/catalog.yaml"
    wait_for(catalog_status.exists, 30, "status/catalog.yaml written by the new leader")
    assert yaml.safe_load(catalog_status.read_text())["leader"]["epoch"] == elected["epoch"]


def ssh_connections(pid: int, nodes) -> set[tuple[str, str]]:
    """The established TCP connections of process `pid` to the nodes' SSH ports: (local, remote) in
    /proc's hex notation. One per node while the daemon keeps its connections open."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed while listed
        if target.startswith("socket:["):
            sockets.add(target[8:-1])
    remote_ports = {f"{int(n.get('ssh', {}).get('port', nodes['ssh'].get('port', 22))):04X}" for n in nodes["nodes"]}
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if state == "01" and inode in sockets and remote.rsplit(":", 1)[1] in remote_ports:
                found.add((local, remote))
    return found


def test_a_standby_probes_read_only_and_takes_over_on_the_connections_it_kept(hosts):
    """SPEC 14: a standby may probe, read-only. It does, each turn, on connections it keeps open, and acts on
    nothing; when the leader dies its first pass as the leader opens no connection (at 10,000 nodes opening
    them all is a 42 s pass)."""
    a = hosts.daemon("host-a")
    a.wait_event("leader.elected", timeout=30)
    hosts.wait_ready("host-a", 1)
    b = hosts.daemon("host-b")
    b.wait_event("leader.standby", timeout=30)
    turns = b.wait_event("probe.standby", count=2, timeout=60)
    assert turns[-1]["nodes"] == len(NODES) and turns[-1]["unreachable"] == 0, turns[-1]
    assert not b.events("decision") and not b.events("pass.start")  # read-only: it acted on nothing
    hosts.assert_exactly(1)
    fleet_doc = yaml.safe_load((hosts.repos["host-b"].path / "fleet.yaml").read_text())
    kept = wait_for(lambda: len(c := ssh_connections(b.pid, fleet_doc)) == len(NODES) and c, 30,
                    "host-b holding one SSH connection per node")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    b.wait_event("leader.elected", timeout=6 * LEASE_S)
    b.wait_event("leader.fenced", timeout=30)
    wait_for(lambda: [e for e in b.events("pass.end") if e.get("result") == "applied"], 60, "host-b's first pass")
    hosts.assert_exactly(1)  # the replica a started is adopted, not started again
    assert not [e for e in b.events("decision") if e.get("action") == "start"]
    assert ssh_connections(b.pid, fleet_doc) == kept  # the same connections: none opened for the takeover


def test_a_drain_in_progress_at_takeover_goes_on_to_the_same_deadline(hosts):
    a = hosts.daemon("host-a")
    a.wait_event("leader.elected", timeout=30)
    b = hosts.daemon("host-b")
    b.wait_event("leader.standby", timeout=30)
    hosts.bump(2, drain_s=40)
    hosts.wait_ready("host-a", 2)
    hosts.bump(1, drain_s=40)  # echo-1 drains for up to 40 s: the leader is killed meanwhile
    draining = wait_for(lambda: (r := hosts.replica("host-a", "echo-1")).get("phase") == "Draining"
                        and "at the latest after" in r.get("message", "") and r, 60, "echo-1 draining on host-a")
    deadline = draining["message"].split("at the latest after", 1)[1].strip()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    b.wait_event("leader.elected", timeout=6 * LEASE_S)
    # The new leader holds the drain the old one began, to the same deadline (from the memory in etcd),
    # rather than beginning it again; then stops it, and only it.
    taken = wait_for(lambda: (r := hosts.replica("host-b", "echo-1")).get("phase") == "Draining"
                     and "at the latest after" in r.get("message", "") and r, 60, "echo-1 draining on host-b")
    assert taken["message"].split("at the latest after", 1)[1].strip() == deadline
    hosts.assert_exactly(1)
    stops = wait_for(lambda: [e for e in b.events("decision") if e.get("action") == "stop"
                              and e.get("replica") == "echo-1"], 30, "host-b's stop of echo-1 logged")
    assert all(e["ok"] and "drained" in e["reason"] for e in stops)
    assert not [e for e in b.events("decision") if e.get("action") == "start"]  # it started nothing


def test_leader_paused_past_its_lease_acts_on_nothing_when_it_wakes(hosts):
    a = hosts.daemon("host-a")
    a.wait_event("leader.elected", timeout=30)
    b = hosts.daemon("host-b")
    b.wait_event("leader.standby", timeout=30)
    hosts.wait_ready("host-a", 1)
    hosts.bump(3)
    wait_for(lambda: a.events("pass.start") and any(e.get("trigger") == "commit" or e.get("trigger") == "interval"
                                                   for e in a.events("pass.start")), 30, "host-a passing")
    a.signal(signal.SIGSTOP)
    try:
        b.wait_event("leader.elected", timeout=6 * LEASE_S)
        hosts.wait_ready("host-b", 3)
    finally:
        a.signal(signal.SIGCONT)
    a.wait_event("leader.lost", timeout=6 * LEASE_S)
    # b bumps again while a is awake and deposed: only b acts on it.
    hosts.bump(2)
    hosts.wait_ready("host-b", 2)
    hosts.assert_exactly(2)
    passes = [e for e in a.events() if e.get("event") in ("leader.lost", "pass.start")]
    assert passes[-1]["event"] == "leader.lost"  # and it began no pass since


def test_leader_cut_off_from_etcd_stops_and_the_other_takes_over_the_fleet(nodes, cluster, tmp_path, request):
    proxies = [TcpProxy(p) for p in cluster.client_ports]
    h = Hosts(nodes, cluster, tmp_path, request)
    try:
        a_repo = h.clone("host-a")
        # Host a reaches etcd through its own link: one commit of its own, on its clone (no --git-pull for it).
        doc = yaml.safe_load((a_repo.path / "fleet.yaml").read_text())
        doc["leader"]["etcd"]["endpoints"] = [p.url for p in proxies]
        a_repo.write("fleet.yaml", yaml.safe_dump(doc, sort_keys=False))
        a_repo.commit("host a's own link to etcd", "fleet.yaml")
        a = DaemonProcess(a_repo.path, "--interval", "1", workdir=tmp_path, name="host-a", real=True,
                          env={"XDG_STATE_HOME": str(tmp_path / "xdg-a"), "E2E_MARKER": h.marker})
        h.daemons.append(a)
        a.wait_event("leader.elected", timeout=30)
        b = h.daemon("host-b")
        b.wait_event("leader.standby", timeout=30)
        h.wait_ready("host-a", 1)
        for p in proxies:
            p.cut()
        a.wait_event("leader.lost", timeout=3 * LEASE_S)
        b.wait_event("leader.elected", timeout=6 * LEASE_S)
        h.bump(2)  # b pulls it; a, cut off, must not act on anything
        h.wait_ready("host-b", 2)
        h.assert_exactly(2)
        assert decisions_after(a, "leader.lost") == []
        assert a.proc.poll() is None and "Traceback" not in a.logfile.read_text()
        # An etcd member restarted under the new leader: it keeps leading, and acting.
        cluster.stop(1)
        cluster.start(1)
        h.bump(3)
        h.wait_ready("host-b", 3)
        h.assert_exactly(3)
        assert len(b.events("leader.lost")) == 0
    finally:
        h.cleanup()
        for p in proxies:
            p.close()


def test_etcd_lost_by_every_host_stops_reconciling_never_serving(hosts, cluster):
    a = hosts.daemon("host-a")
    a.wait_event("leader.elected", timeout=30)
    b = hosts.daemon("host-b")
    b.wait_event("leader.standby", timeout=30)
    hosts.wait_ready("host-a", 1)
    serving = hosts.engines()
    try:
        for i in range(3):
            cluster.stop(i)
        a.wait_event("leader.lost", timeout=6 * LEASE_S)
        b.wait_event("leader.no-etcd", timeout=6 * LEASE_S)
        hosts.bump(3)  # pulled by both; acted on by neither
        wait_for(lambda: all(len([e for e in d.events("pass.standby") if "no etcd endpoint" in e["msg"]
                                  or "could not be renewed" in e["msg"]]) >= 3 for d in (a, b)), 60,
                 "both hosts standing by without etcd")
        assert hosts.engines() == serving  # the engine serves on, untouched
        assert all(d.proc.poll() is None and "Traceback" not in d.logfile.read_text() for d in (a, b))
    finally:
        cluster.start()
    # etcd back: one of them leads again and catches up, each rank once.
    wait_for(lambda: a.events("leader.elected")[1:] or b.events("leader.elected"), 60, "a leader again")
    hosts.assert_exactly(3)
