"""The actor: carries out plan actions on the nodes, through a Launcher. Effects only.

A replica is not "placed" until a process runs on every node the plan named
and the ranks found each other (the seed's lesson). So:

- a replica's ranks start as one: workers first, head last (the head waits
  for its workers), and if any rank fails to start, the ranks already started
  are stopped again, so nothing is left half-started;
- a rank never starts on a GPU a foreign process uses, or whose memory is
  mostly taken, and the refusal names the process and the MiB;
- records on the nodes are the memory: after a restart, whatever runs is
  adopted as it is (the node agent answers "already running" instead of
  launching a second copy).

Every action returns an ActionOutcome and records Decisions; what to do is
the plan's, whether it serves is readiness.py's (observed.py for a replica of
an earlier pass), the snapshot arithmetic is snapshot.py's.

The actions of a pass run at once (`act_all`, a bounded pool), each command
under its node's own deadline, so a node that stops answering holds up only
the actions on it. What has to stay in order does: an action waits for the
earlier ones about the same replica or about a GPU or port it takes or frees
(scheduling.py: a stop that frees GPUs before the start that takes them; Slurm
submissions in plan order); inside one action the steps are as before (a stop-first replace stops,
then starts; ranks start in start_order). Each action writes its effects to a
buffer of its own, merged in plan order, so the decisions, the snapshot after
the pass and status read as if the actions had run one after another.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Callable, ClassVar, Iterable, Sequence

from reconciler.engine_metrics import EngineLoad, profile_series, read_load
from reconciler.errors import PERMANENT, TEMPORARY, ReconcilerError, RenderError, TransportError
from reconciler.fetch import Fetcher, choose_source, progress_message
from reconciler.launcher import Launcher, StartOutcome, StopOutcome
from reconciler.model import Action, Catalog, Fleet, Inventory, Model, Placement, Profile, RankKey, RankLaunch
from reconciler.outcomes import (
    FAILED,
    FETCHING,
    PENDING,
    READY,
    STARTING,
    STOPPING,
    ActionOutcome,
    Decision,
    ReplicaState,
)
from reconciler.readiness import (
    DEFAULT_START_TIMEOUT_S,
    LOG_LINES_IN_MESSAGE,
    HealthCheck,
    Liveness,
    StartedReplica,
    http_health,
    judge_started,
    liveness_due,
    observed_gpus,
)
from reconciler.observed import head_host, observe_replica
from reconciler.plan import Drain
from reconciler.scheduling import MAX_PARALLEL_ACTIONS, Effects, action_dependencies
from reconciler.snapshot import RankRecords, gpu_problems, ranks_by_replica, start_order
from reconciler.vocabulary import ActionKind, NodeState

# `apply` waits at most this long for a started replica to become Ready; past it the
# replica is reported Starting and the next pass (or the daemon) keeps watching.
APPLY_READY_WAIT_S = 300.0
POLL_INTERVAL_S = 0.2

RenderFn = Callable[[Model, Profile, Placement, Fleet, Inventory], list[RankLaunch]]
LogFn = Callable[[Decision], None]


class Actor:
    _dispatch: ClassVar[dict[ActionKind, Callable[["Actor", Action], ActionOutcome]]]
    """Carries out plan actions through a Launcher, recording a Decision for each step.

    Working state, read by the pass when the actions are done:
      states   replica -> the state an action left it in
      started / stopped / pids / taken_ports   what changed on the fleet (snapshot.inventory_after)
      pending  replicas launched in this pass, not yet judged (wait_ready)
    """

    def __init__(
        self,
        catalog: Catalog,
        inventory: Inventory,
        launcher: Launcher,
        render: RenderFn,
        log: LogFn,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        ready_wait_s: float | None = None,
        health: HealthCheck = http_health,
        wall_clock: Callable[[], float] = time.time,
    ):
        self.catalog = catalog
        self.probed = inventory  # as the probe saw it; the ranks stopped since are in _forgotten
        self.launcher = launcher
        self.render = render
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.ready_wait_s = APPLY_READY_WAIT_S if ready_wait_s is None else ready_wait_s
        self.health = health
        self.effects = Effects()  # every action's, merged in plan order
        self.states: dict[str, ReplicaState] = {}  # replica -> state (each action writes its own replica's)
        self.pending: dict[str, StartedReplica] = {}
        # Told when a replica's state changes mid-pass (Fetching progress, Stopping): status rewrites.
        self.on_change: Callable[..., None] = lambda force=False: None
        self._records = ranks_by_replica(inventory)  # as probed
        self._forgotten: dict[str, frozenset[tuple[str, int | None]]] = {}  # replica -> ranks stopped this pass
        self._local = threading.local()  # .effects: the buffer of the action this thread carries out
        # drain_key -> old copies of new-first replaces left draining (begin_drain); one key per action.
        self.drains_begun: dict[str, Drain] = {}
        self.wall_clock = wall_clock  # epoch seconds, as the plan's `now`: a drain's start and end

    # -- bookkeeping: effects go to the buffer of the action in progress (act_all), else to the pass's

    @property
    def _fx(self) -> Effects:
        return getattr(self._local, "effects", None) or self.effects

    @property
    def decisions(self) -> list[Decision]:
        return self._fx.decisions

    @property
    def started(self) -> list[RankLaunch]:
        return self._fx.started

    @property
    def stopped(self) -> list[RankKey]:
        return self._fx.stopped

    @property
    def pids(self) -> dict[RankKey, int]:
        return self._fx.pids

    @property
    def taken_ports(self) -> dict[str, set[int]]:
        return self._fx.taken_ports

    @property
    def adopted_revisions(self) -> dict[RankKey, str | None]:
        return self._fx.adopted_revisions

    def decide(self, replica: str, node: str, action: str, reason: str, ok: bool = True) -> None:
        d = Decision(replica, node, action, reason, ok)
        self.decisions.append(d)
        self.log(d)

    def settle(self, action: str, state: ReplicaState, ok: bool) -> ActionOutcome:
        self.states[state.replica] = state
        return ActionOutcome(state.replica, action, ok, state)

    def fail(self, action: str, replica: str, model: str, profile: str | None, message: str, node: str = "-",
             placement: Placement | None = None, failure: str = TEMPORARY) -> ActionOutcome:
        """The replica is Failed; `failure` (errors.TEMPORARY or PERMANENT) says whether a retry can help."""
        self.decide(replica, node, "fail", message, ok=False)
        return self.settle(action, ReplicaState(
            replica, model, profile, FAILED, message, placement.nodes if placement else (),
            self.catalog.fleet.endpoint(placement.head.node, placement.head.port) if placement else None,
            failure=failure,
        ), ok=False)

    def fail_action(self, action: Action, message: str, failure: str = TEMPORARY) -> ActionOutcome:
        """fail() with the profile and placement the action names."""
        _, profile = self._model_profile(action)
        return self.fail(action.action, action.replica, action.model, profile.name if profile else None, message,
                         placement=action.placement, failure=failure)

    # -- actions

    def act_all(self, actions: Sequence[Action]) -> list[ActionOutcome]:
        """Carry out every action, at once where nothing orders them (action_dependencies), at most
        MAX_PARALLEL_ACTIONS at a time; one action's failure never stops the others. Decisions and
        effects come out in plan order whatever order the nodes answered in."""
        if not actions:
            return []
        after = action_dependencies(actions, self.probed,
                                    scheduled_nodes={n.id for n in self.catalog.fleet.nodes if n.launcher == "slurm"})
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

    def old_targets(self, action: Action) -> list[tuple[str, int]]:
        """(node, rank) of the copy an action supersedes: the plan's `previous`, else what the records show."""
        if action.previous is not None and action.previous.nodes:
            return sorted({(a.node, a.rank) for a in action.previous.nodes})
        return self.recorded_targets(action.replica)

    def recorded_targets(self, replica: str) -> list[tuple[str, int]]:
        """(node, rank) of every record of the replica in the working snapshot."""
        return sorted({(n.id, r.rank) for n, r in self.ranks_of(replica)})

    def ranks_of(self, replica: str) -> RankRecords:
        """The replica's records as probed, less the ranks this pass stopped (forget)."""
        gone = self._forgotten.get(replica, frozenset())
        return [(n, r) for n, r in self._records.get(replica, []) if (n.id, r.rank) not in gone and (n.id, None) not in gone]

    def reachable(self, node_id: str) -> bool:
        node = self.probed.node(node_id)
        return node is not None and node.state != NodeState.UNREACHABLE

    def forget(self, replica: str, targets: Iterable[tuple[str, int | None]]) -> None:
        """Drop stopped ranks from the replica's working records, so later checks do not trip over them.
        Per replica: actions on other replicas, running at the same time, never see it."""
        self._forgotten[replica] = self._forgotten.get(replica, frozenset()) | frozenset(targets)

    def restart(self, action: Action) -> ActionOutcome:
        # A crashed rank takes its whole replica down: ranks of a multi-node replica only rendezvous at start.
        targets = [t for t in self.old_targets(action) if self.reachable(t[0])]
        self.stopping(action, f"restart: {action.reason}")
        if not self.stop_ranks(action.replica, targets, f"restart: {action.reason}"):
            return self.fail_action(action, "restart: the crashed copy could not be stopped")
        self.forget(action.replica, targets)
        return self.start(action, reason=f"restart: {action.reason}")

    def _model_profile(self, action: Action) -> tuple[Model | None, Profile | None]:
        model = self.catalog.model(action.model)
        if model is None or action.placement is None:
            return model, None
        return model, model.profile(action.placement.profile)

    def start(self, action: Action, *, reason: str | None = None) -> ActionOutcome:
        placement = action.placement
        model, profile = self._model_profile(action)
        verb = action.action
        if placement is None or not placement.nodes or model is None or profile is None:
            why = action.reason or "no placement"
            self.decide(action.replica, "-", "skip", f"cannot start: {why}")
            return self.settle(verb, ReplicaState(action.replica, action.model, None, PENDING, why), ok=True)
        try:
            # Each rank's record keeps the revision it comes from, so status can say which replicas
            # still run an older spec.
            launches = [replace(l, revision=self.catalog.revision)
                        for l in self.render(model, profile, placement, self.catalog.fleet, self.probed)]
        except RenderError as exc:  # the catalog has to change first
            return self.fail(verb, action.replica, action.model, profile.name, f"launch refused: {exc}",
                             placement=placement, failure=PERMANENT)

        # Against the snapshot as probed: memory our own ranks held then (stopped since, in a
        # restart or a replace) is ours to reuse, not a foreign tenant's.
        problems = [p for l in launches for p in gpu_problems(l, self.probed.node(l.node))]
        if problems:
            return self.fail(verb, action.replica, action.model, profile.name, "GPUs not clean: " + "; ".join(problems),
                             node=placement.head.node, placement=placement)

        if not self.clear_earlier_copy(action.replica, launches):
            return self.fail(verb, action.replica, action.model, profile.name, "an earlier copy could not be stopped",
                             placement=placement)

        failed = self.launch_ranks(launches, reason or action.reason or "missing")
        if failed is not None:
            launch, message, failure = failed
            return self.fail(verb, action.replica, action.model, profile.name, message, node=launch.node,
                             placement=placement, failure=failure)

        self.pending[action.replica] = StartedReplica(launches, action.model, profile, placement, self.clock())
        return self.settle(verb, ReplicaState(
            action.replica, action.model, profile.name, STARTING, "", placement.nodes,
            self.catalog.fleet.endpoint(placement.head.node, placement.head.port),
            revision=self.revision_of(launches),
        ), ok=True)

    def revision_of(self, launches: Sequence[RankLaunch]) -> str | None:
        """The revision the replica's processes come from: its head's, the adopted record's when the
        head was found already running (started by an earlier revision with the same spec)."""
        head = next(l for l in launches if l.rank == 0)
        key = (head.node, head.replica, head.rank)
        return self.adopted_revisions.get(key, self.effects.adopted_revisions.get(key, head.revision))

    def clear_earlier_copy(self, replica: str, launches: Sequence[RankLaunch]) -> bool:
        """Ranks of this replica left from an earlier life (dead, or on other nodes) would collide with
        the new ones or answer in their place: clear them first, unless every one is alive exactly
        where the plan wants it (then the agent adopts them). False when they could not be stopped."""
        wanted = {(l.node, l.rank, l.spec_hash) for l in launches}
        # Ranks on unreachable nodes cannot be cleared now; the plan stops them as stale copies when they return.
        existing = [(n, r) for n, r in self.ranks_of(replica) if n.state != NodeState.UNREACHABLE]
        if not existing or all(r.alive and (n.id, r.rank, r.spec_hash) in wanted for n, r in existing):
            return True
        targets = sorted({(n.id, r.rank) for n, r in existing})
        if not self.stop_ranks(replica, targets, "clearing an earlier, incomplete copy"):
            return False
        self.forget(replica, targets)
        return True

    def launch_ranks(self, launches: Sequence[RankLaunch], why: str) -> tuple[RankLaunch, str, str] | None:
        """Start every rank, workers first; on the first failure roll back and return (that rank, why,
        the failure's kind: errors.TEMPORARY or PERMANENT, as the launcher typed it)."""
        outcomes: list[tuple[RankLaunch, StartOutcome]] = []
        for launch in start_order(launches):
            outcome = self.launcher.start(launch)
            outcomes.append((launch, outcome))
            if not outcome.ok:
                break
            verb = "adopt" if outcome.already_running else "start"
            if outcome.already_running:
                what = "already running, adopted"
            elif outcome.slurm_job:
                what = f"Slurm job {outcome.slurm_job}"
            elif outcome.pid is None and not launch.health_path:
                what = "held for the replica's job"
            else:
                what = f"pid {outcome.pid}"
            self.decide(launch.replica, launch.node, verb,
                        f"rank {launch.rank}/{launch.nnodes} port {launch.port} ({what}): {why}")
            if outcome.already_running:
                self.adopted_revisions[RankKey(launch.node, launch.replica, launch.rank)] = outcome.revision
            else:
                self.started.append(launch)
                if outcome.pid is not None:
                    self.pids[RankKey(launch.node, launch.replica, launch.rank)] = outcome.pid
        failed = next(((l, o) for l, o in outcomes if not o.ok), None)
        if failed is None:
            return None
        launch, outcome = failed
        message = f"rank {launch.rank} on {launch.node} did not start: {outcome.reason}"
        self.roll_back(outcomes, message)
        if outcome.port_in_use:
            # The snapshot written after this pass says so, and the next plan picks another port.
            self.taken_ports.setdefault(launch.node, set()).add(outcome.port_in_use)
        return launch, message, outcome.failure or TEMPORARY

    def roll_back(self, outcomes: Sequence[tuple[RankLaunch, StartOutcome]], message: str) -> None:
        """Nothing half-started: take back the ranks that did start, and the one whose node
        stopped answering mid-launch (it may have started; if it cannot be reached now,
        its record is on the node and the next probe finds it)."""
        for l, o in outcomes:
            if not o.ok and o.uncertain:
                undone = self.launcher.stop(l.node, l.replica, l.rank)
                self.decide(l.replica, l.node, "stop",
                            f"rank {l.rank}: rolled back after losing the node mid-launch ({undone.detail})",
                            ok=undone.ok)
            elif o.ok:
                undone = self.launcher.stop(l.node, l.replica, l.rank)
                self.decide(l.replica, l.node, "stop", f"rank {l.rank}: rolled back, {message}", ok=undone.ok)
                if undone.ok and l in self.started:
                    self.started.remove(l)
                elif undone.ok:  # an adopted rank: it was in the snapshot, now it is gone
                    self.stopped.append(RankKey(l.node, l.replica, l.rank))

    def stop_ranks(self, replica: str, targets: Sequence[tuple[str, int | None]], reason: str) -> bool:
        """Stop ranks on their nodes, all at once (a multi-node replica goes down as one)."""
        if not targets:
            return True
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            outcomes = list(pool.map(lambda t: self.launcher.stop(t[0], replica, t[1]), targets))
        ok = True
        for (node, rank), outcome in zip(targets, outcomes):
            self.decide(replica, node, "stop", f"{reason} ({outcome.detail})", ok=outcome.ok)
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
                                                   STOPPING, f"stopping: {why}", where.nodes if where else ())
        self.on_change(force=True)

    def stop(self, action: Action) -> ActionOutcome:
        # The plan names the exact ranks (a stale copy is stopped, the current one on other nodes is not).
        if action.placement is not None and action.placement.nodes:
            targets = sorted({(a.node, a.rank) for a in action.placement.nodes})
        else:
            targets = self.recorded_targets(action.replica)
        if not targets:
            self.decide(action.replica, "-", "stop", f"nothing running: {action.reason}")
            return ActionOutcome(action.replica, "stop", True)
        return ActionOutcome(action.replica, "stop", self.stop_ranks(action.replica, targets, action.reason or "not desired"))

    def replace_replica(self, action: Action) -> ActionOutcome:
        placement = action.placement
        if placement is None or not placement.nodes:
            # Nothing fits the new spec: the old replica keeps serving rather than leave a hole.
            self.decide(action.replica, "-", "keep", action.reason or "no placement for the new copy; old one kept")
            return ActionOutcome(action.replica, "replace", True)
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
        if state.phase == READY:
            if not self.begin_drain(action, old_live):
                self.stop_ranks(action.replica, old_live, f"replaced by the new copy: {action.reason}")
            self.pending.pop(action.replica, None)
            return ActionOutcome(action.replica, "replace", True, state)
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
        the next passes see the old one as a stale copy to stop, and stop it once it runs no request
        (memory.hold_drains). False when it is to be stopped at once (drain_s 0, not serving)."""
        previous = action.previous
        model = self.catalog.model(action.model)
        if not action.drain or previous is None or not previous.nodes or model is None or model.drain_s <= 0:
            return False
        if sorted({(a.node, a.rank) for a in previous.nodes}) != sorted(old_live):
            return False  # part of it is on a node that does not answer: nothing to drain
        profile = model.profile(previous.profile)
        series = profile_series(profile) if profile is not None else None
        spec = self.catalog.fleet.node(previous.nodes[0].node)
        if series is not None and spec is not None:
            load = read_load(spec.data_host.bare, previous.nodes[0].port, series)
            if isinstance(load, EngineLoad) and load.running <= 0:
                return False  # it runs no request: nothing to wait for
        now = self.wall_clock()
        drain = Drain(action.replica, action.model, tuple(a.node for a in previous.nodes), previous.nodes[0].port,
                      profile.engine if profile is not None else "", now, now + model.drain_s, profile=previous.profile)
        self.drains_begun[drain.key] = drain
        self.decide(action.replica, previous.nodes[0].node, "drain",
                    f"old copy out of every gateway file; stopped once no request runs, at most {model.drain_s:g} s: "
                    f"{action.reason}")
        return True

    def replace_wait_s(self, action: Action) -> float:
        """A replacement waits for its new copy inside the pass (even for the daemon): the old copy must not
        go before the new one serves, and must not stay beside it for longer than one pass."""
        _, profile = self._model_profile(action)
        timeout = profile.start_timeout_s if profile is not None else APPLY_READY_WAIT_S
        return min(timeout, APPLY_READY_WAIT_S)

    # -- weights, before anything starts

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
            self.decide(action.replica, node, "fetch", f"{model.source} from {source or 'nowhere'}: not on {node}")

        def one(item: tuple[Action, Model, str]):
            action, model, node = item
            source = sources[(action.replica, node)]
            _, profile = self._model_profile(action)

            def progress(got: int, total: int) -> None:
                totals[(action.replica, node)] = (got, total)
                got_all = sum(g for (r, _), (g, _) in totals.items() if r == action.replica)
                want_all = sum(t for (r, _), (_, t) in totals.items() if r == action.replica)
                self.states[action.replica] = ReplicaState(
                    action.replica, action.model, profile.name if profile else None, FETCHING,
                    progress_message(model.source, got_all, want_all), action.placement.nodes)
                self.on_change()

            return item, fetcher.fetch(model, node, source, progress=progress,
                                       timeout_s=profile.start_timeout_s if profile else DEFAULT_START_TIMEOUT_S)

        failed: set[str] = set()
        with ThreadPoolExecutor(max_workers=min(16, len(needed))) as pool:
            for (action, model, node), outcome in pool.map(one, needed):
                self.decide(action.replica, node, "fetch", str(outcome), ok=outcome.ok)
                if not outcome.ok:
                    failed.add(action.replica)
                    self.fail_action(action, f"fetch of {model.source} to {node} failed: {outcome.reason}")
        for action, _, _ in needed:
            if action.replica not in failed:
                self.states.pop(action.replica, None)  # the start that follows says what it is now
        return failed

    # -- readiness of what this pass started

    def judge(self, replica: str, started: StartedReplica, *, final: bool) -> ReplicaState | None:
        """Ready, Failed, or (when `final`) Starting; None means: keep waiting."""
        head = started.head
        base = ReplicaState(replica, started.model, started.profile.name, STARTING, "", started.placement.nodes,
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
            self.decide(replica, state.nodes[0].node if state.nodes else "-", "health",
                        state.phase + (f": {state.message}" if state.message else ""), ok=state.phase != FAILED)
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

    def end_stalled_start(self, replica: str, targets: Sequence[tuple[str, int]]) -> bool:
        """A start that did not become Ready in time ends: every rank's process group is stopped, its
        record kept, so the replica reads as crashed and the plan restarts it with backoff."""
        targets = [t for t in targets if self.reachable(t[0])]
        if not targets:
            return True
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            outcomes = list(pool.map(lambda t: self.launcher.stop(t[0], replica, t[1], keep_record=True), targets))
        for (node, rank), outcome in zip(targets, outcomes):
            self.decide(replica, node, "stop", f"rank {rank}: not Ready by its start timeout ({outcome.detail}); "
                                               "restarted with backoff", ok=outcome.ok)
            self.note_unanswered(outcome)
        return all(o.ok for o in outcomes)


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
