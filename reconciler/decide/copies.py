"""What runs, read from node records for the plan (reconciler/decide/plan.py): every record of a replica,
grouped into the copy the plan reasons about (one node per rank, the best-placed first) and the
stale ranks beside it, and that copy as the Placement it holds.

Pure, like the plan: only the catalog, the snapshot and the previous snapshot are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from reconciler.model import Assignment, Catalog, Inventory, Model, Placement, Profile, RunningRank, spec_hash
from reconciler.decide.placement import pool_name
from reconciler.vocabulary import NodeState


@dataclass
class Copy:
    """The ranks of one replica the plan reasons about: one record per rank, in rank order."""

    replica: str
    model: str
    profile: str
    nnodes: int
    ranks: list[tuple[str, RunningRank]] = field(default_factory=list)  # (node, rank), rank order

    @property
    def nodes(self) -> list[str]:
        return [n for n, _ in self.ranks]


def effective_state(catalog: Catalog, inventory: Inventory, node_id: str) -> str:
    spec = catalog.fleet.node(node_id)
    obs = inventory.node(node_id)
    if obs is None or obs.state == NodeState.UNREACHABLE:
        return NodeState.UNREACHABLE
    return spec.state if spec is not None else obs.state


def collect_records(catalog: Catalog, inventory: Inventory, last_seen: Inventory | None) -> dict[str, list[tuple[str, RunningRank]]]:
    """replica id -> every (node, rank) record found for it on nodes of the fleet.

    Nodes in the snapshot but not in fleet.yaml are ignored (SPEC section 3). An
    unreachable node shows no records; what it ran when it was last seen still
    counts (from `last_seen`), so its replicas are not started twice within the grace period.
    """
    found: dict[str, list[tuple[str, RunningRank]]] = {}
    for spec in sorted(catalog.fleet.nodes, key=lambda n: n.id):
        obs = inventory.node(spec.id)
        ranks = obs.replicas if obs is not None else ()
        if (obs is None or obs.state == NodeState.UNREACHABLE) and not ranks and last_seen is not None:
            prev = last_seen.node(spec.id)
            ranks = prev.replicas if prev is not None else ()
        for r in ranks:
            found.setdefault(r.id, []).append((spec.id, r))
    return found


class SpecHashes:
    """spec_hash per (model, profile), computed once per pass: a pass compares it with every
    running rank, and hashing the spec costs more than the rest of the comparison."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], str] = {}

    def of(self, model: Model, profile: Profile) -> str:
        key = (model.name, profile.name)
        digest = self._known.get(key)
        if digest is None:
            digest = self._known[key] = spec_hash(model, profile)
        return digest


def rank_preference(catalog, inventory, model: Model | None, preferred_nodes: tuple[str, ...], hashes: SpecHashes):
    def key(item: tuple[str, RunningRank]):
        node, r = item
        state = effective_state(catalog, inventory, node)
        prof = model.profile(r.profile) if model else None
        current = prof is not None and hashes.of(model, prof) == r.spec_hash
        return (
            state == NodeState.UNREACHABLE,
            state == NodeState.DRAINED,
            not r.alive,
            not current,
            node not in preferred_nodes,
            node,
        )
    return key


def split_copies(
    catalog: Catalog, inventory: Inventory, rid: str, entries: list[tuple[str, RunningRank]],
    model: Model | None, preferred_nodes: tuple[str, ...], hashes: SpecHashes,
) -> tuple[Copy, list[tuple[str, RunningRank]]]:
    """The copy of a replica to keep reasoning about, and the stale ranks beside it."""
    by_rank: dict[int, list[tuple[str, RunningRank]]] = {}
    for e in entries:
        by_rank.setdefault(e[1].rank, []).append(e)
    key = rank_preference(catalog, inventory, model, preferred_nodes, hashes)
    chosen, stale = [], []
    for rank in sorted(by_rank):
        options = sorted(by_rank[rank], key=key)
        chosen.append(options[0])
        stale.extend(options[1:])
    head = chosen[0][1]
    nnodes = max(r.nnodes for _, r in chosen)
    return Copy(rid, head.model, head.profile, nnodes, chosen), stale


def fabric_of(catalog: Catalog, inventory: Inventory, nodes: list[str]) -> tuple[str | None, dict[str, tuple[str, ...]]]:
    """The fabric a running multi-node replica uses: the first in name order all its nodes share."""
    if len(nodes) < 2:
        return None, {}
    per_node = []
    for node in nodes:
        spec = catalog.fleet.node(node)
        if spec is not None and spec.fabrics:
            per_node.append({k: tuple(v) for k, v in spec.fabrics.items()})
        else:
            obs = inventory.node(node)
            per_node.append({f.name: f.hcas for f in obs.fabrics} if obs is not None else {})
    shared = set(per_node[0]).intersection(*per_node[1:]) if per_node else set()
    if not shared:
        return None, {}
    fabric = sorted(shared)[0]
    return fabric, {node: fab[fabric] for node, fab in zip(nodes, per_node)}


def as_placement(catalog: Catalog, inventory: Inventory, copy: Copy, model: Model | None) -> Placement:
    fabric, hcas = fabric_of(catalog, inventory, copy.nodes)
    prof = model.profile(copy.profile) if model else None
    pool = pool_name(fabric, prof) if prof is not None else f"{fabric or 'none'}/unknown"
    return Placement(
        replica=copy.replica, model=copy.model, profile=copy.profile, fabric=fabric, pool=pool,
        nodes=tuple(Assignment(node=n, rank=r.rank, gpus=r.gpus, hcas=hcas.get(n, ()), port=r.port) for n, r in copy.ranks),
    )


def serving(entries: Iterable[tuple[str, RunningRank]]) -> bool:
    """Every rank alive and running (not queued by a scheduler): the copy may hold requests."""
    entries = list(entries)
    return any(r.rank == 0 for _, r in entries) and all(r.alive and not r.waiting for _, r in entries)


def stop_placement(rid: str, model: str, entries: list[tuple[str, RunningRank]]) -> Placement:
    return Placement(
        replica=rid, model=model, profile=entries[0][1].profile, fabric=None, pool="",
        nodes=tuple(Assignment(node=n, rank=r.rank, gpus=r.gpus, port=r.port) for n, r in entries),
    )
