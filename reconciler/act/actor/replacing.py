"""Replacing a replica: old copy first, or (capacity allowing) the new copy first and the old one
stopped, or left to drain, only once the new one is Ready."""

from __future__ import annotations

from dataclasses import replace

from reconciler.act.actor.starting import StartActions
from reconciler.act.actor.waiting import ReadyWaiting
from reconciler.act.actor.work import APPLY_READY_WAIT_S
from reconciler.model import Action
from reconciler.act.observed import observe_replica
from reconciler.decide.outcomes import ActionOutcome
from reconciler.vocabulary import ActionKind, DecisionAction, Phase
from reconciler.decide.plan_values import Drain


class ReplaceActions(StartActions, ReadyWaiting):
    """A replica replaced by a copy on its new spec, without a hole where capacity allows."""

    def replace_replica(self, action: Action) -> ActionOutcome:
        placement = action.placement
        if placement is None or not placement.nodes:
            # Nothing fits the new spec: the old replica keeps serving rather than leave a hole.
            self.decide(action.replica, "-", DecisionAction.KEEP, action.reason or "no placement for the new copy; old one kept")
            return ActionOutcome(action.replica, ActionKind.REPLACE, True)
        old = self.old_targets(action)
        old_live = [t for t in old if self.reachable(t[0])]
        new_slots = {(a.node, a.rank) for a in placement.nodes}
        # Starting first needs the new ranks' records to be distinct from the old ones (same replica id).
        start_first = bool(old) and not action.stop_first and not (new_slots & set(old))
        if not start_first:
            self.stopping(action, f"replace, old copy first: {action.reason}")
            if not self.stop_ranks(action.replica, old_live, f"replace, old copy first: {action.reason}"):
                return self.fail_action(action, "replace: the old copy could not be stopped")
            self.forget(action.replica, old_live)
            return self.start(action, reason=f"replace: {action.reason}")
        return self.replace_new_first(action, old, old_live)

    def replace_new_first(self, action: Action, old: list[tuple[str, int]],
                          old_live: list[tuple[str, int]]) -> ActionOutcome:
        """Capacity allows: bring the new copy up, and take the old one away only once the new one is Ready."""
        before = self._forgotten.get(action.replica, frozenset())
        kept_ranks = self.ranks_of(action.replica)  # the old copy, as it serves until the new one does
        self.forget(action.replica, old)
        started = self.start(action, reason=f"replace, new copy first: {action.reason}")
        if not started.ok or action.replica not in self.pending:
            self._forgotten[action.replica] = before
            return started
        state = self.wait_ready([action.replica], budget_s=self.replace_wait_s(action))[action.replica]
        if state.phase == Phase.READY:
            if action.keep_previous:
                # A canary's surge: the old copy serves on beside it (plan_values.Plan.beside) until promotion.
                self.decide(action.replica, action.previous.nodes[0].node if action.previous and action.previous.nodes
                            else "-", DecisionAction.KEEP, f"old copy serves on beside the canary: {action.reason}")
                self.pending.pop(action.replica, None)
                return ActionOutcome(action.replica, ActionKind.REPLACE, True, state)
            if not self.begin_drain(action, old_live):
                self.stop_ranks(action.replica, old_live, f"replaced by the new copy: {action.reason}")
            self.pending.pop(action.replica, None)
            return ActionOutcome(action.replica, ActionKind.REPLACE, True, state)
        new_targets = [(l.node, l.rank) for l in self.pending[action.replica].launches]
        self.stop_ranks(action.replica, new_targets, "new copy not Ready; old copy kept")
        for launch in self.pending[action.replica].launches:
            if launch in self.started:
                self.started.remove(launch)
        self._forgotten[action.replica] = before
        message = f"new copy not Ready ({state.message}); old copy kept running"
        outcome = self.fail("replace", action.replica, action.model, state.profile, message,
                            placement=action.placement)
        # What serves is the old copy: report it as it is, so its endpoint stays listed.
        model = self.catalog.model(action.model)
        kept = (observe_replica(self.catalog, kept_ranks, action.replica, model, self.launcher, self.health)
                if model else None)
        if kept is not None:
            outcome = self.settle("replace", replace(kept, message=f"replacement failed: {message}"), ok=False)
        self.pending.pop(action.replica, None)
        return outcome

    def begin_drain(self, action: Action, old_live: list[tuple[str, int]]) -> bool:
        """The new copy serves: the old one, if it was serving, is left to drain (SPEC section 10) rather
        than cut its requests. From here on the replica's state and every gateway file name the new copy;
        the next passes see the old one as a stale copy to stop, and stop it once the gateway serves
        without it and it runs no request (memory.hold_drains). Idle or drain_s 0, it still waits for that
        hand-off (SPEC 13): the gateway files naming it are only written over at the end of this pass.
        False when it is to be stopped at once (not serving)."""
        previous = action.previous
        model = self.catalog.model(action.model)
        if not action.drain or previous is None or not previous.nodes or model is None:
            return False
        if sorted({(a.node, a.rank) for a in previous.nodes}) != sorted(old_live):
            return False  # part of it is on a node that does not answer: nothing to drain
        profile = model.profile(previous.profile)
        now = self.wall_clock()
        drain = Drain(action.replica, action.model, tuple(a.node for a in previous.nodes), previous.nodes[0].port,
                      profile.engine if profile is not None else "", now, now + model.drain_s, profile=previous.profile)
        self.drains_begun[drain.key] = drain
        self.decide(action.replica, previous.nodes[0].node, DecisionAction.DRAIN,
                    f"old copy out of every gateway file; stopped once the gateway serves without it and no "
                    f"request runs (at most {model.drain_s:g} s for requests): "
                    f"{action.reason}")
        return True

    def replace_wait_s(self, action: Action) -> float:
        """A replacement waits for its new copy inside the pass (even for the daemon): the old copy must not
        go before the new one serves, and must not stay beside it for longer than one pass."""
        _, profile = self._model_profile(action)
        timeout = profile.start_timeout_s if profile is not None else APPLY_READY_WAIT_S
        return min(timeout, APPLY_READY_WAIT_S)
