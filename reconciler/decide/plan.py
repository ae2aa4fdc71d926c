"""The diff: desired replicas (the catalog) against observed ones (node records) -> ordered actions.

Pure: every input that changes over time is passed in (`now`, each replica's
`backoff`, when each node became unreachable), so the daemon, `apply` and an
offline `plan` compute the same decisions from the same inputs, and tests need
no clock.

What it decides, in the order the actions come out:

1. stop   replicas of models removed from the catalog, and ordinals above the
          replica count (highest first). Only replicas found in node records
          are ever stopped: those are ours by construction, a foreign process
          never is.
2. stop   stale copies: a replica found on more nodes than it runs on (the
          copy left on a node that came back after its replica was moved).
3. restart a replica with a dead rank, once its crash backoff allows
          (reconciler/decide/backoff.py).
4. replace a replica that sits on a drained node or on a node unreachable
          past the grace period. The new copy is placed while the old one
          still holds its GPUs (start new, then stop old); only when that does
          not fit is the old copy released first (`stop_first`).
5. start  desired replicas not running anywhere; one whose last start failed
          and left nothing running waits out its backoff, or stays stalled.
6. replace a replica whose spec changed (reconciler/decide/rollout.py), decided after
          the starts so that it only ever takes room no missing replica needs:
          surge beside the old copy, else in place on its own nodes. A model with
          `rollout:` (reconciler/decide/canary.py) replaces only its canary replicas while
          Progressing, the rest once Promoting; Aborted, it stops the canary copies
          (drained) and keeps the old ones, starting nothing of the aborted spec: the
          canary replicas start again on the old spec (canary.OldSpec) once their
          canary copies are gone. A canary that surged keeps its replica's old copy
          serving beside it (`Plan.beside`): drained at promotion, kept on abort.

Stops come first so that what they free is free by the time anything starts.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import replace as _replace
from functools import partial
from typing import Iterable, Mapping

from reconciler.decide.backoff import Backoff, attempt_key, backoff_delay
from reconciler.decide.canary import OldSpec, Rollout, RolloutView, canary_ids, phase_for_plan, view
from reconciler.frozen import frozen
from reconciler.teardown import leave_to_exit
from reconciler.observe.inventory import utc_text
from reconciler.model import (
    Action,
    Catalog,
    Inventory,
    Model,
    Placement,
    Profile,
    RunningRank,
    replica_ordinal,
)
from reconciler.decide.copies import (
    Copy, SpecHashes, as_placement, collect_records, effective_state, serving, split_copies, stop_placement,
)
from reconciler.decide.placement import DIST_PORT_BASE, Outcome, Placer, pool_name
from reconciler.decide.plan_values import Plan, Waiting
from reconciler.decide.rollout import SURGE, WAIT, SpecChange, roll_out
from reconciler.vocabulary import ActionKind, GpuHealth, NodeState, RolloutPhase, WaitKind

# A replica with no tries behind it.
_NO_TRIES = Backoff()


# --------------------------------------------------------------------------
# The diff
# --------------------------------------------------------------------------


@frozen
class _Replacement:
    """A running copy to be placed again elsewhere (or anew), decided after every replica was looked at."""

    model: Model
    ordinal: int
    old: Placement  # the running copy; it keeps its resources until the new one is placed
    reason: str
    spec_change: bool = False  # spec changes go one at a time per model; moves off bad nodes all at once
    backoff_after: Backoff | None = None  # None: the new copy's crashes start from none
    # The old copy serves (every rank alive on nodes that answer): it drains before it stops. Not for
    # a crash, a node that does not answer, or a broken GPU: those stop at once.
    drain: bool = False


@contextmanager
def _no_gc():
    """Pause the cyclic garbage collector for one pass.

    A pass allocates a few hundred thousand short-lived, acyclic objects; each
    automatic collection would walk the whole heap, which at fleet scale holds
    millions of catalog and snapshot objects. Measured at 4,000 nodes this
    halves the cost of a pass. Reference counting still frees everything.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_no_gc()
