"""Weights, before anything starts: copied to every node a start puts a rank on without them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from reconciler.act.actor.work import ActorWork
from reconciler.act.fetch import Fetcher, choose_source, progress_message
from reconciler.model import Action, Model
from reconciler.decide.outcomes import ReplicaState
from reconciler.act.readiness import DEFAULT_START_TIMEOUT_S
from reconciler.vocabulary import ActionKind, DecisionAction, Phase


class WeightFetching(ActorWork):
    """Weights copied, before the starts that need them, to the nodes probed without them."""

    def weights_needed(self, actions: Sequence[Action]) -> list[tuple[Action, Model, str]]:
        """(action, model, node) for every node a start or replace puts a rank that reads the weights
        on (a llama.cpp worker does not) and that was probed without them, for models that say how to
        fetch them (without fetch, placement never picks such a node)."""
        needed = []
        for a in actions:
            if a.action not in (ActionKind.START, ActionKind.REPLACE) or a.placement is None:
                continue
            model, profile = self._model_profile(a)
            if model is None or model.fetch is None:
                continue
            for assignment in a.placement.nodes:
                if profile is not None and not profile.reads_weights(assignment.rank):
                    continue
                node = self.probed.node(assignment.node)
                if node is not None and node.weights is not None and model.source not in node.weights:
                    needed.append((a, model, assignment.node))
        return needed

    def fetch_weights(self, actions: Sequence[Action], fetcher: Fetcher) -> set[str]:
        """Copy weights to the nodes that lack them, all at once (each model capped at its fetch.max_parallel
        by the Fetcher). The replica is Fetching meanwhile; a failed fetch is its failed start. Returns the
        replicas whose weights could not be fetched: their actions are not carried out."""
        needed = self.weights_needed(actions)
        if not needed:
            return set()
        totals: dict[tuple[str, str], tuple[int, int]] = {}

        sources = {}
        for action, model, node in needed:  # decided here, in order: the pass's decisions do not depend on threads
            sources[(action.replica, node)] = source = choose_source(model, node, self.catalog.fleet, self.probed)
            self.decide(action.replica, node, DecisionAction.FETCH, f"{model.source} from {source or 'nowhere'}: not on {node}")

        def one(item: tuple[Action, Model, str]):
            action, model, node = item
            source = sources[(action.replica, node)]
            _, profile = self._model_profile(action)

            def progress(got: int, total: int) -> None:
                totals[(action.replica, node)] = (got, total)
                got_all = sum(g for (r, _), (g, _) in totals.items() if r == action.replica)
                want_all = sum(t for (r, _), (_, t) in totals.items() if r == action.replica)
                self.states[action.replica] = ReplicaState(
                    action.replica, action.model, profile.name if profile else None, Phase.FETCHING,
                    progress_message(model.source, got_all, want_all), action.placement.nodes)
                self.on_change()

            return item, fetcher.fetch(model, node, source, progress=progress,
                                       timeout_s=profile.start_timeout_s if profile else DEFAULT_START_TIMEOUT_S)

        failed: set[str] = set()
        with ThreadPoolExecutor(max_workers=min(16, len(needed))) as pool:
            for (action, model, node), outcome in pool.map(one, needed):
                self.decide(action.replica, node, DecisionAction.FETCH, str(outcome), ok=outcome.ok)
                if not outcome.ok:
                    failed.add(action.replica)
                    self.fail_action(action, f"fetch of {model.source} to {node} failed: {outcome.reason}")
        for action, _, _ in needed:
            if action.replica not in failed:
                self.states.pop(action.replica, None)  # the start that follows says what it is now
        return failed
