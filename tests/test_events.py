"""Events derived from what a pass decided and found (pure), the log read back (a torn or corrupt
file: what is readable shown, what was skipped said), --since and --kind parsed, `reconciler events`."""

from __future__ import annotations

import dataclasses
import json

import pytest

from builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile
from reconciler.decide.autoscale import AutoscaleState
from reconciler.cli import main as cli_main
from reconciler.errors import UsageError
from reconciler.record.eventlog import EventJournal, RotatingLines, log_dir
from reconciler.record.events import (
    Event,
    EventFilter,
    RolloutSeen,
    from_document,
    parse_since,
    pass_events,
    read_events,
    revision_refused,
    rollout_events,
    seen_after,
    seen_from_document,
    seen_to_document,
    to_document,
)
from reconciler.record.history import sample_of
from reconciler.model import Assignment, Quarantine
from reconciler.decide.outcomes import Decision, PassMemory, PassResult, ReplicaState
from reconciler.vocabulary import EventKind, FailureKind, GpuHealth, NodeState, Phase

NOW = 1_800_000_000.0


def state(rid, phase, node="n1", message="", failure=None, model_name="llama"):
    return ReplicaState(rid, model_name, "p", phase, message, (Assignment(node, 0, (0,), (), 8000),),
                        endpoint="http://10.1.0.1:8000", failure=failure)


def result(replicas=(), nodes=(), decisions=(), memory=None, autoscale=None, revision="abc123"):
    return PassResult(revision, inventory(*nodes), None, decisions=list(decisions),
                      replicas={s.replica: s for s in replicas}, memory=memory, autoscale=autoscale or {})


def kinds(events):
    return [(e.kind, e.replica or e.node) for e in events]


def test_a_start_then_ready_then_a_node_cut_then_drain_and_stop_each_said_once():
    first = result([state("llama-0", Phase.STARTING)], [observed("n1")],
                   [Decision("llama-0", "n1", "start", "rank 0/1 port 8000"), Decision("llama-0", "n1", "start", "rank 1")])
    e1 = pass_events(None, first, NOW)
    assert kinds(e1) == [(EventKind.REPLICA_STARTED, "llama-0")]
    seen = seen_after(first, None)
    ready = result([state("llama-0", Phase.READY)], [observed("n1")])
    assert kinds(pass_events(seen, ready, NOW)) == [(EventKind.REPLICA_READY, "llama-0")]
    seen = seen_after(ready, seen)
    assert pass_events(seen, ready, NOW) == []  # the same state again is no news
    cut = result([state("llama-0", Phase.UNKNOWN)], [observed("n1", state=NodeState.UNREACHABLE, reason="timed out")])
    assert kinds(pass_events(seen, cut, NOW)) == [(EventKind.NODE_UNREACHABLE, "n1")]
    seen = seen_after(cut, seen)
    assert pass_events(seen, cut, NOW) == []
    back = result([state("llama-0", Phase.DRAINING)], [observed("n1")])
    assert kinds(pass_events(seen, back, NOW)) == [(EventKind.NODE_BACK, "n1"), (EventKind.REPLICA_DRAINING, "llama-0")]
    seen = seen_after(back, seen)
    stop = result([], [observed("n1")], [Decision("llama-0", "n1", "stop", "drained"), Decision("x-0", "-", "stop", "nothing")])
    assert kinds(pass_events(seen, stop, NOW)) == [(EventKind.REPLICA_STOPPED, "llama-0")]


def test_a_failed_replica_carries_its_failure_kind_and_reason_and_a_failed_decision_is_no_start():
    r = result([state("llama-0", Phase.FAILED, message="rank 0 exited 1", failure=FailureKind.TEMPORARY)],
               [observed("n1")], [Decision("llama-0", "n1", "start", "x", ok=False)])
    [e] = pass_events(None, r, NOW)
    assert (e.kind, e.failure, e.message, e.node, e.model) == (
        EventKind.REPLICA_FAILED, "temporary", "rank 0 exited 1", "n1", "llama")


