"""The real daemon (`reconciler run`) with the real apply pass, on a real git catalog.

The node is this machine (`transport: local`), the engines are real HTTP
servers (reconciler.tiny_server) on loopback ports. Every engine a test starts
carries a marker in its environment, so the test can find every process it
caused (and prove none is orphaned or duplicated) and kill them all, by pid,
at the end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.gitcatalog import REPO, CatalogRepo, DaemonProcess, git, marked_pids, stop_all, wait_for

pytestmark = [pytest.mark.process]

def fleet_yaml(state_dir: Path) -> str:
    return (
        f"state_dir: {state_dir}\n"
        "nodes:\n"
        "  - id: local\n"
        "    address: 127.0.0.1\n"
        "    transport: local\n"
    )


def engine_model(name: str, replicas: int, port: int, marker: str) -> str:
    doc = {
        "name": name,
        "source": f"{name}-weights",
        "replicas": replicas,
        "spread": "preferred",  # one node: replicas share it
        "profiles": [{
            "name": "cpu",
            "engine": "command",
            "port": port,
            "command": [sys.executable, "-m", "reconciler.tiny_server", "--host", "127.0.0.1",
                        "--port", "${PORT}", "--model", "${MODEL_SOURCE}"],
            "env": {"E2E_MARKER": marker, "PYTHONPATH": str(REPO)},
            "health_path": "/health",
            "start_timeout_s": 30,
        }],
    }
    return yaml.safe_dump(doc, sort_keys=False)


class E2E:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.marker = f"e2e-{os.getpid()}-{random.randrange(1 << 30)}"
        self.state = tmp_path / "state"
        self.port = random.randrange(21000, 29000, 20)
        self.repo = CatalogRepo(tmp_path / "catalog", init=False)
        self.repo.path.mkdir()
        git(self.repo.path, "init", "-q", "-b", "main")
        git(self.repo.path, "config", "user.email", "person@example.com")
        git(self.repo.path, "config", "user.name", "A Person")
        self.repo.write("fleet.yaml", fleet_yaml(self.state))
        self.daemons: list[DaemonProcess] = []

    def model(self, name: str, replicas: int, port_offset: int = 0) -> None:
        self.repo.write(f"models/{name}.yaml", engine_model(name, replicas, self.port + port_offset, self.marker))

    def daemon(self, *flags: str, name: str = "daemon") -> DaemonProcess:
        # XDG_STATE_HOME: the pass memory (restart counts, backoff) stays in this test's directory
        d = DaemonProcess(self.repo.path, "--interval", "1", *flags, workdir=self.tmp, name=name, real=True,
                          env={"XDG_STATE_HOME": str(self.tmp / "xdg")})
        self.daemons.append(d)
        return d

    def records(self) -> dict[str, dict]:
        out = {}
        for p in sorted((self.state / "replicas").glob("*.json")):
            doc = json.loads(p.read_text())
            out[f"{doc['id']}.rank{doc['rank']}"] = doc
        return out

    def model_status(self, name: str) -> dict:
        try:
            return yaml.safe_load((self.repo.path / "status/models" / f"{name}.yaml").read_text()) or {}
        except FileNotFoundError:
            return {}

    def wait_ready(self, name: str, count: int, timeout: float = 60.0) -> dict:
        return wait_for(lambda: (s := self.model_status(name)) and s.get("ready") == count
                        and s.get("desired") == count and s, timeout, f"{count} Ready replicas of {name}:\n"
                        + "\n".join(d.logfile.read_text()[-3000:] for d in self.daemons))

    def cleanup(self) -> None:
        stop_all(self.daemons, self.marker)


@pytest.fixture
def e2e(tmp_path):
    env = E2E(tmp_path)
    yield env
    env.cleanup()


def record_pids(e2e: E2E) -> set[int]:
    return {r["pid"] for r in e2e.records().values()}


def test_committing_a_replica_bump_starts_the_new_replica(e2e):
    e2e.model("echo", 1)
    e2e.repo.commit("echo: 1 replica")
    d = e2e.daemon("--metrics-address", "127.0.0.1:0")
    e2e.wait_ready("echo", 1)
    first = e2e.records()["echo-0.rank0"]["pid"]

    e2e.model("echo", 2)
    e2e.repo.commit("echo: 2 replicas")
    status = e2e.wait_ready("echo", 2)
    assert [r["id"] for r in status["replicas"]] == ["echo-0", "echo-1"]
    assert e2e.records()["echo-0.rank0"]["pid"] == first, "the running replica was touched"
    assert marked_pids(e2e.marker) == record_pids(e2e)

    # the metrics come from the real pass result
    address = d.wait_event("metrics.serving")[0]["address"]
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    assert 'reconciler_actions_total{action="start",outcome="ok"} 2' in body
    assert 'reconciler_nodes{state="ready"} 1' in body
    assert 'reconciler_replicas{phase="Ready"}' in body


def test_removing_a_model_stops_its_replicas_and_nothing_else(e2e):
    e2e.model("echo", 1)
    e2e.model("other", 2, port_offset=10)
    e2e.repo.commit("two models")
    foreign = __import__("subprocess").Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                             env={**os.environ, "E2E_MARKER": e2e.marker})
    try:
        e2e.daemon()
        e2e.wait_ready("echo", 1)
        e2e.wait_ready("other", 2)
        echo_pid = e2e.records()["echo-0.rank0"]["pid"]
        other_pids = {r["pid"] for k, r in e2e.records().items() if k.startswith("other-")}

        git(e2e.repo.path, "rm", "-q", "models/other.yaml")
        e2e.repo.commit("remove other")
        wait_for(lambda: not any(k.startswith("other-") for k in e2e.records()), 60, "other's records gone")
        wait_for(lambda: not (other_pids & marked_pids(e2e.marker)), 30, "other's engines gone")
        assert e2e.records()["echo-0.rank0"]["pid"] == echo_pid
        assert foreign.poll() is None, "a process the reconciler did not start was stopped"
        assert marked_pids(e2e.marker) == {echo_pid, foreign.pid}
    finally:
        foreign.kill()
        foreign.wait()


def test_a_killed_engine_is_restarted_and_a_second_crash_waits_for_backoff(e2e):
    e2e.model("echo", 1)
    e2e.repo.commit("echo")
    d = e2e.daemon()
    e2e.wait_ready("echo", 1)
    pid = e2e.records()["echo-0.rank0"]["pid"]
    os.killpg(pid, signal.SIGKILL)

    wait_for(lambda: (r := e2e.records().get("echo-0.rank0")) and r["pid"] != pid, 60, "a restarted engine")
    wait_for(lambda: (s := e2e.model_status("echo")) and s["ready"] == 1 and s["replicas"][0]["restarts"] == 1,
             60, "the restarted replica Ready, its restart counted in status")
    second = e2e.records()["echo-0.rank0"]["pid"]

    lines_before_kill = len(d.events())
    os.killpg(second, signal.SIGKILL)
    wait_for(lambda: (s := e2e.model_status("echo")) and s["ready"] == 1 and s["replicas"][0]["restarts"] == 2
             and s, 90, "the restart after the backoff")
    # A second crash in a row is not restarted by the next pass: passes come and go while it waits.
    after = d.events()[lines_before_kill:]
    restart = next(i for i, e in enumerate(after) if e["event"] == "decision" and e["action"] == "start")
    assert "restart 2" in after[restart]["reason"]
    assert sum(e["event"] == "pass.end" for e in after[:restart]) >= 3, "restarted without waiting for backoff"
    assert marked_pids(e2e.marker) == record_pids(e2e)

    # A restarted daemon remembers: the count in status is not reset to 0.
    d.stop()
    again = e2e.daemon(name="again")
    again.wait_event("pass.end")
    assert e2e.model_status("echo")["replicas"][0]["restarts"] == 2


def test_daemon_killed_mid_pass_and_restarted_converges_without_duplicates_or_orphans(e2e):
    e2e.model("echo", 1)
    e2e.repo.commit("echo")
    first = e2e.daemon()
    e2e.wait_ready("echo", 1)

    e2e.model("echo", 4)
    e2e.repo.commit("echo: 4")
    # SIGKILL as soon as the pass that starts the new replicas has made its first start
    wait_for(lambda: [e for e in first.events("decision") if e.get("action") == "start"
                      and e.get("replica") != "echo-0"], 60, "the first new start")
    first.proc.kill()
    first.wait_exit()

    second = e2e.daemon(name="second")
    status = e2e.wait_ready("echo", 4)
    assert [r["id"] for r in status["replicas"]] == [f"echo-{i}" for i in range(4)]
    records = e2e.records()
    assert sorted(records) == [f"echo-{i}.rank0" for i in range(4)]
    assert marked_pids(e2e.marker) == record_pids(e2e), "an engine runs that no record accounts for"
    assert second.events("lock.taken-over")


def test_an_invalid_commit_changes_nothing_on_the_node_and_the_next_valid_one_applies(e2e):
    e2e.model("echo", 1)
    good = e2e.repo.commit("echo")
    d = e2e.daemon()
    e2e.wait_ready("echo", 1)
    before = e2e.records()

    e2e.model("echo", 3)
    e2e.repo.write("models/broken.yaml", "name: broken\nreplicas: two\n")
    bad = e2e.repo.commit("bump echo and add a broken model")
    wait_for(lambda: e2e.repo.status()["last_attempted_revision"] == bad, 60, "the bad revision attempted")
    d.signal(signal.SIGHUP)  # a resync after the refusal keeps the good revision in force
    passes = len(d.events("pass.end"))
    wait_for(lambda: len(d.events("pass.end")) > passes, 60, "a resync")
    assert e2e.repo.status()["last_applied_revision"] == good
    assert e2e.records() == before and marked_pids(e2e.marker) == record_pids(e2e)

    git(e2e.repo.path, "rm", "-q", "models/broken.yaml")
    e2e.repo.commit("drop the broken model")
    e2e.wait_ready("echo", 3)


def test_each_node_s_probe_duration_is_a_gauge_in_seconds_from_the_real_pass(e2e):
    from prometheus_client.parser import text_string_to_metric_families

    e2e.model("echo", 1)
    e2e.repo.commit("echo: 1 replica")
    d = e2e.daemon("--metrics-address", "127.0.0.1:0")
    e2e.wait_ready("echo", 1)
    address = d.wait_event("metrics.serving")[0]["address"]
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}  # the official parser reads it whole
    took = families["reconciler_node_probe_duration_seconds"]
    assert took.type == "gauge" and took.unit in ("", "seconds")
    [sample] = took.samples
    assert sample.labels == {"node": "local"}
    # The local node's probe runs a real python3 on this machine: it takes some time, well under its deadline.
    assert 0 < sample.value < 30
