"""The vocabulary of the reconciler: frozen values, no I/O.

Desired state (what the catalog says) and observed state (what a probe saw)
are kept as separate types on purpose: fleet.yaml is the authority for
operator intent (labels, cordon/drain, fabric declarations, model dirs) and
the inventory snapshot is the authority for facts (GPUs, engines, disks,
running processes). `placement` joins the two; nothing here does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from reconciler.host import Host

ENGINES = ("vllm", "sglang", "llama.cpp", "command")
# Engines that can serve a model with no GPU at all.
CPU_CAPABLE_ENGINES = frozenset({"llama.cpp", "command"})
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}
NODE_STATES = ("ready", "cordoned", "drained")
OBSERVED_STATES = NODE_STATES + ("unreachable", "unusable")
PHASES = ("Pending", "Starting", "Ready", "Failed", "Stopping", "Unknown")
PLACEHOLDERS = (
    "MODEL_SOURCE",
    "REPLICA_ID",
    "NODE_RANK",
    "NNODES",
    "HEAD_ADDRESS",
    "PORT",
    "DIST_PORT",
    "GPUS_PER_NODE",
    "CUDA_VISIBLE_DEVICES",
)

EMPTY: Mapping[str, str] = MappingProxyType({})


def _empty():
    return field(default_factory=lambda: EMPTY)


def frozen_map(d: Mapping | None) -> Mapping:
    return MappingProxyType(dict(d or {}))


# --------------------------------------------------------------------------
# Desired state: the catalog
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SshSettings:
    user: str | None = None
    port: int = 22
    identity_file: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 30.0  # one command on the node, sending its input included


@dataclass(frozen=True)
class NodeSpec:
    id: str
    address: str
    data_address: str
    labels: Mapping[str, str] = _empty()
    state: str = "ready"
    model_dirs: tuple[str, ...] = ()
    # fabric name -> HCAs of this node on that fabric, as declared by the operator
    fabrics: Mapping[str, tuple[str, ...]] = _empty()
    ssh: SshSettings = SshSettings()
    transport: str = "ssh"  # ssh | local
    gpu_class: str | None = None  # operator override of the probed class
    state_dir: str = "~/.local/state/llm-reconciler"
    # Network interface that carries data_address (e.g. "ib0", "eth1"). NCCL and
    # Gloo pick their bootstrap socket by interface NAME, not by address; Gloo
    # otherwise resolves the hostname, which on many distros is 127.0.1.1.
    socket_ifname: str | None = None
    # data_address parsed once; every spelling of it (bare, bracketed, URL) comes from here.
    data_host: Host = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_host", Host(self.data_address))


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[NodeSpec, ...]
    ssh: SshSettings = SshSettings()
    _by_id: Mapping[str, NodeSpec] = field(default_factory=lambda: EMPTY, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", MappingProxyType({n.id: n for n in self.nodes}))

    def node(self, node_id: str) -> NodeSpec | None:
        return self._by_id.get(node_id)


@dataclass(frozen=True)
class Profile:
    name: str
    engine: str
    gpu_class: str | None = None
    gpus_per_node: int = 0  # 0 exactly when gpu_class is None
    nodes: int = 1
    priority: int = 0
    node_selector: Mapping[str, str] = _empty()
    min_memory_gb: float = 0
    min_disk_gb: float = 0
    port: int = 8000
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = _empty()
    health_path: str = "/health"
    start_timeout_s: float = 900
    command: tuple[str, ...] | None = None  # engine: command only

    @property
    def cpu_only(self) -> bool:
        return self.gpu_class is None

    @property
    def class_label(self) -> str:
        return self.gpu_class or "cpu"


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    replicas: int = 1
    spread: str = "required"  # required | preferred
    # Sorted by descending priority, catalog order among equals.
    profiles: tuple[Profile, ...] = ()
    file: str = ""  # path relative to the catalog root

    def profile(self, name: str) -> Profile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def replica_ids(self) -> list[str]:
        return [replica_id(self.name, i) for i in range(self.replicas)]


@dataclass(frozen=True)
class Catalog:
    root: str
    fleet: Fleet
    models: tuple[Model, ...]  # sorted by name
    revision: str | None = None

    def model(self, name: str) -> Model | None:
        for m in self.models:
            if m.name == name:
                return m
        return None


def replica_id(model: str, ordinal: int) -> str:
    return f"{model}-{ordinal}"


def replica_ordinal(model: str, rid: str) -> int | None:
    prefix = model + "-"
    if not rid.startswith(prefix):
        return None
    tail = rid[len(prefix):]
    return int(tail) if tail.isdigit() else None


def spec_hash(model: Model, profile: Profile) -> str:
    """Digest of everything that shapes a replica's processes.

    A change to any of these means the running processes no longer match the
    catalog and the replica must be replaced; anything else (priority, the
    replica count, other profiles) leaves a running replica alone.
    """
    shape = {
        "source": model.source,
        "engine": profile.engine,
        "profile": profile.name,
        "gpu_class": profile.gpu_class,
        "gpus_per_node": profile.gpus_per_node,
        "nodes": profile.nodes,
        "args": list(profile.args),
        "env": dict(sorted(profile.env.items())),
        "command": list(profile.command) if profile.command is not None else None,
        "health_path": profile.health_path,
    }
    raw = json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


# --------------------------------------------------------------------------
# Observed state: the inventory snapshot (SPEC section 3)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mb: int


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    gpu_class: str
    memory_total_mb: int
    memory_used_mb: int = 0
    nvlink_peers: tuple[int, ...] = ()
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class FabricAttachment:
    name: str
    hcas: tuple[str, ...]


@dataclass(frozen=True)
class Disk:
    path: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class RunningRank:
    """One managed engine process found on a node (from its record)."""

    id: str  # replica id
    model: str
    profile: str
    rank: int
    gpus: tuple[int, ...]
    port: int
    spec_hash: str
    nnodes: int = 1
    pid: int | None = None
    alive: bool = True


@dataclass(frozen=True)
class ObservedNode:
    id: str
    state: str = "ready"  # ready | cordoned | drained | unreachable | unusable (answered; GPUs unknown)
    reason: str = ""
    labels: Mapping[str, str] = _empty()
    memory_total_mb: int | None = None
    engines: Mapping[str, str] | None = None  # None: never probed
    gpus: tuple[Gpu, ...] = ()
    fabrics: tuple[FabricAttachment, ...] = ()
    disks: tuple[Disk, ...] = ()
    weights: tuple[str, ...] | None = None  # None: never asked to look
    replicas: tuple[RunningRank, ...] = ()
    # TCP ports something listens on (from /proc/net/tcp*), so placement never hands out a taken one
    ports_in_use: tuple[int, ...] = ()


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[ObservedNode, ...]
    _by_id: Mapping[str, ObservedNode] = field(default_factory=lambda: EMPTY, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", MappingProxyType({n.id: n for n in self.nodes}))

    def node(self, node_id: str) -> ObservedNode | None:
        return self._by_id.get(node_id)


# --------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """One node's share of a replica."""

    node: str
    rank: int
    gpus: tuple[int, ...] = ()
    hcas: tuple[str, ...] = ()  # of the replica's fabric only
    port: int = 0


