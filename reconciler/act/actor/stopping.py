"""Stopping ranks: a stop action, the stops inside a restart or a replace, a start that timed out."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from reconciler.act.actor.work import FENCED, ActorWork
from reconciler.act.launcher import StopOutcome
from reconciler.model import Action, RankKey
from reconciler.decide.outcomes import ActionOutcome, ReplicaState
from reconciler.vocabulary import ActionKind, DecisionAction, Phase


class StopActions(ActorWork):
    """Ranks stopped on their nodes, all at once, each stop recorded (and a node that did not answer noted)."""

    def stop(self, action: Action) -> ActionOutcome:
        # The plan names the exact ranks (a stale copy is stopped, the current one on other nodes is not).
        if action.placement is not None and action.placement.nodes:
            targets = sorted({(a.node, a.rank) for a in action.placement.nodes})
        else:
            targets = self.recorded_targets(action.replica)
        if not targets:
            self.decide(action.replica, "-", DecisionAction.STOP, f"nothing running: {action.reason}")
            return ActionOutcome(action.replica, ActionKind.STOP, True)
        return ActionOutcome(action.replica, ActionKind.STOP, self.stop_ranks(action.replica, targets, action.reason or "not desired"))

    def stop_ranks(self, replica: str, targets: Sequence[tuple[str, int | None]], reason: str) -> bool:
        """Stop ranks on their nodes, all at once (a multi-node replica goes down as one)."""
        if not targets:
            return True
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            outcomes = list(pool.map(lambda t: self.launcher.stop(t[0], replica, t[1]), targets))
        ok = True
        for (node, rank), outcome in zip(targets, outcomes):
            # Fenced: this host no longer leads; the decision says so in its own word (SPEC 14).
            self.decide(replica, node, FENCED if outcome.fenced else DecisionAction.STOP, f"{reason} ({outcome.detail})",
                        ok=outcome.ok)
            self.note_unanswered(outcome)
            if outcome.ok:
                self.stopped.append(RankKey(node, replica, rank))
            ok = ok and outcome.ok
        return ok

    def note_unanswered(self, outcome: StopOutcome) -> None:
        """A node that did not answer a stop: the snapshot after the pass says so (unreachable)."""
        if outcome.unanswered:
            self._fx.unanswered.setdefault(outcome.node, outcome.detail)

    def stopping(self, action: Action, why: str) -> None:
        """Phase Stopping, told to status at once: a stop waits out the engine's TERM (up to the grace) before
        the new copy starts, and for that long the replica serves nothing."""
        where = action.previous or action.placement
        self.states[action.replica] = ReplicaState(action.replica, action.model, where.profile if where else None,
                                                   Phase.STOPPING, f"stopping: {why}", where.nodes if where else ())
        self.on_change(force=True)

    def end_stalled_start(self, replica: str, targets: Sequence[tuple[str, int]]) -> bool:
        """A start that did not become Ready in time ends: every rank's process group is stopped, its
        record kept, so the replica reads as crashed and the plan restarts it with backoff."""
        targets = [t for t in targets if self.reachable(t[0])]
        if not targets:
            return True
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            outcomes = list(pool.map(lambda t: self.launcher.stop(t[0], replica, t[1], keep_record=True), targets))
        for (node, rank), outcome in zip(targets, outcomes):
            self.decide(replica, node, DecisionAction.STOP, f"rank {rank}: not Ready by its start timeout ({outcome.detail}); "
                                               "restarted with backoff", ok=outcome.ok)
            self.note_unanswered(outcome)
        return all(o.ok for o in outcomes)
