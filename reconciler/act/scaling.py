"""The pass's autoscale step (SPEC section 11): read each Ready replica's load once, decide each count.

The decision is autoscale.decide's (pure); this module is its edge: which replicas are asked
(Ready ones of autoscaled models, inside the count in force), where (the head's data address and
serving port, the profile's series), and the one read through engine_metrics.read_loads, every
replica under its own deadline. A replica whose load cannot be read is counted at target and
said once, as a warning line (a Decision with action `metrics`), never a traceback.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from reconciler.decide.autoscale import AutoscaleState, decide, initial_state, new_unknowns
from reconciler.act.engine_metrics import METRICS_TIMEOUT_S, LoadAnswer, LoadTarget, LoadUnknown, profile_series, read_loads
from reconciler.model import Catalog, Model, replica_ordinal
from reconciler.decide.outcomes import Decision, ReplicaState
from reconciler.vocabulary import DecisionAction, Phase

LoadReader = Callable[[Sequence[LoadTarget]], Mapping[str, LoadAnswer]]
METRICS_ACTION = DecisionAction.METRICS  # a Decision line about a replica's load that could not be read
SCALE_ACTION = DecisionAction.SCALE  # a Decision line about a model whose count moved


def default_reader(targets: Sequence[LoadTarget]) -> Mapping[str, LoadAnswer]:
    return read_loads(targets, timeout_s=METRICS_TIMEOUT_S)


def load_targets(catalog: Catalog, model: Model, replicas: Mapping[str, ReplicaState]
                 ) -> tuple[list[LoadTarget], dict[str, str]]:
    """The Ready replicas of `model` to ask, and those Ready but with nowhere to ask (replica -> why)."""
    targets, nowhere = [], {}
    for rid in model.replica_ids():
        state = replicas.get(rid)
        if state is None or state.phase != Phase.READY:
            continue
        head = next((a for a in state.nodes if a.rank == 0), None)
        profile = model.profile(state.profile) if state.profile else None
        node = catalog.fleet.node(head.node) if head is not None else None
        series = profile_series(profile) if profile is not None else None
        if head is None or node is None or series is None:
            nowhere[rid] = "no metrics series known for its engine" if series is None else "its head is not known"
            continue
        targets.append(LoadTarget(rid, node.data_address, head.port, series))
    return targets, nowhere


ModelLoads = tuple[dict[str, "float | None"], dict[str, str]]  # (replica -> in flight or None, replica -> why unknown)


def read_model_loads(catalog: Catalog, replicas: Mapping[str, ReplicaState], read: LoadReader) -> dict[str, ModelLoads]:
    """Every autoscaled model's Ready replicas' loads, in one read of them all at once (a slow engine
    delays only itself): model -> (replica -> requests in flight, None where unknown; replica -> why)."""
    asked: dict[str, tuple[list[LoadTarget], dict[str, str]]] = {}
    for m in catalog.models:
        if m.scale is not None and m.autoscale is not None:
            asked[m.name] = load_targets(catalog, m, replicas)
    answers = read([t for targets, _ in asked.values() for t in targets]) if asked else {}
    out = {}
    for name, (targets, nowhere) in asked.items():
        loads: dict[str, float | None] = {}
        unknown = dict(nowhere)
        for t in targets:
            answer = answers.get(t.replica, LoadUnknown("not asked"))
            if isinstance(answer, LoadUnknown):
                unknown[t.replica] = answer.reason
                loads[t.replica] = None
            else:
                loads[t.replica] = answer.in_flight
        for rid in nowhere:
            loads[rid] = None
        out[name] = (loads, unknown)
    return out


def scale_pass(catalog: Catalog, replicas: Mapping[str, ReplicaState], kept: Mapping[str, AutoscaleState],
               now: float, read: LoadReader, log: Callable[[Decision], None]) -> dict[str, AutoscaleState]:
    """Every autoscaled model's state after this pass: one read of all Ready replicas' loads at once
    (read_model_loads), then autoscale.decide per model."""
    read_now = read_model_loads(catalog, replicas, read)
    out = {}
    for m in catalog.models:
        if m.name not in read_now:
            continue
        loads, unknown = read_now[m.name]
        before = kept.get(m.name) or initial_state(m)
        after = decide(m.autoscale, m.scale, before.current, loads, now, before, unknown)
        for rid, why in sorted(new_unknowns(before, after).items(), key=lambda kv: replica_ordinal(m.name, kv[0]) or 0):
            where = next((a.node for a in replicas[rid].nodes if a.rank == 0), "-") if rid in replicas else "-"
            log(Decision(rid, where, METRICS_ACTION,
                         f"load unknown, counted at target {m.autoscale.target:g}: {why}"))
        if after.current != before.current:
            log(Decision(m.name, "-", SCALE_ACTION, after.reason))
        out[m.name] = after
    return out
