"""The canary rollout's state machine (SPEC section 13), pure: each row is a pass and what it must leave."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.decide.canary import (
    CanaryCopy, Measurement, advance, begin, canary_ids, canary_weights, check_names, checks_due, next_wake,
    out_of_sync, phase_for_plan, spec_key,
)
from reconciler.model import Model, Profile, RequestCheck, RolloutPolicy
from reconciler.vocabulary import Phase, RolloutPhase

P = Profile(name="cpu", engine="llama.cpp", args=("-c", "512"))
POLICY = RolloutPolicy(canary_replicas=1, weight=20, analysis_s=30, interval_s=10, failure_limit=1,
                       request=RequestCheck(contains="ready", max_latency_ratio=2.0))
MODEL = Model("chat", "/m/chat.gguf", replicas=3, profiles=(P,), rollout=POLICY)
NEW = replace(MODEL, profiles=(replace(P, args=("-c", "1024")),))

READY = [CanaryCopy("chat-0", Phase.READY)]
STARTING = [CanaryCopy("chat-0", Phase.STARTING)]
OK = [Measurement("request", True, "request: 2 of 2 answered as expected"),
      Measurement("latency", True, "latency: p95 0.2 s = 1.0x stable 0.2 s")]
BAD = [Measurement("request", False, "request: 2 of 2 failed: HTTP 500"),
       Measurement("latency", True, "latency: p95 0.2 s = 1.0x stable 0.2 s")]


def test_a_spec_change_with_old_copies_running_begins_progressing():
    r = advance(NEW, None, old_copies=3, canaries=STARTING, now=100, revision="b", from_revision="a")
    assert (r.state, r.target, r.since, r.weight, r.revision, r.from_revision) == (
        RolloutPhase.PROGRESSING, spec_key(NEW), 100, 20, "b", "a")
    assert [t.name for t in r.checks] == ["request", "latency"] and "chat-0 not Ready" in r.reason


def test_a_first_start_has_nothing_to_roll_out():
    assert advance(NEW, None, old_copies=0, canaries=READY, now=100) is None


def test_a_model_without_rollout_has_no_rollout_state():
    plain = replace(NEW, rollout=None)
    assert advance(plain, None, old_copies=3, canaries=READY, now=1) is None
    assert phase_for_plan(plain, None) is None


def test_a_change_not_begun_yet_is_planned_as_progressing():
    assert phase_for_plan(NEW, None) == RolloutPhase.PROGRESSING
    aborted_old = replace(begin(MODEL, 0, "a", None), state=RolloutPhase.ABORTED)
    assert phase_for_plan(NEW, aborted_old) == RolloutPhase.PROGRESSING  # another spec's abort does not hold this one


CASES = {
    # name: (passes as (now, canaries, measurements), state after the last, reason contains)
    "canary_starting_stays_progressing_without_measuring": (
        [(100, STARTING, [])], RolloutPhase.PROGRESSING, "not Ready yet"),
    "one_failed_measurement_within_the_limit_keeps_progressing": (
        [(100, STARTING, []), (110, READY, BAD)], RolloutPhase.PROGRESSING, "checks must hold"),
    "a_check_past_its_failure_limit_aborts_with_its_figures": (
        [(100, STARTING, []), (110, READY, BAD), (120, READY, BAD)], RolloutPhase.ABORTED,
        "request: 2 of 2 failed: HTTP 500 (2 failed measurements, failure_limit 1)"),
    "a_canary_that_fails_to_start_aborts": (
        [(100, [CanaryCopy("chat-0", Phase.FAILED, "not Ready within start_timeout_s 60 s")], [])],
        RolloutPhase.ABORTED, "canary chat-0 failed: not Ready within start_timeout_s 60 s"),
    "a_canary_that_crashes_after_ready_aborts": (
        [(100, READY, OK), (110, [CanaryCopy("chat-0", Phase.FAILED, "rank 0 is dead")], [])],
        RolloutPhase.ABORTED, "canary chat-0 failed: rank 0 is dead"),
    "checks_held_for_analysis_s_promote": (
        [(100, READY, OK), (110, READY, OK), (120, READY, OK), (130, READY, OK)], RolloutPhase.PROMOTING,
        "analysis_s 30 s"),
    "analysis_counts_from_every_canary_ready_not_from_the_change": (
        [(100, STARTING, []), (125, READY, OK), (140, READY, OK)], RolloutPhase.PROGRESSING, "15 s more"),
    "promotion_needs_each_check_measured_once": (
        [(100, READY, []), (200, READY, [])], RolloutPhase.PROGRESSING, "checks must hold 0 s more"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rollout_passes(name):
    passes, state, phrase = CASES[name]
    r = None
    for now, canaries, measured in passes:
        r = advance(NEW, r, old_copies=2, canaries=canaries, measurements=measured, now=now)
    assert r.state == state and phrase in r.reason, (r.state, r.reason)


def test_an_aborted_spec_stays_aborted_whatever_the_canary_does_next():
    r = advance(NEW, None, old_copies=2, canaries=[CanaryCopy("chat-0", Phase.FAILED, "HTTP 500")], now=1)
    again = advance(NEW, r, old_copies=2, canaries=READY, measurements=OK, now=1000)
    assert again == r and phase_for_plan(NEW, again) == RolloutPhase.ABORTED


def test_a_new_spec_after_an_abort_begins_again_from_what_the_old_copies_run():
    r = advance(NEW, None, old_copies=2, canaries=[CanaryCopy("chat-0", Phase.FAILED)], now=1, revision="b",
                from_revision="a")
    newer = replace(NEW, profiles=(replace(P, args=("-c", "2048")),))
    again = advance(newer, r, old_copies=3, canaries=STARTING, now=50, revision="c", from_revision="a")
    assert again.state == RolloutPhase.PROGRESSING and again.target == spec_key(newer) and again.from_revision == "a"
    unknown = advance(newer, r, old_copies=3, canaries=STARTING, now=50, revision="c")
    assert unknown.from_revision is None  # never the aborted revision: it runs nowhere


def test_after_a_completed_rollout_the_next_one_rolls_away_from_its_revision():
    done = replace(begin(NEW, 0, "b", "a"), state=RolloutPhase.COMPLETE)
    newer = replace(NEW, profiles=(replace(P, args=("-c", "2048")),))
    assert advance(newer, done, old_copies=3, canaries=STARTING, now=9, revision="c").from_revision == "b"


def test_promoting_completes_once_no_old_copy_runs():
    r = replace(begin(NEW, 0, "b", "a"), state=RolloutPhase.PROMOTING)
    assert advance(NEW, r, old_copies=1, canaries=READY, now=5).state == RolloutPhase.PROMOTING
    done = advance(NEW, r, old_copies=0, canaries=READY, now=6)
    assert done.state == RolloutPhase.COMPLETE and done.since == 6
    assert advance(NEW, done, old_copies=0, canaries=READY, now=7) == done


def test_checks_measure_once_per_interval_and_only_with_every_canary_ready():
    assert not checks_due(NEW, None, STARTING, now=100)
    assert checks_due(NEW, None, READY, now=100)
    r = advance(NEW, None, old_copies=2, canaries=READY, measurements=OK, now=100)
    assert r.next_check_at == 110 and not checks_due(NEW, r, READY, now=105) and checks_due(NEW, r, READY, now=110)
    assert next_wake(NEW, r) == 110
    aborted = replace(r, state=RolloutPhase.ABORTED)
    assert not checks_due(NEW, aborted, READY, now=200) and next_wake(NEW, aborted) is None


def test_tallies_count_each_check_and_keep_the_last_figures():
    r = advance(NEW, None, old_copies=2, canaries=READY, measurements=OK, now=100)
    r = advance(NEW, r, old_copies=2, canaries=READY, measurements=BAD, now=110)
    req = r.tally("request")
    assert (req.passed, req.failed, req.last) == (1, 1, "request: 2 of 2 failed: HTTP 500")
    assert r.tally("latency").passed == 2


@pytest.mark.parametrize("weight,canaries,stable,share", [(10, 1, 2, 10), (20, 1, 2, 20), (50, 2, 1, 50), (1, 1, 9, 1),
                                                          (99, 3, 1, 99)])
def test_litellm_weights_give_the_canary_copies_their_share_together(weight, canaries, stable, share):
    c, s = canary_weights(weight, canaries, stable)
    assert 100 * c * canaries / (c * canaries + s * stable) == pytest.approx(share)


def test_canaries_are_the_lowest_ordinals_and_checks_are_named_as_status_lists_them():
    assert canary_ids(replace(NEW, rollout=replace(POLICY, canary_replicas=2))) == ["chat-0", "chat-1"]
    assert check_names(NEW) == ("request", "latency")


def test_an_aborted_spec_puts_the_model_out_of_sync_by_name():
    r = advance(NEW, None, old_copies=2, canaries=[CanaryCopy("chat-0", Phase.FAILED, "HTTP 500")], now=1, revision="b")
    [said] = out_of_sync([NEW], {"chat": r})
    assert said.startswith("chat: rollout of revision b aborted: canary chat-0 failed: HTTP 500")
    assert out_of_sync([NEW], {}) == []



def test_a_rollout_without_checks_wakes_an_interval_on_and_promotes_after_analysis():
    bare = replace(NEW, rollout=replace(POLICY, request=None))
    r = advance(bare, None, old_copies=2, canaries=READY, now=100)
    assert r.checks == () and r.next_check_at == 110 and next_wake(bare, r) == 110
    assert advance(bare, r, old_copies=2, canaries=READY, now=131).state == RolloutPhase.PROMOTING
