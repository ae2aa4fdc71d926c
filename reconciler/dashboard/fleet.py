"""The fleet page: the nodes the filters keep, a page of grid rows at a time (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.dashboard.filters import PAGE_SIZE, Filters, page_window
from reconciler.dashboard.index import Index, NodeRow


@dataclass(frozen=True)
class FleetPage:
    rows: list[NodeRow]
    matched: int
    total: int
    page: int
    pages: int
    first: int  # 1-based number of the first row shown


def fleet_view(ix: Index, f: Filters) -> FleetPage:
    rows = ix.nodes
    if f.active:
        rows = [n for n in rows if _node_kept(n, f, ix)]
    per = f.per or PAGE_SIZE
    page, pages, start = page_window(len(rows), f.page, per)
    return FleetPage(rows[start:start + per], len(rows), len(ix.nodes), page, pages, start + 1)


def _node_kept(n: NodeRow, f: Filters, ix: Index) -> bool:
    return _node_itself_kept(n, f) and _placements_kept(n, f, ix) and _gpus_kept(n, f)


def _node_itself_kept(n: NodeRow, f: Filters) -> bool:
    """The filters on the node's own id, state and labels; an unplaced replica is on no node."""
    if f.node and f.node not in n.id:
        return False
    if f.unplaced:
        return False
    if f.state and n.state != f.state:
        return False
    if f.labels and not f.node_matches({"labels": n.labels}):
        return False
    return True


def _placements_kept(n: NodeRow, f: Filters, ix: Index) -> bool:
    """The filters on what runs on the node: a model, and a phase (of that model, when one is chosen)."""
    if f.model and f.model not in ix.models_on_node.get(n.id, ()):
        return False
    if f.phase and not any(phase == f.phase and (not f.model or model == f.model)
                           for model, phase in ix.phases_on_node.get(n.id, ())):
        return False
    return True


def _gpus_kept(n: NodeRow, f: Filters) -> bool:
    """The filter on what the node's GPUs do: at least one GPU in that use."""
    return not f.gpu or any(c.use == f.gpu for c in n.gpus)
