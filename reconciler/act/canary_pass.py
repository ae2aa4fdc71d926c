"""The pass's canary step (SPEC section 13): each canary rollout after the pass's actions.

The decisions are canary.py's (pure: checks_due, advance, next_wake); this module is their edge:
which copies are the canary and which run the old spec (the records the pass left, and the
decisions of its starts that failed), the checks measured through canary_checks.measure when
due (requests to the engines, queries to Prometheus), each state change logged once, and the
canary copies marked in the replicas' states (serving as the canary, or draining once aborted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from reconciler.decide.canary import CanaryCopy, Measurement, Rollout, advance, canary_ids, checks_due, next_wake
from reconciler.act.canary_checks import Target, measure as measure_checks
from reconciler.model import Catalog, Inventory, Model, spec_hash
from reconciler.decide.outcomes import Decision, ReplicaState
from reconciler.observe.snapshot import RankRecords, ranks_by_replica
from reconciler.vocabulary import DecisionAction, Phase, RolloutPhase

MeasureFn = Callable[[Model, Sequence[Target], Sequence[Target]], "list[Measurement]"]
LogFn = Callable[[Decision], None]


@dataclass(frozen=True)
class ModelCopies:
    """A model's copies as the pass left them, as its rollout reads them.

    targets    the spec hashes of the catalog's spec (any profile's)
    on_target  replica id -> whether its current copy runs one of them
    old        running copies (their heads) on another spec
    canaries   the canary replicas (canary.canary_ids), each as a CanaryCopy
    """

    targets: frozenset[str]
    on_target: Mapping[str, bool]
    old: int
    canaries: tuple[CanaryCopy, ...]


def rollouts_after(catalog: Catalog, before: Mapping[str, Rollout], inventory: Inventory,
                   replicas: dict[str, ReplicaState], decisions: Sequence[Decision], now: float, *,
                   log: LogFn = lambda d: None, measure: MeasureFn | None = None
                   ) -> tuple[dict[str, ReplicaState], dict[str, Rollout]]:
    """Each canary rollout after the pass (SPEC section 13), and the replicas with their canary copies
    marked. The checks measure (an effect: requests to the engines, queries to Prometheus) only where
    canary.checks_due says so; canary.advance decides the rest."""
    measure = measure or measure_checks
    records = ranks_by_replica(inventory)
    failed_now = failed_starts(decisions)
    out = {name: r for name, r in before.items() if catalog.model(name) is not None}
    replicas = dict(replicas)
    for model in catalog.models:
        r, marked = (None, {}) if model.rollout is None else _model_step(
            catalog, model, before.get(model.name), records, replicas, failed_now, now, log, measure)
        if r is None:
            out.pop(model.name, None)
            continue
        out[model.name] = r
        replicas.update(marked)
    return replicas, dict(sorted(out.items()))


def failed_starts(decisions: Sequence[Decision]) -> dict[str, str]:
    """A start or replace of this pass that failed (a refused launch, a new copy never Ready), replica id
    -> why: the copy may be gone already, so the decision says it, not the records."""
    return {d.replica: d.reason for d in decisions if not d.ok and d.action in ("fail", "health")}


def _model_step(catalog: Catalog, model: Model, was: Rollout | None, records: Mapping[str, RankRecords],
                replicas: Mapping[str, ReplicaState], failed_now: Mapping[str, str], now: float, log: LogFn,
                measure: MeasureFn) -> tuple[Rollout | None, dict[str, ReplicaState]]:
    """One model's rollout after the pass, and its canary replicas' states marked (None: no rollout)."""
    copies = model_copies(model, records, replicas, failed_now)
    measured = _measure_when_due(catalog, model, was, copies, replicas, now, log, measure)
    r = advance(model, was, old_copies=copies.old, canaries=copies.canaries, measurements=measured, now=now,
                revision=catalog.revision, from_revision=_from_revision(records, model, copies.targets))
    if r is None:
        return None, {}
    if r != was and (was is None or r.state != was.state):
        log(Decision(model.name, "-", DecisionAction.ROLLOUT, f"{r.state}: {r.reason}", ok=r.state != RolloutPhase.ABORTED))
    return r, marked_canaries(model, r, replicas, copies.on_target)


def model_copies(model: Model, records: Mapping[str, RankRecords], replicas: Mapping[str, ReplicaState],
                 failed_now: Mapping[str, str]) -> ModelCopies:
    """Which of the model's copies run its spec, how many run another, and its canary replicas (pure)."""
    targets = frozenset(spec_hash(model, p) for p in model.profiles)
    on_target = {rid: _runs(records.get(rid, ()), st, targets) for rid, st in replicas.items() if st.model == model.name}
    old = sum(1 for rs in records.values()
              if any(r.rank == 0 and r.model == model.name and r.spec_hash not in targets for _, r in rs))
    canaries = tuple(_canary_copy(rid, replicas.get(rid), on_target.get(rid), failed_now) for rid in canary_ids(model))
    return ModelCopies(targets, on_target, old, canaries)


