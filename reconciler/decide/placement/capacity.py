"""What placement works on during one pass: each node's facts and what is taken on it so far
(GPUs, ports, replicas hosted), and the nodes that pass one filter, bucketed by how much they
have free.

Mutable, and private to one Placer: built from the fleet and a snapshot, changed only by the
Placer's hold and release.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from functools import lru_cache
from typing import Iterator

from reconciler.model import ObservedNode
from reconciler.vocabulary import GpuHealth, LauncherKind, NodeState

MAX_PORT = 65535


# --------------------------------------------------------------------------
# Working state of one node during a placement pass
# --------------------------------------------------------------------------


def _state(spec, obs: ObservedNode | None) -> tuple[str, str]:
    """(state, why). Operator intent (fleet.yaml) wins for state; an unreachable or unseen node is
    unreachable whatever it says, and a scheduler's drain (Slurm DRAIN) is a fact of the node: it
    takes nothing new."""
    if obs is None:
        return NodeState.UNREACHABLE, "missing from the inventory snapshot"
    if obs.state in (NodeState.UNREACHABLE, NodeState.UNUSABLE):
        return obs.state, obs.reason
    if obs.state == NodeState.CORDONED and spec.state == NodeState.READY:
        return NodeState.CORDONED, obs.reason
    return spec.state, ""


def _model_disk(spec, obs: ObservedNode | None) -> tuple[str | None, float | None]:
    """(path, GiB free) of the disk the node keeps weights on: its first model_dir, else the first disk seen."""
    if obs is None or not obs.disks:
        return None, None
    if not spec.model_dirs:
        disk = obs.disks[0]
        return disk.path, disk.free_bytes / (1 << 30)
    want = spec.model_dirs[0]
    for disk in obs.disks:  # a loop, not next() over a generator: once per node of the fleet
        if disk.path == want:
            return disk.path, disk.free_bytes / (1 << 30)
    return None, None


def _fabrics(spec, obs: ObservedNode | None) -> dict[str, tuple[str, ...]]:
    """Fabric membership: what the operator declared, else what the probe observed."""
    if spec.fabrics:
        return {name: tuple(hcas) for name, hcas in spec.fabrics.items()}
    return {f.name: tuple(f.hcas) for f in obs.fabrics} if obs is not None else {}


@lru_cache(maxsize=256)
def _all_linked_topology(topology: tuple[tuple[int, tuple[int, ...]], ...]) -> bool:
    """_all_linked of (gpu index, its NVLink peers) pairs, once per topology: a fleet has a few
    shapes of node (eight H100s linked all to all) and thousands of each."""
    return _all_linked(dict(topology))


def _all_linked(nvlink: dict[int, tuple[int, ...]]) -> bool:
    """Whether every GPU is NVLinked to every other (any set of them is then one domain)."""
    count = len(nvlink)
    if count < 2:
        return False
    indices = set(nvlink)
    # Too few peers settles it without a set (PCIe-only nodes list none): most nodes stop here.
    return all(len(peers) >= count - 1 and indices.issubset((*peers, g)) for g, peers in nvlink.items())


class NodeCapacity:
    """One node as placement sees it in a pass: what it is (state, labels, engines, memory, disk,
    fabrics, GPUs by class, launcher) and what is taken on it so far (GPUs, ports, replicas hosted)."""

    __slots__ = (
        "idx", "id", "state", "state_reason", "labels", "engines", "memory_gib", "disk_path",
        "disk_free_gib", "weights", "fabrics", "gpu_class", "free", "total", "busy", "nvlink",
        "ranks", "models", "ports_used", "ports_observed", "obs", "_all_nvlinked", "launcher", "held",
        "llama_cpp", "data_ipv6", "unusable",
    )

    def __init__(self, idx: int, spec, obs: ObservedNode | None):
        self.idx = idx
        self.id = spec.id
        self.obs = obs
        self.state, self.state_reason = _state(spec, obs)
        self.launcher = getattr(spec, "launcher", LauncherKind.SSH)
        self.labels = spec.labels
        self.engines = obs.engines if obs is not None else None
        self.llama_cpp = obs.llama_cpp if obs is not None else None
        self.data_ipv6 = spec.data_host.is_ipv6
        self.memory_gib = obs.memory_total_mb / 1024 if obs is not None and obs.memory_total_mb else None
        self.disk_path, self.disk_free_gib = _model_disk(spec, obs)
        self.weights = frozenset(obs.weights) if obs is not None and obs.weights is not None else None
        self.fabrics = _fabrics(spec, obs)
        self.gpu_class: dict[int, str] = {}
        self.free: dict[str, set[int]] = {}
        self.total: dict[str, int] = {}
        self.busy: dict[int, str] = {}  # gpu index -> who holds it
        self.held: dict[str, list[str]] = {}  # class -> other scheduler jobs holding its GPUs here
        self.nvlink: dict[int, tuple[int, ...]] = {}
        # gpu index -> why it is not usable (SPEC section 9): unhealthy, lost, quarantined, cordoned, or
        # memory held by no process. Never free, not even when a replica on it is released.
        self.unusable: dict[int, str] = {}
        gpus = obs.gpus if obs is not None else ()
        if gpus:
            self._add_gpus(gpus, spec, obs)
        self._all_nvlinked: bool | None = None if gpus else False  # asked of the few nodes a group is picked on
        self.ranks = 0
        self.models: dict[str, list[str]] = {}  # model -> its replicas hosted here
        self.ports_observed = frozenset(obs.ports_in_use) if obs is not None else frozenset()
        self.ports_used: set[int] = set(self.ports_observed)

    def _add_gpus(self, gpus, spec, obs: ObservedNode) -> None:
        cordoned = frozenset(getattr(spec, "cordon_gpus", ()))
        own = {i for r in obs.replicas for i in r.gpus} if obs.replicas else ()
        forced = spec.gpu_class
        gpu_class, total, nvlink, free = self.gpu_class, self.total, self.nvlink, self.free
        for g in gpus:
            i = g.index
            if (g.health is GpuHealth.OK and g.quarantined is None and not g.processes and not g.held_by
                    and not g.memory_used_mb and i not in cordoned):
                # The common GPU (healthy, nobody's, no memory in use, not cordoned) is free: none of
                # gpu_unusable's questions can say otherwise. A snapshot has 30,000 of them.
                cls = forced or g.gpu_class
                gpu_class[i] = cls
                total[cls] = total.get(cls, 0) + 1
                nvlink[i] = g.nvlink_peers
                members = free.get(cls)
                if members is None:
                    free[cls] = {i}
                else:
                    members.add(i)
            else:
                self._add_gpu(g, forced or g.gpu_class, gpu_unusable(g, i in cordoned, i in own))

    def _add_gpu(self, g, cls: str, unusable: str = "") -> None:
        self.gpu_class[g.index] = cls
        self.total[cls] = self.total.get(cls, 0) + 1
        self.nvlink[g.index] = g.nvlink_peers
        if unusable:
            self.unusable[g.index] = unusable
            self.busy[g.index] = unusable
        elif g.held_by:
            self.busy[g.index] = g.held_by
            self.held.setdefault(cls, []).append(g.held_by)
        elif g.processes:
            p = g.processes[0]
            self.busy[g.index] = f"foreign process {p.pid} ({p.name})" if p.name else f"foreign process {p.pid}"
        else:
            self.free.setdefault(cls, set()).add(g.index)

    @property
    def all_nvlinked(self) -> bool:
        """Whether every GPU of the node is NVLinked to every other (any set of them is one domain)."""
        linked = self._all_nvlinked
        if linked is None:
            gpus = self.obs.gpus
            linked = self._all_nvlinked = _all_linked_topology(tuple((g.index, g.nvlink_peers) for g in gpus))
        return linked

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


# A GPU whose memory is this much in use with no process listed holds a dead engine's context
# (llm-d-fast-model-actuation#709: replacements crashed on memory nobody held): not free.
LEAK_MIN_MB = 1024
LEAK_FRACTION = 0.05


def gpu_unusable(g, cordoned: bool, held_by_own_rank: bool) -> str:
    """Why this GPU takes no new rank (SPEC section 9), or "" when it may."""
    if g.health != GpuHealth.OK:
        return g.health_reason or f"{g.health}"
    if g.quarantined is not None:
        return f"quarantined: {g.quarantined.reason}" if g.quarantined.reason else "quarantined"
    if cordoned:
        return "cordoned in fleet.yaml"
    if (not g.processes and not g.held_by and not held_by_own_rank
            and g.memory_used_mb > max(LEAK_MIN_MB, LEAK_FRACTION * g.memory_total_mb)):
        return f"{g.memory_used_mb} MiB used by no process"
    return ""


def pick_gpus(n: NodeCapacity, gpu_class: str, want: int) -> tuple[int, ...]:
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


# --------------------------------------------------------------------------
# Indexes: eligible nodes bucketed by level, each bucket sorted by node index
# --------------------------------------------------------------------------


class LevelIndex:
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
