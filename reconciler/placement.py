"""Which nodes and GPUs each replica runs on, or every reason it cannot run anywhere.

Pure: a function of the catalog, the fleet, an inventory snapshot and the
replicas already running. No I/O, no clock, deterministic (ties go to the
lowest node id).

Two rules here are not negotiable, and the rest of this module exists to keep
them true:

- a multi-node replica never spans two fabrics (only that fabric's HCAs are
  handed out), and
- a tensor-parallel group never mixes GPU classes.

Breaking either gives a replica that starts, passes its health check and then
hangs or crawls under load: it looks like success until traffic arrives.

Every candidate that was considered and discarded gets a Rejection naming the
profile, the pool, the node and the number that failed. "No suitable nodes"
with no reason is the failure people complain about most in schedulers of
this kind, so a rejection is never a bare "does not fit".

At fleet scale (thousands of nodes, ten thousand replicas) the search must not
scan every node for every replica. Nodes are indexed per (static filter, GPU
class, fabric[, weights held]) into buckets by free GPUs (or by replicas
hosted, for CPU-only work), each bucket kept sorted by node id, so the bin
packing choice is the first eligible node of the lowest bucket that fits.
Per-node rejection lists are only built when a replica could not be placed
(or when explain asks for them), and only once per model: the next unplaced
replica of the same model failed against the same state.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from reconciler.errors import Problem
from reconciler.model import (
    Assignment,
    Catalog,
    Fleet,
    Inventory,
    Model,
    ObservedNode,
    Placement,
    Profile,
    Reason,
    RejectKind,
    Rejection,
    figure,
)

MAX_PORT = 65535
# First rendezvous port tried on a multi-node replica's head (torch.distributed's customary default).
DIST_PORT_BASE = 29500
# How far above its first port a profile's port search is expected to reach on one node.
PORT_SEARCH_SPAN = 512
# Nodes named per group in a summary line unless --all is given.
SUMMARY_NAMES = 3

_SCHEDULABLE = "ready"
# Reasons without figures, one value each.
_REPLACED_COPY = Reason(RejectKind.REPLACED_COPY)
_INCOMPLETE = Reason(RejectKind.INCOMPLETE)
_NO_FABRIC = Reason(RejectKind.NO_FABRIC)
_IPV6_RPC = Reason(RejectKind.IPV6_RPC)


def pool_name(fabric: str | None, profile: Profile) -> str:
    return f"{fabric or 'none'}/{profile.class_label}"


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
# Working state of one node during a placement pass
# --------------------------------------------------------------------------


class _Node:
    __slots__ = (
        "idx", "id", "state", "state_reason", "labels", "engines", "memory_gib", "disk_path",
        "disk_free_gib", "weights", "fabrics", "gpu_class", "free", "total", "busy", "nvlink",
        "ranks", "models", "ports_used", "ports_observed", "obs", "all_nvlinked", "launcher", "held",
        "llama_cpp", "data_ipv6",
    )

    def __init__(self, idx: int, spec, obs: ObservedNode | None):
        self.idx = idx
        self.id = spec.id
        self.obs = obs
        # Operator intent (fleet.yaml) wins for state; an unreachable or unseen node is unreachable whatever it says.
        if obs is None:
            self.state, self.state_reason = "unreachable", "missing from the inventory snapshot"
        elif obs.state in ("unreachable", "unusable"):
            self.state, self.state_reason = obs.state, obs.reason
        elif obs.state == "cordoned" and spec.state == "ready":
            # A scheduler's drain (Slurm DRAIN) is a fact of the node: it takes nothing new.
            self.state, self.state_reason = "cordoned", obs.reason
        else:
            self.state, self.state_reason = spec.state, ""
        self.launcher = getattr(spec, "launcher", "ssh")
        self.labels = spec.labels
        self.engines = obs.engines if obs is not None else None
        self.llama_cpp = obs.llama_cpp if obs is not None else None
        self.data_ipv6 = spec.data_host.is_ipv6
        self.memory_gib = obs.memory_total_mb / 1024 if obs is not None and obs.memory_total_mb else None
        self.disk_path = None
        self.disk_free_gib = None
        if obs is not None and obs.disks:
            want = spec.model_dirs[0] if spec.model_dirs else None
            disk = next((d for d in obs.disks if d.path == want), None) if want else obs.disks[0]
            if disk is not None:
                self.disk_path, self.disk_free_gib = disk.path, disk.free_bytes / (1 << 30)
        self.weights = frozenset(obs.weights) if obs is not None and obs.weights is not None else None
        # Fabric membership: what the operator declared, else what the probe observed.
        if spec.fabrics:
            self.fabrics = {name: tuple(hcas) for name, hcas in spec.fabrics.items()}
        elif obs is not None:
            self.fabrics = {f.name: tuple(f.hcas) for f in obs.fabrics}
        else:
            self.fabrics = {}
        self.gpu_class: dict[int, str] = {}
        self.free: dict[str, set[int]] = {}
        self.total: dict[str, int] = {}
        self.busy: dict[int, str] = {}  # gpu index -> who holds it
        self.held: dict[str, list[str]] = {}  # class -> other scheduler jobs holding its GPUs here
        self.nvlink: dict[int, tuple[int, ...]] = {}
        for g in obs.gpus if obs is not None else ():
            cls = spec.gpu_class or g.gpu_class
            self.gpu_class[g.index] = cls
            self.total[cls] = self.total.get(cls, 0) + 1
            self.nvlink[g.index] = g.nvlink_peers
            if g.held_by:
                self.busy[g.index] = g.held_by
                self.held.setdefault(cls, []).append(g.held_by)
            elif g.processes:
                p = g.processes[0]
                self.busy[g.index] = f"foreign process {p.pid} ({p.name})" if p.name else f"foreign process {p.pid}"
            else:
                self.free.setdefault(cls, set()).add(g.index)
        indices = set(self.nvlink)
        self.all_nvlinked = len(indices) > 1 and all(
            set(peers) | {g} >= indices for g, peers in self.nvlink.items()
        )
        self.ranks = 0
        self.models: dict[str, list[str]] = {}  # model -> its replicas hosted here
        self.ports_observed = frozenset(obs.ports_in_use) if obs is not None else frozenset()
        self.ports_used: set[int] = set(self.ports_observed)

    def level(self, gpu_class: str | None) -> int:
        if gpu_class is None:
            return self.ranks
        free = self.free.get(gpu_class)
        return len(free) if free else 0

    def free_port(self, start: int, also_taken: int | None = None) -> int | None:
        p = start
        used = self.ports_used
        while p in used or p == also_taken:
            p += 1
        return p if p <= MAX_PORT else None


# --------------------------------------------------------------------------
# Indexes: eligible nodes bucketed by level, each bucket sorted by node index
# --------------------------------------------------------------------------


class _Index:
    """The nodes that pass one static filter, bucketed by their level.

    The level is the count of free GPUs of the index's class, or, for CPU-only
    work, the number of replica ranks a node hosts. Node indices follow node id
    order, so the first entry of a bucket is the deterministic tie-break.
    """

    __slots__ = ("gpu_class", "buckets", "levels", "members")

    def __init__(self, gpu_class: str | None):
        self.gpu_class = gpu_class
        self.buckets: dict[int, list[int]] = {}
        self.levels: list[int] = []  # every level that has had a bucket, ascending
        self.members: set[int] = set()

    def _bucket(self, level: int) -> list[int]:
        b = self.buckets.get(level)
        if b is None:
            b = self.buckets[level] = []
            insort(self.levels, level)
        return b

    def add(self, idx: int, level: int) -> None:
        self.members.add(idx)
        insort(self._bucket(level), idx)

    def move(self, idx: int, old: int, new: int) -> None:
        if old == new:
            return
        b = self.buckets[old]
        del b[bisect_left(b, idx)]
        insort(self._bucket(new), idx)

    def scan(self, min_level: int, descending: bool) -> Iterator[int]:
        levels = self.levels[bisect_left(self.levels, min_level):]
        buckets = self.buckets
        for level in reversed(levels) if descending else levels:
            b = buckets[level]
            if b:
                yield from b


# --------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class PlacementResult:
    outcomes: Mapping[str, Outcome]  # replica id -> outcome, in the order they were decided

    @property
    def placements(self) -> list[Placement]:
        return [o.placement for o in self.outcomes.values() if o.placement is not None]

    @property
    def unplaced(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.placement is None]


# --------------------------------------------------------------------------
# The placer
# --------------------------------------------------------------------------


def _without_disk(profile: Profile) -> Profile:
    """The profile without its disk requirement (the part of the filter that depends on the model)."""
    return replace(profile, min_disk_gb=0) if profile.min_disk_gb else profile


def _selector_key(profile: Profile) -> tuple:
    return tuple(sorted(profile.node_selector.items()))


def _base_key(profile: Profile) -> tuple:
    engine = None if profile.engine == "command" else profile.engine
    # llama.cpp's filter differs by shape: one node must run llama-server; a multi-node
    # replica takes nodes with either role (the ranks are matched to roles when choosing).
    shape = (profile.nodes > 1) if profile.engine == LLAMA_CPP else None
    return (engine, _selector_key(profile), profile.min_memory_gb or 0, shape)


LLAMA_CPP = "llama.cpp"
RPC_SERVER_NAMES = "ggml-rpc-server or rpc-server"


def llama_rank_reason(binaries, rank: int) -> Reason | None:
    """Why a node cannot run this rank of a llama.cpp replica (its binaries), or None."""
    if binaries is None or binaries.can_run_rank(rank):
        return None
    if rank == 0:
        return Reason(RejectKind.LLAMA_BINARY, "llama-server", "head")
    return Reason(RejectKind.LLAMA_BINARY, RPC_SERVER_NAMES, "worker")


def _weights_on_every_node(model: Model, profile: Profile) -> bool:
    """A path source without fetch is needed on every node of the replica (not only on its head)."""
    return model.needs_weights_on_node and (profile.nodes <= 1 or profile.reads_weights(1))


def _weights_reason(node, model: Model) -> Reason | None:
    """A path source without `fetch` is a hard requirement, on nodes whose weights were probed."""
    if model.needs_weights_on_node and node.weights is not None and model.source not in node.weights:
        return Reason(RejectKind.WEIGHTS, model.source)
    return None


def _head_reason(node, model: Model) -> Reason | None:
    """Why a node cannot be the head (rank 0) of a multi-node llama.cpp replica: its binary, then the weights."""
    return llama_rank_reason(node.llama_cpp, 0) or _weights_reason(node, model)


def _rank_reason(node, rank: int, model: Model, profile: Profile) -> Reason | None:
    """What one rank of a multi-node llama.cpp replica asks of its node beyond the profile's
    static filter (its role's binary; the weights on the head), or None."""
    if profile.engine != LLAMA_CPP or profile.nodes <= 1:
        return None
    return _head_reason(node, model) if rank == 0 else llama_rank_reason(node.llama_cpp, rank)


def _llama_roles_reason(qualified: list, model: Model, profile: Profile, fabric: str) -> Reason:
    """Why enough qualifying nodes on a fabric still make no llama.cpp replica: the roles they can take."""
    servers = [n for n in qualified if llama_rank_reason(n.llama_cpp, 0) is None]
    heads = sum(1 for n in servers if _weights_reason(n, model) is None)
    workers = sum(1 for n in qualified if llama_rank_reason(n.llama_cpp, 1) is None)
    if servers and not heads:
        # Only the head reads the weights: the workers are fine; no node that could lead holds them.
        return Reason(RejectKind.HEAD_WEIGHTS, model.source, profile.nodes, len(servers), detail=fabric)
    return Reason(RejectKind.LLAMA_ROLES, fabric, profile.nodes, len(qualified),
                  detail=f"{heads} have llama-server and {workers} the RPC server")


def _assign_llama_roles(candidates: list, count: int, model: Model) -> list | None:
    """Rank order for a multi-node llama.cpp replica: a head that has llama-server (and the
    weights, when they cannot be fetched), then count-1 nodes that have the RPC server;
    candidates in preference order; None if impossible."""
    for head in candidates:
        if _head_reason(head, model) is not None:
            continue
        workers = [c for c in candidates if c is not head and llama_rank_reason(c.llama_cpp, 1) is None]
        if len(workers) >= count - 1:
            return [head] + workers[: count - 1]
    return None


def _static_key(model: Model, profile: Profile) -> tuple:
    return _base_key(profile) + ((profile.min_disk_gb, model.source) if profile.min_disk_gb else None,)


class Placer:
    """Placement state for one pass: holds what runs, places what is missing.

    Stateful so that the plan can try a replacement with the old copy still
    holding its resources (start the new copy before stopping the old) and,
    when that does not fit, release the old copy and try again. Still pure:
    it only ever reads the values it was built from.
    """

    def __init__(self, fleet: Fleet, inventory: Inventory, models: Iterable[Model] = ()):
        self.models = {m.name: m for m in models}
        specs = sorted(fleet.nodes, key=lambda n: n.id)
        self.nodes = [_Node(i, spec, inventory.node(spec.id)) for i, spec in enumerate(specs)]
        self.by_id = {n.id: n for n in self.nodes}
        self.fabric_names = sorted({f for n in self.nodes for f in n.fabrics})
        self.launchers = sorted({n.launcher for n in self.nodes}) or ["ssh"]
        self._static_reasons: dict[tuple, list[Reason | None]] = {}
        self._indexes: dict[tuple, _Index] = {}
        # Lookups by object identity: a profile's filters are hashed once, not once per replica.
        self._index_by_profile: dict[tuple, _Index] = {}
        self._keepalive: list = []  # keeps the ids above from being reused while this placer lives
        # node idx -> the indexes it belongs to, so a change of level updates each of them
        self._node_indexes: list[list[_Index]] = [[] for _ in self.nodes]
        holders: dict[str, list[int]] = {}
        for n in self.nodes:
            for w in n.weights or ():
                holders.setdefault(w, []).append(n.idx)
        self._holders = holders
        # Nodes whose weights were never looked at: a path source without fetch may be there (SPEC section 7).
        self._weights_unknown = [n.idx for n in self.nodes if n.weights is None]

    # ---- static filters -------------------------------------------------

    def _static_reason(self, node: _Node, model: Model, profile: Profile) -> Reason | None:
        """Why this node can never take this profile in this pass, or None."""
        if node.state != _SCHEDULABLE:
            return Reason(RejectKind.NODE_STATE, node.state, detail=node.state_reason)
        for key, want in sorted(profile.node_selector.items()):
            have = node.labels.get(key)
            if have != want:
                return Reason(RejectKind.LABEL, key, want, have)
        if profile.engine != "command" and node.engines is not None and profile.engine not in node.engines:
            return Reason(RejectKind.ENGINE, profile.engine)
        if profile.engine == LLAMA_CPP:
            if profile.nodes <= 1:
                reason = llama_rank_reason(node.llama_cpp, 0)
                if reason is not None:
                    return reason
            elif node.data_ipv6:
                return _IPV6_RPC
        if profile.min_memory_gb and node.memory_gib is not None and node.memory_gib < profile.min_memory_gb:
            return Reason(RejectKind.MEMORY, "memory", profile.min_memory_gb, round(node.memory_gib, 1))
        if profile.min_disk_gb:
            return self._disk_reason(node, model, profile)
        return None

    @staticmethod
    def _has_room(node: _Node, profile: Profile) -> bool:
        """Room for weights on the node's model disk (or nothing known about it)."""
        return node.disk_free_gib is None or node.disk_free_gib >= profile.min_disk_gb

    @staticmethod
    def _disk_ok(node: _Node, model: Model, profile: Profile) -> bool:
        """Room for the weights on the node's model disk, or the weights already there (or nothing known)."""
        free = node.disk_free_gib
        return free is None or free >= profile.min_disk_gb or (node.weights is not None and model.source in node.weights)

    def _disk_reason(self, node: _Node, model: Model, profile: Profile) -> Reason | None:
        if self._disk_ok(node, model, profile):
            return None
        # Rounded down, so "needs 100" is never shown beside "has 100.0".
        have = math.floor(node.disk_free_gib * 10) / 10
        return Reason(RejectKind.DISK, "disk", profile.min_disk_gb, have, detail=node.disk_path)

    def _base_list(self, profile: Profile) -> list[Reason | None]:
        """Per node (by index): why it can never take a profile like this one (state, labels, engine, memory)."""
        base_key = _base_key(profile)
        base = self._static_reasons.get(base_key)
        if base is None:
            plain = _without_disk(profile)
            base = [self._static_reason(n, None, plain) for n in self.nodes]
            self._static_reasons[base_key] = base
        return base

    def _static_list(self, model: Model, profile: Profile) -> list[Reason | None]:
        """Per node (by index), why it can never take this profile in this pass, or None; disk included."""
        base = self._base_list(profile)
        # A llama.cpp replica's workers never read the weights: only its head must hold them (_head_reason).
        needs_weights = _weights_on_every_node(model, profile)
        if not profile.min_disk_gb and not needs_weights:
            return base
        key = _static_key(model, profile) + ((model.source,) if needs_weights else ())
        lst = self._static_reasons.get(key)
        if lst is None:
            lst = [r if r is not None else ((_weights_reason(n, model) if needs_weights else None) or
                                            (self._disk_reason(n, model, profile) if profile.min_disk_gb else None))
                   for r, n in zip(base, self.nodes)]
            self._static_reasons[key] = lst
        return lst

    def _candidates(self, model: Model, profile: Profile, fabric: str | None) -> tuple[_Index | None, _Index]:
        """The indexes a replica is searched in, preferred first: the nodes holding the weights, then
        every eligible node (or, for weights that cannot be fetched, those never probed for them)."""
        holders = self._index(model, profile, fabric, model.source) if model.source in self._holders else None
        if _weights_on_every_node(model, profile):
            return holders, self._index(model, profile, fabric, ("unprobed",))
        return holders, self._index(model, profile, fabric, None)

    def _index(self, model: Model, profile: Profile, fabric: str | None, holders_of: str | None) -> _Index:
        fast = (id(profile), fabric, holders_of)
        idx = self._index_by_profile.get(fast)
        if idx is not None:
            return idx
        idx = self._index_slow(model, profile, fabric, holders_of)
        self._index_by_profile[fast] = idx
        self._keepalive.append(profile)
        return idx

    def _index_slow(self, model: Model, profile: Profile, fabric: str | None, holders_of: str | None) -> _Index:
        if not profile.min_disk_gb:
            key = (_base_key(profile), profile.gpu_class, fabric, holders_of)
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
            return self._index_slow(model, _without_disk(profile), fabric, holders_of)
        key = (_base_key(profile), profile.min_disk_gb, profile.gpu_class, fabric, holders_of)
        idx = self._indexes.get(key)
        if idx is None:
            blind = self._index_slow(model, _without_disk(profile), fabric, holders_of)
            nodes = self.nodes
            fits = sorted(i for i in blind.members if self._has_room(nodes[i], profile))
            idx = self._indexes[key] = self._build_index(profile, fabric, fits)
        return idx

    def _build_index(self, profile: Profile, fabric: str | None, candidates: Iterable[int]) -> _Index:
        """The candidates (node indices) that have the profile's GPU class and, if given, adapters on the fabric."""
        idx = _Index(profile.gpu_class)
        for i in candidates:
            n = self.nodes[i]
            if fabric is not None and not n.fabrics.get(fabric):
                continue
            if profile.gpu_class is not None and profile.gpu_class not in n.total:
                continue
            idx.add(i, n.level(profile.gpu_class))
            self._node_indexes[i].append(idx)
        return idx

    # ---- resource bookkeeping --------------------------------------------

    def _levels(self, n: _Node, gpus: Iterable[int]) -> dict[str | None, int]:
        """The levels a change to these GPUs (and to the rank count) can move."""
        levels: dict[str | None, int] = {None: n.ranks}
        for g in gpus:
            cls = n.gpu_class.get(g)
            if cls is not None and cls not in levels:
                levels[cls] = n.level(cls)
        return levels

    def _relevel(self, n: _Node, before: dict[str | None, int]) -> None:
        for ix in self._node_indexes[n.idx]:
            old = before.get(ix.gpu_class, -1)
            if old != -1:
                ix.move(n.idx, old, n.level(ix.gpu_class))

    def hold(self, placement: Placement) -> None:
        """Count a running (or just placed) replica's GPUs, ports and presence against its nodes."""
        for a in placement.nodes:
            n = self.by_id.get(a.node)
            if n is None:
                continue  # a node no longer in the fleet holds nothing we hand out
            before = self._levels(n, a.gpus)
            for g in a.gpus:
                cls = n.gpu_class.get(g)
                if cls is None:
                    continue
                n.free.get(cls, set()).discard(g)
                n.busy[g] = placement.replica
            if a.port:
                n.ports_used.add(a.port)
            n.ranks += 1
            n.models.setdefault(placement.model, []).append(placement.replica)
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

    def _pick_gpus(self, n: _Node, gpu_class: str, want: int) -> tuple[int, ...]:
        """`want` free GPUs of the class, inside one NVLink domain when one has room.

        A tensor-parallel group that falls back to PCIe for its all-reduces runs
        several times slower. Among domains that have room, the smallest is used,
        keeping larger domains whole for larger groups. Without topology (or no
        domain large enough) this takes the lowest free indices.
        """
        free = sorted(n.free[gpu_class])
        if want == 1 or want == len(free) or n.all_nvlinked:
            # One GPU, all of them, or every GPU linked to every other: any set is one domain.
            return tuple(free[:want])
        free_set = set(free)
        seen: set[int] = set()
        domains: list[list[int]] = []
        for g in free:
            if g in seen:
                continue
            comp, stack = [], [g]
            seen.add(g)
            while stack:
                cur = stack.pop()
                comp.append(cur)
                for peer in n.nvlink.get(cur, ()):
                    if peer in free_set and peer not in seen:
                        seen.add(peer)
                        stack.append(peer)
            domains.append(sorted(comp))
        fitting = [d for d in domains if len(d) >= want and len(d) > 1]
        if fitting:
            best = min(fitting, key=lambda d: (len(d), d[0]))
            return tuple(best[:want])
        return tuple(free[:want])

    @staticmethod
    def _ok(n: _Node, model: Model, exclude: frozenset, avoid_hosting: bool) -> bool:
        # Disk is not checked here: the index holds only nodes with room for the weights.
        return n.id not in exclude and not (avoid_hosting and model.name in n.models)

    def _holder_fit(self, model: Model, profile: Profile, exclude: frozenset, avoid: bool, need: int) -> _Node | None:
        """The bin-packing choice among the nodes holding the weights: fewest free (of the class) that
        still fits, then node id, as the index scan would pick. The holders of one source are a few
        nodes, so they are scanned, not indexed: an index per source costs a walk to build and a
        re-level on every placement for each model of a fleet-wide update."""
        static = self._base_list(profile)
        cls = profile.gpu_class
        best: tuple[int, int] | None = None
        for i in self._holders.get(model.source, ()):
            if static[i] is not None:
                continue
            n = self.nodes[i]
            if cls is not None and cls not in n.total:
                continue
            level = n.level(cls)
            if level < need or (best is not None and (level, i) >= best):
                continue
            if (avoid and model.name in n.models) or (exclude and n.id in exclude):
                continue
            best = (level, i)
        return self.nodes[best[1]] if best is not None else None

    def _try_single(self, model: Model, profile: Profile, exclude: frozenset) -> list[_Node] | None:
        need = profile.gpus_per_node if profile.gpu_class else 0
        main = (self._index(model, profile, None, ("unprobed",)) if model.needs_weights_on_node
                else self._index(model, profile, None, None))
        nodes = self.nodes
        name = model.name
        # Avoiding nodes that host the model comes before the weights preference when the
        # spread is only preferred: the weights are most likely on the node already running it.
        for avoid in (True,) if model.spread != "preferred" else (True, False):
            held = self._holder_fit(model, profile, exclude, avoid, need) if model.source in self._holders else None
            if held is not None:
                return [held]  # disk is not asked of a node that holds the weights
            for ix in (main,):
                if ix is None:
                    continue
                # The scan of _Index.scan, inlined: this loop is the hot path of a fleet-sized pass.
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

    def _try_multi(self, model: Model, profile: Profile, exclude: frozenset) -> tuple[str, list[_Node]] | None:
        need = profile.gpus_per_node if profile.gpu_class else 0
        # GPU work takes the emptiest nodes (most free GPUs); CPU work the fewest replicas.
        descending = profile.gpu_class is not None
        passes = [True] if model.spread != "preferred" else [True, False]
        for fabric in self.fabric_names:
            holders, main = self._candidates(model, profile, fabric)
            apart = holders is not None and _weights_on_every_node(model, profile)  # holders are not in main
            if len(main.members) + (len(holders.members) if apart else 0) < profile.nodes:
                continue
            # A multi-node replica never mixes launchers: its ranks are one Slurm job, or all over SSH.
            for launcher in self.launchers:
                chosen: list[_Node] = []
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
                                    ranked = (_assign_llama_roles(chosen, profile.nodes, model)
                                              if len(chosen) >= profile.nodes else None)
                                    if ranked is not None:
                                        return fabric, ranked
                                elif len(chosen) == profile.nodes:
                                    return fabric, chosen
        return None

    def _commit(self, rid: str, model: Model, profile: Profile, fabric: str | None, nodes: list[_Node]) -> Placement | None:
        assignments = []
        for rank, n in enumerate(nodes):
            gpus = self._pick_gpus(n, profile.gpu_class, profile.gpus_per_node) if profile.gpu_class else ()
            port = n.free_port(profile.port)
            if port is None:
                return None
            hcas = n.fabrics.get(fabric, ()) if fabric else ()
            assignments.append(Assignment(node=n.id, rank=rank, gpus=gpus, hcas=hcas, port=port))
        dist_port = None
        if len(nodes) > 1:
            dist_port = nodes[0].free_port(DIST_PORT_BASE, also_taken=assignments[0].port)
            if dist_port is None:
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
            static = self._static_list(model, profile)
            # In place the replica shares its nodes with whatever it shared them with before: no spread check.
            reasons = [(n, static[n.idx] or _rank_reason(n, rank, model, profile)
                        or self._dynamic_reason(n, model, profile, frozenset(), may_share=True))
                       for rank, n in enumerate(nodes)]
            why = next(((n, r) for n, r in reasons if r), None)
            if why is not None:
                rejections.append(Rejection(profile.name, pool_name(fabric, profile), why[0].id, why[1]))
                continue
            assignments = []
            for rank, (n, was) in enumerate(zip(nodes, old.nodes)):
                gpus: tuple[int, ...] = ()
                if profile.gpu_class:
                    free = n.free.get(profile.gpu_class, set())
                    same = len(was.gpus) == profile.gpus_per_node and all(g in free for g in was.gpus)
                    gpus = tuple(was.gpus) if same else self._pick_gpus(n, profile.gpu_class, profile.gpus_per_node)
                # A port that was seen listening is never handed out, the old copy's own included: its
                # engine may still hold it in TIME_WAIT or be slow to exit when the new one binds.
                port = n.free_port(profile.port)
                if port is None:
                    break
                hcas = n.fabrics.get(fabric, ()) if fabric else ()
                assignments.append(Assignment(node=n.id, rank=rank, gpus=gpus, hcas=hcas, port=port))
            if len(assignments) != len(nodes):
                continue
            dist_port = None
            if len(nodes) > 1:
                dist_port = nodes[0].free_port(DIST_PORT_BASE, also_taken=assignments[0].port)
                if dist_port is None:
                    continue
            placement = Placement(replica=rid, model=model.name, profile=profile.name, fabric=fabric,
                                  pool=pool_name(fabric, profile), nodes=tuple(assignments), dist_port=dist_port)
            self.hold(placement)
            return Outcome(rid, model.name, placement, tuple(rejections))
        return Outcome(rid, model.name, None, tuple(rejections), nodes_considered=len(nodes))

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

    def _dynamic_reason(self, n: _Node, model: Model, profile: Profile, exclude: frozenset,
                        *, may_share: bool = False) -> Reason | None:
        if n.id in exclude:
            return _REPLACED_COPY
        if model.spread != "preferred" and model.name in n.models and not may_share:
            return Reason(RejectKind.HOSTS_MODEL, detail=n.models[model.name][0])
        if profile.gpu_class is not None:
            have = n.level(profile.gpu_class)
            if have < profile.gpus_per_node:
                others = sorted(c for c in n.total if c != profile.gpu_class)
                other_classes = ", ".join(others) if have == 0 and others and profile.gpu_class not in n.total else ""
                held = n.held.get(profile.gpu_class, [])
                return Reason(RejectKind.GPUS, profile.gpu_class, profile.gpus_per_node, have, detail=other_classes,
                              held_by=held_summary(held))
        if n.free_port(profile.port) is None:
            return Reason(RejectKind.NO_PORT, "port", profile.port)
        return None

    def rejections_for(self, model: Model, profile: Profile, exclude: Iterable[str] = ()) -> list[Rejection]:
        """Every node weighed for this profile in the current state, with why it was discarded."""
        exclude = frozenset(exclude)
        static = self._static_list(model, profile)
        out: list[Rejection] = []
        if profile.nodes <= 1:
            pool = pool_name(None, profile)
            for n in self.nodes:
                reason = static[n.idx] or self._dynamic_reason(n, model, profile, exclude)
                if reason is None:
                    # It qualifies on its own; only a later step (ports for every rank) failed.
                    reason = _INCOMPLETE
                out.append(Rejection(profile.name, pool, n.id, reason))
            return out
        if not self.fabric_names:
            return [Rejection(profile.name, pool_name(None, profile), "", Reason(RejectKind.NO_FABRICS, requested=profile.nodes))]
        for fabric in self.fabric_names:
            pool = pool_name(fabric, profile)
            qualify = 0
            qualified: list[_Node] = []
            by_launcher: dict[str, int] = {}
            for n in self.nodes:
                if fabric not in n.fabrics:
                    continue
                reason = static[n.idx]
                if reason is None and not n.fabrics[fabric]:
                    reason = Reason(RejectKind.NO_ADAPTERS, fabric)
                if reason is None:
                    reason = self._dynamic_reason(n, model, profile, exclude)
                if reason is None:
                    qualify += 1
                    qualified.append(n)
                    by_launcher[n.launcher] = by_launcher.get(n.launcher, 0) + 1
                else:
                    out.append(Rejection(profile.name, pool, n.id, reason))
            if qualify >= profile.nodes and len(by_launcher) > 1:
                counts = ", ".join(f"{c} {l}" for l, c in sorted(by_launcher.items()))
                out.append(Rejection(profile.name, pool, "", Reason(RejectKind.MIXED_LAUNCHERS, fabric, profile.nodes,
                                                                    max(by_launcher.values()), detail=counts)))
                continue
            if profile.engine == LLAMA_CPP and qualify >= profile.nodes:
                out.append(Rejection(profile.name, pool, "", _llama_roles_reason(qualified, model, profile, fabric)))
                continue
            out.append(Rejection(profile.name, pool, "", Reason(RejectKind.FABRIC_SHORT, fabric, profile.nodes, qualify)))
        pool = pool_name(None, profile)
        for n in self.nodes:
            if not n.fabrics:
                # A node that cannot run anything says so first: an unreachable node shows no
                # fabric only because nothing was observed, and "no fabric" would send the
                # operator looking at cabling instead of at the node.
                state = static[n.idx] if n.state != _SCHEDULABLE else None
                out.append(Rejection(profile.name, pool, n.id, state or _NO_FABRIC))
        return out


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


def held_summary(held: Sequence[str]) -> str:
    """`2 held by other Slurm jobs: Slurm job 5 of alice` (the first three jobs named)."""
    if not held:
        return ""
    jobs = sorted(set(held))
    return f"{len(held)} held by other Slurm jobs: {', '.join(jobs[:3])}{', ...' if len(jobs) > 3 else ''}"


# --------------------------------------------------------------------------
# Summaries in the style of the Kubernetes scheduler, with nodes named
# --------------------------------------------------------------------------

def _group(why: Reason) -> tuple[str, str] | None:
    """The group a node's reason joins in a summary line: (said of one node, said of several)."""
    key = (why.kind, why.resource, why.requested)
    label = _GROUP_CACHE.get(key)
    if label is None:
        label = _GROUP_CACHE[key] = _group_label(why)
    return label or None


def _group_label(why: Reason) -> tuple[str, str] | tuple[()]:
    k = why.kind
    if k is RejectKind.NODE_STATE:
        return f"is {why.resource}", f"are {why.resource}"
    if k is RejectKind.LABEL:
        return f"lacks label {why.resource}={why.requested}", f"lack label {why.resource}={why.requested}"
    if k is RejectKind.ENGINE:
        return f"lacks engine {why.resource}", f"lack engine {why.resource}"
    if k is RejectKind.LLAMA_BINARY:
        what = "llama-server" if why.requested == "head" else "llama.cpp RPC server"
        return f"has no {what}", f"have no {what}"
    if k is RejectKind.GPUS:
        return f"has too few free {why.resource} GPUs", f"have too few free {why.resource} GPUs"
    if k is RejectKind.WEIGHTS:
        return f"lacks the weights {why.resource} (no fetch)", f"lack the weights {why.resource} (no fetch)"
    return _GROUPS.get(k, ())


# (kind, resource, requested) -> group label; a few dozen distinct ones per pass, asked 100,000 times.
_GROUP_CACHE: dict[tuple, tuple[str, str] | tuple[()]] = {}
_GROUPS = {
    RejectKind.MEMORY: ("has too little memory", "have too little memory"),
    RejectKind.DISK: ("has too little disk for the weights", "have too little disk for the weights"),
    RejectKind.HOSTS_MODEL: ("already hosts this model", "already host this model"),
    RejectKind.REPLACED_COPY: ("runs the copy being replaced", "run the copy being replaced"),
    RejectKind.NO_FABRIC: ("is on no fabric", "are on no fabric"),
    RejectKind.NO_ADAPTERS: ("has no adapters on the fabric", "have no adapters on the fabric"),
    RejectKind.IPV6_RPC: ("has an IPv6 data address (llama.cpp RPC is IPv4 only)",
                          "have an IPv6 data address (llama.cpp RPC is IPv4 only)"),
}
# The figures a summary shows beside each node's name, for the kinds that have them.
_DETAIL = {
    RejectKind.MEMORY: lambda r: f"{figure(r.available)} GiB, needs {figure(r.requested)}",
    RejectKind.DISK: lambda r: f"{figure(r.available)} GiB free, needs {figure(r.requested)}",
    RejectKind.GPUS: lambda r: f"{r.available} free, needs {r.requested}",
}


def _summary_entry(node: str, why: Reason) -> tuple[tuple, str]:
    """(sort key, text) of one node in its group: the nearest misses first ("h100-a3: 7 free, needs 8"
    before "l40s-c1: 0 free, needs 8"), then by name."""
    detail = _DETAIL.get(why.kind)
    if detail is None:
        return (0.0, node), node
    text = f"{node}: {detail(why)}"
    return (-float(why.available), text), text


def summarize(rejections: Sequence[Rejection], total_nodes: int, show_all: bool = False) -> list[str]:
    """One line per profile: `0/12 nodes fit profile h100-tp8: 8 have too few free H100-80GB GPUs (a1: 4 free, needs 8; ...), 4 lack label zone=a (...)`."""
    by_profile: dict[str, list[Rejection]] = {}
    for r in rejections:
        by_profile.setdefault(r.profile, []).append(r)
    lines = []
    for profile, rejs in by_profile.items():
        groups: dict[tuple[str, str], list[tuple[tuple, str]]] = {}
        pool_lines: list[str] = []
        rejected_nodes: set[str] = set()
        for r in rejs:
            if not r.node:
                pool_lines.append(r.reason)
                continue
            if r.node in rejected_nodes:
                continue
            rejected_nodes.add(r.node)
            label = _group(r.why) or (r.reason, r.reason)
            groups.setdefault(label, []).append(_summary_entry(r.node, r.why))
        parts = []
        for label, entries in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            names = [text for _, text in sorted(entries)]
            shown = names if show_all or len(names) <= SUMMARY_NAMES else names[:SUMMARY_NAMES]
            sep = "; " if any(":" in s for s in shown) else ", "
            more = "" if len(shown) == len(names) else f"{sep}... {len(names) - len(shown)} more"
            parts.append(f"{len(names)} {label[0] if len(names) == 1 else label[1]} ({sep.join(shown)}{more})")
        fit = max(total_nodes - len(rejected_nodes), 0)
        head = f"{fit}/{total_nodes} nodes fit profile {profile}"
        body = ", ".join(parts)
        tail = "; ".join(pool_lines)
        line = head + (": " + body if body else "")
        if tail:
            line += ("; " if body else ": ") + tail
        lines.append(line)
    return lines


# --------------------------------------------------------------------------
# Models that can never fit, for `validate --inventory`
# --------------------------------------------------------------------------


def _hardware_reason(spec, obs: ObservedNode | None, profile: Profile) -> str | None:
    """Why this node could not take the profile even with nothing running and every node ready."""
    if obs is None:
        return "not in the snapshot"
    for key, want in profile.node_selector.items():
        if spec.labels.get(key) != want:
            return f"lacks label {key}={want}"
    if profile.engine != "command" and obs.engines is not None and profile.engine not in obs.engines:
        return f"lacks {profile.engine}"
    if profile.min_memory_gb and obs.memory_total_mb and obs.memory_total_mb / 1024 < profile.min_memory_gb:
        return "too little memory"
    if profile.gpu_class is not None:
        n = sum(1 for g in obs.gpus if (spec.gpu_class or g.gpu_class) == profile.gpu_class)
        if n < profile.gpus_per_node:
            return f"has {n} {profile.gpu_class} GPUs"
    return None


def _why_never(fleet: Fleet, inventory: Inventory, profile: Profile) -> tuple[str | None, str, set[str]]:
    """(None, "", nodes that can hold a rank) when the profile fits an empty fleet; else (why not, field to blame, {})."""
    ok_nodes = []
    for spec in fleet.nodes:
        obs = inventory.node(spec.id)
        if _hardware_reason(spec, obs, profile) is None:
            ok_nodes.append((spec, obs))
    if profile.nodes <= 1:
        if ok_nodes:
            return None, "", {s.id for s, _ in ok_nodes}
    else:
        per_fabric: dict[str, int] = {}
        for spec, obs in ok_nodes:
            names = spec.fabrics.keys() if spec.fabrics else [f.name for f in obs.fabrics if f.hcas]
            for f in names:
                per_fabric[f] = per_fabric.get(f, 0) + 1
        if any(c >= profile.nodes for c in per_fabric.values()):
            return None, "", {s.id for s, _ in ok_nodes}
        if ok_nodes:
            best = max(per_fabric.values(), default=0)
            return (f"profile {profile.name} needs {profile.nodes} nodes on one fabric, "
                    f"the most any fabric has that could hold a rank is {best}"), "nodes", set()
    if profile.gpu_class is not None:
        most = 0
        for spec in fleet.nodes:
            obs = inventory.node(spec.id)
            if obs is not None:
                most = max(most, sum(1 for g in obs.gpus if (spec.gpu_class or g.gpu_class) == profile.gpu_class))
        if most < profile.gpus_per_node:
            return (f"profile {profile.name} needs {profile.gpus_per_node} {profile.gpu_class} GPUs per node, "
                    f"the most any node has is {most}"), "gpus_per_node", set()
    return (f"profile {profile.name}: no node in the fleet matches its selector, engine, memory and GPUs",
            "name", set())


def unfittable_problems(
    catalog: Catalog, inventory: Inventory, locate: Callable[[str, tuple], tuple[int, int]] | None = None,
) -> list[Problem]:
    """Models that no profile could ever fit on this fleet, even with nothing running.

    Left alone these would sit Pending forever with a rejection list that reads
    like a capacity problem; they are a catalog mistake (16 GPUs per node on a
    fleet of 8-GPU nodes) and `validate --inventory` says so.

    locate(file, path) -> (line, column) places a problem at a field; a path names list items
    by their `name` (("profiles", "h100-tp16", "gpus_per_node")). Without it, problems point
    at 1:1 of the model file.
    """
    problems = []
    for model in catalog.models:
        reasons = []
        blame: tuple | None = None
        hosts: set[str] = set()
        single_only = all(p.nodes <= 1 for p in model.profiles)
        for profile in model.profiles:
            why, fieldname, ok = _why_never(catalog.fleet, inventory, profile)
            if why is None:
                hosts |= ok
            else:
                reasons.append(why)
                if blame is None:
                    blame = ("profiles", profile.name, fieldname)
        where = model.file or f"models/{model.name}.yaml"

        def at(path: tuple) -> tuple[int, int]:
            return locate(where, path) if locate is not None else (1, 1)

        if model.profiles and len(reasons) == len(model.profiles):
            problems.append(Problem(where, *at(blame or ("profiles",)),
                                    f"model {model.name} can never be placed on this inventory: " + "; ".join(reasons)))
        elif single_only and model.spread != "preferred" and model.replicas > len(hosts):
            problems.append(Problem(
                where, *at(("replicas",)),
                f"model {model.name} asks for {model.replicas} replica{'s' * (model.replicas != 1)}, but only "
                f"{len(hosts)} node{'s' * (len(hosts) != 1)} can ever hold one "
                f"and replicas of a model never share a node (set spread: preferred to allow it)",
            ))
    return problems