def _canary_copy(rid: str, state: ReplicaState | None, on_target: bool | None,
                 failed_now: Mapping[str, str]) -> CanaryCopy:
    """A canary replica as its rollout reads it: failed in this pass, running the new spec, or still to come."""
    if rid in failed_now:
        return CanaryCopy(rid, Phase.FAILED, failed_now[rid])
    if state is not None and on_target:
        return CanaryCopy(rid, state.phase, state.message)
    return CanaryCopy(rid, Phase.STARTING, "runs the old spec still")


def _measure_when_due(catalog: Catalog, model: Model, was: Rollout | None, copies: ModelCopies,
                      replicas: Mapping[str, ReplicaState], now: float, log: LogFn,
                      measure: MeasureFn) -> list[Measurement]:
    """The checks measured, canary copies against stable ones, each measurement logged; none while
    nothing runs the old spec or canary.checks_due says they are not due."""
    if not copies.old or not checks_due(model, was, copies.canaries, now):
        return []
    canary = [t for t in (_target(catalog, replicas.get(c.replica)) for c in copies.canaries) if t is not None]
    stable = [t for rid, st in sorted(replicas.items()) if st.model == model.name and st.phase == Phase.READY
              and not copies.on_target.get(rid) for t in [_target(catalog, st)] if t is not None]
    measured = measure(model, canary, stable)
    for m in measured:
        log(Decision(model.name, "-", DecisionAction.CHECK, m.said, ok=m.ok))
    return measured


def marked_canaries(model: Model, r: Rollout, replicas: Mapping[str, ReplicaState],
                    on_target: Mapping[str, bool]) -> dict[str, ReplicaState]:
    """The model's canary replicas that run the new spec, as the rollout makes them (pure): the canary
    while it progresses; once it is aborted, a Ready one draining."""
    marked = {}
    for rid in canary_ids(model):
        st = replicas.get(rid)
        if st is None or not on_target.get(rid):
            continue
        if r.state == RolloutPhase.PROGRESSING:
            marked[rid] = replace(st, canary=True)
        elif r.state == RolloutPhase.ABORTED and st.phase == Phase.READY:
            # Out of every gateway file in the pass that aborted it; the next pass stops it, drained.
            marked[rid] = replace(st, phase=Phase.DRAINING, message=f"canary aborted: {r.reason}")
    return marked


def with_canary_wakes(catalog: Catalog, rollouts: Mapping[str, Rollout], next_at: float | None,
                      now: float) -> float | None:
    """When the daemon passes next (pure): it wakes for a canary's next measurement, or the end of its
    analysis, as for a drain."""
    wakes = [t for t in (next_wake(m, rollouts.get(m.name)) for m in catalog.models)
             if t is not None and t > now]  # one already due was measured in this pass
    return min((t for t in (next_at, *wakes) if t is not None), default=None)


def _runs(records, state: ReplicaState, targets: frozenset[str]) -> bool:
    """Whether the replica's current copy (the one its state names) runs one of the spec hashes."""
    where = {a.node for a in state.nodes}
    heads = [r for n, r in records if r.rank == 0 and (not where or n.id in where)]
    return bool(heads) and heads[0].spec_hash in targets


def _from_revision(records: Mapping[str, RankRecords], model: Model, targets: frozenset[str]) -> str | None:
    """The revision the old copies were started from (what a rollout rolls away from)."""
    for _, rs in sorted(records.items()):
        for _, r in rs:
            if r.rank == 0 and r.model == model.name and r.spec_hash not in targets and r.revision:
                return r.revision
    return None


def _target(catalog: Catalog, state: ReplicaState | None) -> Target | None:
    """Where a check reaches a Ready copy's engine (its head's data address)."""
    if state is None or state.phase != Phase.READY or not state.nodes:
        return None
    head = next((a for a in state.nodes if a.rank == 0), state.nodes[0])
    spec = catalog.fleet.node(head.node)
    if spec is None or not head.port:
        return None
    return Target(state.replica, spec.data_host.bare, head.port)
