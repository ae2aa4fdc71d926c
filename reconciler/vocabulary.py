"""The words the reconciler and its files agree on, each defined once (SPEC sections 2, 3, 9, 10).

Every value is a StrEnum, so it is its own spelling in YAML, JSON and log lines (`Phase.READY ==
"Ready"`), and a typo is an AttributeError at import, not a replica that silently never matches.
Code compares against these members, never against a bare literal.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """A replica's phase in status/models/<name>.yaml (SPEC section 2; Draining: section 10)."""

    PENDING = "Pending"
    FETCHING = "Fetching"  # the weights are on their way to a node that lacks them (SPEC section 7)
    STARTING = "Starting"
    READY = "Ready"
    DRAINING = "Draining"  # out of every gateway file, waiting for its requests to end before it stops
    FAILED = "Failed"
    STOPPING = "Stopping"
    UNKNOWN = "Unknown"


class NodeState(StrEnum):
    """A node's state: the first three are operator intent (fleet.yaml), the last two observed only."""

    READY = "ready"
    CORDONED = "cordoned"  # keeps what runs on it, takes nothing new
    DRAINED = "drained"  # its replicas are moved off
    UNREACHABLE = "unreachable"  # did not answer (reason says how)
    UNUSABLE = "unusable"  # answered, but its report is junk or its hardware is broken

    @property
    def intent(self) -> bool:
        return self in _INTENT_STATES


_INTENT_STATES = frozenset({NodeState.READY, NodeState.CORDONED, NodeState.DRAINED})
# What fleet.yaml may say, in the schema's order.
INTENT_STATES = (NodeState.READY, NodeState.CORDONED, NodeState.DRAINED)


class ActionKind(StrEnum):
    """What a plan action does to a replica; the actor dispatches over every member."""

    START = "start"
    STOP = "stop"
    REPLACE = "replace"
    RESTART = "restart"


class FailureKind(StrEnum):
    """Whether retrying can help (ARCHITECTURE: three outcomes, not one)."""

    TEMPORARY = "temporary"  # retried with capped exponential backoff and jitter
    PERMANENT = "permanent"  # stalled until the catalog or the node changes
    BUG = "bug"  # anything else: logged with its traceback, tried again next pass


class GpuHealth(StrEnum):
    """One GPU's health as the probe judged it (SPEC section 9)."""

    OK = "ok"
    UNHEALTHY = "unhealthy"  # an uncorrected ECC error, a pending remap, a fatal Xid, a field the driver cannot read
    LOST = "lost"  # the driver stopped listing it while /proc/driver/nvidia/gpus/ still has its bus id


class CheckResult(StrEnum):
    """How one health check of a node went (`health_checks: {ecc, remap, xid}` in status/nodes.yaml)."""

    OK = "ok"
    UNREADABLE = "unreadable"  # it exists but this login cannot read it: never taken as clean
    UNSUPPORTED = "unsupported"  # the driver or the GPU does not offer it


class WaitKind(StrEnum):
    """Why a replica waits (plan_values.Waiting.kind); status and phases read this, never the message."""

    STOP_WHEN_BACK = "stop_when_back"  # not desired, on a node that does not answer: stopped when it does
    NODE_UNREACHABLE = "node_unreachable"  # within the grace period of a node that does not answer
    BACKOFF = "backoff"  # crashed, waiting for its restart backoff
    ONE_AT_A_TIME = "one_at_a_time"  # spec changed, another replica of the model is being replaced first
    UPDATE_POLICY = "update_policy"  # spec changed, the model's update policy allows no more changes this pass
    # A start that failed and left nothing running (reconciler/decide/backoff.py):
    START_BACKOFF = "start_backoff"  # temporary failure: retried after a backoff with jitter
    STALLED = "stalled"  # permanent failure: not retried until the catalog or the node changes
    # A serving copy to be stopped, out of every gateway file, until no request runs or drain_s passed
    # (memory.hold_drains; SPEC section 10).
    DRAINING = "draining"
    # SPEC section 13: a change with `rollout:` held while its canary is checked, or after its abort.
    CANARY = "canary"  # spec changed, the old copy serves on while the canary copies are checked
    ROLLOUT_ABORTED = "rollout_aborted"  # the new spec's canary failed: not tried again until the spec changes


