"""SPEC 13's hand-off with real processes: `apply` and the daemon on this machine (`transport: local`),
the engines tests/apply_support/load_engine.py (a `command` profile that reports its requests on
/metrics as `load:requests_running`, not any engine's own series).

- an idle copy scaled down is still running when the gateway files first lack it, and one `apply`
  stops it (after gateway.settle_s): today's pass stopped it before the files were written;
- a removed model's copy drains by the series it was started with and ends on its engine's word,
  long before its drain_s, and the model's status file shows it Draining until it has stopped.
"""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli
from tests.gitcatalog import git, wait_for
from tests.test_autoscale_daemon import e2e  # noqa: F401 - the fixture, shared
from tests.test_daemon_e2e import fleet_yaml
from tests.test_daemon_wakes import _running, held_model

pytestmark = [pytest.mark.process]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gateway_ids(root: Path) -> list[str] | None:
    try:
        doc = yaml.safe_load((root / "status" / "gateway" / "litellm.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return [e["model_info"]["id"] for e in (doc or {}).get("model_list", ())]


class FilesWatch(threading.Thread):
    """Every few ms: whether a replica is in litellm.yaml and whether its engine runs, as pairs."""

    def __init__(self, root: Path, replica: str, pid: int):
        super().__init__(daemon=True)
        self.root, self.replica, self.pid = root, replica, pid
        self.seen: list[tuple[bool, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.005):
            ids = gateway_ids(self.root)
            if ids is not None:
                self.seen.append((self.replica in ids, alive(self.pid)))


def test_apply_stops_an_idle_copy_only_once_the_gateway_files_without_it_have_settled(e2e):
    e2e.repo.write("fleet.yaml", "gateway: {settle_s: 1}\n" + fleet_yaml(e2e.state))
    e2e.repo.write("models/held.yaml", held_model("held", 2, e2e.port, e2e.marker, e2e.tmp / "never"))
    e2e.repo.commit("held: 2 replicas")
    env = {"XDG_STATE_HOME": str(e2e.tmp / "xdg")}
    up = run_cli("apply", str(e2e.repo.path), env=env, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert gateway_ids(e2e.repo.path) == ["held-0", "held-1"]
    pid = e2e.records()["held-1.rank0"]["pid"]

    e2e.repo.write("models/held.yaml", held_model("held", 1, e2e.port, e2e.marker, e2e.tmp / "never"))
    e2e.repo.commit("held: 1 replica")
    watch = FilesWatch(e2e.repo.path, "held-1", pid)
    watch.start()
    try:
        down = run_cli("apply", str(e2e.repo.path), env=env, timeout=180)
    finally:
        watch.stop.set()
        watch.join(timeout=10)
    assert down.returncode == 0, down.stdout + down.stderr
    out = [(listed, running) for listed, running in watch.seen if not listed]
    assert out, watch.seen[-5:]
    assert out[0][1], "held-1's engine was stopped before the gateway files without it were written"
    # One apply: it waited for the hand-off within its run, then stopped the copy.
    lines = down.stdout.splitlines()
    waited = [i for i, line in enumerate(lines) if line.startswith("held-1 ") and "  wait  " in line]
    stopped = [i for i, line in enumerate(lines) if line.startswith("held-1 ") and "  stop  " in line]
    assert waited and stopped and waited[0] < stopped[0], down.stdout
    assert "held-1.rank0" not in e2e.records() and not alive(pid)
    assert gateway_ids(e2e.repo.path) == ["held-0"]


def test_a_removed_models_copy_drains_by_its_own_metrics_and_its_status_file_stays_meanwhile(e2e):
    e2e.repo.write("fleet.yaml", "gateway: {settle_s: 1}\n" + fleet_yaml(e2e.state))
    release = e2e.tmp / "release-the-request"
    # drain_s 120: far past this test's deadlines, so the drain must end on the engine's word
    e2e.repo.write("models/held.yaml", held_model("held", 1, e2e.port, e2e.marker, release))
    e2e.repo.commit("held: 1 replica")
    d = e2e.daemon("--interval", "3600")
    up = e2e.wait_ready("held", 1)
    endpoint = up["replicas"][0]["nodes"][0]["endpoint"]
    answer: list[int] = []
    request = threading.Thread(target=lambda: answer.append(urllib.request.urlopen(
        urllib.request.Request(endpoint + "/v1/completions", data=b"{}"), timeout=90).status))
    request.start()
    status_file = e2e.repo.path / "status" / "models" / "held.yaml"
    try:
        wait_for(lambda: _running(endpoint) == 1, 30, "the held request to be running")
        git(e2e.repo.path, "rm", "-q", "models/held.yaml")
        e2e.repo.commit("held: removed")
        wait_for(lambda: (s := e2e.model_status("held")) and [r["phase"] for r in s.get("replicas", ())] == ["Draining"],
                 60, "held-0 Draining in its status file:\n" + d.logfile.read_text()[-3000:])
        passes = len(d.events("pass.end"))
        d.wait_event("pass.end", count=passes + 2, timeout=60)  # wake-ups look at the drain again: it stays
        assert [r["phase"] for r in e2e.model_status("held").get("replicas", ())] == ["Draining"], (
            d.logfile.read_text()[-6000:])
        assert "held-0.rank0" in e2e.records()
        release.touch()
        request.join(timeout=60)
        assert answer == [200], "the request in flight was cut"
        [stop] = wait_for(lambda: [e for e in d.events("decision") if e.get("action") == "stop"], 60,
                          "held-0 stopped once idle:\n" + d.logfile.read_text()[-3000:])
    finally:
        release.touch()
        request.join(timeout=60)
    # Its own series (load:requests_running) said it was idle: not drain_s, not a guess at llama.cpp's.
    assert stop["replica"] == "held-0" and "its engine runs no request" in stop["reason"], stop
    wait_for(lambda: not status_file.exists(), 30, "status/models/held.yaml removed once its copy stopped")
    assert not any(k.startswith("held-0.") for k in e2e.records())
    assert not d.events("pass.error") and not d.events("pass.failed"), d.events("pass.error") + d.events("pass.failed")
