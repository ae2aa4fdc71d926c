"""What the plan does with a spec change of a model with `rollout:` (SPEC section 13), offline: plan only.
Progressing replaces only the canary replicas; Promoting the rest, as section 7 says; Aborted stops the
canary copies (drained) and keeps the old ones serving, starting nothing of the aborted spec."""

from __future__ import annotations

from dataclasses import replace

from reconciler.decide.canary import begin
from reconciler.model import RolloutPolicy, spec_hash
from reconciler.decide.plan import plan
from reconciler.vocabulary import RolloutPhase, WaitKind
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

P = profile("p", gpus_per_node=8)
M = replace(model("m", P, replicas=3), rollout=RolloutPolicy(canary_replicas=1, weight=10))
NEW = spec_hash(M, P)
F = fleet(*(node_spec(n) for n in "abcd"))


def running(*hashes: str, spare: bool = True):
    nodes = [observed(n, gpu=gpus(8), replicas=[rank(f"m-{i}", "m", "p", gpus=range(8), spec_hash=h)])
             for i, (n, h) in enumerate(zip("abc", hashes))]
    return inventory(*nodes, *([observed("d", gpu=gpus(8))] if spare else []))


def kinds(p):
    return [(a.action, a.replica) for a in p.actions]


def waits(p):
    return {w.replica: w.kind for w in p.waiting}


def test_a_new_spec_replaces_only_the_canary_replica_and_the_others_keep_the_old_spec():
    p = plan(catalog(F, M), running("old", "old", "old"))
    assert kinds(p) == [("replace", "m-0")] and not p.actions[0].stop_first  # surge into the spare node
    assert waits(p) == {"m-1": WaitKind.CANARY, "m-2": WaitKind.CANARY}
    assert "runs the old spec while the canary (m-0) is checked" in p.waiting[0].reason


def test_without_room_the_canary_replaces_one_copy_in_place():
    p = plan(catalog(F, M), running("old", "old", "old", spare=False))
    assert kinds(p) == [("replace", "m-0")] and p.actions[0].stop_first


def test_progressing_with_the_canary_serving_changes_nothing_else():
    r = begin(M, 0, "b", "a")
    p = plan(catalog(F, M), running(NEW, "old", "old"), rollouts={"m": r})
    assert kinds(p) == [] and waits(p) == {"m-1": WaitKind.CANARY, "m-2": WaitKind.CANARY}


def test_promoting_replaces_the_rest_as_section_7_says_one_at_a_time():
    r = replace(begin(M, 0, "b", "a"), state=RolloutPhase.PROMOTING)
    p = plan(catalog(F, M), running(NEW, "old", "old"), rollouts={"m": r})
    assert kinds(p) == [("replace", "m-1")] and waits(p) == {"m-2": WaitKind.ONE_AT_A_TIME}


def test_aborted_stops_the_canary_drained_and_keeps_the_old_copies_serving():
    r = replace(begin(M, 0, "b", "a"), state=RolloutPhase.ABORTED, reason="request: 2 of 2 failed: HTTP 500")
    p = plan(catalog(F, M), running(NEW, "old", "old"), rollouts={"m": r})
    assert kinds(p) == [("stop", "m-0")] and p.actions[0].drain
    assert "canary aborted" in p.actions[0].reason and "HTTP 500" in p.actions[0].reason
    assert waits(p) == {"m-1": WaitKind.ROLLOUT_ABORTED, "m-2": WaitKind.ROLLOUT_ABORTED}


def test_an_aborted_spec_starts_nothing_until_the_spec_changes():
    r = replace(begin(M, 0, "b", "a"), state=RolloutPhase.ABORTED, reason="canary m-0 failed")
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8), replicas=[
        rank("m-1", "m", "p", gpus=range(8), spec_hash="old")]), observed("c", gpu=gpus(8)))
    p = plan(catalog(F, M), inv, rollouts={"m": r})
    assert kinds(p) == [] and waits(p)["m-0"] == WaitKind.ROLLOUT_ABORTED and p.unplaced == ()
    newer = replace(M, profiles=(replace(P, args=("--x",)),))
    again = plan(catalog(F, newer), inv, rollouts={"m": r})
    assert ("start", "m-0") in kinds(again)  # another spec: the abort holds it no more


def test_a_model_without_rollout_updates_as_before():
    plain = replace(M, rollout=None)
    p = plan(catalog(F, plain), running("old", "old", "old"))
    assert kinds(p) == [("replace", "m-0")] and waits(p) == {"m-1": WaitKind.ONE_AT_A_TIME, "m-2": WaitKind.ONE_AT_A_TIME}


def test_autoscaling_keeps_working_during_a_rollout():
    # The load asked for a fourth replica while the canary is checked: it starts (on the catalog's
    # spec, the only one there is), and the canary still replaces only m-0.
    f5 = fleet(*(node_spec(n) for n in "abcde"))
    scaled_up = replace(M, replicas=4)
    p = plan(catalog(f5, scaled_up), inventory(*running("old", "old", "old").nodes, observed("e", gpu=gpus(8))))
    assert sorted(kinds(p)) == [("replace", "m-0"), ("start", "m-3")]
    assert waits(p) == {"m-1": WaitKind.CANARY, "m-2": WaitKind.CANARY}
    # And scaling down takes the highest ordinal, never the canary.
    r = begin(M, 0, "b", "a")
    down = plan(catalog(F, replace(M, replicas=2)), running(NEW, "old", "old"), rollouts={"m": r})
    assert kinds(down) == [("stop", "m-2")]
