"""When a daemon pass asks for the next one (reconcile.next_pass_wanted): pure, on a PassResult."""

from __future__ import annotations

from reconciler.record.memory import DRAIN_RECHECK_S, PassMemory
from reconciler.decide.outcomes import PassResult, ReplicaState
from reconciler.decide.plan_values import Drain, Plan, Waiting
from reconciler.model import Assignment
from reconciler.control.reconcile import START_RECHECK_S, next_pass_wanted, wake_nodes
from reconciler.vocabulary import Phase, WaitKind


def result(*, waiting=(), draining=None, phases=(), autoscale_at=None) -> PassResult:
    replicas = {f"m-{i}": ReplicaState(f"m-{i}", "m", "p", phase) for i, phase in enumerate(phases)}
    plan = Plan(actions=(), outcomes={}, unplaced=(), waiting=tuple(waiting), observed={}, backoff={})
    return PassResult(None, None, plan, replicas=replicas,
                      memory=PassMemory(draining=draining or {}), next_pass_at=autoscale_at)


def test_a_quiet_pass_leaves_the_next_one_to_the_resync_interval():
    assert next_pass_wanted(result(phases=[Phase.READY, Phase.FAILED]), ended=100.0) is None


def test_a_start_left_to_judge_asks_for_a_look_soon():
    assert next_pass_wanted(result(phases=[Phase.READY, Phase.STARTING]), ended=100.0) == 100.0 + START_RECHECK_S


def test_a_wait_that_ends_asks_for_a_pass_then_and_one_already_over_asks_for_nothing():
    backoff = Waiting("m-0", "m", "crashed; waiting for backoff", until=104.0, kind=WaitKind.BACKOFF)
    over = Waiting("m-1", "m", "stalled", until=90.0, kind=WaitKind.STALLED)
    assert next_pass_wanted(result(waiting=[backoff, over]), ended=100.0) == 104.0
    assert next_pass_wanted(result(waiting=[over]), ended=100.0) is None  # never a loop of passes


def test_the_earliest_of_a_drain_an_autoscaling_move_and_a_start_wins():
    drain = Drain("m-2", "m", ("a",), 8002, "vllm", started=95.0, until=200.0, running=3.0)
    both = result(draining={"m-2@a": drain}, phases=[Phase.STARTING], autoscale_at=150.0)
    assert next_pass_wanted(both, ended=100.0) == 100.0 + DRAIN_RECHECK_S
    assert next_pass_wanted(result(autoscale_at=101.0, phases=[Phase.STARTING]), ended=100.0) == 101.0


def test_the_nodes_a_wake_is_about_are_those_of_starts_drains_and_waits_that_end():
    r = result(phases=[Phase.STARTING, Phase.READY, Phase.FAILED],
               draining={"m-9@d": Drain("m-9", "m", ("d1", "d2"), 8002, "vllm", started=95.0, until=200.0)},
               waiting=[Waiting("m-2", "m", "crashed; waiting for backoff", until=104.0, kind=WaitKind.BACKOFF),
                        Waiting("m-5", "m", "node g does not answer", until=300.0, kind=WaitKind.NODE_UNREACHABLE, nodes=("g",)),
                        Waiting("m-1", "m", "no time to it", kind=WaitKind.STALLED)])
    r.replicas = {rid: replace_nodes(st, (f"n{rid[-1]}a", f"n{rid[-1]}b")) for rid, st in r.replicas.items()}
    # m-0 Starting (n0a, n0b); m-2's backoff (n2a, n2b); m-5's grace (g); the drain (d1, d2). Not m-1 (Ready,
    # and its wait has no end) nor anything else.
    assert wake_nodes(r) == {"n0a", "n0b", "n2a", "n2b", "g", "d1", "d2"}
    assert wake_nodes(result(phases=[Phase.READY])) == frozenset()


def replace_nodes(st: ReplicaState, nodes: tuple[str, ...]) -> ReplicaState:
    from dataclasses import replace

    return replace(st, nodes=tuple(Assignment(node=n, rank=i) for i, n in enumerate(nodes)))
