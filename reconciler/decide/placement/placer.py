"""The Placer: which nodes and GPUs each replica runs on, or every reason it cannot run anywhere.

Holds the working state of one pass (capacity.NodeCapacity per node, searched through the
candidate indexes of indexes.py), applies the filters of rules.py, and commits placements
against it. See the package
docstring for the rules it keeps and how it stays fast at fleet scale.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Mapping, Sequence

from reconciler.frozen import frozen
from reconciler.model import (
    Assignment,
    Fleet,
    Inventory,
    Model,
    Placement,
    Profile,
    Rejection,
)
from reconciler.decide.placement.capacity import MAX_PORT, NodeCapacity, pick_gpus
from reconciler.decide.placement.indexes import CandidateIndexes
from reconciler.decide.placement.rejections import rejections_for
from reconciler.decide.placement.rules import (
    LLAMA_CPP,
    assign_llama_roles,
    rank_reason,
    weights_on_every_node,
    dynamic_reason,
    pool_name,
)

# First rendezvous port tried on a multi-node replica's head (torch.distributed's customary default).
DIST_PORT_BASE = 29500
# How far above its first port a profile's port search is expected to reach on one node.
PORT_SEARCH_SPAN = 512


def port_windows(models) -> list[tuple[int, int]]:
    """The port ranges placement hands out from for these models: each profile's first port and
    the rendezvous base, each with PORT_SEARCH_SPAN above it (half-open, merged, sorted)."""
    starts = sorted({p.port for m in models for p in m.profiles} | {DIST_PORT_BASE})
    windows: list[tuple[int, int]] = []
    for lo in starts:
        hi = min(lo + PORT_SEARCH_SPAN, MAX_PORT + 1)
        if windows and lo <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(windows[-1][1], hi))
        else:
            windows.append((lo, hi))
    return windows


# --------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------


@frozen
class Outcome:
    """One desired replica: where it goes, or why it cannot go anywhere."""

    replica: str
    model: str
    placement: Placement | None
    # Every discarded candidate, profile by profile, for an unplaced replica (and, when
    # explain asked for it, for the higher-priority profiles a placed replica skipped).
    rejections: tuple[Rejection, ...] = ()
    # Set instead of rejections when an earlier replica of the model failed against the same state.
    rejections_same_as: str | None = None
    # Per profile that did not fit: how many fleet nodes it was weighed against (for the summary).
    nodes_considered: int = 0
    kept: bool = False  # already running and left where it is

    @property
    def placed(self) -> bool:
        return self.placement is not None


@frozen
class PlacementResult:
    outcomes: Mapping[str, Outcome]  # replica id -> outcome, in the order they were decided

    @property
    def placements(self) -> list[Placement]:
        return [o.placement for o in self.outcomes.values() if o.placement is not None]

    @property
    def unplaced(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.placement is None]


# --------------------------------------------------------------------------
# Ports and GPUs of a chosen set of nodes
# --------------------------------------------------------------------------


def _dist_port(nodes: list[NodeCapacity], assignments: list[Assignment]) -> int | None:
    """The rendezvous port on a multi-node replica's head (never its serving port); None for one node,
    or when the head has none free."""
    if len(nodes) <= 1:
        return None
    return nodes[0].free_port(DIST_PORT_BASE, also_taken=assignments[0].port)


def _in_place_assignments(nodes: list[NodeCapacity], old: Placement, profile: Profile,
                          fabric: str | None) -> list[Assignment] | None:
    """Each rank on its old node again: its old GPUs when they are free and as many as the profile
    asks, else a fresh pick there; a fresh port. None when a node has no free port."""
    assignments = []
    for rank, (n, was) in enumerate(zip(nodes, old.nodes)):
        gpus: tuple[int, ...] = ()
        if profile.gpu_class:
            free = n.free.get(profile.gpu_class, set())
            same = len(was.gpus) == profile.gpus_per_node and all(g in free for g in was.gpus)
            gpus = tuple(was.gpus) if same else pick_gpus(n, profile.gpu_class, profile.gpus_per_node)
        # A port that was seen listening is never handed out, the old copy's own included: its
        # engine may still hold it in TIME_WAIT or be slow to exit when the new one binds.
        port = n.free_port(profile.port)
        if port is None:
            return None
        hcas = n.fabrics.get(fabric, ()) if fabric else ()
        assignments.append(Assignment(node=n.id, rank=rank, gpus=gpus, hcas=hcas, port=port))
    return assignments


# --------------------------------------------------------------------------
# The placer
# --------------------------------------------------------------------------


class Placer(CandidateIndexes):
    """Placement state for one pass: holds what runs, places what is missing.

    Stateful so that the plan can try a replacement with the old copy still
    holding its resources (start the new copy before stopping the old) and,
    when that does not fit, release the old copy and try again. Still pure:
    it only ever reads the values it was built from.
    """

    def __init__(self, fleet: Fleet, inventory: Inventory, models: Iterable[Model] = ()):
        self.models = {m.name: m for m in models}
        super().__init__(fleet, inventory)
        self._single_pairs: dict[tuple[int, int], tuple] = {}  # _try_single's (holders, main) indexes

    # ---- resource bookkeeping --------------------------------------------

    def hold(self, placement: Placement) -> None:
        """Count a running (or just placed) replica's GPUs, ports and presence against its nodes."""
        rid = placement.replica
        for a in placement.nodes:
            n = self.by_id.get(a.node)
            if n is None:
                continue  # a node no longer in the fleet holds nothing we hand out
            before = self._levels(n, a.gpus)
            gpu_class, free, busy = n.gpu_class, n.free, n.busy
            for g in a.gpus:
                cls = gpu_class.get(g)
                if cls is None:
                    continue
                members = free.get(cls)
                if members is not None:
                    members.discard(g)
                busy[g] = rid
            if a.port:
                n.ports_used.add(a.port)
            n.ranks += 1
            hosted = n.models.get(placement.model)
            if hosted is None:
                n.models[placement.model] = [rid]
            else:
                hosted.append(rid)
            self._relevel(n, before)
        if placement.dist_port and placement.nodes:
            head = self.by_id.get(placement.nodes[0].node)
            if head is not None:
                head.ports_used.add(placement.dist_port)

    def release(self, placement: Placement) -> None:
        """Undo hold(): the replica's resources are free again (it is being stopped first)."""
        for a in placement.nodes:
            n = self.by_id.get(a.node)
            if n is None:
                continue
            before = self._levels(n, a.gpus)
            for g in a.gpus:
                cls = n.gpu_class.get(g)
                if cls is None or n.busy.get(g) != placement.replica:
                    continue
                if g in n.unusable:  # a bad GPU a replica ran on goes back to being bad, not free
                    n.busy[g] = n.unusable[g]
                    continue
                del n.busy[g]
                n.free.setdefault(cls, set()).add(g)
            if a.port and a.port not in n.ports_observed:
                n.ports_used.discard(a.port)
            n.ranks -= 1
            hosted = n.models.get(placement.model)
            if hosted and placement.replica in hosted:
                hosted.remove(placement.replica)
                if not hosted:
                    del n.models[placement.model]
            self._relevel(n, before)
        if placement.dist_port and placement.nodes:
            head = self.by_id.get(placement.nodes[0].node)
            if head is not None and placement.dist_port not in head.ports_observed:
                head.ports_used.discard(placement.dist_port)

    # ---- choosing --------------------------------------------------------

    @staticmethod
    def _ok(n: NodeCapacity, model: Model, exclude: frozenset, avoid_hosting: bool) -> bool:
        # Disk is not checked here: the index holds only nodes with room for the weights.
        return n.id not in exclude and not (avoid_hosting and model.name in n.models)

    def _try_single(self, model: Model, profile: Profile, exclude: frozenset) -> list[NodeCapacity] | None:
        need = profile.gpus_per_node if profile.gpu_class else 0
        # The pair is looked up once per (model, profile), not per replica: indexes are updated in place.
        pair_key = (id(model), id(profile))
        pair = self._single_pairs.get(pair_key)
        if pair is None:
            main = (self._index(model, profile, None, ("unprobed",)) if model.needs_weights_on_node
                    else self._index(model, profile, None, None))
            # The nodes holding the weights first (disk is not asked of them): a few dozen per source, in an
            # index of their own, so a replica is not weighed against every holder that is already full.
            holders = self._index(model, profile, None, model.source) if model.source in self._holders else None
            pair = self._single_pairs[pair_key] = (holders, main)
            self._keepalive.append(model)
        holders, main = pair
        nodes = self.nodes
        name = model.name
        # Avoiding nodes that host the model comes before the weights preference when the
        # spread is only preferred: the weights are most likely on the node already running it.
        for avoid in (True,) if model.spread != "preferred" else (True, False):
            for ix in (holders, main):
                if ix is None:
                    continue
                # The scan of LevelIndex.scan, inlined: this loop is the hot path of a fleet-sized pass.
                levels = ix.levels
                buckets = ix.buckets
                for level in levels[bisect_left(levels, need):]:
                    for i in buckets[level]:
                        n = nodes[i]
                        if avoid and name in n.models:
                            continue
                        if exclude and n.id in exclude:
                            continue
                        return [n]  # disk needs no check: the index holds only nodes with room
        return None

    def _try_multi(self, model: Model, profile: Profile, exclude: frozenset) -> tuple[str, list[NodeCapacity]] | None:
        need = profile.gpus_per_node if profile.gpu_class else 0
        # GPU work takes the emptiest nodes (most free GPUs); CPU work the fewest replicas.
        descending = profile.gpu_class is not None
        passes = [True] if model.spread != "preferred" else [True, False]
        for fabric in self.fabric_names:
            holders, main = self._candidates(model, self._node_rules_profile(profile), fabric)
            apart = holders is not None and weights_on_every_node(model, profile)  # holders are not in main
            if len(main.members) + (len(holders.members) if apart else 0) < profile.nodes:
                continue
            # A multi-node replica never mixes launchers: its ranks are one Slurm job, or all over SSH.
            for launcher in self.launchers:
                chosen: list[NodeCapacity] = []
                taken: set[int] = set()
                for avoid in passes:
                    for ix in (holders, main):
                        if ix is None:
                            continue
                        for i in ix.scan(need, descending):
                            if i in taken:
                                continue
                            n = self.nodes[i]
                            if n.launcher != launcher:
                                continue
                            if self._ok(n, model, exclude, avoid):
                                chosen.append(n)
                                taken.add(i)
                                if profile.engine == LLAMA_CPP:
                                    # Every rank needs its binary: the head llama-server, the others the RPC server.
                                    ranked = (assign_llama_roles(chosen, profile.nodes, model, profile)
                                              if len(chosen) >= profile.nodes else None)
                                    if ranked is not None:
                                        return fabric, ranked
                                elif len(chosen) == profile.nodes:
                                    return fabric, chosen
        return None

    def _commit(self, rid: str, model: Model, profile: Profile, fabric: str | None, nodes: list[NodeCapacity]) -> Placement | None:
        assignments = []
        for rank, n in enumerate(nodes):
            gpus = pick_gpus(n, profile.gpu_class, profile.gpus_per_node) if profile.gpu_class else ()
            port = n.free_port(profile.port)
            if port is None:
                return None
            hcas = n.fabrics.get(fabric, ()) if fabric else ()
            assignments.append(Assignment(node=n.id, rank=rank, gpus=gpus, hcas=hcas, port=port))
        dist_port = _dist_port(nodes, assignments)
        if len(nodes) > 1 and dist_port is None:
            return None
        placement = Placement(
            replica=rid, model=model.name, profile=profile.name, fabric=fabric,
            pool=pool_name(fabric, profile), nodes=tuple(assignments), dist_port=dist_port,
        )
        self.hold(placement)
        return placement

    def place(self, model: Model, rid: str, exclude: Iterable[str] = (), explain: bool = False,
              rejections_wanted: bool = True) -> Outcome:
        """Place one replica: profiles by descending priority, the first that fits wins.

        `exclude` names nodes the replica must not use (those of the copy it replaces,
        which keeps running until the new one is up). With `explain`, the rejections
        of higher-priority profiles that did not fit are kept even when a later one does.
        Without `rejections_wanted` a failure carries none (a surge that is only tried: at
        fleet scale each list is a walk of every node).
        """
        exclude = frozenset(exclude)
        rejections: list[Rejection] = []
        for profile in model.profiles:
            if profile.nodes > 1:
                found = self._try_multi(model, profile, exclude)
                fabric, nodes = found if found else (None, None)
            else:
                fabric, nodes = None, self._try_single(model, profile, exclude)
            if nodes is not None:
                placement = self._commit(rid, model, profile, fabric, nodes)
                if placement is not None:
                    return Outcome(rid, model.name, placement, tuple(rejections))
            if explain:
                # Only here, before a later profile's commit changes the state they describe.
                rejections.extend(self.rejections_for(model, profile, exclude))
        if not explain and rejections_wanted:
            # Nothing was committed, so the state is still the one every profile failed against.
            for profile in model.profiles:
                rejections.extend(self.rejections_for(model, profile, exclude))
        return Outcome(rid, model.name, None, tuple(rejections), nodes_considered=len(self.nodes))

    def place_on(self, model: Model, rid: str, old: Placement) -> Outcome:
        """Place a replica again on exactly the nodes of its old copy, in the same rank order (an in-place
        replace: the old copy is released first, by the caller). Its GPUs are reused where the profile's
        shape allows; profiles by priority."""
        nodes = [self.by_id.get(a.node) for a in old.nodes]
        if any(n is None for n in nodes):
            return Outcome(rid, model.name, None)
        rejections: list[Rejection] = []
        for profile in model.profiles:
            if profile.nodes != len(nodes):
                continue
            fabric = old.fabric if profile.nodes > 1 else None
            if profile.nodes > 1 and (fabric is None or any(not n.fabrics.get(fabric) for n in nodes)):
                continue
            why = self._in_place_rejection(nodes, model, profile, fabric)
            if why is not None:
                rejections.append(why)
                continue
            assignments = _in_place_assignments(nodes, old, profile, fabric)
            dist_port = _dist_port(nodes, assignments) if assignments is not None else None
            if assignments is None or (len(nodes) > 1 and dist_port is None):
                continue
            placement = Placement(replica=rid, model=model.name, profile=profile.name, fabric=fabric,
                                  pool=pool_name(fabric, profile), nodes=tuple(assignments), dist_port=dist_port)
            self.hold(placement)
            return Outcome(rid, model.name, placement, tuple(rejections))
        return Outcome(rid, model.name, None, tuple(rejections), nodes_considered=len(nodes))

    def _in_place_rejection(self, nodes: list[NodeCapacity], model: Model, profile: Profile,
                            fabric: str | None) -> Rejection | None:
        """The first rank's node that cannot take this profile in place, with why; None when every one can."""
        static = self._static_list(model, profile)
        for rank, n in enumerate(nodes):
            # In place the replica shares its nodes with whatever it shared them with before: no spread check.
            reason = (static[n.idx] or rank_reason(n, rank, model, profile)
                      or dynamic_reason(n, model, profile, frozenset(), may_share=True))
            if reason is not None:
                return Rejection(profile.name, pool_name(fabric, profile), n.id, reason)
        return None

    def place_missing(self, models: Iterable[Model], decided: dict[str, Outcome],
                      explain: frozenset[str] = frozenset()) -> list[Outcome]:
        """Place every replica of `models` not yet in `decided`, largest demand first.

        Every outcome goes into `decided`; the placed ones are also returned, in the
        order they were placed. Once a replica of a model fails, the later ones of that
        model get `rejections_same_as` it: nothing was placed since, so they would fail
        against the same state, and their rejection lists would only repeat it.
        """
        placed: list[Outcome] = []
        for model in placement_order(models):
            failed_first: str | None = None
            for rid in model.replica_ids():
                if rid in decided:
                    continue
                if failed_first is not None:
                    decided[rid] = Outcome(rid, model.name, None, rejections_same_as=failed_first)
                    continue
                out = self.place(model, rid, explain=model.name in explain)
                decided[rid] = out
                if out.placement is None:
                    failed_first = rid
                else:
                    placed.append(out)
        return placed

    # ---- explaining ------------------------------------------------------

    def rejections_for(self, model: Model, profile: Profile, exclude: Iterable[str] = ()) -> list[Rejection]:
        """Every node weighed for this profile in the current state, with why it was discarded."""
        return rejections_for(self.nodes, self.fabric_names, self._static_list(model, profile),
                              model, profile, frozenset(exclude))


