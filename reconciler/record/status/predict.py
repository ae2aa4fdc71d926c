"""What a plan predicts a pass will leave: each replica's phase, failure kind, message and revision
(`plan --write-status`, and the replicas an applied pass has not settled yet). Pure."""

from __future__ import annotations

from typing import Mapping

from reconciler.model import Catalog, Inventory, Placement
from reconciler.decide.outcomes import PassResult, ReplicaState
from reconciler.decide.placement import summarize
from reconciler.decide.plan_values import Plan
from reconciler.vocabulary import ActionKind, FailureKind, Phase, WaitKind


def where_it_runs(plan: Plan, rid: str) -> Placement | None:
    """Where the plan puts a replica, else where it was found running."""
    out = plan.outcomes.get(rid)
    return out.placement if out is not None and out.placement is not None else plan.observed.get(rid)


_HELD_FOR_FAILURE = {WaitKind.BACKOFF: FailureKind.TEMPORARY, WaitKind.START_BACKOFF: FailureKind.TEMPORARY,
                     WaitKind.STALLED: FailureKind.PERMANENT}


def predicted_phases(plan: Plan) -> dict[str, Phase]:
    """The phase each desired replica will be in once the plan is applied, as far as a plan can tell.

    Kept replicas are assumed Ready (a plan has no health checks); anything about
    to be started is Pending; a crashed replica waiting out its backoff is Failed;
    one on a node that stopped answering is Unknown.
    """
    phases: dict[str, Phase] = {}
    for rid, out in plan.outcomes.items():
        phases[rid] = Phase.READY if out.kept else Phase.PENDING
    for w in plan.waiting:
        if w.kind in _HELD_FOR_FAILURE:
            phases[w.replica] = Phase.FAILED
        elif w.kind is WaitKind.NODE_UNREACHABLE:
            phases[w.replica] = Phase.UNKNOWN
        elif w.kind is WaitKind.DRAINING:
            # Out of endpoints.yaml and every gateway file, stopped once its requests end (SPEC section 10).
            phases[w.replica] = Phase.DRAINING
    for a in plan.actions:
        if a.action in (ActionKind.RESTART, ActionKind.REPLACE) and a.replica in phases:
            phases[a.replica] = Phase.PENDING if a.placement is not None else phases[a.replica]
    return phases


def predicted_failures(plan: Plan) -> dict[str, FailureKind]:
    """The failure kind of each replica the plan holds because it failed: a crash waiting out its
    restart backoff, a failed start backing off (temporary), or stalled (permanent)."""
    return {w.replica: _HELD_FOR_FAILURE[w.kind] for w in plan.waiting if w.kind in _HELD_FOR_FAILURE}


def unplaced_message(out, show_all: bool = False) -> str:
    """The one-line status message of a replica that could not be placed; the same whether
    predicted (plan --write-status) or observed (apply, the daemon), so status does not flip."""
    if out.rejections_same_as:
        return f"cannot be placed; same rejections as {out.rejections_same_as}"
    return "cannot be placed: " + " | ".join(summarize(out.rejections, out.nodes_considered, show_all))


def _plan_reasons(plan: Plan) -> dict[str, str]:
    """replica id -> what the plan does with it or waits for: the message when nothing else says more."""
    reasons: dict[str, str] = {}
    for a in plan.actions:
        reasons[a.replica] = f"{a.action}: {a.reason}"
    for w in plan.waiting:
        reasons[w.replica] = w.reason
    return reasons


def predicted_pass(catalog: Catalog, plan: Plan, observed: Mapping[str, str | None] | None = None) -> PassResult:
    """The pass a plan predicts, as the PassResult an applied one would be: what `plan --write-status`
    writes, and what a pass reports for the replicas it has not settled yet. Each desired replica's
    phase as far as a plan can tell, its message the plan's reason, its revision the plan's for what it
    starts and the record's (`observed`) for what it keeps."""
    phases = predicted_phases(plan)
    failures = predicted_failures(plan)
    revisions = predicted_revisions(plan, observed)
    reasons = _plan_reasons(plan)
    replicas: dict[str, ReplicaState] = {}
    for model in catalog.models:
        for rid in model.replica_ids():
            out = plan.outcomes.get(rid)
            placement = where_it_runs(plan, rid)
            phase = phases.get(rid, Phase.UNKNOWN)
            unplaced = out is not None and out.placement is None
            replicas[rid] = ReplicaState(
                rid, model.name, placement.profile if placement is not None else None, phase,
                unplaced_message(out) if unplaced else reasons.get(rid, ""),
                placement.nodes if placement is not None else (),
                catalog.fleet.endpoint(placement.head.node, placement.head.port) if placement and placement.nodes else None,
                revision=revisions.get(rid),
                failure=failures.get(rid) if phase == Phase.FAILED else None,
            )
    for w in plan.waiting:  # no longer desired (a scale down, a removed model), draining before it stops
        where = plan.observed.get(w.replica)
        if w.kind is WaitKind.DRAINING and w.replica not in replicas and where is not None and where.nodes:
            replicas[w.replica] = ReplicaState(w.replica, w.model, where.profile, Phase.DRAINING, w.reason, where.nodes,
                                               catalog.fleet.endpoint(where.head.node, where.head.port))
    return PassResult(catalog.revision, None, plan, replicas=replicas, dry_run=True)


def predicted_revisions(plan: Plan, observed: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """The revision each replica will run once the plan is applied: the plan's for what it starts,
    what the records say (`observed`) for what it keeps."""
    revisions = dict(observed or {})
    for a in plan.actions:
        if a.action in (ActionKind.START, ActionKind.REPLACE, ActionKind.RESTART) and a.placement is not None:
            revisions[a.replica] = plan.revision
    return revisions


def observed_revisions(inventory: Inventory) -> dict[str, str | None]:
    """Per replica, the revision its head rank's record names."""
    return {r.id: r.revision for n in inventory.nodes for r in n.replicas if r.rank == 0}