@dataclass(frozen=True)
class Placement:
    replica: str
    model: str
    profile: str
    fabric: str | None
    pool: str  # "<fabric|none>/<class|cpu>"
    nodes: tuple[Assignment, ...]  # rank order; nodes[0] is the head
    dist_port: int | None = None  # rendezvous port on the head, multi-node only

    @property
    def head(self) -> Assignment:
        return self.nodes[0]


@dataclass(frozen=True)
class Rejection:
    profile: str
    pool: str
    node: str
    reason: str


@dataclass(frozen=True)
class Action:
    action: str  # start | stop | replace | restart
    replica: str
    model: str
    reason: str = ""
    # start/replace: the new placement (None for a replace that found no room: leave the old copy alone);
    # restart: the same nodes/GPUs/ports again; stop: the node records to stop.
    placement: Placement | None = None
    # replace/restart: the running copy this action supersedes.
    previous: Placement | None = None
    # replace: the new copy only fits once the old one is gone, so stop it before starting the new one
    # (otherwise start the new copy first and stop the old one when it is up).
    stop_first: bool = False


@dataclass(frozen=True)
class RankLaunch:
    """Everything needed to start one rank of one replica on one node, fully rendered.

    argv and env hold final strings: no placeholder is left (render refuses
    otherwise). Transports quote argv once; nothing re-interprets it.
    """

    replica: str
    model: str
    profile: str
    node: str
    rank: int
    nnodes: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int  # the port this rank binds (the serving port on the head)
    gpus: tuple[int, ...]
    spec_hash: str
    health_path: str | None  # set on the head only: where Ready is asked
    start_timeout_s: float = 900
