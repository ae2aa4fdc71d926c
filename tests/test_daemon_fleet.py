"""The real daemon on the namespaced test fleet (tests/fleet.py): SSH to real sshd nodes, real engines.

Every engine carries a marker in its environment; the nodes share this
machine's pid namespace, so the test finds every process it caused from here,
proves none is duplicated or orphaned, and kills them all by pid at the end.
"""

from __future__ import annotations

import os

import pytest
import yaml

from tests.fleet import fleet  # noqa: F401  (module-scoped fixture)
from tests.gitcatalog import REPO, CatalogRepo, DaemonProcess, git, marked_pids, stop_all, wait_for

pytestmark = [pytest.mark.fleet]

NODES = ("d1", "d2", "d3")


@pytest.fixture(scope="module")
def nodes(fleet):  # noqa: F811
    for n in NODES:
        fleet.add_node(n)
    return fleet


def model_doc(name: str, replicas: int, marker: str, port: int) -> str:
    return yaml.safe_dump({
        "name": name,
        "source": f"{name}-weights",
        "replicas": replicas,
        "profiles": [{
            "name": "cpu",
            "engine": "command",
            "port": port,
            "command": ["python3", "-m", "reconciler.tiny_server", "--host", "0.0.0.0", "--port", "${PORT}",
                        "--model", "${MODEL_SOURCE}"],
            "env": {"E2E_MARKER": marker, "PYTHONPATH": str(REPO)},
            "start_timeout_s": 30,
        }],
    }, sort_keys=False)


class FleetCatalog:
    def __init__(self, fleet, tmp_path, request):  # noqa: F811
        self.tmp = tmp_path
        self.marker = f"fleet-{os.getpid()}-{request.node.name}"
        self.repo = CatalogRepo(tmp_path / "catalog", init=False)
        self.repo.path.mkdir()
        git(self.repo.path, "init", "-q", "-b", "main")
        git(self.repo.path, "config", "user.email", "person@example.com")
        git(self.repo.path, "config", "user.name", "A Person")
        fleet.fleet_yaml(self.repo.path)
        self.daemons: list[DaemonProcess] = []

    def model(self, name: str, replicas: int, port: int) -> None:
        self.repo.write(f"models/{name}.yaml", model_doc(name, replicas, self.marker, port))

    def daemon(self, name: str = "daemon") -> DaemonProcess:
        d = DaemonProcess(self.repo.path, "--interval", "1", workdir=self.tmp, name=name, real=True,
                          env={"XDG_STATE_HOME": str(self.tmp / "xdg")})
        self.daemons.append(d)
        return d

    def status(self, name: str) -> dict:
        try:
            return yaml.safe_load((self.repo.path / "status/models" / f"{name}.yaml").read_text()) or {}
        except FileNotFoundError:
            return {}

    def wait_ready(self, name: str, count: int, timeout: float = 90.0) -> dict:
        return wait_for(lambda: (s := self.status(name)) and s.get("ready") == count == s.get("desired") and s,
                        timeout, f"{count} Ready replicas of {name}:\n"
                        + "\n".join(d.logfile.read_text()[-4000:] for d in self.daemons))

    def cleanup(self) -> None:
        stop_all(self.daemons, self.marker)


@pytest.fixture
def cat(nodes, tmp_path, request):
    c = FleetCatalog(nodes, tmp_path, request)
    yield c
    c.cleanup()


def placed_nodes(status: dict) -> list[str]:
    return [r["nodes"][0]["node"] for r in status["replicas"]]


def test_committing_a_replica_bump_starts_the_new_replica_on_another_node(cat):
    cat.model("echo", 1, 24100)
    cat.repo.commit("echo: 1")
    cat.daemon()
    first = placed_nodes(cat.wait_ready("echo", 1))

    cat.model("echo", 2, 24100)
    cat.repo.commit("echo: 2")
    now = placed_nodes(cat.wait_ready("echo", 2))
    assert now[0] == first[0], "the running replica moved"
    assert len(set(now)) == 2, "two replicas of one model share a node"
    assert len(marked_pids(cat.marker)) == 2


def test_removing_a_model_stops_its_replicas_on_the_nodes_and_nothing_else(cat, nodes):
    cat.model("keep", 1, 24200)
    cat.model("drop", 2, 24300)
    cat.repo.commit("two models")
    # python3 of the node's own PATH: this interpreter lives under /root, which each node mounts over
    foreign = nodes.spawn("d1", ["python3", "-c", "import time; time.sleep(300)"],
                          env={**os.environ, "E2E_MARKER": cat.marker})
    cat.daemon()
    cat.wait_ready("keep", 1)
    cat.wait_ready("drop", 2)
    before = marked_pids(cat.marker)
    assert len(before) == 4 and foreign.pid in before  # keep-0, drop-0, drop-1 and the foreign process

    git(cat.repo.path, "rm", "-q", "models/drop.yaml")
    cat.repo.commit("remove drop")
    wait_for(lambda: len(marked_pids(cat.marker)) == 2, 60, "drop's engines stopped")
    after = marked_pids(cat.marker)
    assert foreign.pid in after, "a process the reconciler did not start was stopped"
    assert after <= before
    assert cat.status("keep")["ready"] == 1


def test_daemon_sigkilled_mid_pass_and_restarted_converges_on_the_fleet(cat):
    cat.model("burst", 1, 24400)
    cat.repo.commit("burst: 1")
    first = cat.daemon()
    cat.wait_ready("burst", 1)
    cat.model("burst", 3, 24400)
    cat.repo.commit("burst: 3")
    wait_for(lambda: [e for e in first.events("decision") if e.get("action") == "start"
                      and e.get("replica") != "burst-0"], 60, "the first new start")
    first.proc.kill()
    first.wait_exit()

    cat.daemon(name="second")
    status = cat.wait_ready("burst", 3)
    assert len(set(placed_nodes(status))) == 3
    assert len(marked_pids(cat.marker)) == 3, "a duplicate or orphaned engine runs"