# --------------------------------------------------------------------------
# The whole-catalog entry point
# --------------------------------------------------------------------------


def placement_order(models: Iterable[Model]) -> list[Model]:
    """Models in the order their new replicas are placed: the largest demand first.

    Placing the replicas that need whole nodes before the small ones keeps the
    small ones from fragmenting the nodes the large ones need (first-fit
    decreasing); the model name breaks ties so plans are deterministic.
    """
    def demand(m: Model) -> int:
        if not m.profiles:
            return 0
        p = m.profiles[0]
        return p.nodes * max(p.gpus_per_node, 0)

    return sorted(models, key=lambda m: (-demand(m), m.name))


def place(
    models: Sequence[Model],
    fleet: Fleet,
    inventory: Inventory,
    running: Iterable[Placement] = (),
    explain: Iterable[str] = (),
) -> PlacementResult:
    """Place every desired replica of `models` that is not already in `running`.

    `running` are the replicas that stay where they are (sticky): they hold their
    GPUs and ports before anything new is placed. `explain` names models whose
    placed replicas should also keep the rejections of profiles they skipped.
    """
    placer = Placer(fleet, inventory, models)
    outcomes: dict[str, Outcome] = {}
    for p in running:
        placer.hold(p)
        outcomes[p.replica] = Outcome(p.replica, p.model, p, kept=True)
    placer.place_missing(models, outcomes, frozenset(explain))
    return PlacementResult(outcomes)
