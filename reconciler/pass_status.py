"""Status documents of one apply pass (SPEC section 2): models, endpoints, nodes.

Interim home: the placement branch builds the model/endpoint documents in
status.py for `plan --write-status`; once both are merged, these builders
should become calls to those, so a predicted status and an applied status
have the same shape. Until then this follows SPEC section 2 field by field.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from reconciler.inventory import inventory_to_document
from reconciler.model import Catalog, Fleet
from reconciler.status import write_document


def host_for_url(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def endpoint_url(fleet: Fleet, node_id: str, port: int) -> str:
    """Where a replica serves: the head's data address (what other hosts reach), not its SSH address."""
    spec = fleet.node(node_id)
    address = spec.data_address if spec is not None else node_id
    return f"http://{host_for_url(address)}:{port}"


def plan_unplaced(plan: Any) -> dict[str, Any]:
    """Replica id -> its unplaced outcome (with rejections), from a plan."""
    out = {}
    for u in getattr(plan, "unplaced", None) or []:
        rid = getattr(u, "replica", None) or (u.get("replica") if isinstance(u, dict) else None)
        if rid:
            out[rid] = u
    return out


def _rejection_docs(unplaced: Any) -> dict:
    if unplaced is None:
        return {}
    get = (lambda k: unplaced.get(k)) if isinstance(unplaced, dict) else (lambda k: getattr(unplaced, k, None))
    same = get("rejections_same_as")
    if same:
        return {"rejections_same_as": same}
    out = []
    for r in get("rejections") or []:
        if isinstance(r, dict):
            out.append({k: r.get(k) for k in ("profile", "pool", "node", "reason")})
        else:
            out.append({"profile": r.profile, "pool": r.pool, "node": r.node, "reason": r.reason})
    return {"rejections": out} if out else {}


def model_documents(catalog: Catalog, result) -> dict[str, dict]:
    unplaced = plan_unplaced(result.plan)
    restarts = _restart_counts(result.plan)
    docs = {}
    for model in catalog.models:
        replicas = []
        ready = 0
        for rid in model.replica_ids():
            state = result.replicas.get(rid)
            if state is None:
                continue
            ready += state.phase == "Ready"
            entry: dict[str, Any] = {
                "id": rid,
                "profile": state.profile,
                "phase": state.phase,
                "nodes": [
                    {"node": a.node, "rank": a.rank, "gpus": list(a.gpus), "port": a.port,
                     "endpoint": _endpoint(catalog, a.node, a.port)}
                    for a in state.nodes
                ],
                "message": state.message,
                "restarts": restarts.get(rid, 0),
            }
            entry.update(_rejection_docs(unplaced.get(rid)))
            replicas.append(entry)
        docs[model.name] = {"name": model.name, "desired": model.replicas, "ready": ready, "replicas": replicas}
    return docs


def _restart_counts(plan: Any) -> dict[str, int]:
    counts = getattr(plan, "restarts", None)
    return dict(counts) if isinstance(counts, dict) else {}


def _endpoint(catalog: Catalog, node: str, port: int) -> str:
    return endpoint_url(catalog.fleet, node, port)


def endpoints_document(catalog: Catalog, result) -> dict:
    ready = result.endpoints()
    return {"models": {m.name: sorted(ready.get(m.name, [])) for m in catalog.models}}


def _shared_writer():
    """The placement branch's status writer, when merged: one shape for predicted and applied status."""
    try:
        from reconciler.status import write_plan_status
    except ImportError:
        return None
    return write_plan_status


def write_pass_status(catalog: Catalog, result) -> list[str]:
    """Write status/ for this pass; returns the files whose content changed."""
    status_dir = Path(catalog.root) / "status"
    written = []
    shared = _shared_writer()
    if shared is not None and hasattr(result.plan, "outcomes"):
        phases = {rid: st.phase for rid, st in result.replicas.items()}
        messages = {rid: st.message for rid, st in result.replicas.items() if st.message}
        # The pass observed every replica, so its messages are the whole story: without the plan's
        # action reasons ("start: not running") a replica started in this pass reads the same as
        # in the next, quiet one, and status does not change for nothing.
        observed_plan = result.plan
        if dataclasses.is_dataclass(observed_plan):
            observed_plan = dataclasses.replace(observed_plan, actions=(), waiting=())
        written.extend(str(p) for p in shared(catalog.root, catalog, observed_plan, phases, messages))
    elif result.plan is not None:
        models_dir = status_dir / "models"
        docs = model_documents(catalog, result)
        for name, doc in docs.items():
            path = models_dir / f"{name}.yaml"
            if write_document(path, doc):
                written.append(str(path))
        # A model removed from the catalog has no status any more.
        if models_dir.is_dir():
            for stale in sorted(models_dir.glob("*.yaml")):
                if stale.stem not in docs:
                    os.unlink(stale)
                    written.append(str(stale))
        path = status_dir / "endpoints.yaml"
        if write_document(path, endpoints_document(catalog, result)):
            written.append(str(path))
    if result.inventory is not None:
        path = status_dir / "nodes.yaml"
        if write_document(path, inventory_to_document(result.inventory)):
            written.append(str(path))
    return written
