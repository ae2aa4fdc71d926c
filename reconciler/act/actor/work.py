"""The working state of a pass's actions and its bookkeeping: what each action changed (its own
Effects buffer), the decisions it recorded, the states it left, the records it still counts.

The kinds of action (stopping, starting, waiting, replacing, weights) are the classes over this
one; dispatch puts them together as the Actor.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Sequence

from reconciler.act.launcher import Launcher
from reconciler.model import Action, Catalog, Fleet, Inventory, Model, Placement, Profile, RankKey, RankLaunch
from reconciler.decide.outcomes import ActionOutcome, Decision, ReplicaState
from reconciler.decide.plan_values import Drain
from reconciler.act.readiness import HealthCheck, StartedReplica, http_health
from reconciler.decide.scheduling import Effects
from reconciler.observe.snapshot import RankRecords, ranks_by_replica
from reconciler.vocabulary import ActionKind, DecisionAction, FailureKind, NodeState, Phase

# `apply` waits at most this long for a started replica to become Ready; past it the
# replica is reported Starting and the next pass (or the daemon) keeps watching.
APPLY_READY_WAIT_S = 300.0
FENCED = DecisionAction.FENCED  # a node refused this host's epoch, or its lease ran out (SPEC 14)

RenderFn = Callable[[Model, Profile, Placement, Fleet, Inventory], list[RankLaunch]]
LogFn = Callable[[Decision], None]


class ActorWork:
    """The Actor's working state, read by the pass when the actions are done:
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

    def decide(self, replica: str, node: str, action: DecisionAction | ActionKind, reason: str, ok: bool = True) -> None:
        d = Decision(replica, node, DecisionAction(action), reason, ok)
        self.decisions.append(d)
        self.log(d)

    def settle(self, action: ActionKind, state: ReplicaState, ok: bool) -> ActionOutcome:
        self.states[state.replica] = state
        return ActionOutcome(state.replica, action, ok, state)

    def fail(self, action: ActionKind, replica: str, model: str, profile: str | None, message: str, node: str = "-",
             placement: Placement | None = None, failure: FailureKind = FailureKind.TEMPORARY) -> ActionOutcome:
        """The replica is Failed; `failure` (TEMPORARY or PERMANENT) says whether a retry can help."""
        self.decide(replica, node, DecisionAction.FAIL, message, ok=False)
        return self.settle(action, ReplicaState(
            replica, model, profile, Phase.FAILED, message, placement.nodes if placement else (),
            self.catalog.fleet.endpoint(placement.head.node, placement.head.port) if placement else None,
            failure=failure,
        ), ok=False)

    def fail_action(self, action: Action, message: str, failure: FailureKind = FailureKind.TEMPORARY) -> ActionOutcome:
        """fail() with the profile and placement the action names."""
        _, profile = self._model_profile(action)
        return self.fail(action.action, action.replica, action.model, profile.name if profile else None, message,
                         placement=action.placement, failure=failure)

    def _model_profile(self, action: Action) -> tuple[Model | None, Profile | None]:
        model = action.spec if action.spec is not None else self.catalog.model(action.model)
        if model is None or action.placement is None:
            return model, None
        return model, model.profile(action.placement.profile)

    def revision_of(self, launches: Sequence[RankLaunch]) -> str | None:
        """The revision the replica's processes come from: its head's, the adopted record's when the
        head was found already running (started by an earlier revision with the same spec)."""
        head = next(l for l in launches if l.rank == 0)
        key = (head.node, head.replica, head.rank)
        return self.adopted_revisions.get(key, self.effects.adopted_revisions.get(key, head.revision))

    # -- the replica's records, as probed, less what this pass stopped

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