def test_gpus_unhealthy_and_quarantined_once_and_not_again_when_their_node_comes_back():
    bad = dataclasses.replace(gpus(2)[1], health=GpuHealth.UNHEALTHY, health_reason="uncorrected ECC errors")
    mem = PassMemory(quarantines={("n2", 0): Quarantine("3 failed starts", NOW + 3600, "GPU-0")})
    r = result(nodes=[observed("n1", gpu=(gpus(2)[0], bad)), observed("n2", gpu=gpus(1))], memory=mem)
    events = pass_events(None, r, NOW)
    assert [(e.kind, e.node, e.gpu) for e in events] == [
        (EventKind.GPU_UNHEALTHY, "n1", 1), (EventKind.GPU_QUARANTINED, "n2", 0)]
    assert "uncorrected ECC" in events[0].message
    seen = seen_after(r, None)
    down = result(nodes=[observed("n1", state=NodeState.UNREACHABLE), observed("n2", gpu=gpus(1))], memory=mem)
    seen = seen_after(down, seen)
    assert kinds(pass_events(seen, r, NOW)) == [(EventKind.NODE_BACK, "n1")]


def test_autoscale_decision_when_the_count_moves():
    before = seen_after(result(autoscale={"llama": AutoscaleState(2, 2)}), None)
    moved = result(autoscale={"llama": AutoscaleState(3, 3, 13.0, "requests 13 over 2 replicas > target 4")})
    [e] = pass_events(before, moved, NOW)
    assert (e.kind, e.model) == (EventKind.AUTOSCALE, "llama")
    assert e.message.startswith("2 -> 3 replicas: requests 13")


def test_rollout_step_promotion_and_abort_are_derived_once():
    p = RolloutSeen("Progressing", "abcdef123456", 10)
    assert [e.kind for e in rollout_events({}, {"chat": p}, NOW)] == [EventKind.ROLLOUT_STEP]
    assert rollout_events({"chat": p}, {"chat": p}, NOW) == []
    promoting = RolloutSeen("Promoting", "abcdef123456", 10, "checks held for 300 s")
    assert [e.kind for e in rollout_events({"chat": p}, {"chat": promoting}, NOW)] == [EventKind.ROLLOUT_PROMOTED]
    aborted = RolloutSeen("Aborted", "abcdef123456", 10, "request: 3 of 4 failed: HTTP 500")
    [e] = rollout_events({"chat": p}, {"chat": aborted}, NOW)
    assert (e.kind, e.model) == (EventKind.ROLLOUT_ABORTED, "chat") and "HTTP 500" in e.message


def test_a_pass_whose_canary_aborts_says_so_once_and_the_abort_survives_the_seen_file():
    from reconciler.decide.canary import Rollout
    from reconciler.vocabulary import RolloutPhase

    def with_rollout(phase, reason=""):
        r = result()
        r.rollouts = {"chat": Rollout("chat", phase, "spec-b", NOW, 10, "abcdef123456", "0123456789ab", reason=reason)}
        return r

    progressing = seen_after(with_rollout(RolloutPhase.PROGRESSING), None)
    aborted = with_rollout(RolloutPhase.ABORTED, "request: 2 of 2 failed: HTTP 401")
    [e] = pass_events(progressing, aborted, NOW)
    assert (e.kind, e.model) == (EventKind.ROLLOUT_ABORTED, "chat") and "HTTP 401" in e.message
    kept = seen_from_document(json.loads(json.dumps(seen_to_document(seen_after(aborted, progressing)))))
    assert pass_events(kept, aborted, NOW) == []  # said once, across a daemon restart too


def test_a_dry_run_says_nothing():
    r = result([state("llama-0", Phase.READY)], [observed("n1")])
    r.dry_run = True
    assert pass_events(None, r, NOW) == []