def plan(
    catalog: Catalog,
    inventory: Inventory,
    *,
    now: float = 0.0,
    backoff: Mapping[str, Backoff] | None = None,
    unreachable_since: Mapping[str, float] | None = None,
    grace_s: float | None = None,
    last_seen: Inventory | None = None,
    explain: Iterable[str] = (),
    placed_on: Mapping[str, tuple[str, ...]] | None = None,
    rollouts: Mapping[str, Rollout] | None = None,
    old_specs: Mapping[str, OldSpec] | None = None,
) -> Plan:
    """Compare the catalog with what runs and decide what to do, each action with its reason.

    catalog            desired state (models, fleet); `catalog.revision` is copied into the plan.
    inventory          the observed snapshot; node records are the replicas found running.
    now                epoch seconds; only compared with the other times passed in.
    backoff            per replica, how its tries went, from the previous pass (PassMemory.backoff):
                       a crash's restart and a failed start's next start wait out its backoff.
    unreachable_since  per node, when it was first seen unreachable; a node missing here
                       counts as unreachable since `now` (within grace).
    grace_s            how long replicas on an unreachable node are left alone
                       (default: fleet.yaml unreachable_grace_s).
    last_seen          the previous snapshot: records of nodes unreachable now.
    explain            model names whose placed replicas keep the rejections of skipped profiles.
    placed_on          per replica, the nodes the reconciler last placed it on; when two copies
                       of a replica are found, the copy there is the current one.
    rollouts           per model, its canary rollout as the last pass left it (PassMemory.rollouts).
    old_specs          per model whose rollout is Aborted, the model at the rollout's from_revision
                       (read from git at the edge): what its missing replicas start on again.
    """
    grace_s = catalog.fleet.unreachable_grace_s if grace_s is None else grace_s
    diff = _Diff(catalog, inventory, now=now, backoff=dict(backoff or {}), unreachable_since=unreachable_since or {},
                 grace_s=grace_s, explain=frozenset(explain), rollouts=rollouts or {}, old_specs=old_specs or {})
    placed_on = placed_on or {}
    # 1. Every replica found in node records, one case each (see _Diff.observe).
    for rid, entries in sorted(collect_records(catalog, inventory, last_seen).items()):
        diff.observe(rid, entries, tuple(placed_on.get(rid, ())))
    # 2. Moves off bad nodes, once every running copy holds its resources.
    diff.replace_all()
    # 3. Starts: everything desired and not found running, while every old-spec copy still holds its room.
    diff.start_missing()
    # 4. Spec changes, into the room that is left (SPEC section 7: never room a missing replica needs).
    diff.roll_out()
    # The placer's state (a NodeCapacity per node, its indexes) is only this plan's: a one-shot command
    # leaves it to the exit rather than free it here (15 ms at 4,000 nodes); elsewhere it is freed now.
    leave_to_exit(diff)
    return diff.result()


