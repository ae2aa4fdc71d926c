"""The phase judgements of a replica, pure (reconciler/act/readiness.py): each rule by its name.

The fleet tests see these through real processes; a rule here that no fast test held could be dropped
with the whole fast tier green (a rank found dead while starting judged Ready, a head that answers
while another rank's node is away judged Ready: the seed's own failure, a replica that looks Ready
while a rank is gone).
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.model import Assignment, Placement, RankLaunch, RunningRank
from reconciler.decide.outcomes import ReplicaState
from reconciler.act.readiness import Liveness, StartedReplica, judge_records, judge_started, judge_unanswered
from reconciler.vocabulary import FailureKind, NodeState, Phase
from tests.builders import observed, profile

TIMEOUT = 60.0
PROFILE = profile("p", start_timeout_s=TIMEOUT)


def launch(node: str, number: int, nnodes: int = 2) -> RankLaunch:
    return RankLaunch(replica="m-0", model="m", profile="p", node=node, rank=number, nnodes=nnodes,
                      argv=("engine",), env={}, port=8000, gpus=(0,), spec_hash="h",
                      health_path="/health" if number == 0 else None, start_timeout_s=TIMEOUT)


def started(nnodes: int = 2, at: float = 100.0) -> StartedReplica:
    nodes = ("head", "work")[:nnodes]
    placement = Placement("m-0", "m", "p", None, "none/H100-80GB",
                          tuple(Assignment(n, i, (0,), (), 8000) for i, n in enumerate(nodes)))
    return StartedReplica([launch(n, i, nnodes) for i, n in enumerate(nodes)], "m", PROFILE, placement, at)


def state(node: str, number: int, *, alive: bool = True, waiting: str = "", log=("loading",)) -> RunningRank:
    return RunningRank("m-0", "m", "p", number, (0,), 8000, "h", nnodes=2, alive=alive, waiting=waiting,
                       node=node, log_tail=tuple(log))


BOTH_ALIVE = {("head", 0): state("head", 0), ("work", 1): state("work", 1)}
BASE = ReplicaState("m-0", "m", "p", Phase.STARTING)


def judge(liveness: Liveness, *, answered: bool, now: float = 110.0, final: bool = False, seen: str = "no answer"):
    return judge_started(BASE, started(), answered=answered, seen=seen, liveness=liveness, now=now, final=final)


# ---------------------------------------------------------------- judge_started

def test_a_head_that_answers_with_every_rank_alive_is_ready():
    assert judge(Liveness(BOTH_ALIVE), answered=True).phase == Phase.READY


def test_a_rank_found_dead_while_starting_fails_the_replica_even_when_the_head_answers():
    dead = {**BOTH_ALIVE, ("work", 1): state("work", 1, alive=False, log=("CUDA error",))}
    for answered in (True, False):
        judged = judge(Liveness(dead), answered=answered)
        assert judged is not None and judged.phase == Phase.FAILED, answered
        assert judged.failure == FailureKind.TEMPORARY
        assert "rank 1 on work exited; last log lines: CUDA error" in judged.message


def test_a_rank_with_no_state_on_a_node_that_answered_is_dead():
    judged = judge(Liveness({("head", 0): state("head", 0)}), answered=True)
    assert judged.phase == Phase.FAILED and "rank 1 on work exited" in judged.message


def test_a_head_that_answers_while_another_ranks_node_is_unreachable_is_not_ready():
    away = Liveness({("head", 0): state("head", 0)}, unreachable=("work",))
    assert judge(away, answered=True) is None  # keep waiting: the rank there may be gone
    last = judge(away, answered=True, final=True)
    assert last.phase == Phase.STARTING


def test_a_rank_on_an_unreachable_node_is_not_taken_for_dead():
    away = Liveness({("head", 0): state("head", 0)}, unreachable=("work",))
    assert away.dead(started().launches) == []


def test_queued_ranks_are_pending_and_their_start_timeout_has_not_begun():
    queued = {("head", 0): state("head", 0, waiting="Resources"), ("work", 1): state("work", 1, waiting="Resources")}
    assert judge(Liveness(queued), answered=False, now=100.0 + 10 * TIMEOUT) is None
    last = judge(Liveness(queued), answered=False, now=100.0 + 10 * TIMEOUT, final=True)
    assert last.phase == Phase.PENDING and last.message == "queued: Resources"


def test_not_ready_by_the_start_timeout_fails_and_asks_for_the_processes_to_end():
    late = judge(Liveness(BOTH_ALIVE), answered=False, now=100.0 + TIMEOUT, seen="connection refused")
    assert late.phase == Phase.FAILED and late.start_timed_out and late.failure == FailureKind.TEMPORARY
    assert late.message.startswith("rank 0 on head not Ready after 60s: connection refused")
    assert judge(Liveness(BOTH_ALIVE), answered=False, now=100.0 + TIMEOUT - 1) is None


def test_the_last_look_of_a_wait_leaves_a_replica_starting_with_what_was_seen():
    last = judge(Liveness(BOTH_ALIVE), answered=False, final=True, seen="HTTP 503")
    assert (last.phase, last.message) == (Phase.STARTING, "waiting for HTTP 503")


# ---------------------------------------------------------------- judge_records (a replica of an earlier pass)

def ranks_on(*pairs):
    return [(observed(node, state=node_state, reason="timed out" if node_state != "ready" else ""), rank)
            for node, node_state, rank in pairs]


def test_a_running_replica_with_a_node_away_is_unknown_not_failed():
    judged = judge_records(BASE, ranks_on(("head", "ready", state("head", 0)),
                                          ("work", NodeState.UNREACHABLE, state("work", 1, alive=False))))
    assert judged.phase == Phase.UNKNOWN and "node work unreachable: timed out" in judged.message


def test_a_running_replica_with_a_dead_rank_is_failed():
    judged = judge_records(BASE, ranks_on(("head", "ready", state("head", 0)), ("work", "ready", state("work", 1, alive=False))))
    assert judged.phase == Phase.FAILED and judged.failure == FailureKind.TEMPORARY
    assert judged.message == "rank 1 on work is not running"


def test_a_running_replica_missing_a_rank_is_failed():
    judged = judge_records(BASE, ranks_on(("head", "ready", state("head", 0))))
    assert (judged.phase, judged.message) == (Phase.FAILED, "1 of 2 ranks are missing")


def test_a_running_replica_whose_records_are_whole_is_left_to_its_health():
    assert judge_records(BASE, ranks_on(("head", "ready", state("head", 0)), ("work", "ready", state("work", 1)))) is None


# ---------------------------------------------------------------- judge_unanswered

def test_an_unanswered_head_within_its_start_timeout_is_starting_and_past_it_failed():
    head = replace(state("head", 0), started_at=1000.0)
    within = judge_unanswered(BASE, seen="refused", head_state=head, timeout_s=TIMEOUT, wall_now=1000.0 + TIMEOUT - 1)
    assert within.phase == Phase.STARTING
    past = judge_unanswered(BASE, seen="refused", head_state=head, timeout_s=TIMEOUT, wall_now=1000.0 + TIMEOUT)
    assert past.phase == Phase.FAILED and past.start_timed_out and "last log lines: loading" in past.message
