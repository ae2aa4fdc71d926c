"""Every node weighed for a profile, with why it was discarded: what `explain` shows and what an
unplaced replica carries (model.Rejection, one per node, plus one per pool for a multi-node
profile whose fabric could not hold it).

Built only when a replica could not be placed, or when explain asks: at fleet scale each list
is a walk of every node.
"""

from __future__ import annotations

from typing import Sequence

from reconciler.model import Model, Profile, Reason, RejectKind, Rejection
from reconciler.decide.placement.capacity import NodeCapacity
from reconciler.decide.placement.rules import (
    INCOMPLETE,
    LLAMA_CPP,
    NO_FABRIC,
    SCHEDULABLE,
    llama_roles_reason,
    dynamic_reason,
    pool_name,
)

Statics = Sequence["Reason | None"]  # per node index: why it can never take the profile this pass


def rejections_for(nodes: Sequence[NodeCapacity], fabric_names: Sequence[str], static: Statics,
                   model: Model, profile: Profile, exclude: frozenset) -> list[Rejection]:
    """Every node of `nodes` (in node id order) weighed for this profile in their current state."""
    if profile.nodes <= 1:
        return _single_node(nodes, static, model, profile, exclude)
    if not fabric_names:
        return [Rejection(profile.name, pool_name(None, profile), "", Reason(RejectKind.NO_FABRICS, requested=profile.nodes))]
    out: list[Rejection] = []
    for fabric in fabric_names:
        out.extend(_on_fabric(nodes, static, model, profile, exclude, fabric))
    pool = pool_name(None, profile)
    for n in nodes:
        if not n.fabrics:
            # A node that cannot run anything says so first: an unreachable node shows no
            # fabric only because nothing was observed, and "no fabric" would send the
            # operator looking at cabling instead of at the node.
            state = static[n.idx] if n.state != SCHEDULABLE else None
            out.append(Rejection(profile.name, pool, n.id, state or NO_FABRIC))
    return out


def _single_node(nodes: Sequence[NodeCapacity], static: Statics, model: Model, profile: Profile,
                 exclude: frozenset) -> list[Rejection]:
    pool = pool_name(None, profile)
    out = []
    for n in nodes:
        reason = static[n.idx] or dynamic_reason(n, model, profile, exclude)
        if reason is None:
            # It qualifies on its own; only a later step (ports for every rank) failed.
            reason = INCOMPLETE
        out.append(Rejection(profile.name, pool, n.id, reason))
    return out


def _on_fabric(nodes: Sequence[NodeCapacity], static: Statics, model: Model, profile: Profile,
               exclude: frozenset, fabric: str) -> list[Rejection]:
    """The nodes attached to one fabric that cannot hold a rank, then the pool line: why the rest
    did not make a replica (too few, mixed launchers, or llama.cpp roles)."""
    pool = pool_name(fabric, profile)
    out: list[Rejection] = []
    qualified: list[NodeCapacity] = []
    by_launcher: dict[str, int] = {}
    for n in nodes:
        if fabric not in n.fabrics:
            continue
        reason = static[n.idx]
        if reason is None and not n.fabrics[fabric]:
            reason = Reason(RejectKind.NO_ADAPTERS, fabric)
        if reason is None:
            reason = dynamic_reason(n, model, profile, exclude)
        if reason is None:
            qualified.append(n)
            by_launcher[n.launcher] = by_launcher.get(n.launcher, 0) + 1
        else:
            out.append(Rejection(profile.name, pool, n.id, reason))
    qualify = len(qualified)
    if qualify >= profile.nodes and len(by_launcher) > 1:
        counts = ", ".join(f"{c} {l}" for l, c in sorted(by_launcher.items()))
        why = Reason(RejectKind.MIXED_LAUNCHERS, fabric, profile.nodes, max(by_launcher.values()), detail=counts)
    elif profile.engine == LLAMA_CPP and qualify >= profile.nodes:
        why = llama_roles_reason(qualified, model, profile, fabric)
    else:
        why = Reason(RejectKind.FABRIC_SHORT, fabric, profile.nodes, qualify)
    out.append(Rejection(profile.name, pool, "", why))
    return out
