"""How a replica started by an earlier pass (or an earlier reconciler) is doing: its records, its health,
its ranks' log lines when it crashed. Effects are the injected launcher's and health check's only."""

from __future__ import annotations

import time
from dataclasses import replace

from reconciler.errors import TransportError
from reconciler.act.launcher import Launcher
from reconciler.model import Assignment, Catalog, Fleet, Model
from reconciler.decide.outcomes import ReplicaState
from reconciler.vocabulary import Phase
from reconciler.act.readiness import (
    DEFAULT_START_TIMEOUT_S,
    LOG_LINES_IN_MESSAGE,
    HealthCheck,
    http_health,
    judge_records,
    judge_unanswered,
)
from reconciler.observe.snapshot import RankRecords


def head_host(fleet: Fleet, node_id: str) -> str:
    """The bare address the head serves on (its data address), for the health request."""
    spec = fleet.node(node_id)
    return spec.data_host.bare if spec is not None else node_id


def observe_replica(
    catalog: Catalog,
    ranks: RankRecords,
    replica: str,
    model: Model,
    launcher: Launcher,
    health: HealthCheck = http_health,
    wall_now: float | None = None,
) -> ReplicaState | None:
    """The phase of a replica running from an earlier pass (or an earlier reconciler), or None when none runs.

    ranks: the replica's records in the snapshot (ranks_by_replica).
    """
    if not ranks:
        return None
    head_node, head = next(((n, r) for n, r in ranks if r.rank == 0), ranks[0])
    profile = model.profile(head.profile)
    nodes = tuple(Assignment(n.id, r.rank, tuple(r.gpus), (), r.port) for n, r in ranks)
    base = ReplicaState(replica, model.name, head.profile, Phase.UNKNOWN, "", nodes,
                        catalog.fleet.endpoint(head_node.id, head.port), revision=head.revision)
    settled = judge_records(base, ranks)
    if settled is not None and settled.phase == Phase.FAILED:
        return with_crash_logs(settled, ranks, replica, launcher)
    if settled is not None:
        return settled
    answered, seen = health(head_host(catalog.fleet, head_node.id), head.port,
                            profile.health_path if profile is not None else "/health")
    if answered:
        return replace(base, phase=Phase.READY)
    try:
        states = launcher.ranks(head_node.id, replica, log_lines=LOG_LINES_IN_MESSAGE)
    except TransportError as exc:
        return replace(base, message=f"{seen}; node {head_node.id}: {exc.reason}")
    return judge_unanswered(
        base, seen=seen, head_state=next((s for s in states if s.rank == head.rank), None),
        timeout_s=profile.start_timeout_s if profile is not None else DEFAULT_START_TIMEOUT_S,
        wall_now=time.time() if wall_now is None else wall_now,
    )


def with_crash_logs(state: ReplicaState, ranks: RankRecords, replica: str, launcher: Launcher | None) -> ReplicaState:
    """A crashed replica's message with its dead ranks' last log lines: while it waits out its restart
    backoff, status has to say why it died, not only the daemon's log of the pass that saw it die.
    Without a launcher (a judgement from records alone) the message stays as the records make it."""
    if launcher is None:
        return state
    tails = []
    for node in sorted({n.id for n, r in ranks if not r.alive}):
        try:
            states = launcher.ranks(node, replica, log_lines=LOG_LINES_IN_MESSAGE)
        except TransportError:
            continue  # the node just answered the probe; if it does not now, the message stays as it was
        tails += [f"rank {s.rank} on {node}: " + " | ".join(s.log_tail) for s in states if not s.alive and s.log_tail]
    if not tails:
        return state
    return replace(state, message=f"{state.message}; last log lines: {'; '.join(tails)}")