def test_seen_round_trips_and_junk_is_forgotten():
    r = result([state("llama-0", Phase.READY)], [observed("n1", state=NodeState.UNREACHABLE)])
    seen = seen_after(r, None)
    assert seen_from_document(json.loads(json.dumps(seen_to_document(seen)))) == seen
    assert seen_from_document({"phases": {"a": "Sleeping"}}) is None


def test_an_event_round_trips_through_its_line():
    e = revision_refused("0123456789abcdef", ["models/x.yaml:3:5: unknown key 'replicass'"], NOW)
    back = from_document(json.loads(json.dumps(to_document(e))))
    assert back == dataclasses.replace(e, time=round(NOW, 3))
    assert back.errors == ("models/x.yaml:3:5: unknown key 'replicass'",)


@pytest.mark.parametrize("text, back", [("90s", 90), ("15m", 900), ("1h", 3600), ("1h30m", 5400), ("2d", 172800),
                                        ("1.5h", 5400)])
def test_since_as_a_duration(text, back):
    assert parse_since(text, NOW) == NOW - back


def test_since_as_a_time():
    # 2027-01-15T08:00:00Z is 1,800,000,000 s after the epoch; a time without a zone is UTC.
    assert parse_since("2027-01-15T08:00:00Z", NOW) == 1_800_000_000.0
    assert parse_since("2027-01-15T09:00:00+01:00", NOW) == 1_800_000_000.0
    assert parse_since("2027-01-15T08:00:00", NOW) == 1_800_000_000.0


@pytest.mark.parametrize("text", ["yesterday", "1 hour", "h1", "", "10x", "1h-2m"])
def test_since_that_does_not_parse_says_what_is_expected(text):
    with pytest.raises(UsageError, match="expected a duration such as 30s"):
        parse_since(text, NOW)


def test_a_torn_and_corrupt_log_shows_what_it_can_and_counts_the_rest():
    good = [json.dumps(to_document(Event(NOW + i, EventKind.REPLICA_READY, "Ready", replica=f"r-{i}"))) for i in range(3)]
    lines = [good[0].encode(), b"\x00\x00garbage", good[1].encode(), b'{"time": "x"}', b"", good[2][:20].encode()]
    events, skipped = read_events("events.jsonl", lines)
    assert [e.replica for e in events] == ["r-0", "r-1"]
    assert (skipped.count, skipped.first_line) == (3, 2)
    assert "skipped 3 unreadable lines (the first at line 2)" in str(skipped)


def test_filters_narrow_by_time_model_node_and_kind():
    es = [Event(NOW - 7200, EventKind.REPLICA_READY, "", model="a", node="n1"),
          Event(NOW - 60, EventKind.NODE_UNREACHABLE, "", node="n2"),
          Event(NOW - 30, EventKind.REPLICA_FAILED, "", model="b", node="n2")]
    assert [e.kind for e in es if EventFilter(since=NOW - 3600)(e)] == [EventKind.NODE_UNREACHABLE, EventKind.REPLICA_FAILED]
    assert [e.model for e in es if EventFilter(model="b")(e)] == ["b"]
    assert len([e for e in es if EventFilter(node="n2", kind=EventKind.NODE_UNREACHABLE)(e)]) == 1


def test_the_log_rotates_and_stays_bounded(tmp_path):
    lines = RotatingLines(tmp_path / "events.jsonl", max_bytes=1000)
    for i in range(100):
        lines.append([json.dumps({"i": i, "pad": "x" * 50})])
    sizes = [p.stat().st_size for p in lines.files()]
    assert len(sizes) == 2 and all(s <= 1000 + 80 for s in sizes)
    kept = [json.loads(l)["i"] for p in lines.files() for l in p.read_text().splitlines()]
    assert kept == sorted(kept) and kept[-1] == 99 and kept[0] > 0


