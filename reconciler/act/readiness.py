"""Is a replica serving? Phase judgement as pure functions, and the one health request.

A replica judged Failed here crashed or did not become Ready in time: a temporary failure
(FailureKind.TEMPORARY), restarted with the plan's capped backoff.

Ready means the head answers its health path with 200, asked from the
management host at the head's data address, AND every rank's process is
alive: a head that answers while a worker is dead is not serving anything.

The functions here take what was observed (rank states from the nodes, the
health answer, the time) and return the phase; asking the nodes is the
actor's job, so these are tested with plain values and an injected clock.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from reconciler.frozen import frozen
from reconciler.act.launcher import RankState
from reconciler.model import Placement, Profile, RankLaunch
from reconciler.decide.outcomes import ReplicaState
from reconciler.observe.snapshot import RankRecords
from reconciler.vocabulary import FailureKind, NodeState, Phase

HEALTH_TIMEOUT_S = 2.0
# Health is one cheap local request; liveness is a round trip to every node of the replica,
# asked at most this often while nothing else forces it.
LIVENESS_INTERVAL_S = 1.0
LOG_LINES_IN_MESSAGE = 10
DEFAULT_START_TIMEOUT_S = 900.0

# host, port, path -> (answered 200, what was seen instead)
HealthCheck = Callable[[str, int, str], tuple[bool, str]]


def http_health(host: str, port: int, path: str, timeout: float = HEALTH_TIMEOUT_S) -> tuple[bool, str]:
    """GET http://host:port/path. (True, "") on 200, else (False, what was seen instead).

    host is bare (an IPv6 literal without brackets): http.client brackets it itself.
    """
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path or "/", headers={"Connection": "close"})
        resp = conn.getresponse()
        resp.read(4096)
        if resp.status == 200:
            return True, ""
        return False, f"{path} answered {resp.status}"
    except (OSError, http.client.HTTPException, UnicodeError) as exc:  # UnicodeError: a host name idna refuses
        return False, f"{path} did not answer: {why_no_answer(exc, timeout)}"
    finally:
        conn.close()


def why_no_answer(exc: BaseException, timeout: float) -> str:
    """What went wrong with a health request, in words (status messages are read by people, not
    Python: "connection refused", not "ConnectionRefusedError: [Errno 111] Connection refused")."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(exc, ConnectionResetError):
        return "the connection was reset"
    if isinstance(exc, UnicodeError):
        return "the host name cannot be encoded as a DNS name"
    if isinstance(exc, http.client.HTTPException):
        return "it answered something that is not HTTP"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return "the request failed"


@dataclass
class StartedReplica:
    """A replica launched in this pass, waiting to be judged."""

    launches: list[RankLaunch]
    model: str
    profile: Profile
    placement: Placement
    started_at: float  # monotonic
    ranks_checked_at: float | None = None  # monotonic; when liveness was last asked

    @property
    def head(self) -> RankLaunch:
        return next(l for l in self.launches if l.rank == 0)


@frozen
class Liveness:
    """What the nodes of a replica said about its ranks."""

    states: Mapping[tuple[str, int], RankState]  # (node, rank) -> state
    unreachable: tuple[str, ...] = ()  # nodes that did not answer

    def dead(self, launches: Sequence[RankLaunch]) -> list[RankLaunch]:
        """Launches whose process is gone, on nodes that answered."""
        return [l for l in launches if l.node not in self.unreachable
                and not (self.states.get((l.node, l.rank)) is not None and self.states[(l.node, l.rank)].alive)]


def liveness_due(started: StartedReplica, *, now: float, answered: bool, final: bool) -> bool:
    """Ask the nodes when it decides something (the head answers, time is up, the wait ends), else
    once a LIVENESS_INTERVAL_S, soon enough to notice a rank that crashed while loading."""
    timed_out = now - started.started_at >= started.profile.start_timeout_s
    checked = started.ranks_checked_at
    return answered or timed_out or final or checked is None or now - checked >= LIVENESS_INTERVAL_S