class _Diff:
    """The accumulators of one plan, and one method per case of an observed copy.

    Each case method decides for one replica and records its action, wait or
    outcome; `plan` is the order in which the cases are visited.
    """

    def __init__(self, catalog: Catalog, inventory: Inventory, *, now: float, backoff: dict[str, Backoff],
                 unreachable_since: Mapping[str, float], grace_s: float, explain: frozenset[str],
                 rollouts: Mapping[str, Rollout], old_specs: Mapping[str, OldSpec]):
        self.catalog = catalog
        self.old_specs = old_specs
        self.inventory = inventory
        self.now = now
        self.backoff = backoff
        self.unreachable_since = unreachable_since
        self.grace_s = grace_s
        self.explain = explain
        self.models = {m.name: m for m in catalog.models}
        self.placer = Placer(catalog.fleet, inventory, catalog.models)
        self.hashes = SpecHashes()
        self.stops_removed: list[Action] = []
        self.stops_scaled: list[Action] = []
        self.stops_stale: list[Action] = []
        self.restarts: list[Action] = []
        self.replaces: list[Action] = []
        self.starts: list[Action] = []
        self.waiting: list[Waiting] = []
        self.outcomes: dict[str, Outcome] = {}
        self.observed: dict[str, Placement] = {}
        self.new_backoff: dict[str, Backoff] = {}
        self.to_replace: list[_Replacement] = []
        self.changes: list[SpecChange] = []
        self.serving_old: set[str] = set()  # spec changes whose old copy drains before it stops
        # Models with `rollout:`: how their spec changes go (canary.phase_for_plan), and the rollout behind it.
        self.canary_stopped: set[str] = set()  # canary copies of an aborted spec stopped (or drained) now
        self.beside: dict[str, Placement] = {}  # canary replicas' old copies kept serving (Plan.beside)
        self.rollouts = {m.name: (phase_for_plan(m, rollouts.get(m.name)), rollouts.get(m.name))
                         for m in catalog.models if m.rollout is not None}

    def rollout_phase(self, model: str) -> RolloutPhase | None:
        return self.rollouts.get(model, (None, None))[0]

    def aborted_why(self, model: str) -> str:
        _, r = self.rollouts.get(model, (None, None))
        return (f"the rollout of this spec was aborted ({r.reason if r is not None else 'its canary failed'}); "
                "not tried again until the spec changes")

    def state(self, node: str) -> str:
        return effective_state(self.catalog, self.inventory, node)

    def tries(self, rid: str) -> Backoff:
        """How the replica's tries went before this pass (a replica never tried: none)."""
        return self.backoff.get(rid, _NO_TRIES)

    # -- the cases of one observed copy, in the order they are tried

    def observe(self, rid: str, entries: list[tuple[str, RunningRank]], preferred_nodes: tuple[str, ...]) -> None:
        model_name = entries[0][1].model
        model = self.models.get(model_name)
        copy, stale = split_copies(self.catalog, self.inventory, rid, entries, model, preferred_nodes, self.hashes)
        current = as_placement(self.catalog, self.inventory, copy, model)
        self.observed[rid] = current
        ordinal = replica_ordinal(model_name, rid)
        if model is None or ordinal is None or ordinal >= model.replicas:
            self.not_desired(rid, model_name, model, entries)
            return
        stale = self.keep_beside(rid, model, copy, stale)
        self.stop_stale(rid, model_name, copy, stale)
        # Whatever happens to it, the running copy holds its GPUs and ports until it is stopped.
        self.placer.hold(current)
        tries = self.tries(rid)
        lost = [n for n in copy.nodes if self.state(n) == NodeState.UNREACHABLE]
        drained = [n for n in copy.nodes if self.state(n) == NodeState.DRAINED]
        profile = model.profile(copy.profile)
        if lost:
            self.on_lost_node(rid, model, ordinal, current, tries, lost)
        elif drained:
            self.to_replace.append(_Replacement(model, ordinal, current, f"node {', '.join(drained)} is drained",
                                                drain=self.complete_and_alive(copy)))
        elif bad := self.bad_gpus(copy):
            # SPEC section 9: a replica on a GPU that turned unhealthy or lost moves, as off a drained node.
            self.to_replace.append(_Replacement(model, ordinal, current, bad))
        elif profile is None or self.spec_changed(model, profile, copy):
            why = "spec changed" if profile is not None else f"profile {copy.profile} is no longer in the catalog"
            self.to_replace.append(_Replacement(model, ordinal, current, why, spec_change=True,
                                                drain=self.complete_and_alive(copy)))
        elif self.rollout_phase(model.name) == RolloutPhase.ABORTED:
            self.stop_aborted_canary(rid, model, current, copy)
            if rid in self.beside:
                # The old copy beside it serves on as the replica: nothing to start again.
                old = self.beside[rid]
                self.outcomes[rid] = Outcome(rid, model.name, old, kept=True)
                self.waiting.append(Waiting(rid, model.name, f"spec changed; runs the old spec: {self.aborted_why(model.name)}",
                                            kind=WaitKind.ROLLOUT_ABORTED))
        elif any(not r.alive for _, r in copy.ranks) or self.missing_ranks(copy):
            self.crashed(rid, model, ordinal, current, copy, profile, tries)
        else:
            self.healthy(rid, model_name, current, tries)

    def keep_beside(self, rid: str, model: Model, copy: Copy,
                    stale: list[tuple[str, RunningRank]]) -> list[tuple[str, RunningRank]]:
        """A canary replica that surged runs two copies: the canary (the copy kept, on the catalog's spec)
        and its old copy, alive on nodes that answer. While the rollout is Progressing the old copy
        serves on as a stable one, and on abort it is the replica again (SPEC section 13: the stable
        copies keep serving on the old spec); once Promoting it is a stale copy, drained and stopped.
        Returns the stale ranks left to stop."""
        if self.rollout_phase(model.name) not in (RolloutPhase.PROGRESSING, RolloutPhase.ABORTED) or not stale:
            return stale
        profile = model.profile(copy.profile)
        if rid not in canary_ids(model) or profile is None or self.spec_changed(model, profile, copy):
            return stale
        old = [(n, r) for n, r in stale if r.spec_hash != copy.ranks[0][1].spec_hash]
        whole = {r.rank for _, r in old} == set(range(max(r.nnodes for _, r in old))) if old else False
        if not whole or not serving(old) or any(self.state(n) not in (NodeState.READY, NodeState.CORDONED)
                                                for n, _ in old):
            return stale
        old.sort(key=lambda e: e[1].rank)
        kept = as_placement(self.catalog, self.inventory, Copy(rid, model.name, old[0][1].profile,
                                                               old[0][1].nnodes, old), model)
        self.placer.hold(kept)
        self.beside[rid] = kept
        return [e for e in stale if e not in old]

    def stop_aborted_canary(self, rid: str, model: Model, current: Placement, copy: Copy) -> None:
        """A copy of an aborted spec (a canary): drained and stopped through the plan's stop, as a scale
        down's; the replica then waits for a spec that is not the aborted one (start_missing)."""
        stop = Action(ActionKind.STOP, rid, model.name, f"canary aborted: {self.aborted_why(model.name)}",
                      stop_placement(rid, model.name, copy.ranks), drain=self.complete_and_alive(copy))
        self.placer.release(current)
        self.canary_stopped.add(rid)
        self.stops_scaled.append(stop)
        self.hold_if_draining(stop, model)
        self.new_backoff[rid] = self.tries(rid)

    def bad_gpus(self, copy: Copy) -> str:
        """`gpu 3 of h100-a1 is unhealthy: Xid 79 ...` for the copy's GPUs that are not ok or are
        quarantined (the crash-loop breaker's: it is placed elsewhere, not restarted there), else ""."""
        said = []
        for node, rank in copy.ranks:
            obs = self.inventory.node(node)
            if obs is None or not rank.gpus:
                continue
            on = set(rank.gpus)
            said += [f"gpu {g.index} of {node} is {g.health}" + (f": {g.health_reason}" if g.health_reason else "")
                     for g in obs.gpus if g.index in on and g.health != GpuHealth.OK]
            said += [f"gpu {g.index} of {node} is quarantined: {g.quarantined.reason}"
                     for g in obs.gpus if g.index in on and g.health == GpuHealth.OK and g.quarantined is not None]
        return "; ".join(said)

    def not_desired(self, rid: str, model_name: str, model: Model | None, entries: list[tuple[str, RunningRank]]) -> None:
        """A model removed from the catalog, or an ordinal above the replica count: stop it where it answers."""
        why = "model removed from the catalog" if model is None else f"scaled down to {model.replicas} replica{'s' * (model.replicas != 1)}"
        reachable = [(n, r) for n, r in entries if self.state(n) != NodeState.UNREACHABLE]
        away = sorted({n for n, r in entries if self.state(n) == NodeState.UNREACHABLE})
        if reachable:
            stop = Action(ActionKind.STOP, rid, model_name, why, stop_placement(rid, model_name, reachable),
                          drain=not away and serving(reachable))
            (self.stops_removed if model is None else self.stops_scaled).append(stop)
            self.hold_if_draining(stop, model)
        if away:
            # A node that does not answer cannot be told to stop; its copy is stopped when it is back.
            self.waiting.append(Waiting(rid, model_name, f"{why}; stopped on {', '.join(away)} when it answers again",
                                        kind=WaitKind.STOP_WHEN_BACK, nodes=tuple(away)))

    def stop_stale(self, rid: str, model_name: str, copy: Copy, stale: list[tuple[str, RunningRank]]) -> None:
        """Ranks beside the copy kept (left on a node that came back after the replica moved)."""
        reachable_stale = [(n, r) for n, r in stale if self.state(n) != NodeState.UNREACHABLE]
        if reachable_stale:
            where = ", ".join(sorted({n for n, _ in copy.ranks}))
            stop = Action(ActionKind.STOP, rid, model_name, f"stale copy: the replica runs on {where}",
                          stop_placement(rid, model_name, reachable_stale),
                          drain=len(reachable_stale) == len(stale) and serving(reachable_stale))
            self.stops_stale.append(stop)
            self.hold_if_draining(stop, self.models.get(model_name))

    def hold_if_draining(self, stop: Action, model: Model | None) -> None:
        """A copy that drains keeps its GPUs and ports until it stops, a pass or more later: nothing
        placed in this pass may count on them (with drain_s 0 too: its hand-off to the gateway comes first)."""
        if stop.drain and stop.placement is not None:
            self.placer.hold(stop.placement)

    def on_lost_node(self, rid: str, model: Model, ordinal: int, current: Placement, tries: Backoff,
                     lost: list[str]) -> None:
        """Left alone within the grace period; placed elsewhere after it."""
        now, grace_s, since = self.now, self.grace_s, self.unreachable_since
        overdue = [n for n in lost if now - since.get(n, now) >= grace_s]
        if overdue:
            n = overdue[0]
            self.to_replace.append(_Replacement(model, ordinal, current,
                                                f"node {n} unreachable for {int(now - since.get(n, now))} s "
                                                f"(grace {int(grace_s)} s)"))
            return
        self.outcomes[rid] = Outcome(rid, model.name, current, kept=True)
        self.new_backoff[rid] = tries
        first = min(since.get(n, now) for n in lost)
        lost_text = f"node {', '.join(lost)} unreachable"
        if any(n in since for n in lost):
            lost_text += f" since {utc_text(first)}"
            when = f"after {utc_text(first + grace_s)} (grace {int(grace_s)} s)"
        else:
            when = f"if it stays unreachable for {int(grace_s)} s"
        self.waiting.append(Waiting(rid, model.name, f"{lost_text}; replaced elsewhere {when}",
                                    first + grace_s, kind=WaitKind.NODE_UNREACHABLE, nodes=tuple(lost)))

    def spec_changed(self, model: Model, profile: Profile, copy: Copy) -> bool:
        digest = copy.ranks[0][1].spec_hash
        return self.hashes.of(model, profile) != digest or any(r.spec_hash != digest for _, r in copy.ranks)

    def complete_and_alive(self, copy: Copy) -> bool:
        """Every rank there and alive: the copy may be serving, so stopping it drains it first."""
        return not self.missing_ranks(copy) and serving(copy.ranks)

    @staticmethod
    def missing_ranks(copy: Copy) -> list[int]:
        return sorted(set(range(copy.nnodes)) - {r.rank for _, r in copy.ranks})

    def crashed(self, rid: str, model: Model, ordinal: int, current: Placement, copy: Copy, profile: Profile,
                tries: Backoff) -> None:
        """A dead or missing rank: restart in place after the backoff (placed again when a rank is missing)."""
        dead = [(n, r) for n, r in copy.ranks if not r.alive]
        missing = self.missing_ranks(copy)
        self.outcomes[rid] = Outcome(rid, model.name, current, kept=True)
        what = [f"rank {r.rank} on {n} is dead" for n, r in dead] + [f"rank {k} is missing" for k in missing]
        until = tries.held_until(self.now)
        if until is not None:
            wait = f"waiting for backoff until {utc_text(until)} (restart {tries.restarts + 1})"
            self.waiting.append(Waiting(rid, model.name, f"{'; '.join(what)}; {wait}", until,
                                        kind=WaitKind.BACKOFF, next_step=wait))
            self.new_backoff[rid] = tries
            return
        after = self.new_backoff[rid] = tries.restarted(self.now)
        why = f"{'; '.join(what)}; restart {after.restarts} (next backoff {int(backoff_delay(after.streak))} s)"
        if missing:
            # Where a lost rank ran is unknown, so the replica is placed again as a whole.
            del self.outcomes[rid]
            self.to_replace.append(_Replacement(model, ordinal, current, why, backoff_after=after))
            return
        target = _restart_placement(self.placer, current, profile)
        self.restarts.append(Action(ActionKind.RESTART, rid, model.name, why, target, previous=current))

    def healthy(self, rid: str, model_name: str, current: Placement, tries: Backoff) -> None:
        """Kept where it is; a quiet spell long enough resets the backoff, not the count shown in status."""
        self.outcomes[rid] = Outcome(rid, model_name, current, kept=True)
        self.new_backoff[rid] = tries.calmed(self.now)

    # -- after every copy was looked at

    def replace_all(self) -> None:
        """Moves off bad nodes, all at once; spec changes are set aside for roll_out (after the starts)."""
        for r in sorted(self.to_replace, key=lambda r: (r.model.name, r.ordinal)):
            if r.spec_change:
                self.changes.append(SpecChange(r.model, r.ordinal, r.old, r.reason))
                if r.drain:
                    self.serving_old.add(r.old.replica)
                # Kept for now, so start_missing does not take it for a replica that is not running.
                self.outcomes[r.old.replica] = Outcome(r.old.replica, r.model.name, r.old, kept=True)
                continue
            self.replace_one(r)

    def roll_out(self) -> None:
        """Each spec change: surge, in place, elsewhere, no fit, or wait for its turn (reconciler/decide/rollout.py)."""
        down: dict[str, int] = {}  # per model, desired replicas not serving after this pass
        for o in self.outcomes.values():
            if o.placement is None:
                down[o.model] = down.get(o.model, 0) + 1
        for a in self.restarts:
            down[a.model] = down.get(a.model, 0) + 1
        for step in roll_out(self.placer, self.canary_held(self.changes), down=down, explain=self.explain):
            rid, model = step.replica, step.change.model
            self.outcomes[rid] = step.outcome
            if step.how == WAIT:
                self.new_backoff[rid] = self.tries(rid)
                kind = WaitKind.ONE_AT_A_TIME if model.update is None else WaitKind.UPDATE_POLICY
                self.waiting.append(Waiting(rid, model.name, step.reason, kind=kind))
                continue
            self.new_backoff[rid] = self.tries(rid).anew()
            # A canary's surge keeps the old copy serving beside it until promotion (SPEC section 13).
            keep = (step.how == SURGE and self.rollout_phase(model.name) == RolloutPhase.PROGRESSING
                    and rid in canary_ids(model))
            self.replaces.append(Action(ActionKind.REPLACE, rid, model.name, step.reason, step.outcome.placement,
                                        previous=step.change.old, stop_first=step.stop_first,
                                        drain=rid in self.serving_old, keep_previous=keep))

    def canary_held(self, changes: list[SpecChange]) -> list[SpecChange]:
        """The spec changes a canary rollout lets through now (SPEC section 13): only the canary replicas
        while Progressing, none once Aborted, all once Promoting; those held keep the old spec, waiting."""
        through = []
        for c in changes:
            phase = self.rollout_phase(c.model.name)
            rid = c.old.replica
            if phase == RolloutPhase.ABORTED:
                self.hold_old(c, f"{c.reason}; runs the old spec: {self.aborted_why(c.model.name)}",
                              WaitKind.ROLLOUT_ABORTED)
            elif phase == RolloutPhase.PROGRESSING and rid not in canary_ids(c.model):
                self.hold_old(c, f"{c.reason}; runs the old spec while the canary "
                                 f"({', '.join(canary_ids(c.model))}) is checked", WaitKind.CANARY)
            else:
                through.append(c)
        return through

    def hold_old(self, c: SpecChange, reason: str, kind: WaitKind) -> None:
        rid = c.old.replica
        self.outcomes[rid] = Outcome(rid, c.model.name, c.old, kept=True)
        self.new_backoff[rid] = self.tries(rid)
        self.waiting.append(Waiting(rid, c.model.name, reason, kind=kind))

    def replace_one(self, r: _Replacement) -> None:
        model, rid, old, why = r.model, r.old.replica, r.old, r.reason
        explain = model.name in self.explain
        out = self.placer.place(model, rid, exclude=[a.node for a in old.nodes], explain=explain)
        stop_first = False
        if out.placement is None:
            # No room beside the old copy: free its resources and try again, stopping it first.
            self.placer.release(old)
            retry = self.placer.place(model, rid, explain=explain)
            out, stop_first = retry, retry.placement is not None
            if retry.placement is None:
                self.placer.hold(old)
        self.outcomes[rid] = out
        fresh = self.tries(rid).anew()
        self.new_backoff[rid] = r.backoff_after if r.backoff_after is not None else fresh
        reason = why + ("; no room beside the old copy, so it is stopped first" if stop_first else "")
        if out.placement is None:
            reason += "; no placement fits, the old copy keeps running"
        self.replaces.append(Action(ActionKind.REPLACE, rid, model.name, reason, out.placement, previous=old,
                                    stop_first=stop_first, drain=r.drain))

    def start_missing(self) -> None:
        """Everything desired and not running, placed; a start that failed before waits instead while its
        backoff holds it (the placement stays counted, so nothing else takes its room in this pass)."""
        # An aborted spec starts nothing (SPEC section 13). Its missing replicas (the canary's, once their
        # canary copies are gone) start again on the old spec, so the model serves its full count; where
        # the old spec could not be had they wait for the spec to change, saying why.
        models, old_spec = [], {}
        for m in self.catalog.models:
            if self.rollout_phase(m.name) != RolloutPhase.ABORTED:
                models.append(m)
                continue
            old = self.old_specs.get(m.name)
            if old is not None and old.model is not None:
                # The catalog's count (autoscaling included), on the old spec.
                old_spec[m.name] = old
                models.append(_replace(old.model, replicas=m.replicas))
                continue
            why = f"not started: {self.aborted_why(m.name)}"
            if old is not None and old.why:
                why += f"; not started on the old spec either: {old.why}"
            for rid in m.replica_ids():
                if rid not in self.outcomes and rid not in self.canary_stopped:
                    self.waiting.append(Waiting(rid, m.name, why, kind=WaitKind.ROLLOUT_ABORTED))
        # A canary copy stopped in this pass may still drain under the same replica id: its replica
        # starts on the old spec in a later pass, never beside it (a start clears the replica's ranks).
        decided = {**self.outcomes, **{rid: Outcome(rid, "", None) for rid in self.canary_stopped}}
        placed = self.placer.place_missing(models, decided, self.explain)
        self.outcomes.update({rid: o for rid, o in decided.items() if rid not in self.canary_stopped})
        for o in placed:
            old = old_spec.get(o.model)
            if old is None:
                start = Action(ActionKind.START, o.replica, o.model, "not running", o.placement)
            else:
                start = Action(ActionKind.START, o.replica, o.model,
                               f"not running; canary aborted: started again on the old spec of revision "
                               f"{(old.revision or '?')[:12]}", o.placement, spec=old.model,
                               spec_revision=old.revision)
            tries = self.new_backoff[o.replica] = self.tries(o.replica).anew()
            until = tries.held_until(self.now, start=partial(attempt_key, self.catalog, self.inventory, start))
            if until is None:
                self.starts.append(start)
            else:
                self.waiting.append(_held_start(start, tries))

    def _backoff_after(self) -> dict[str, Backoff]:
        """Every replica looked at, as this pass leaves it; of the others only a failed start, kept for
        memory.remember to judge (a replica not running has no crashes to remember)."""
        kept = {rid: b.anew() for rid, b in self.backoff.items() if b.failure is not None}
        return {**kept, **self.new_backoff}

    def result(self) -> Plan:
        def by_model_ordinal(a: Action):
            return (a.model, replica_ordinal(a.model, a.replica) or 0)

        self.stops_scaled.sort(key=lambda a: (a.model, -(replica_ordinal(a.model, a.replica) or 0)))
        self.starts.sort(key=by_model_ordinal)
        self.restarts.sort(key=by_model_ordinal)
        # Stops first, so that what they free is free by the time anything starts.
        actions = tuple(self.stops_removed + self.stops_scaled + self.stops_stale + self.restarts + self.replaces
                        + self.starts)
        ordered = {rid: self.outcomes[rid] for model in self.catalog.models for rid in model.replica_ids()
                   if rid in self.outcomes}
        return Plan(
            actions=actions,
            outcomes=ordered,
            unplaced=tuple(o for o in ordered.values() if o.placement is None),
            waiting=tuple(sorted(self.waiting, key=lambda w: w.replica)),
            observed=self.observed,
            backoff=dict(sorted(self._backoff_after().items())),
            revision=self.catalog.revision,
            rollouts=self.rollout_views(),
            beside=dict(self.beside),
        )

    def rollout_views(self) -> tuple[RolloutView, ...]:
        changing = {c.model.name for c in self.changes}
        views = (view(m, self.rollouts[m.name][1], m.name in changing) for m in self.catalog.models
                 if m.name in self.rollouts)
        return tuple(v for v in views if v is not None)


