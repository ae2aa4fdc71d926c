"""The models page: each model the filters keep, its replicas and its unplaced ones' rejections (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reconciler.dashboard.files import StatusSnapshot
from reconciler.dashboard.filters import MAX_PAGE_SIZE, MODELS_PAGE_SIZE, Filters, page_window
from reconciler.dashboard.index import Index, Replica
from reconciler.dashboard.rejections import RejectionGroups

REPLICAS_SHOWN = 10  # replicas per model on the models page before "N more" (choosing the model shows them all)

Unplaced = list[tuple[Replica, RejectionGroups | None, list[str]]]  # (replica, groups, replicas sharing them)


@dataclass(frozen=True)
class ModelView:
    name: str
    desired: Any
    ready: Any
    autoscale: dict | None
    endpoints: list[str]
    replicas: list[Replica]  # those the filters keep, at most REPLICAS_SHOWN unless a model is chosen
    matched: int  # how many the filters keep
    total: int
    phases: dict[str, int]
    unplaced: Unplaced
    rollout: dict | None = None  # the canary rollout (SPEC section 13): state, weight, checks, reason


@dataclass(frozen=True)
class ModelsPage:
    models: list[ModelView]
    matched: int  # models the filters keep
    total: int
    page: int
    pages: int
    first: int


def replica_matches(rep: Replica, f: Filters, ix: Index) -> bool:
    if f.phase and rep.phase != f.phase:
        return False
    if f.unplaced and not rep.unplaced:
        return False
    if f.labels and not _on_labelled_node(rep, f, ix):
        return False
    if f.node and not any(f.node in str(n.get("node")) for n in rep.nodes):
        return False
    return True


def _on_labelled_node(rep: Replica, f: Filters, ix: Index) -> bool:
    """A rank of the replica is on a node with the labels the filters ask for."""
    return any(f.node_matches({"labels": ix.node_labels.get(str(n.get("node")), {})}) for n in rep.nodes)


def models_view(snap: StatusSnapshot, ix: Index, f: Filters) -> ModelsPage:
    endpoints = _endpoints(snap)
    kept_models = _kept_models(ix, f)
    per = f.per or MODELS_PAGE_SIZE
    page, pages, start = page_window(len(kept_models), f.page, per)
    out = [_model_view(m, reps, kept, ix, f, endpoints) for m, reps, kept in kept_models[start:start + per]]
    return ModelsPage(out, len(kept_models), len(ix.models), page, pages, start + 1)


def _endpoints(snap: StatusSnapshot) -> dict:
    """status/endpoints.yaml's models: model -> its endpoints."""
    endpoints = snap.endpoints.doc.get("models") if isinstance(snap.endpoints.doc, dict) else None
    return endpoints if isinstance(endpoints, dict) else {}


def _narrows_replicas(f: Filters) -> bool:
    return bool(f.phase or f.labels or f.node or f.unplaced)


def _kept_models(ix: Index, f: Filters) -> list[tuple[dict, list[Replica], list[Replica]]]:
    """(model, its replicas, those the filters keep) of each model the filters keep: a filter on
    replicas keeps only the models with a replica it keeps."""
    narrowed = _narrows_replicas(f)
    kept_models = []
    for m in ix.models:
        if f.model and m["name"] != f.model:
            continue
        reps = _model_replicas(m, ix)
        kept = [r for r in reps if replica_matches(r, f, ix)] if narrowed else reps
        if narrowed and not kept:
            continue
        kept_models.append((m, reps, kept))
    return kept_models


def _model_replicas(m: dict, ix: Index) -> list[Replica]:
    return [ix.replicas[r["id"]] for r in m.get("replicas") or [] if isinstance(r, dict) and r.get("id") in ix.replicas]


def _model_view(m: dict, reps: list[Replica], kept: list[Replica], ix: Index, f: Filters,
                endpoints: dict) -> ModelView:
    autoscale = m.get("autoscale") if isinstance(m.get("autoscale"), dict) else None
    eps = endpoints.get(m["name"])
    return ModelView(
        name=m["name"], desired=m.get("desired"), ready=m.get("ready"), autoscale=autoscale,
        endpoints=[str(e) for e in eps] if isinstance(eps, list) else [],
        replicas=kept[:MAX_PAGE_SIZE] if f.model else kept[:REPLICAS_SHOWN], matched=len(kept), total=len(reps),
        phases=_phase_counts(reps), unplaced=_unplaced(reps, kept, ix),
        rollout=m.get("rollout") if isinstance(m.get("rollout"), dict) else None,
    )


def _phase_counts(reps: list[Replica]) -> dict[str, int]:
    phases: dict[str, int] = {}
    for r in reps:
        phases[r.phase] = phases.get(r.phase, 0) + 1
    return phases


def _unplaced(reps: list[Replica], kept: list[Replica], ix: Index) -> Unplaced:
    """The unplaced replicas the filters keep, each with its rejection groups and the replicas whose
    rejections are the same as its (those are listed under it, not on their own)."""
    same = _sharing_rejections(reps)
    return [(r, ix.groups(r), same.get(r.id, [])) for r in kept if r.unplaced and not r.doc.get("rejections_same_as")]


def _sharing_rejections(reps: list[Replica]) -> dict[str, list[str]]:
    """replica -> the replicas whose entries say their rejections are the same as its."""
    same: dict[str, list[str]] = {}
    for r in reps:
        if r.doc.get("rejections_same_as"):
            same.setdefault(str(r.doc["rejections_same_as"]), []).append(r.id)
    return same
