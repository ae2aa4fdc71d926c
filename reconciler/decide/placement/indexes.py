"""The Placer's candidate indexes: for each (static filter, GPU class, fabric[, weights held]),
the nodes that pass, bucketed by free GPUs (capacity.LevelIndex) and kept current as
placements hold and release resources; and the per-node static reasons behind them.

The Placer (placer.py) is built on this class; see the package docstring for why the search
goes through indexes at fleet scale.
"""

from __future__ import annotations

from typing import Iterable

from reconciler.model import Fleet, Inventory, Model, Profile, Reason
from reconciler.decide.placement.capacity import LevelIndex, NodeCapacity
from reconciler.decide.placement.rules import (
    base_key,
    disk_reason,
    has_room,
    node_rules_profile,
    static_key,
    static_reason,
    weights_on_every_node,
    weights_reason,
    without_disk,
)
from reconciler.vocabulary import LauncherKind


class CandidateIndexes:
    """The nodes of one pass, their static reasons, and the indexes the Placer searches."""

    def __init__(self, fleet: Fleet, inventory: Inventory):
        specs = sorted(fleet.nodes, key=lambda n: n.id)
        self.nodes = [NodeCapacity(i, spec, inventory.node(spec.id)) for i, spec in enumerate(specs)]
        self.by_id = {n.id: n for n in self.nodes}
        self.fabric_names = sorted({f for n in self.nodes for f in n.fabrics})
        self.launchers = sorted({n.launcher for n in self.nodes}) or [LauncherKind.SSH]
        self._static_reasons: dict[tuple, list[Reason | None]] = {}
        self._indexes: dict[tuple, LevelIndex] = {}
        # Lookups by object identity: a profile's filters are hashed once, not once per replica.
        self._index_by_profile: dict[tuple, LevelIndex] = {}
        self._keepalive: list = []  # keeps the ids above from being reused while this placer lives
        self._derived: dict[tuple, Profile] = {}
        # node idx -> the indexes it belongs to, so a change of level updates each of them
        self._node_indexes: list[list[LevelIndex]] = [[] for _ in self.nodes]
        holders: dict[str, list[int]] = {}
        for n in self.nodes:
            for w in n.weights or ():
                holders.setdefault(w, []).append(n.idx)
        self._holders = holders
        # Nodes whose weights were never looked at: a path source without fetch may be there (SPEC section 7).
        self._weights_unknown = [n.idx for n in self.nodes if n.weights is None]

    # ---- static filters -------------------------------------------------

    def _node_rules_profile(self, profile: Profile) -> Profile:
        """node_rules_profile, one object per profile: the index caches below are keyed by identity."""
        ruled = node_rules_profile(profile)
        if ruled is profile:
            return profile
        key = ("node-rules", id(profile))
        cached = self._derived.get(key)
        if cached is None:
            cached = self._derived[key] = ruled
            self._keepalive.append(profile)
        return cached

    def _base_list(self, profile: Profile) -> list[Reason | None]:
        """Per node (by index): why it can never take a profile like this one (state, labels, engine, memory)."""
        key = base_key(profile)
        base = self._static_reasons.get(key)
        if base is None:
            plain = without_disk(profile)
            base = [static_reason(n, None, plain) for n in self.nodes]
            self._static_reasons[key] = base
        return base

    def _static_list(self, model: Model, profile: Profile) -> list[Reason | None]:
        """Per node (by index), why it can never take this profile in this pass, or None; disk included."""
        # A llama.cpp replica's workers never read the weights: only its head must hold them, or
        # have room for them (head_reason).
        profile = self._node_rules_profile(profile)
        base = self._base_list(profile)
        needs_weights = weights_on_every_node(model, profile)
        if not profile.min_disk_gb and not needs_weights:
            return base
        key = static_key(model, profile) + ((model.source,) if needs_weights else ())
        lst = self._static_reasons.get(key)
        if lst is None:
            lst = [r if r is not None else ((weights_reason(n, model) if needs_weights else None) or
                                            (disk_reason(n, model, profile) if profile.min_disk_gb else None))
                   for r, n in zip(base, self.nodes)]
            self._static_reasons[key] = lst
        return lst

    def _candidates(self, model: Model, profile: Profile, fabric: str | None) -> tuple[LevelIndex | None, LevelIndex]:
        """The indexes a replica is searched in, preferred first: the nodes holding the weights, then
        every eligible node (or, for weights that cannot be fetched, those never probed for them)."""
        holders = self._index(model, profile, fabric, model.source) if model.source in self._holders else None
        if weights_on_every_node(model, profile):
            return holders, self._index(model, profile, fabric, ("unprobed",))
        return holders, self._index(model, profile, fabric, None)

    def _index(self, model: Model, profile: Profile, fabric: str | None, holders_of: str | None) -> LevelIndex:
        fast = (id(profile), fabric, holders_of)
        idx = self._index_by_profile.get(fast)
        if idx is not None:
            return idx
        idx = self._index_slow(model, profile, fabric, holders_of)
        self._index_by_profile[fast] = idx
        self._keepalive.append(profile)
        return idx

    def _index_slow(self, model: Model, profile: Profile, fabric: str | None, holders_of: str | None) -> LevelIndex:
        if not profile.min_disk_gb:
            key = (base_key(profile), profile.gpu_class, fabric, holders_of)
            idx = self._indexes.get(key)
            if idx is None:
                static = self._base_list(profile)
                if holders_of is None:
                    pool = range(len(self.nodes))
                elif isinstance(holders_of, tuple):  # ("unprobed",): never probed for weights; holders come apart
                    pool = self._weights_unknown
                else:
                    pool = self._holders.get(holders_of, ())
                idx = self._indexes[key] = self._build_index(profile, fabric, (i for i in pool if static[i] is None))
            return idx
        # A profile that needs disk gets an index of the nodes with room, drawn from the members of
        # the disk-blind one: a node without room is never scanned, instead of being passed over
        # again by every replica. A node holding the weights needs no room for them, and holders
        # are always searched apart (first): their index needs no disk filter, and every other index
        # asks for room only, so it is shared by every model of this shape, whatever its weights
        # (an index per source cost a walk of the fleet per model of a fleet-wide update).
        if isinstance(holders_of, str):
            return self._index_slow(model, without_disk(profile), fabric, holders_of)
        key = (base_key(profile), profile.min_disk_gb, profile.gpu_class, fabric, holders_of)
        idx = self._indexes.get(key)
        if idx is None:
            blind = self._index_slow(model, without_disk(profile), fabric, holders_of)
            nodes = self.nodes
            fits = sorted(i for i in blind.members if has_room(nodes[i], profile))
            idx = self._indexes[key] = self._build_index(profile, fabric, fits)
        return idx

    def _build_index(self, profile: Profile, fabric: str | None, candidates: Iterable[int]) -> LevelIndex:
        """The candidates (node indices) that have the profile's GPU class and, if given, adapters on the fabric."""
        cls = profile.gpu_class
        idx = LevelIndex(cls)
        nodes, node_indexes, members, buckets = self.nodes, self._node_indexes, idx.members, idx.buckets
        for i in candidates:
            n = nodes[i]
            if fabric is not None and not n.fabrics.get(fabric):
                continue
            if cls is not None and cls not in n.total:
                continue
            level = n.level(cls)
            bucket = buckets.get(level)
            # Candidates come in ascending node order (every pool is), so a bucket is appended to
            # in order; LevelIndex.add (a sorted insert) only for one that would not be.
            if bucket is None or (bucket and bucket[-1] > i):
                idx.add(i, level)
            else:
                members.add(i)
                bucket.append(i)
            node_indexes[i].append(idx)
        return idx

    # ---- keeping the indexes current ------------------------------------

    def _levels(self, n: NodeCapacity, gpus: Iterable[int]) -> dict[str | None, int]:
        """The levels a change to these GPUs (and to the rank count) can move."""
        levels: dict[str | None, int] = {None: n.ranks}
        gpu_class, free = n.gpu_class, n.free
        for g in gpus:
            cls = gpu_class.get(g)
            if cls is not None and cls not in levels:
                members = free.get(cls)
                levels[cls] = len(members) if members else 0  # n.level(cls), inlined: once per rank held
        return levels

    def _relevel(self, n: NodeCapacity, before: dict[str | None, int]) -> None:
        idx = n.idx
        for ix in self._node_indexes[idx]:
            cls = ix.gpu_class
            old = before.get(cls, -1)
            if old != -1:
                if cls is None:
                    new = n.ranks
                else:
                    members = n.free.get(cls)
                    new = len(members) if members else 0
                if new != old:
                    ix.move(idx, old, new)