def test_the_history_sample_of_a_pass():
    cat = catalog(fleet(node_spec("n1")), model("llama", profile(), replicas=2), model("qwen", profile(), replicas=1))
    bad = dataclasses.replace(gpus(2)[1], health=GpuHealth.UNHEALTHY)
    q = dataclasses.replace(gpus(3)[2], quarantined=Quarantine("x", NOW + 1, ""))
    r = result([state("llama-0", Phase.READY), state("llama-1", Phase.STARTING)],
               [observed("n1", gpu=(gpus(1)[0], bad, q)), observed("n2", state=NodeState.UNREACHABLE, gpu=gpus(4))],
               autoscale={"qwen": AutoscaleState(2, 2, 7.0)})
    s = sample_of(r, cat, NOW)
    assert (s.models["llama"].ready, s.models["llama"].desired, s.models["llama"].in_flight) == (1, 2, None)
    assert (s.models["qwen"].ready, s.models["qwen"].desired, s.models["qwen"].in_flight) == (0, 2, 7.0)
    assert s.gpus == {"ok": 1, "quarantined": 1, "unhealthy": 1, "lost": 0}
    assert (s.fleet().ready, s.fleet().desired, s.fleet().in_flight) == (1, 4, 7.0)


# ------------------------------------------------------------------ the command


@pytest.fixture
def logged(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "catalog"
    root.mkdir()
    journal = EventJournal.for_catalog(root)
    journal.append([
        Event(NOW - 7200, EventKind.REPLICA_STARTED, "started", model="llama", replica="llama-0", node="n1"),
        Event(NOW - 7100, EventKind.REPLICA_READY, "Ready", model="llama", replica="llama-0", node="n1"),
        Event(NOW - 60, EventKind.NODE_UNREACHABLE, "does not answer: timed out", node="n1"),
    ])
    return root, journal


def test_events_command_text_newest_last_and_filtered(logged, capsys, monkeypatch):
    root, _ = logged
    assert cli_main(["events", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out] == ["replica.started", "replica.ready", "node.unreachable"]
    assert "model=llama replica=llama-0 node=n1" in out[0]
    assert cli_main(["events", str(root), "--kind", "node.unreachable", "--format", "json"]) == 0
    [doc] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (doc["kind"], doc["node"]) == ("node.unreachable", "n1")
    assert cli_main(["events", str(root), "--model", "llama", "--node", "n1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_events_command_bad_input_is_a_usage_error(logged, capsys):
    root, _ = logged
    assert cli_main(["events", str(root), "--since", "yesterday"]) == 2
    assert "--since 'yesterday': expected a duration" in capsys.readouterr().err
    assert cli_main(["events", str(root), "--kind", "replica.exploded"]) == 2
    err = capsys.readouterr().err
    assert "--kind 'replica.exploded' is not an event kind" in err and "replica.ready, replica.failed" in err


def test_events_command_on_a_corrupt_log_shows_the_rest_and_says_what_was_skipped(logged, capsys):
    root, journal = logged
    with open(journal.events.path, "ab") as f:
        f.write(b"\xff\xfe not json\n{\"time\": \"2027-01-15T08:00:00Z\", \"kind\": \"replica.re")  # torn
    assert cli_main(["events", str(root)]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 3
    assert "skipped 2 unreadable lines (the first at line 4)" in captured.err


def test_events_follow_prints_what_is_appended(logged, tmp_path):
    _, journal = logged
    stream = journal.follow(poll_s=0, sleep=lambda s: None)
    journal.append([Event(NOW, EventKind.NODE_BACK, "answers again", node="n1")])
    assert next(stream).kind == EventKind.NODE_BACK
    # Rotated under the follower: the new file is read from its start.
    journal.events.path.rename(journal.events.older)
    journal.append([Event(NOW + 1, EventKind.REPLICA_READY, "Ready", replica="llama-0")])
    assert next(stream).kind == EventKind.REPLICA_READY


def test_the_log_lives_outside_the_catalog(logged):
    root, journal = logged
    assert not str(journal.directory).startswith(str(root))
    assert journal.directory == log_dir(root)
