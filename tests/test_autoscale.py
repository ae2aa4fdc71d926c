"""Autoscaling inside the range git holds (SPEC section 11): the catalog, the pure decision, the status
block, and the load reading against real engines on loopback (tests/apply_support/load_engine.py).

The tests that start engines or the CLI are marked `process`; the rest are the fast tier."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from reconciler.decide.autoscale import (
    AutoscaleState,
    decide,
    kept_states,
    new_unknowns,
    next_pass_at,
    state_document,
    state_from_document,
    with_counts,
)
from reconciler.catalog import load_catalog
from reconciler.errors import CatalogInvalid
from reconciler.model import Assignment, AutoscalePolicy, ReplicaRange
from reconciler.decide.outcomes import ReplicaState
from reconciler.act.scaling import METRICS_ACTION, SCALE_ACTION, default_reader, scale_pass
from reconciler.record.status.read_back import counts_in_force
from reconciler.record.status.documents import model_status_document
from reconciler.record.status.predict import predicted_pass
from tests.apply_support.local import free_port, wait_for
from tests.conftest import run_cli

LOAD_ENGINE = Path(__file__).resolve().parent / "apply_support" / "load_engine.py"

FLEET = """\
nodes:
  - id: local
    address: 127.0.0.1
    transport: local
"""


def model_text(replicas="{min: 1, max: 4}", autoscale="{target: 4, up_delay_s: 10, down_delay_s: 60}",
               engine="llama.cpp", extra_profile="") -> str:
    lines = ["name: m", "source: /models/m"]
    if replicas is not None:
        lines.append(f"replicas: {replicas}")
    if autoscale is not None:
        lines.append(f"autoscale: {autoscale}")
    lines += ["spread: preferred", "profiles:", "  - name: cpu", f"    engine: {engine}"]
    if engine == "command":
        lines += ["    port: 9000", "    command: [/bin/true]"]
    if extra_profile:
        lines.append(extra_profile)
    return "\n".join(lines) + "\n"


def catalog_dir(tmp_path: Path, model: str) -> Path:
    (tmp_path / "models").mkdir(parents=True, exist_ok=True)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "models" / "m.yaml").write_text(model)
    return tmp_path


def problems(tmp_path: Path, model: str) -> list[str]:
    with pytest.raises(CatalogInvalid) as info:
        load_catalog(catalog_dir(tmp_path, model), with_revision=False)
    return [str(p) for p in info.value.problems]


# ---------------------------------------------------------------- the catalog


def test_a_range_and_a_policy_build_the_model_at_min_with_defaults(tmp_path):
    cat = load_catalog(catalog_dir(tmp_path, model_text(autoscale="{target: 4}")), with_revision=False)
    m = cat.model("m")
    assert m.scale == ReplicaRange(1, 4) and m.replicas == 1 and m.replica_ids() == ["m-0"]
    assert m.autoscale == AutoscalePolicy(target=4.0, metric="requests", up_delay_s=30.0, down_delay_s=300.0)


def test_a_plain_number_still_means_exactly_that_many(tmp_path):
    cat = load_catalog(catalog_dir(tmp_path, model_text(replicas="3", autoscale=None)), with_revision=False)
    m = cat.model("m")
    assert m.replicas == 3 and m.scale is None and m.autoscale is None
    assert m.replica_range == ReplicaRange(3, 3)


@pytest.mark.parametrize("replicas, autoscale, where, words", [
    ("{min: 5, max: 2}", "{target: 4}", "models/m.yaml:3:", "min 5 is above max 2"),
    ("{min: 1, max: 4}", "{target: 4, metric: latency}", "models/m.yaml:4:", "metric"),
    ("{min: 1, max: 4}", "{target: 0}", "models/m.yaml:4:", "target"),
    ("{min: 1, max: 4}", "{target: -3}", "models/m.yaml:4:", "target"),
    ("2", "{target: 4}", "models/m.yaml:4:", "autoscale needs a range"),
    (None, "{target: 4}", "models/m.yaml:3:", "autoscale needs a range"),
    ("{min: 1, max: 4}", None, "models/m.yaml:3:", "has no autoscale"),
    ("{min: 0, max: 4}", "{target: 4}", "models/m.yaml:3:", "min 0 with autoscale would never scale up"),
    ("{min: 1}", "{target: 4}", "models/m.yaml:3:", "max"),
    ("{min: 1, max: 4, most: 9}", "{target: 4}", "models/m.yaml:3:", "unknown field 'most'"),
    ("{min: 1, max: 4}", "{up_delay_s: 3}", "models/m.yaml:4:", "target"),
    ("{min: 1, max: 4}", "{target: 4, down_delay_s: -1}", "models/m.yaml:4:", "down_delay_s"),
])
def test_bad_scaling_is_refused_at_its_position(tmp_path, replicas, autoscale, where, words):
    found = problems(tmp_path, model_text(replicas=replicas, autoscale=autoscale))
    assert any(p.startswith(where) and words in p for p in found), found


def test_a_command_profile_declares_its_metrics_and_only_it_may(tmp_path):
    ok = model_text(engine="command", extra_profile="    metrics: {waiting: q:waiting, running: q:running}")
    m = load_catalog(catalog_dir(tmp_path / "a", ok), with_revision=False).model("m")
    assert (m.profiles[0].metrics.waiting, m.profiles[0].metrics.running, m.profiles[0].metrics.path) == \
        ("q:waiting", "q:running", "/metrics")
    missing = problems(tmp_path / "b", model_text(engine="command"))
    assert any(p.startswith("models/m.yaml:7:") and "metrics: {waiting" in p for p in missing), missing
    foreign = problems(tmp_path / "c", model_text(extra_profile="    metrics: {waiting: a, running: b}"))
    assert any(p.startswith("models/m.yaml:9:") and "only for engine: command" in p for p in foreign), foreign


@pytest.mark.process
def test_validate_says_where_and_never_a_traceback(tmp_path):
    root = catalog_dir(tmp_path, model_text(replicas="{min: 5, max: 2}"))
    proc = run_cli("validate", str(root))
    assert proc.returncode != 0
    assert "models/m.yaml:3:" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- the decision

POLICY = AutoscalePolicy(target=4, up_delay_s=30, down_delay_s=300)
RANGE = ReplicaRange(1, 4)


def loads(*values):
    return {f"m-{i}": v for i, v in enumerate(values)}


# (current, loads, now, previous, want current, want wanted, words in the reason)
DECISIONS = [
    # at target: nothing pending
    (2, loads(4, 4), 100, None, 2, 2, "requests 8 over 2 replicas = target 4: 2 replicas"),
    # above: wanted 4, but not for up_delay_s yet
    (2, loads(7, 6), 100, None, 2, 4, "requests 13 over 2 replicas > target 4: wants 4, up after 30 s"),
    # above since 60, now 95: 35 s > 30 s: straight to wanted
    (2, loads(7, 6), 95, AutoscaleState(2, 4, 13, "", since=60), 4, 4, "2 -> 4 after 35 s above"),
    # above, wanted beyond max: clamped to max
    (2, loads(40, 40), 95, AutoscaleState(2, 4, 80, "", since=60), 4, 4, "2 -> 4"),
    # below since 0, now 400: down by one only
    (4, loads(0, 0, 0, 0), 400, AutoscaleState(4, 1, 0, "", since=0), 3, 1, "4 -> 3 after 400 s below"),
    # below, but the previous state was above: the clock starts again
    (3, loads(0, 0, 0), 400, AutoscaleState(3, 4, 20, "", since=0), 3, 1, "down after 300 s (0 s so far)"),
    # never below min
    (1, loads(0), 10_000, AutoscaleState(1, 1, 0, "", since=0), 1, 1, "= target" if False else "1 replica"),
    # an unknown replica counts as at target: 2 known at 0 + 1 at 4 -> wanted 1 < 3
    (3, {"m-0": 0, "m-1": 0, "m-2": None}, 100, None, 3, 1, "(1 unknown, counted at target)"),
    # every replica unknown: exactly at target, no move either way
    (2, {"m-0": None, "m-1": None}, 10_000, AutoscaleState(2, 2, 8, "", since=0), 2, 2, "= target 4"),
    # no Ready replica: hold
    (3, {}, 10_000, AutoscaleState(3, 1, 0, "", since=0), 3, 3, "no Ready replica"),
    # a current count outside the range (git narrowed it) is clamped first
    (6, loads(4, 4, 4, 4), 100, None, 4, 4, "4 replicas"),
]


@pytest.mark.parametrize("current, given, now, previous, want_current, want_wanted, words", DECISIONS)
def test_decide(current, given, now, previous, want_current, want_wanted, words):
    unknown = {rid: "did not answer" for rid, v in given.items() if v is None}
    state = decide(POLICY, RANGE, current, given, now, previous, unknown)
    assert (state.current, state.wanted) == (want_current, want_wanted), state
    assert words in state.reason, state.reason
    assert RANGE.min <= state.current <= RANGE.max



def test_a_count_changed_since_the_last_pass_starts_its_wait_anew():
    # Above target since 100 at a count of 1; git then raised the range's min to 2, so the count in force
    # is 2: a new relation, whose up_delay_s starts now rather than at 100 (no jump to 4 at once).
    previous = AutoscaleState(current=1, wanted=4, since=100.0)
    after = decide(POLICY, ReplicaRange(2, 4), 1, {"m-0": 8.0, "m-1": 8.0}, now=200.0, previous=previous)
    assert (after.current, after.wanted, after.since) == (2, 4, 200.0)


def test_with_no_ready_replica_a_hold_keeps_its_since_and_a_move_waits_anew():
    held = AutoscaleState(current=2, wanted=2, since=50.0)
    assert decide(POLICY, RANGE, 2, {}, now=500.0, previous=held).since == 50.0
    rising = AutoscaleState(current=2, wanted=4, since=50.0)
    after = decide(POLICY, RANGE, 2, {}, now=500.0, previous=rising)
    assert (after.current, after.since) == (2, 500.0)

def test_down_one_replica_per_down_delay_from_the_last_step():
    policy = AutoscalePolicy(target=4, up_delay_s=30, down_delay_s=300)
    state = AutoscaleState(4, 4, 16, "", since=0)
    history = []
    for now in range(0, 2000, 50):  # a pass every 50 s, no load at all
        state = decide(policy, RANGE, state.current, loads(*[0] * state.current), now, state)
        history.append((now, state.current))
    steps = [(t, c) for (t, c), (_, before) in zip(history[1:], history) if c != before]
    assert steps == [(300, 3), (600, 2), (900, 1)]
    assert history[-1][1] == 1


def test_a_load_that_stays_up_does_not_oscillate():
    """In-flight requests, not the queue: once capacity suffices the queue empties, the count holds."""
    policy = AutoscalePolicy(target=1, up_delay_s=0, down_delay_s=0)
    state = initial_state_of(ReplicaRange(1, 4))
    seen = []
    for now in range(10):
        # 3 long requests in flight over however many replicas run: 1 each once there are 3
        per = [3 / state.current] * state.current
        state = decide(policy, ReplicaRange(1, 4), state.current, loads(*per), now, state)
        seen.append(state.current)
    assert seen[-5:] == [3] * 5


def initial_state_of(rng):
    return AutoscaleState(rng.min, rng.min)


def test_next_pass_is_due_when_a_move_falls_due(tmp_path):
    cat = load_catalog(catalog_dir(tmp_path, model_text()), with_revision=False)
    assert math.isclose(next_pass_at(cat, {"m": AutoscaleState(1, 3, 9, "", since=100.2)}), 100.2 + 10)
    assert math.isclose(next_pass_at(cat, {"m": AutoscaleState(3, 1, 0, "", since=100.2)}), 100.2 + 60)
    assert next_pass_at(cat, {"m": AutoscaleState(1, 1, since=5)}) is None


def test_only_new_unknowns_are_warned_about():
    before = AutoscaleState(2, 2, unknown={"m-0": "timed out"})
    after = AutoscaleState(2, 2, unknown={"m-0": "timed out", "m-1": "answered 404"})
    assert new_unknowns(before, after) == {"m-1": "answered 404"}
    assert new_unknowns(None, after) == dict(after.unknown)


# ---------------------------------------------------------------- the count in force and its status block


def test_status_block_round_trips_and_junk_reads_as_min(tmp_path):
    cat = load_catalog(catalog_dir(tmp_path, model_text()), with_revision=False)
    m = cat.model("m")
    state = AutoscaleState(3, 4, 13.0, "requests 13 over 2 replicas > target 4", since=1_700_000_000.4,
                           unknown={"m-1": "did not answer"})
    doc = state_document(m, state)
    assert doc == {"min": 1, "max": 4, "current": 3, "wanted": 4, "metric_sum": 13,
                   "reason": "requests 13 over 2 replicas > target 4", "since": "2023-11-14T22:13:20.400Z",
                   "metrics_unknown": {"m-1": "did not answer"}}
    back = state_from_document(yaml.safe_load(yaml.safe_dump(doc)))
    assert (back.current, back.wanted, back.metric_sum) == (3, 4, 13.0)
    assert math.isclose(back.since, 1_700_000_000.4, abs_tol=0.001)
    assert back.since >= state.since, "a delay read back is never shortened"
    assert state_from_document({**doc, "since": "yesterday"}).since is None
    for junk in (None, "three", {"current": "3"}, {"current": -1}, {"current": True}, []):
        assert state_from_document(junk) is None


def test_counts_come_from_status_clamped_to_the_range_and_the_catalog_is_untouched(tmp_path):
    root = catalog_dir(tmp_path, model_text())
    before = (root / "models" / "m.yaml").read_bytes()
    cat = load_catalog(root, with_revision=False)
    assert counts_in_force(cat)["m"].current == 1  # no status file: min
    status = root / "status" / "models"
    status.mkdir(parents=True)
    (status / "m.yaml").write_text(yaml.safe_dump({"name": "m", "autoscale": {"current": 3, "wanted": 3}}))
    states = counts_in_force(cat)
    scaled = with_counts(cat, states)
    assert scaled.model("m").replicas == 3 and scaled.model("m").replica_ids() == ["m-0", "m-1", "m-2"]
    (status / "m.yaml").write_text(yaml.safe_dump({"name": "m", "autoscale": {"current": 9, "wanted": 9}}))
    kept = counts_in_force(cat)["m"]
    assert (kept.current, kept.wanted) == (4, 4) and "clamped" in kept.reason
    (status / "m.yaml").write_text("autoscale: [not, a, block\n")
    assert counts_in_force(cat)["m"].current == 1
    assert (root / "models" / "m.yaml").read_bytes() == before


def test_model_status_document_carries_the_block_after_ready(tmp_path):
    from reconciler.decide.plan import plan
    from reconciler.model import Inventory

    cat = load_catalog(catalog_dir(tmp_path, model_text()), with_revision=False)
    states = {"m": AutoscaleState(2, 2, 8, "requests 8 over 2 replicas = target 4", since=0)}
    scaled = with_counts(cat, states)
    result = predicted_pass(scaled, plan(scaled, Inventory(())))
    result.autoscale = states
    doc = model_status_document(scaled.model("m"), result, scaled.fleet)
    assert list(doc) == ["name", "desired", "ready", "autoscale", "replicas"]
    assert doc["desired"] == 2 and doc["autoscale"]["current"] == 2 and len(doc["replicas"]) == 2
    fixed = load_catalog(catalog_dir(tmp_path / "fixed", model_text(replicas="2", autoscale=None)), with_revision=False)
    fixed_result = predicted_pass(fixed, plan(fixed, Inventory(())))
    fixed_result.autoscale = states  # a fixed count has no block, whatever a result carries
    assert "autoscale" not in model_status_document(fixed.model("m"), fixed_result, fixed.fleet)
    assert kept_states(fixed, {}) == {}


# ---------------------------------------------------------------- reading loads from real engines


@pytest.fixture
def engines(tmp_path):
    procs = []

    def start(mode="ok", parallel=1, serve_s=3.0):
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(LOAD_ENGINE), "--port", str(port), "--metrics", mode,
                                 "--parallel", str(parallel), "--serve-s", str(serve_s)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait_for(lambda: _answers(port), 20, f"load engine on {port}")
        return port

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
    except OSError:
        return False


def command_catalog(tmp_path: Path):
    text = model_text(engine="command", autoscale="{target: 2, up_delay_s: 0, down_delay_s: 0}",
                      extra_profile="    metrics: {waiting: load:requests_waiting, running: load:requests_running}")
    return load_catalog(catalog_dir(tmp_path, text), with_revision=False)


def ready(rid: str, port: int) -> ReplicaState:
    return ReplicaState(rid, "m", "cpu", "Ready", nodes=(Assignment("local", 0, (), (), port),))


@pytest.mark.process
def test_scale_pass_reads_real_in_flight_requests_and_scales_up(tmp_path, engines):
    port = engines(parallel=1, serve_s=4.0)
    cat = with_counts(command_catalog(tmp_path), {"m": AutoscaleState(1, 1)})
    url = f"http://127.0.0.1:{port}/v1/completions"
    log = []
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(urllib.request.urlopen, urllib.request.Request(url, data=b"{}"), None, 30)
                   for _ in range(5)]
        wait_for(lambda: b"load:requests_waiting 4" in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=5).read(), 20, "4 requests waiting")
        after = scale_pass(cat, {"m-0": ready("m-0", port)}, {"m": AutoscaleState(1, 1, since=0)}, 100,
                           default_reader, log.append)
        for f in futures:
            assert f.result().status == 200
    state = after["m"]
    # 1 running + 4 waiting = 5 in flight over 1 replica, target 2: wanted ceil(5/2) = 3, up_delay_s 0
    assert (state.metric_sum, state.wanted, state.current) == (5, 3, 3), state
    assert [d.action for d in log] == [SCALE_ACTION] and "1 -> 3" in log[0].reason


@pytest.mark.process
@pytest.mark.parametrize("mode, words", [
    ("missing", "answered 404"),
    ("garbage", "not Prometheus exposition text"),
    ("nan", "not a count of requests"),
    ("negative", "not a count of requests"),
    ("absent", "have no load:requests_running"),
    ("slow", "did not answer within"),
])
def test_a_broken_metrics_endpoint_counts_at_target_with_one_warning(tmp_path, engines, mode, words):
    bad, good = engines(mode=mode), engines()
    cat = with_counts(command_catalog(tmp_path), {"m": AutoscaleState(2, 2)})
    replicas = {"m-0": ready("m-0", good), "m-1": ready("m-1", bad)}
    log = []

    def reader(targets):
        from reconciler.act.engine_metrics import read_loads
        return read_loads(targets, timeout_s=1.0)

    first = scale_pass(cat, replicas, {"m": AutoscaleState(2, 2, since=0)}, 100, reader, log.append)["m"]
    # the good replica reads 0, the broken one counts as at target 2: sum 2, wanted 1 < 2 (down after 0 s: one step)
    assert first.metric_sum == 2 and list(first.unknown) == ["m-1"] and words in first.unknown["m-1"]
    warnings = [d for d in log if d.action == METRICS_ACTION]
    assert len(warnings) == 1 and warnings[0].replica == "m-1" and words in warnings[0].reason
    assert "Traceback" not in "".join(d.reason for d in log)
    log.clear()
    second = scale_pass(cat, replicas, {"m": first}, 101, reader, log.append)["m"]
    assert [d for d in log if d.action == METRICS_ACTION] == [], "said once, not on every pass"
    assert second.unknown == first.unknown


@pytest.mark.process
def test_every_replica_unknown_never_moves_the_count(tmp_path, engines):
    cat = with_counts(command_catalog(tmp_path), {"m": AutoscaleState(3, 3)})
    bad = [engines(mode="garbage") for _ in range(3)]
    replicas = {f"m-{i}": ready(f"m-{i}", p) for i, p in enumerate(bad)}
    state = AutoscaleState(3, 3, since=0)
    for now in (100, 200, 300):
        state = scale_pass(cat, replicas, {"m": state}, now, default_reader, lambda d: None)["m"]
        assert (state.current, state.wanted) == (3, 3)
    assert math.isclose(state.metric_sum, 6)


def test_only_ready_replicas_inside_the_count_are_asked(tmp_path):
    cat = with_counts(command_catalog(tmp_path), {"m": AutoscaleState(2, 2)})
    asked = []

    def reader(targets):
        asked.extend(t.replica for t in targets)
        return {}

    replicas = {"m-0": ready("m-0", 1), "m-1": ReplicaState("m-1", "m", "cpu", "Starting"),
                "m-2": ready("m-2", 3)}
    scale_pass(cat, replicas, {}, 0, reader, lambda d: None)
    assert asked == ["m-0"]


@pytest.mark.process
def test_status_cli_and_json_show_the_count(tmp_path):
    root = catalog_dir(tmp_path, model_text())
    cat = load_catalog(root, with_revision=False)
    state = AutoscaleState(2, 4, 13, "requests 13 over 2 replicas > target 4: wants 4, up after 10 s (3 s so far)",
                           since=1_700_000_000)
    from reconciler.decide.plan import plan
    from reconciler.model import Inventory
    from reconciler.record.status.write import write_pass

    scaled = with_counts(cat, {"m": state})
    result = predicted_pass(scaled, plan(scaled, Inventory(())))
    result.autoscale = {"m": state}
    write_pass(scaled, result, nodes=False)
    text = run_cli("status", str(root))
    assert text.returncode == 0, text.stderr
    assert "m: replicas 1-4 (now 2, wants 4): requests 13 over 2 replicas > target 4" in text.stdout
    doc = json.loads(run_cli("status", str(root), "--format", "json").stdout)
    assert doc["models"][0]["autoscale"]["current"] == 2


def _scaled_to_three(root, tmp_path, reason: str):
    """status/models/m.yaml holding an autoscale count of 3 (for `reason`), and a one-node snapshot:
    (the status/models directory, the snapshot's path)."""
    status = root / "status" / "models"
    status.mkdir(parents=True)
    (status / "m.yaml").write_text(yaml.safe_dump({"name": "m", "autoscale": {
        "current": 3, "wanted": 3, "reason": reason}}))
    snapshot = tmp_path / "snap.yaml"
    snapshot.write_text(yaml.safe_dump({"nodes": [{"id": "local", "state": "ready", "memory_total_mb": 65536,
                                                   "engines": {"llama.cpp": "b1"}, "gpus": [], "replicas": []}]}))
    return status, snapshot


@pytest.mark.process
def test_plan_takes_the_count_from_status_and_says_the_range(tmp_path):
    root = catalog_dir(tmp_path, model_text())
    status, snapshot = _scaled_to_three(root, tmp_path, "requests 12 over 3 replicas = target 4")
    md = run_cli("plan", str(root), "--inventory", str(snapshot), "--format", "markdown")
    assert md.returncode == 0, md.stderr
    assert "| `m` | 1-4 (now 3) | requests 12 over 3 replicas = target 4 |" in md.stdout
    assert md.stdout.count("| start |") == 3
    text = run_cli("plan", str(root), "--inventory", str(snapshot))
    assert "m: 1-4 (now 3)" in text.stdout


@pytest.mark.process
def test_a_scale_up_that_cannot_be_placed_has_rejections_and_status_says_what_the_load_wanted(tmp_path):
    root = catalog_dir(tmp_path, model_text().replace("spread: preferred\n", ""))  # one node, spread required
    status, snapshot = _scaled_to_three(root, tmp_path, "requests 12 over 1 replica > target 4: 1 -> 3 after 10 s above")
    done = run_cli("plan", str(root), "--inventory", str(snapshot), "--write-status")
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load((status / "m.yaml").read_text())
    assert doc["desired"] == 3 and doc["autoscale"]["wanted"] == 3 and doc["autoscale"]["current"] == 3
    pending = [r for r in doc["replicas"] if r["phase"] == "Pending" and r.get("rejections") or
               r.get("rejections_same_as")]
    assert [r["id"] for r in pending] == ["m-1", "m-2"], doc["replicas"]
    assert "already hosts m-0" in doc["replicas"][1]["rejections"][0]["reason"]


def test_an_unreadable_load_is_a_warning_line_in_the_daemon_log():
    import io

    from reconciler.control.log import EventLog
    from reconciler.decide.outcomes import Decision

    out = io.StringIO()
    EventLog("json", out)(Decision("m-1", "n1", METRICS_ACTION, "load unknown, counted at target 4: /metrics answered 404"))
    line = json.loads(out.getvalue())
    assert (line["level"], line["action"], line["replica"]) == ("warning", "metrics", "m-1")
    assert len(out.getvalue().splitlines()) == 1