def judge_started(base: ReplicaState, started: StartedReplica, *, answered: bool, seen: str, liveness: Liveness,
                  now: float, final: bool) -> ReplicaState | None:
    """Ready, Failed, or (when `final`) Starting; None means: keep waiting."""
    dead = liveness.dead(started.launches)
    if dead:
        return replace(base, phase=Phase.FAILED, message=failure_message(dead, liveness.states, "exited"),
                       failure=FailureKind.TEMPORARY)
    if answered and not liveness.unreachable:
        return replace(base, phase=Phase.READY)
    queued = queued_message(liveness.states.values())
    if queued:
        # Queued by a scheduler: not started, so its start timeout has not begun either.
        return replace(base, phase=Phase.PENDING, message=queued) if final else None
    timeout = started.profile.start_timeout_s
    if now - started.started_at >= timeout:
        message = failure_message(started.launches, liveness.states, f"not Ready after {timeout:g}s: {seen}")
        return replace(base, phase=Phase.FAILED, message=message, start_timed_out=True, failure=FailureKind.TEMPORARY)
    if final:
        return replace(base, phase=Phase.STARTING, message=f"waiting for {seen or 'all ranks'}")
    return None


def observed_gpus(state: ReplicaState, liveness: Liveness) -> ReplicaState:
    """Where a scheduler handed out the GPUs (Slurm sets CUDA_VISIBLE_DEVICES), status records its
    indices, not the placement's."""
    nodes = []
    for a in state.nodes:
        s = liveness.states.get((a.node, a.rank))
        nodes.append(replace(a, gpus=tuple(s.gpus)) if s is not None and s.slurm_job and s.gpus else a)
    return replace(state, nodes=tuple(nodes)) if tuple(nodes) != tuple(state.nodes) else state


def failure_message(launches: Sequence[RankLaunch], states: Mapping[tuple[str, int], RankState], what: str) -> str:
    parts = []
    for l in launches:
        s = states.get((l.node, l.rank))
        lines = " | ".join(s.log_tail) if s is not None and s.log_tail else "(no log)"
        parts.append(f"rank {l.rank} on {l.node} {what}; last log lines: {lines}")
    return "; ".join(parts)


def judge_records(base: ReplicaState, ranks: RankRecords) -> ReplicaState | None:
    """The phase of a running replica that its records alone decide (a node away, a rank dead or
    missing); None when only its health can tell."""
    gone = [n for n, _ in ranks if n.state == NodeState.UNREACHABLE]
    if gone:
        return replace(base, phase=Phase.UNKNOWN, message="; ".join(f"node {n.id} unreachable: {n.reason}" for n in gone))
    dead = [(n, r) for n, r in ranks if not r.alive]
    if dead:
        return replace(base, phase=Phase.FAILED, message="; ".join(f"rank {r.rank} on {n.id} is not running" for n, r in dead),
                       failure=FailureKind.TEMPORARY)
    head = next((r for _, r in ranks if r.rank == 0), ranks[0][1])
    missing = head.nnodes - len(ranks)
    if missing > 0:
        return replace(base, phase=Phase.FAILED, message=f"{missing} of {head.nnodes} ranks are missing", failure=FailureKind.TEMPORARY)
    queued = queued_message(r for _, r in ranks)
    if queued:
        return replace(base, phase=Phase.PENDING, message=queued)
    return None


def queued_message(ranks) -> str:
    """`Slurm job 42 is queued: Resources` for ranks a scheduler has not started yet, else ""."""
    for r in ranks:
        if getattr(r, "waiting", ""):
            job = getattr(r, "slurm_job", "")
            return f"Slurm job {job} is queued: {r.waiting}" if job else f"queued: {r.waiting}"
    return ""


def judge_unanswered(base: ReplicaState, *, seen: str, head_state: RankState | None, timeout_s: float,
                     wall_now: float) -> ReplicaState:
    """A replica from an earlier pass whose head does not answer: still starting, or stuck.
    The head's launch time (node wall clock) tells which."""
    if head_state is not None and head_state.started_at is not None and wall_now - head_state.started_at < timeout_s:
        return replace(base, phase=Phase.STARTING, message=f"waiting for {seen}")
    tail = " | ".join(head_state.log_tail) if head_state is not None and head_state.log_tail else "(no log)"
    return replace(base, phase=Phase.FAILED, message=f"not Ready after {timeout_s:g}s: {seen}; last log lines: {tail}",
                   start_timed_out=head_state is not None, failure=FailureKind.TEMPORARY)
