"""Waiting for what this pass started: health checks and rank liveness, judged by readiness.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from reconciler.act.actor.stopping import StopActions
from reconciler.errors import TransportError
from reconciler.model import RankLaunch
from reconciler.act.observed import head_host
from reconciler.decide.outcomes import ReplicaState
from reconciler.vocabulary import DecisionAction, Phase
from reconciler.act.readiness import (
    LOG_LINES_IN_MESSAGE,
    Liveness,
    StartedReplica,
    judge_started,
    liveness_due,
    observed_gpus,
)
from reconciler.decide.scheduling import MAX_PARALLEL_ACTIONS, Effects

POLL_INTERVAL_S = 0.2


class ReadyWaiting(StopActions):
    """What this pass started, polled until Ready or Failed (a start past its timeout is stopped)."""

    def wait_ready(self, replicas: Sequence[str], budget_s: float | None = None) -> dict[str, ReplicaState]:
        """Poll started replicas until each is Ready or Failed, or the wait budget runs out."""
        waiting = {r: self.pending[r] for r in replicas if r in self.pending}
        effects = self._fx  # a replace's own wait reads what its action adopted (revision_of)
        results: dict[str, ReplicaState] = {}
        deadline = self.clock() + (self.ready_wait_s if budget_s is None else budget_s)
        while waiting:
            final = self.clock() >= deadline
            items = list(waiting.items())
            # Every replica's health check and liveness at once, each under its own deadline; judged in order.
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_ACTIONS, len(items))) as pool:
                judged = list(pool.map(lambda item: self._judge_for(effects, item, final), items))
            for (replica, _), state in zip(items, judged):
                if state is not None:
                    results[replica] = state
                    del waiting[replica]
            if waiting:
                self.sleep(POLL_INTERVAL_S)
        for replica, state in results.items():
            self.states[replica] = state
            self.decide(replica, state.nodes[0].node if state.nodes else "-", DecisionAction.HEALTH,
                        state.phase + (f": {state.message}" if state.message else ""), ok=state.phase != Phase.FAILED)
            if state.start_timed_out and replica in self.pending:
                self.end_stalled_start(replica, [(l.node, l.rank) for l in self.pending[replica].launches])
        return results

    def _judge_for(self, effects: Effects, item: tuple[str, StartedReplica], final: bool) -> ReplicaState | None:
        """judge() on a pool thread, reading the buffer of the action (or pass) that waits."""
        self._local.effects = effects
        try:
            return self.judge(item[0], item[1], final=final)
        finally:
            self._local.effects = None

    def judge(self, replica: str, started: StartedReplica, *, final: bool) -> ReplicaState | None:
        """Ready, Failed, or (when `final`) Starting; None means: keep waiting."""
        head = started.head
        base = ReplicaState(replica, started.model, started.profile.name, Phase.STARTING, "", started.placement.nodes,
                            self.catalog.fleet.endpoint(head.node, head.port),
                            revision=self.revision_of(started.launches))
        answered, seen = self.health(head_host(self.catalog.fleet, head.node), head.port,
                                     head.health_path or started.profile.health_path)
        now = self.clock()
        if not liveness_due(started, now=now, answered=answered, final=final):
            return None
        started.ranks_checked_at = now
        liveness = self.rank_liveness(started.launches)
        state = judge_started(base, started, answered=answered, seen=seen, liveness=liveness, now=now, final=final)
        return observed_gpus(state, liveness) if state is not None else None

    def rank_liveness(self, launches: Sequence[RankLaunch]) -> Liveness:
        """Ask every node of the replica about its ranks (one round trip per node)."""
        replica = launches[0].replica
        nodes = sorted({l.node for l in launches})

        def ask(node: str):
            try:
                return node, self.launcher.ranks(node, replica, log_lines=LOG_LINES_IN_MESSAGE)
            except TransportError:
                return node, None

        states, unreachable = {}, []
        # Each node under its own deadline, all at once: a silent one costs its deadline, not the sum.
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_ACTIONS, len(nodes))) as pool:
            for node, answer in pool.map(ask, nodes):
                if answer is None:
                    unreachable.append(node)
                    continue
                for s in answer:
                    states[(node, s.rank)] = s
        return Liveness(states, tuple(unreachable))
