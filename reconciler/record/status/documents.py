"""The status documents (SPEC section 2) built from one PassResult: status/models/<name>.yaml,
status/endpoints.yaml and status/catalog.yaml. Pure: values in, dicts out; writing is files.py's."""

from __future__ import annotations

from typing import Any, Mapping

from reconciler.decide.autoscale import state_document
from reconciler.decide.canary import Rollout, current
from reconciler.errors import Problem
from reconciler.frozen import frozen
from reconciler.observe.inventory import utc_text
from reconciler.model import Catalog, Fleet, Model, Placement, Rejection, replica_ordinal
from reconciler.decide.outcomes import PassResult, ReplicaState
from reconciler.record.status.predict import unplaced_message, where_it_runs
from reconciler.vocabulary import Phase


def rejection_document(r: Rejection) -> dict:
    return {"profile": r.profile, "pool": r.pool, "node": r.node, "reason": r.reason}


def _node_entries(fleet: Fleet, placement: Placement | None) -> list[dict]:
    nodes = []
    for a in placement.nodes if placement is not None else ():
        entry = {"node": a.node, "rank": a.rank, "gpus": list(a.gpus), "port": a.port}
        if a.rank == 0:
            # Only the head serves; other ranks' ports are for the engine's own traffic.
            entry["endpoint"] = fleet.endpoint(a.node, a.port)
        nodes.append(entry)
    return nodes


def _replica_entry(fleet: Fleet, result: PassResult, state: ReplicaState | None, rid: str, show_all: bool) -> dict:
    plan = result.plan
    out = plan.outcomes.get(rid)
    placement = where_it_runs(plan, rid)
    phase = state.phase if state is not None else Phase.UNKNOWN
    entry = {
        "id": rid,
        "profile": placement.profile if placement is not None else None,
        "phase": phase,
        "nodes": _node_entries(fleet, placement),
        "message": state.message if state is not None else "",
    }
    if phase == Phase.FAILED and state.failure:
        # Beside the message: whether retrying can help (temporary) or not until something changes (permanent).
        entry["failure"] = state.failure
    entry["restarts"] = plan.restarts.get(rid, 0)
    if state is not None and state.revision:  # known only for a catalog in git; absent rather than null
        entry["revision"] = state.revision
    if state is not None and state.canary:  # a canary copy of a rollout Progressing (SPEC section 13)
        entry["canary"] = True
    if out is not None and out.placement is None:
        # An unplaced replica: its message and the rejections behind it (or the replica that has the same).
        entry["message"] = entry["message"] or unplaced_message(out, show_all)
        if out.rejections_same_as:
            entry["rejections_same_as"] = out.rejections_same_as
        else:
            entry["rejections"] = [rejection_document(r) for r in out.rejections]
    return entry


def model_status_document(model: Model, result: PassResult, fleet: Fleet, show_all: bool = False) -> dict:
    """status/models/<name>.yaml: desired and ready counts, every replica with its nodes and endpoints,
    from the pass's replica states (observed by apply and the daemon, or predicted_pass's); a model
    with a range also its count and why (result.autoscale, SPEC section 11), after `ready`."""
    replicas = [_replica_entry(fleet, result, result.replicas.get(rid), rid, show_all) 
                for rid in model.replica_ids() + _draining_beyond(model, result.replicas)]
    doc = {
        "name": model.name,
        "desired": model.replicas,
        "ready": sum(1 for r in replicas if r["phase"] == Phase.READY),
    }
    autoscale = result.autoscale.get(model.name)
    if model.scale is not None and autoscale is not None:
        doc["autoscale"] = state_document(model, autoscale)
    rollout = current(model, result.rollouts.get(model.name))
    if rollout is not None:
        doc["rollout"] = rollout_document(rollout)
    doc["replicas"] = replicas
    return doc


def rollout_document(r: Rollout) -> dict:
    """status/models `rollout:` (SPEC section 13): no clock time but `since`, so it changes only with the rollout."""
    return {
        "state": str(r.state),
        "revision": r.revision,
        "from_revision": r.from_revision,
        "since": utc_text(r.since),
        "weight": r.weight,
        "checks": [{"name": c.name, "passed": c.passed, "failed": c.failed, "last": c.last} for c in r.checks],
        "reason": r.reason,
    }


