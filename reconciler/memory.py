"""What one pass hands to the next, and how `apply` keeps it between runs.

The daemon keeps a PassMemory in memory; a one-shot `apply` persists it as a
JSON-able document, so restart backoff and grace periods survive between runs.
`remember` is pure: the memory after a pass, from the memory before it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from reconciler.inventory import inventory_from_document, inventory_to_document
from reconciler.model import Inventory
from reconciler.outcomes import FAILED, ReplicaState
from reconciler.plan import Plan, ReplicaHistory


@dataclass(frozen=True)
class PassMemory:
    """What one pass hands to the next: the daemon keeps it in memory, a one-shot `apply` starts empty.

    history            the plan's per-replica restart bookkeeping (Plan.history)
    unreachable_since  node id -> epoch seconds it was first seen unreachable
    last_seen          the last snapshot in which each node answered (records of nodes unreachable now)
    placed_on          replica id -> nodes it was last placed on (which copy is current when two are found)
    """

    history: Mapping[str, ReplicaHistory] = field(default_factory=dict)
    unreachable_since: Mapping[str, float] = field(default_factory=dict)
    last_seen: Inventory | None = None
    placed_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def remember(
    memory: PassMemory,
    plan: Plan | None,
    inventory: Inventory,
    acted: Mapping[str, ReplicaState],
    now: float,
    desired: Iterable[str] | None = None,
) -> PassMemory:
    """The memory after a pass (pure)."""
    desired = None if desired is None else set(desired)
    unreachable = {}
    last_nodes = []
    for node in inventory.nodes:
        if node.state == "unreachable":
            unreachable[node.id] = memory.unreachable_since.get(node.id, now)
            previous = memory.last_seen.node(node.id) if memory.last_seen is not None else None
            if previous is not None:
                last_nodes.append(previous)
        else:
            last_nodes.append(node)
    placed_on = dict(memory.placed_on)
    for rid, state in acted.items():
        if state.nodes and state.phase != FAILED:
            placed_on[rid] = tuple(a.node for a in state.nodes)
    if desired is not None:  # forget replicas no longer wanted, so the memory does not grow forever
        placed_on = {rid: nodes for rid, nodes in placed_on.items() if rid in desired}
    return PassMemory(
        history=dict(plan.history if plan is not None else memory.history),
        unreachable_since=unreachable,
        last_seen=Inventory(tuple(last_nodes)),
        placed_on=placed_on,
    )


def memory_to_document(memory: PassMemory) -> dict:
    """PassMemory as JSON-able data, so one-shot `apply` runs remember backoff and grace periods."""
    return {
        "history": {rid: dataclasses.asdict(h) for rid, h in sorted(memory.history.items())},
        "unreachable_since": dict(sorted(memory.unreachable_since.items())),
        "last_seen": inventory_to_document(memory.last_seen) if memory.last_seen is not None else None,
        "placed_on": {rid: list(nodes) for rid, nodes in sorted(memory.placed_on.items())},
    }


def memory_from_document(doc: Any) -> PassMemory:
    """The inverse of memory_to_document; anything unreadable is forgotten, never an error."""
    try:
        return PassMemory(
            history={rid: ReplicaHistory(**h) for rid, h in (doc.get("history") or {}).items()},
            unreachable_since={n: float(t) for n, t in (doc.get("unreachable_since") or {}).items()},
            last_seen=inventory_from_document(doc["last_seen"]) if doc.get("last_seen") else None,
            placed_on={rid: tuple(nodes) for rid, nodes in (doc.get("placed_on") or {}).items()},
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        return PassMemory()
