"""What the act stage reports: typed values the daemon, the CLI and status read.

Decision       one line of the pass log (what was done where, and why)
ReplicaState   a desired replica after the pass: phase, where it runs, its endpoint
ActionOutcome  what carrying out one plan action came to
PassMemory     what one pass hands the next
PassResult     one whole pass: the plan, every decision, every replica's state; status/ is written
               from it alone (status.write_pass)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from reconciler.decide.autoscale import AutoscaleState
from reconciler.decide.backoff import Backoff
from reconciler.decide.canary import Rollout
from reconciler.frozen import frozen
from reconciler.model import Assignment, Inventory, ProfileMetrics, Quarantine, replica_ordinal
from reconciler.decide.plan_values import Drain, Plan
from reconciler.vocabulary import ActionKind, DecisionAction, FailureKind, Phase


@frozen
class Decision:
    """One line of the pass log: what was done (or would be) to which replica where, and why."""

    replica: str
    node: str  # "-" when the decision is about no node in particular
    action: DecisionAction  # an ActionKind's word, or another step of the pass (fail, health, drain, ...)
    reason: str
    ok: bool = True

    def __str__(self) -> str:
        return f"{self.replica}  {self.node}  {self.action}  {self.reason}"

    def as_dict(self) -> dict:
        return {"replica": self.replica, "node": self.node, "action": self.action, "reason": self.reason, "ok": self.ok}


@frozen
class ReplicaState:
    """A desired replica after the pass: where it runs and how it is doing."""

    replica: str
    model: str
    profile: str | None
    phase: Phase
    message: str = ""
    nodes: tuple[Assignment, ...] = ()
    endpoint: str | None = None  # http://<head data address>:<port>, when placed
    # Failed because it was not Ready by its profile's start_timeout_s: its processes are to be ended.
    start_timed_out: bool = False
    revision: str | None = None  # the catalog revision its processes were started from
    # Failed: whether retrying can help. TEMPORARY: retried with capped exponential backoff and jitter
    # (a timeout, a crash, a taken port); PERMANENT: stalled until the catalog or the node changes (the
    # engine's binary is not on the node, a launch that cannot be rendered). None when not Failed.
    failure: FailureKind | None = None
    # A canary copy: it runs the new spec of a rollout still Progressing (SPEC section 13).
    canary: bool = False


@frozen
class ActionOutcome:
    """What one plan action came to. `state` is the replica's state when the action settled it
    (Starting after a launch, Failed after a refusal); None when it leaves the state to be observed."""

    replica: str
    action: ActionKind
    ok: bool
    state: ReplicaState | None = None


@frozen
class PassMemory:
    """What one pass hands to the next: the daemon keeps it in memory, a one-shot `apply` persists it
    (memory.save_memory / load_memory).

    backoff            replica id -> how its tries went and when it may be tried next (reconciler/decide/backoff.py):
                       a crash's restarts, counted by the plan (Plan.backoff), and a start that failed
                       and left nothing running, recorded by memory.remember
    unreachable_since  node id -> epoch seconds it was first seen unreachable
    last_seen          the last snapshot in which each node answered (records of nodes unreachable now)
    placed_on          replica id -> nodes it was last placed on (which copy is current when two are found)
    gpu_strikes        replica id -> its failed starts in a row on the same GPUs (the crash-loop breaker)
    quarantines        (node id, GPU index) -> the quarantine of that GPU (status/nodes.yaml shows them)
    started_with       copy_key -> the engine and metrics series a running copy was started with
    """

    backoff: Mapping[str, Backoff] = field(default_factory=dict)
    unreachable_since: Mapping[str, float] = field(default_factory=dict)
    last_seen: Inventory | None = None
    placed_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # drain_key -> a serving copy being drained before it stops (memory.hold_drains; SPEC section 10)
    draining: Mapping[str, Drain] = field(default_factory=dict)
    gpu_strikes: Mapping[str, "GpuStrikes"] = field(default_factory=dict)
    quarantines: Mapping[tuple[str, int], Quarantine] = field(default_factory=dict)
    # model -> its canary rollout (reconciler/decide/canary.py; SPEC section 13): kept here, not in git
    rollouts: Mapping[str, Rollout] = field(default_factory=dict)
    # copy_key -> what each running copy was started with that its drain reads its load by (SPEC 13):
    # recorded when the copy is first seen, so a removed model's copy drains by its own series
    started_with: Mapping[str, "StartedWith"] = field(default_factory=dict)


def copy_key(replica: str, head_node: str, port: int) -> str:
    """One running copy: its head's node and serving port hold one process at a time."""
    return f"{replica}@{head_node}:{port}"


@frozen
class StartedWith:
    """What a copy was started with that its drain needs once its model or profile may be gone: its
    engine, the series its /metrics reports its load in (a `command` profile's `metrics:`), and its
    model's drain_s."""

    engine: str
    metrics: ProfileMetrics | None = None
    drain_s: float | None = None


@frozen
class GpuStrikes:
    """Failed starts in a row of one replica on the same GPUs (SPEC section 9's crash-loop breaker):
    where ((node, GPU indices) per node), how many, and the last one's message."""

    where: tuple[tuple[str, tuple[int, ...]], ...]
    count: int
    message: str = ""


@dataclass
class PassResult:
    revision: str | None
    inventory: Inventory | None
    plan: Plan
    decisions: list[Decision] = field(default_factory=list)
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    dry_run: bool = False
    written: list[str] = field(default_factory=list)  # status files whose content changed
    memory: PassMemory | None = None  # hand to the next pass as `history`
    # Node id -> seconds its probe took in this pass, for each probe that ended; None when the
    # pass probed nothing (it planned against the inventory an earlier pass left).
    probe_seconds: dict[str, float] | None = None
    # Autoscaled model -> its count and why after this pass (SPEC section 11; status/models `autoscale:`).
    autoscale: dict[str, AutoscaleState] = field(default_factory=dict)
    # Epoch seconds the daemon should pass again (reconcile.next_pass_wanted): a start to judge, a drain's
    # next look or deadline, a wait that ends, an autoscaling move; None: the resync interval will do.
    next_pass_at: float | None = None
    # The nodes that pass is about (reconcile.wake_nodes): the daemon probes only these for it.
    next_pass_nodes: frozenset[str] = frozenset()
    # Model -> its canary rollout after this pass (SPEC section 13; status/models `rollout:`).
    rollouts: dict[str, Rollout] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.decisions)

    def endpoints(self) -> dict[str, list[str]]:
        """Model -> URLs of its Ready replicas, in replica order: computed here only (status/endpoints.yaml,
        apply's summary and the gateway files read this)."""
        out: dict[str, list[str]] = {}
        for state in sorted(self.replicas.values(), key=_replica_sort_key):
            if state.phase == Phase.READY and state.endpoint:
                out.setdefault(state.model, []).append(state.endpoint)
        return out


def _replica_sort_key(state: ReplicaState):
    return (state.model, replica_ordinal(state.model, state.replica) or 0, state.replica)