def _held_start(start: Action, tries: Backoff) -> Waiting:
    """A start held by its failed start before: backing off (temporary), or stalled (permanent)."""
    failed = f"{tries.failed_starts} failed start{'s' * (tries.failed_starts != 1)}"
    if tries.stalled:
        where = f"node {', '.join(tries.nodes)}" if tries.nodes else "the node"
        reason = (f"{tries.message}; stalled until the catalog or {where} changes ({failed}; checked again after "
                  f"{utc_text(tries.retry_at)})")
        return Waiting(start.replica, start.model, reason, tries.retry_at, kind=WaitKind.STALLED, nodes=tries.nodes)
    reason = f"{tries.message}; retried after {utc_text(tries.retry_at)} ({failed}, backing off)"
    return Waiting(start.replica, start.model, reason, tries.retry_at, kind=WaitKind.START_BACKOFF, nodes=tries.nodes)


def _restart_placement(placer: Placer, current: Placement, profile: Profile) -> Placement:
    """The same nodes, GPUs and ports again; a multi-node replica also needs a rendezvous port."""
    placement = _replace(current, pool=pool_name(current.fabric, profile))
    if len(current.nodes) > 1:
        head = placer.by_id.get(current.nodes[0].node)
        port = head.free_port(DIST_PORT_BASE, also_taken=current.nodes[0].port) if head is not None else DIST_PORT_BASE
        placement = _replace(placement, dist_port=port)
        if head is not None and port is not None:
            head.ports_used.add(port)
    return placement
