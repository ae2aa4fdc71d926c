"""The real daemon passes again when what a pass left waiting can move, not a resync interval later:
a start it left to judge (it does not wait for /health within the pass), and a drain, which ends on
the pass after the engine's last request (SPEC section 10: a draining replica is a wait, like a backoff).

This machine is the node (`transport: local`); the engine is tests/apply_support/load_engine.py,
which reports the requests it runs on /metrics. Each daemon here resyncs once an hour: only the
wake-ups its passes ask for can move anything.
"""

from __future__ import annotations

import threading
import urllib.request

import pytest
import yaml

from tests.gitcatalog import wait_for
from tests.test_autoscale_daemon import autoscaled_model, e2e  # noqa: F401 - e2e: the fixture, shared

pytestmark = [pytest.mark.process]


def held_model(name: str, replicas: int, port: int, marker: str, release) -> str:
    """The autoscaling tests' engine and model, at a fixed count with a drain_s far past the test's
    deadlines: the drain must end on the engine's word."""
    doc = yaml.safe_load(autoscaled_model(name, port, marker, release, serve_s=0.1))
    del doc["autoscale"]
    doc.update(replicas=replicas, drain_s=120)
    return yaml.safe_dump(doc, sort_keys=False)


def _running(endpoint: str) -> float:
    body = urllib.request.urlopen(endpoint + "/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in body.splitlines() if line.startswith("load:requests_running"))


def test_a_start_is_judged_on_the_pass_it_asked_for_not_at_the_next_resync(e2e):
    e2e.repo.write("models/held.yaml", held_model("held", 1, e2e.port, e2e.marker, e2e.tmp / "never"))
    e2e.repo.commit("held: 1 replica")
    d = e2e.daemon("--interval", "3600")
    [first] = d.wait_event("pass.end")
    assert e2e.model_status("held")["replicas"][0]["phase"] == "Starting"  # the first pass did not wait
    ready = e2e.wait_ready("held", 1, timeout=60)
    assert ready["replicas"][0]["phase"] == "Ready"
    assert [e["trigger"] for e in d.events("pass.start")][:2] == ["start", "wake"]  # the wake-up, not a resync
    assert first["trigger"] == "start"
    # The wake-ups probed only the node of the start they were about (test_daemon_pass: only those nodes).
    partial = d.events("probe.partial")
    assert partial and all(e["nodes"] == ["local"] and e["of"] == 1 for e in partial), partial


def test_a_drain_ends_on_the_pass_after_its_last_request_not_at_the_next_resync(e2e):
    release = e2e.tmp / "release-the-request"
    e2e.repo.write("models/held.yaml", held_model("held", 2, e2e.port, e2e.marker, release))
    e2e.repo.commit("held: 2 replicas")
    d = e2e.daemon("--interval", "3600")
    up = e2e.wait_ready("held", 2)
    endpoint = {r["id"]: r["nodes"][0]["endpoint"] for r in up["replicas"]}["held-1"]

    answer: list[int] = []
    request = threading.Thread(target=lambda: answer.append(urllib.request.urlopen(
        urllib.request.Request(endpoint + "/v1/completions", data=b"{}"), timeout=90).status))
    request.start()
    try:
        wait_for(lambda: _running(endpoint) == 1, 30, "the held request to be running")
        e2e.repo.write("models/held.yaml", held_model("held", 1, e2e.port, e2e.marker, release))
        e2e.repo.commit("held: 1 replica")
        draining = wait_for(lambda: (s := e2e.model_status("held")) and any(
            r["id"] == "held-1" and r["phase"] == "Draining" for r in s.get("replicas", ())) and s, 60,
            "held-1 Draining:\n" + d.logfile.read_text()[-3000:])
        assert "out of every gateway file" in next(r["message"] for r in draining["replicas"] if r["id"] == "held-1")
        assert "held-1" in {r.split(".")[0] for r in e2e.records()}  # still running: it drains
        release.touch()
        request.join(timeout=60)
        assert answer == [200], "the request in flight was cut"
        # No commit, no signal, an hour to the resync: only the pass the drain asked for stops it.
        [stop] = wait_for(lambda: [e for e in d.events("decision") if e.get("action") == "stop"], 60,
                          "held-1 stopped once idle:\n" + d.logfile.read_text()[-3000:])
    finally:
        release.touch()
        request.join(timeout=60)
    assert stop["replica"] == "held-1" and "the gateway serves without it and its engine runs no request" in stop["reason"], stop
    assert not any(k.startswith("held-1.") for k in e2e.records())
    assert [e.get("trigger") for e in d.events("pass.start")][-1] == "wake"  # the wake-up, not a commit or a resync


def test_a_step_of_load_is_seen_between_passes_and_scaled_for_not_at_the_next_resync(e2e):
    release = e2e.tmp / "release-the-load"
    e2e.repo.write("models/busy.yaml", autoscaled_model("busy", e2e.port, e2e.marker, release, hi=2))
    e2e.repo.commit("busy: 1-2 replicas, autoscaled")
    d = e2e.daemon("--interval", "3600")
    first = e2e.wait_ready("busy", 1)
    url = first["replicas"][0]["nodes"][0]["endpoint"] + "/v1/completions"
    answers: list[int] = []
    load = [threading.Thread(target=lambda: answers.append(urllib.request.urlopen(
        urllib.request.Request(url, data=b"{}"), timeout=90).status)) for _ in range(3)]
    for t in load:
        t.start()
    try:
        # 3 in flight on one replica, target 1: wants 2. No commit, no signal, an hour to the resync:
        # only a look at the load between passes can see it.
        [scale] = wait_for(lambda: [e for e in d.events("decision") if e.get("action") == "scale"], 30,
                           "busy scaled to 2:\n" + d.logfile.read_text()[-3000:])
    finally:
        release.touch()
        for t in load:
            t.join(timeout=60)
    assert "1 -> 2" in scale["reason"], scale
    assert answers == [200, 200, 200], "a request was cut"
    assert [e["models"] for e in d.events("autoscale.load-rose")][:1] == [["busy"]]
    assert "interval" not in [e.get("trigger") for e in d.events("pass.start")]
