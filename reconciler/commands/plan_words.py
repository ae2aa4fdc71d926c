"""How a plan is put in words, shared by `plan`'s text output and its pull-request Markdown."""

from __future__ import annotations

from reconciler.model import Placement
from reconciler.decide.plan_values import Plan


def _gpus(gpus) -> str:
    g = list(gpus)
    if not g:
        return ""
    if len(g) > 2 and g == list(range(g[0], g[-1] + 1)):
        return f"[{g[0]}-{g[-1]}]"
    return "[" + ",".join(map(str, g)) + "]"


def where_text(p: Placement | None) -> str:
    """Nodes, GPUs and ports in one short line: `a1[0-7]:8000 a2[0-7]:8000`."""
    if p is None:
        return "-"
    return " ".join(f"{a.node}{_gpus(a.gpus)}:{a.port}" for a in p.nodes)


def span(replicas: list[str]) -> str:
    return replicas[0] if len(replicas) == 1 else f"{replicas[0]} .. {replicas[-1]}"


def same_rejections(pl: Plan) -> dict[str, list[str]]:
    """Per unplaced replica that carries rejections, the other unplaced replicas that failed the same way."""
    same: dict[str, list[str]] = {}
    for o in pl.unplaced:
        if o.rejections_same_as:
            same.setdefault(o.rejections_same_as, []).append(o.replica)
    return same
