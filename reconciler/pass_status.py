"""Status files of one apply pass (SPEC section 2): models and endpoints (through status.py's
writer, shared with `plan --write-status`) and nodes (the snapshot the pass left behind)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from reconciler.inventory import inventory_to_document
from reconciler.model import Catalog, Fleet
from reconciler.status import endpoint_url as status_endpoint_url
from reconciler.status import write_document, write_plan_status


def endpoint_url(fleet: Fleet, node_id: str, port: int) -> str:
    """Where a replica serves: the head's data address (what other hosts reach), not its SSH address."""
    spec = fleet.node(node_id)
    return status_endpoint_url(spec.data_address if spec is not None else node_id, port)


def plan_unplaced(plan: Any) -> dict[str, Any]:
    """Replica id -> its unplaced outcome (with rejections), from a plan."""
    out = {}
    for u in getattr(plan, "unplaced", None) or []:
        rid = getattr(u, "replica", None) or (u.get("replica") if isinstance(u, dict) else None)
        if rid:
            out[rid] = u
    return out


def write_pass_status(catalog: Catalog, result) -> list[str]:
    """Write status/ for this pass (models, endpoints, nodes); returns the files whose content changed.

    The documents are built by status.py's writer, the same one `plan
    --write-status` uses, so a predicted status and an applied one have one
    shape; here it gets the phases and messages the pass observed.
    """
    status_dir = Path(catalog.root) / "status"
    written: list[str] = []
    if result.plan is not None and result.replicas is not None:
        phases = {rid: st.phase for rid, st in result.replicas.items()}
        messages = {rid: st.message for rid, st in result.replicas.items() if st.message}
        # The pass observed every replica, so its messages are the whole story: without the plan's
        # action reasons ("start: not running") a replica started in this pass reads the same as
        # in the next, quiet one, and status does not change for nothing.
        observed_plan = dataclasses.replace(result.plan, actions=(), waiting=())
        written.extend(str(p) for p in write_plan_status(catalog.root, catalog, observed_plan, phases, messages))
    if result.inventory is not None:
        path = status_dir / "nodes.yaml"
        if write_document(path, inventory_to_document(result.inventory)):
            written.append(str(path))
    return written
