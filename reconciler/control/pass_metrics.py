"""What the daemon takes from a pass result: metrics, and a log line when a node goes or comes back."""

from __future__ import annotations

from typing import Iterable

from reconciler.control.log import EventLog
from reconciler.record.metrics import FleetFigures, Metrics, count_by
from reconciler.model import OBSERVED_STATES, PHASES, Catalog, ObservedNode
from reconciler.decide.outcomes import PassResult
from reconciler.vocabulary import GpuHealth, NodeState, Phase, RolloutPhase


def observe_pass(metrics: Metrics, result: PassResult, catalog: Catalog) -> None:
    """Metrics from a pass result."""
    for decision in result.decisions:
        metrics.action(decision.action, decision.ok)
    metrics.fleet(fleet_figures(result, catalog))


def fleet_figures(result: PassResult, catalog: Catalog) -> FleetFigures:
    """The fleet's gauges after a pass: replicas by phase and per model, nodes by state, autoscaling."""
    states = list(result.replicas.values())
    nodes = result.inventory.nodes if result.inventory is not None else ()
    return FleetFigures(
        phases=count_by((s.phase for s in states), PHASES),
        desired=_desired_counts(result, catalog),
        ready={m.name: sum(1 for s in states if s.model == m.name and s.phase == Phase.READY) for m in catalog.models},
        unplaced=_unplaced_counts(result, catalog),
        restarts=_restart_counts(result, catalog),
        node_states=count_by((n.state for n in nodes), OBSERVED_STATES) if nodes else {},
        node_up={n.id: n.state != NodeState.UNREACHABLE for n in nodes},
        probe_seconds=result.probe_seconds,
        autoscale_current={name: st.current for name, st in result.autoscale.items()},
        autoscale_wanted={name: st.wanted for name, st in result.autoscale.items()},
        **alert_figures(result, catalog),
    )


def alert_figures(result: PassResult, catalog: Catalog) -> dict:
    """What the shipped alert rules need of a pass: failures in a row per replica, broken and
    quarantined GPUs, when each silent node went silent, the grace period."""
    memory = result.memory
    nodes = result.inventory.nodes if result.inventory is not None else ()
    model_of = {rid: m.name for m in catalog.models for rid in m.replica_ids()}
    streaks = {}
    if memory is not None:
        for rid, b in memory.backoff.items():
            n = max(b.streak, b.failed_starts)
            if n and rid in model_of:
                streaks[(model_of[rid], rid)] = n
    return {
        "crash_streaks": streaks,
        "bad_gpus": {(n.id, g.index): str(g.health) for n in nodes if n.state != NodeState.UNREACHABLE
                     for g in n.gpus if g.health != GpuHealth.OK},
        "quarantined_gpus": frozenset(memory.quarantines) if memory is not None else frozenset(),
        "unreachable_since": dict(memory.unreachable_since) if memory is not None else {},
        "unreachable_grace_s": catalog.fleet.unreachable_grace_s,
        # SPEC 13: Aborted until a changed spec begins a new rollout (the alert says to fix and commit).
        "rollout_aborted": {m.name: 1 for m in catalog.models
                            if (r := result.rollouts.get(m.name)) is not None and r.state == RolloutPhase.ABORTED},
    }


def _desired_counts(result: PassResult, catalog: Catalog) -> dict[str, int]:
    # An autoscaled model's desired count is the one in force (status/), not the catalog's min.
    return {m.name: (result.autoscale[m.name].current if m.name in result.autoscale else m.replicas)
            for m in catalog.models}


def _unplaced_counts(result: PassResult, catalog: Catalog) -> dict[str, int]:
    unplaced = [o.model for o in result.plan.unplaced] if result.plan is not None else []
    return {m.name: unplaced.count(m.name) for m in catalog.models}


def _restart_counts(result: PassResult, catalog: Catalog) -> dict[str, int]:
    restarts = result.plan.restarts if result.plan is not None else {}
    return {m.name: sum(restarts.get(rid, 0) for rid in m.replica_ids()) for m in catalog.models}


def node_events(log: EventLog, nodes: Iterable[ObservedNode], was_unreachable: set[str]) -> set[str]:
    """One log line when a node stops answering and one when it answers again, not one per pass.
    Returns the nodes unreachable now (the next call's `was_unreachable`)."""
    nodes = tuple(nodes)
    down = {n.id: n.reason for n in nodes if n.state == NodeState.UNREACHABLE}
    seen = {n.id for n in nodes}  # a node gone from the fleet is not one that answers again
    for node, reason in sorted(down.items()):
        if node not in was_unreachable:
            log("node.unreachable", node=node, reason=reason)
    for node in sorted(was_unreachable):
        if node not in down and node in seen:
            log("node.reachable", node=node, msg="answers again")
    return set(down)
