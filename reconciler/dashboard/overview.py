"""The overview page: the revision in force and whether it is HEAD's, and the fleet counted (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reconciler.dashboard.cells import GpuUse
from reconciler.dashboard.files import StatusSnapshot
from reconciler.dashboard.index import Index
from reconciler.vocabulary import NodeState, Phase


class Sync(StrEnum):
    SYNCED = "Synced"  # the revision in force is the catalog at HEAD, and it validated
    OUT_OF_SYNC = "OutOfSync"  # HEAD moved on (or nothing was applied yet)
    FAILED = "Failed"  # the last attempted revision did not validate


@dataclass(frozen=True)
class Overview:
    applied: str | None
    attempted: str | None
    head: str | None
    head_catalog: str | None
    git: bool
    sync: Sync
    sync_reason: str
    errors: list[dict]
    message: str
    warnings: list[str]
    models: int
    desired: int
    ready: int
    unplaced: int
    phases: dict[str, int]
    node_states: dict[str, int]
    gpus: dict[str, int]
    gpu_total: int
    gateway: list[str]
    leader: dict | None = None  # status/catalog.yaml `leader:` (SPEC 14): who leads, as its last status says


def overview(snap: StatusSnapshot, ix: Index) -> Overview:
    cat = snap.catalog.doc if isinstance(snap.catalog.doc, dict) else {}
    applied, attempted = _rev(cat.get("last_applied_revision")), _rev(cat.get("last_attempted_revision"))
    errors = [e for e in cat.get("errors") or [] if isinstance(e, dict)]
    sync, why = sync_state(snap, applied, attempted, errors)
    phases = _phase_counts(ix)
    gpus = _gpu_use_counts(ix)
    return Overview(
        applied=applied, attempted=attempted, head=snap.head, head_catalog=snap.catalog_revision_at_head,
        git=snap.git, sync=sync, sync_reason=why, errors=errors, message=str(cat.get("message") or ""),
        warnings=[str(w) for w in cat.get("warnings") or []], models=len(ix.models), desired=_desired(ix),
        ready=phases.get(Phase.READY, 0), unplaced=_unplaced_count(ix),
        phases=_phases_shown(phases), node_states=_node_state_counts(ix), gpus=gpus, gpu_total=sum(gpus.values()),
        gateway=[rel for rel, _ in snap.gateway],
        leader=_leader(cat.get("leader")),
    )


def _leader(doc) -> dict | None:
    if not isinstance(doc, dict) or not doc.get("host"):
        return None
    return {"host": str(doc["host"]), "epoch": doc.get("epoch"), "since": str(doc.get("since") or "")}


def sync_state(snap: StatusSnapshot, applied: str | None, attempted: str | None,
               errors: list[dict]) -> tuple[Sync, str]:
    """Whether the revision in force is the catalog at HEAD, and why not."""
    if errors:
        return Sync.FAILED, f"revision {_short(attempted) or '(working tree)'} did not validate"
    if not snap.catalog.doc:
        return Sync.OUT_OF_SYNC, "nothing applied yet: no status/catalog.yaml"
    if _head_moved_on(snap, applied):
        return Sync.OUT_OF_SYNC, (f"HEAD's catalog is {_short(snap.catalog_revision_at_head)}, "
                                  f"applied is {_short(applied) or 'none'}")
    aborted = [str(m) for m in snap.catalog.doc.get("out_of_sync") or []]
    if aborted:  # a canary rollout aborted: the fleet runs the old spec of these models (SPEC section 13)
        return Sync.OUT_OF_SYNC, "; ".join(aborted)
    return Sync.SYNCED, ("the catalog at HEAD is applied" if snap.git
                         else "the working tree is applied (no git: no revision)")


def _head_moved_on(snap: StatusSnapshot, applied: str | None) -> bool:
    return bool(snap.git and snap.catalog_revision_at_head and applied != snap.catalog_revision_at_head)


def _phase_counts(ix: Index) -> dict[str, int]:
    """Replicas per phase: every phase of the vocabulary, and any other a file wrote."""
    phases = {str(p): 0 for p in Phase}
    for r in ix.replicas.values():
        phases[r.phase] = phases.get(r.phase, 0) + 1
    return phases


def _phases_shown(phases: dict[str, int]) -> dict[str, int]:
    """The vocabulary's phases always, another only when a replica is in it."""
    return {k: v for k, v in phases.items() if v or k in Phase.__members__.values()}


def _node_state_counts(ix: Index) -> dict[str, int]:
    states = {str(s): 0 for s in NodeState}
    for n in ix.nodes:
        states[n.state] = states.get(n.state, 0) + 1
    return states


def _gpu_use_counts(ix: Index) -> dict[str, int]:
    gpus = {str(u): 0 for u in GpuUse}
    for n in ix.nodes:
        for c in n.gpus:
            gpus[c.use] += 1
    return gpus


def _desired(ix: Index) -> int:
    return sum(m["desired"] for m in ix.models if isinstance(m.get("desired"), int))


def _unplaced_count(ix: Index) -> int:
    return sum(1 for r in ix.replicas.values() if r.unplaced)


def _rev(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _short(rev: str | None) -> str:
    return rev[:12] if rev else ""