class DecisionAction(StrEnum):
    """What one line of the pass log did (outcomes.Decision.action): an ActionKind's word, or a step of one."""

    START = "start"
    STOP = "stop"
    REPLACE = "replace"
    RESTART = "restart"
    ADOPT = "adopt"  # a start found its rank already running, started by an earlier pass, and kept it
    FAIL = "fail"  # the replica is Failed (its message and failure kind say why)
    SKIP = "skip"  # an action that could not begin (no placement to start on)
    KEEP = "keep"  # a replace with no room for the new copy: the old one keeps serving
    DRAIN = "drain"  # a serving copy taken out of the gateway files before it stops
    FETCH = "fetch"  # weights copied to a node that lacks them
    HEALTH = "health"  # the wait for Ready ended: Ready, or why not
    METRICS = "metrics"  # a Ready replica's load could not be read (autoscaling)
    SCALE = "scale"  # an autoscaled model's count moved
    WARN = "warn"  # nothing done to a replica: something a person should know (a hand-edited gateway file)
    CHECK = "check"  # one measurement of a canary rollout's check (SPEC section 13)
    ROLLOUT = "rollout"  # a canary rollout moved: Progressing, Promoting, Complete or Aborted
    FENCED = "fenced"  # a node refused this host's epoch, or its lease ran out: it no longer leads (SPEC 14)


class TransportKind(StrEnum):
    """How the management host reaches a node (fleet.yaml `transport:`)."""

    SSH = "ssh"
    LOCAL = "local"  # this machine: commands run here, no SSH


class LauncherKind(StrEnum):
    """What gets a node's ranks running (fleet.yaml `launcher:`; SPEC section 8)."""

    SSH = "ssh"  # the node agent, over the node's transport
    SLURM = "slurm"  # a Slurm job, submitted through `slurm.submit_via`


class SecretKind(StrEnum):
    """Where a secret env value is read at launch (SPEC section 7): the model file's key names it."""

    FROM_FILE = "from_file"  # an absolute path on the node, read by the node agent
    FROM_ENV = "from_env"  # a variable of the reconciler's own environment


class PullState(StrEnum):
    """What `--git-pull` found (gitrev.PullOutcome.state); status/catalog.yaml's `upstream.state` writes
    FAST_FORWARDED as up-to-date."""

    UP_TO_DATE = "up-to-date"
    FAST_FORWARDED = "fast-forwarded"
    FOLLOWED_REWRITE = "followed-rewrite"  # a force-pushed upstream followed: nothing made only here lost
    AHEAD = "ahead"  # local commits not pushed yet
    REFUSED = "refused"  # following would discard a commit made only here, or the working tree blocks it
    DETACHED = "detached"
    NO_UPSTREAM = "no-upstream"
    FETCH_FAILED = "fetch-failed"


class RolloutPhase(StrEnum):
    """The state of a model's canary rollout (SPEC section 13; status/models `rollout.state`)."""

    PROGRESSING = "Progressing"  # canary copies starting or being checked
    PROMOTING = "Promoting"  # the checks held for analysis_s: the rest is replaced (section 7)
    COMPLETE = "Complete"
    ABORTED = "Aborted"  # a check failed or a canary copy did: canary stopped, the spec not tried again


class Role(StrEnum):
    """A daemon's part under `leader:` in fleet.yaml (SPEC section 14)."""

    LEADER = "leader"  # holds the lease and renewed it within the renew deadline: it acts
    STANDBY = "standby"  # another daemon leads: pulls, may probe, acts on nothing
    NO_ETCD = "no-etcd"  # etcd cannot be reached (or refuses): acts on nothing until it can


class EventKind(StrEnum):
    """What an event in the event log says happened (SPEC section 15); `reconciler events --kind` takes these."""

    REPLICA_STARTED = "replica.started"
    REPLICA_READY = "replica.ready"
    REPLICA_FAILED = "replica.failed"  # with its failure kind and reason
    REPLICA_DRAINING = "replica.draining"
    REPLICA_STOPPED = "replica.stopped"
    NODE_UNREACHABLE = "node.unreachable"
    NODE_BACK = "node.back"
    GPU_UNHEALTHY = "gpu.unhealthy"
    GPU_QUARANTINED = "gpu.quarantined"
    AUTOSCALE = "autoscale.decision"
    ROLLOUT_STEP = "rollout.step"
    ROLLOUT_PROMOTED = "rollout.promoted"
    ROLLOUT_ABORTED = "rollout.aborted"
    REVISION_APPLIED = "revision.applied"
    REVISION_REFUSED = "revision.refused"  # with its validation errors
