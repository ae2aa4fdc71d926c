"""Every action of a pass, carried out at once where nothing orders them: the Actor, which is each
kind of action (replacing over starting, waiting and stopping; weights) put together, and the
table that sends each ActionKind to its handler."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, ClassVar, Sequence

from reconciler.act.actor.replacing import ReplaceActions
from reconciler.act.actor.weights import WeightFetching
from reconciler.errors import ReconcilerError
from reconciler.model import Action
from reconciler.decide.outcomes import ActionOutcome
from reconciler.decide.scheduling import MAX_PARALLEL_ACTIONS, Effects, action_dependencies
from reconciler.vocabulary import ActionKind, LauncherKind


class Actor(ReplaceActions, WeightFetching):
    """Carries out plan actions through a Launcher, recording a Decision for each step (the working
    state it leaves is ActorWork's)."""

    _dispatch: ClassVar[dict[ActionKind, Callable[["Actor", Action], ActionOutcome]]]

    def act_all(self, actions: Sequence[Action]) -> list[ActionOutcome]:
        """Carry out every action, at once where nothing orders them (action_dependencies), at most
        MAX_PARALLEL_ACTIONS at a time; one action's failure never stops the others. Decisions and
        effects come out in plan order whatever order the nodes answered in."""
        if not actions:
            return []
        after = action_dependencies(actions, self.probed,
                                    scheduled_nodes={n.id for n in self.catalog.fleet.nodes if n.launcher == LauncherKind.SLURM})
        buffers = [Effects() for _ in actions]
        futures: list[Future] = []
        # Each action waits only for earlier ones, and the pool takes work first in first out: an
        # action a worker holds never waits for one still queued behind it.
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_ACTIONS, len(actions)),
                                thread_name_prefix="action") as pool:
            for action, effects, deps in zip(actions, buffers, after):
                futures.append(pool.submit(self._act_one, action, effects, [futures[j] for j in deps]))
        outcomes, bug = [], None
        for effects, future in zip(buffers, futures):
            self.effects.merge(effects)
            error = future.exception()
            if error is not None:
                bug = bug or error
                continue
            outcomes.append(future.result())
        order = {a.replica: i for i, a in enumerate(actions)}
        self.pending = dict(sorted(self.pending.items(), key=lambda kv: order.get(kv[0], len(order))))
        if bug is not None:  # a bug, not a node's failure: the daemon logs it whole (after every action ended)
            raise bug
        return outcomes

    def _act_one(self, action: Action, effects: Effects, deps: Sequence[Future]) -> ActionOutcome:
        wait(deps)
        self._local.effects = effects
        try:
            return self.act(action)
        except ReconcilerError as exc:
            self.decide(action.replica, "-", action.action, f"failed: {exc}", ok=False)
            return ActionOutcome(action.replica, action.action, False)
        finally:
            self._local.effects = None

    def act(self, action: Action) -> ActionOutcome:
        return self._dispatch[ActionKind(action.action)](self, action)


# Every ActionKind has its handler: a kind added to the vocabulary without one fails at import, not
# at the first pass that plans it.
Actor._dispatch = {
    ActionKind.START: Actor.start,
    ActionKind.STOP: Actor.stop,
    ActionKind.REPLACE: Actor.replace_replica,
    ActionKind.RESTART: Actor.restart,
}
if set(Actor._dispatch) != set(ActionKind):
    raise ImportError(f"Actor has no handler for {sorted(set(ActionKind) - set(Actor._dispatch))}")
