"""The real daemon scales a model inside its range on the load its real engines report (SPEC section 11).

This machine is the node (`transport: local`); the engines are tests/apply_support/load_engine.py,
which serves one request at a time and reports the requests running and waiting on /metrics, as
llama-server does. The load is a bounded number of real concurrent requests from the test.
"""

from __future__ import annotations

import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli
from tests.gitcatalog import git, wait_for
from tests.test_daemon_e2e import E2E

pytestmark = [pytest.mark.process]

LOAD_ENGINE = Path(__file__).resolve().parent / "apply_support" / "load_engine.py"


def autoscaled_model(name: str, port: int, marker: str, release: Path, *, lo=1, hi=3, serve_s=0.2) -> str:
    doc = {
        "name": name,
        "source": f"{name}-weights",
        "replicas": {"min": lo, "max": hi},
        "autoscale": {"metric": "requests", "target": 1, "up_delay_s": 1, "down_delay_s": 2},
        "spread": "preferred",
        "profiles": [{
            "name": "cpu",
            "engine": "command",
            "port": port,
            "command": [sys.executable, str(LOAD_ENGINE), "--host", "127.0.0.1", "--port", "${PORT}",
                        "--parallel", "1", "--serve-s", str(serve_s), "--hold-until", str(release)],
            "metrics": {"waiting": "load:requests_waiting", "running": "load:requests_running"},
            "env": {"E2E_MARKER": marker},
            "health_path": "/health",
            "start_timeout_s": 30,
        }],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def e2e(tmp_path):
    env = E2E(tmp_path)
    yield env
    env.cleanup()


class Watch:
    """Polls status/models/<name>.yaml and the node records in a thread: every count the test could
    have seen, so 'never above max' is checked throughout, not only at the end."""

    def __init__(self, e2e: E2E, name: str):
        self.e2e, self.name = e2e, name
        self.desired: list[int] = []
        self.records: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def sample(self) -> None:
        try:
            d = self.e2e.model_status(self.name).get("desired")
        except yaml.YAMLError:
            return
        if isinstance(d, int) and (not self.desired or self.desired[-1] != d):
            self.desired.append(d)
        self.records.append(len([k for k in self.e2e.records() if k.startswith(self.name + "-")]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()  # what the test saw last is in the history too


def test_the_daemon_scales_up_to_max_under_load_and_back_to_min_one_at_a_time(e2e):
    release = e2e.tmp / "release-the-load"
    e2e.repo.write("models/busy.yaml", autoscaled_model("busy", e2e.port, e2e.marker, release))
    e2e.repo.commit("busy: 1-3 replicas, autoscaled")
    catalog_bytes = (e2e.repo.path / "models" / "busy.yaml").read_bytes()
    d = e2e.daemon("--metrics-address", "127.0.0.1:0")
    first = e2e.wait_ready("busy", 1)
    assert first["autoscale"]["current"] == 1 and first["autoscale"]["min"] == 1
    url = first["replicas"][0]["nodes"][0]["endpoint"] + "/v1/completions"
    watch = Watch(e2e, "busy")
    try:
        # 8 requests at once on one slot, held until the test releases them: 8 in flight,
        # wanted ceil(8 / 1) = 8, clamped to max 3
        with ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(lambda: urllib.request.urlopen(
                urllib.request.Request(url, data=b"{}"), timeout=60).status) for _ in range(8)]
            up = e2e.wait_ready("busy", 3, timeout=90)
            assert up["autoscale"]["current"] == 3, up["autoscale"]
            # A manual apply in between changes nothing: the daemon holds the catalog's lock
            applied = run_cli("apply", str(e2e.repo.path), env={"XDG_STATE_HOME": str(e2e.tmp / "xdg")})
            assert applied.returncode == 1 and f"(pid {d.pid}) is already acting on" in applied.stderr, applied.stderr
            assert applied.stdout == ""
            assert e2e.model_status("busy")["desired"] == 3
            release.touch()
            assert all(a.result() == 200 for a in answers), "a request was cut"
        # The load has stopped: one replica every down_delay_s, highest ordinal first, down to min
        # The pass that stops a drained replica writes status after the stop (SPEC 13: never in the pass
        # that began its drain): wait for the status that no longer lists it too.
        down = wait_for(lambda: (s := e2e.model_status("busy")) and s.get("desired") == 1 and s.get("ready") == 1
                        and len(e2e.records()) == 1 and len(s.get("replicas", ())) == 1 and s, 90,
                        "back to 1 replica:\n" + d.logfile.read_text()[-3000:])
        assert [r["id"] for r in down["replicas"]] == ["busy-0"]
    finally:
        watch.stop()
    assert max(watch.desired) == 3 and max(watch.records) <= 3, (watch.desired, max(watch.records))
    assert watch.desired[watch.desired.index(3):] == [3, 2, 1], watch.desired  # one at a time
    assert [e["replica"] for e in d.events("decision") if e.get("action") == "stop"] == ["busy-2", "busy-1"]
    scales = [e for e in d.events("decision") if e.get("action") == "scale"]
    assert [e["reason"].split(": ")[-1].split(" after")[0] for e in scales] == ["1 -> 3", "3 -> 2", "2 -> 1"]
    # the catalog is never modified, and the count lives in status/ only
    assert (e2e.repo.path / "models" / "busy.yaml").read_bytes() == catalog_bytes
    assert git(e2e.repo.path, "status", "--porcelain", "--", "models").strip() == ""
    address = d.wait_event("metrics.serving")[0]["address"]
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    assert 'reconciler_model_autoscale_current_replicas{model="busy"} 1.0' in body
    assert 'reconciler_model_autoscale_wanted_replicas{model="busy"} 1.0' in body