def _draining_beyond(model: Model, replicas: Mapping[str, ReplicaState]) -> list[str]:
    """Replicas above the replica count still draining after a scale down: listed until they stop."""
    extra = []
    for rid, state in replicas.items():
        ordinal = replica_ordinal(model.name, rid)
        if state.phase == Phase.DRAINING and ordinal is not None and ordinal >= model.replicas:
            extra.append((ordinal, rid))
    return [rid for _, rid in sorted(extra)]


def endpoints_document(catalog: Catalog, result: PassResult) -> dict:
    """status/endpoints.yaml: per model of the catalog, the URLs of its Ready replicas (PassResult.endpoints)."""
    ready = result.endpoints()
    doc: dict[str, Any] = {"models": {model.name: sorted(ready.get(model.name, ())) for model in catalog.models}}
    # Canary URLs (SPEC section 13), also listed under models: a gateway that weighs by hand can tell them.
    canary = {}
    for st in result.replicas.values():
        if st.canary and st.phase == Phase.READY and st.endpoint:
            canary.setdefault(st.model, []).append(st.endpoint)
    if canary:
        doc["canary"] = {name: sorted(urls) for name, urls in sorted(canary.items())}
    return doc


def removed_model_document(name: str, result: PassResult, fleet: Fleet) -> dict:
    """status/models/<name>.yaml of a model no longer in the catalog whose copies still drain: kept
    until its last copy has stopped (SPEC 13), so status shows them Draining."""
    states = sorted((s for s in result.replicas.values() if s.model == name),
                    key=lambda s: (replica_ordinal(name, s.replica) or 0, s.replica))
    return {"name": name, "desired": 0, "ready": 0,
            "replicas": [_replica_entry(fleet, result, s, s.replica, False) for s in states]}


@frozen
class Upstream:
    """What a daemon with --git-pull last heard from its upstream."""

    ref: str
    state: str  # up-to-date | diverged | unreachable | ...
    message: str = ""


@frozen
class LeaderStatus:
    host: str
    since: str  # UTC, ISO 8601
    epoch: int


@frozen
class CatalogStatus:
    """What status/catalog.yaml says, whoever applied last (`apply` or the daemon), so a reviewer and
    a daemon started later read one shape.

    branch/uncommitted are None outside git (and then not written); never HEAD's own id, which a
    status commit would move."""

    attempted: str | None
    applied: str | None
    message: str
    errors: tuple[Problem, ...] = ()
    branch: str | None = None
    uncommitted: tuple[str, ...] | None = None
    upstream: Upstream | None = None
    warnings: tuple[str, ...] = ()
    # Models the fleet does not run as HEAD says, in words: a canary rollout aborted (SPEC section 13).
    out_of_sync: tuple[str, ...] = ()
    leader: LeaderStatus | None = None  # with `leader:` in fleet.yaml: who leads (SPEC 14)


def catalog_document(st: CatalogStatus) -> dict:
    doc: dict[str, Any] = {
        "last_attempted_revision": st.attempted,
        "last_applied_revision": st.applied,
        "message": st.message,
        "errors": [{"file": p.file, "line": p.line, "column": p.column, "message": p.message} for p in st.errors],
    }
    if st.uncommitted is not None:
        doc["branch"] = st.branch
        doc["uncommitted_changes"] = list(st.uncommitted)
        if st.upstream is not None:
            doc["upstream"] = {"ref": st.upstream.ref, "state": st.upstream.state, "message": st.upstream.message}
    if st.leader is not None:
        doc["leader"] = {"host": st.leader.host, "since": st.leader.since, "epoch": st.leader.epoch}
    doc["warnings"] = list(st.warnings)
    if st.out_of_sync:  # only when some model is: a catalog without rollouts keeps its file as it was
        doc["out_of_sync"] = list(st.out_of_sync)
    return doc
