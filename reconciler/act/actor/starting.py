"""Starting a replica: its ranks rendered, checked against the GPUs as probed, started workers first
and rolled back as one when any fails; a restart is a stop and then a start."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from reconciler.act.actor.stopping import StopActions
from reconciler.act.actor.work import FENCED
from reconciler.errors import RenderError
from reconciler.act.launcher import StartOutcome
from reconciler.model import Action, RankKey, RankLaunch
from reconciler.decide.outcomes import ActionOutcome, ReplicaState
from reconciler.act.readiness import StartedReplica
from reconciler.observe.snapshot import gpu_problems, start_order
from reconciler.vocabulary import DecisionAction, FailureKind, NodeState, Phase


class StartActions(StopActions):
    """A replica started as one: workers first, head last, nothing left half-started."""

    def start(self, action: Action, *, reason: str | None = None) -> ActionOutcome:
        placement = action.placement
        model, profile = self._model_profile(action)
        verb = action.action
        if placement is None or not placement.nodes or model is None or profile is None:
            why = action.reason or "no placement"
            self.decide(action.replica, "-", DecisionAction.SKIP, f"cannot start: {why}")
            return self.settle(verb, ReplicaState(action.replica, action.model, None, Phase.PENDING, why), ok=True)
        try:
            # Each rank's record keeps the revision it comes from, so status can say which replicas
            # still run an older spec.
            # An old spec started again keeps its own revision: a later rollout rolls away from that one.
            revision = action.spec_revision if action.spec is not None else self.catalog.revision
            launches = [replace(l, revision=revision)
                        for l in self.render(model, profile, placement, self.catalog.fleet, self.probed)]
        except RenderError as exc:  # the catalog has to change first
            return self.fail(verb, action.replica, action.model, profile.name, f"launch refused: {exc}",
                             placement=placement, failure=FailureKind.PERMANENT)

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
            action.replica, action.model, profile.name, Phase.STARTING, "", placement.nodes,
            self.catalog.fleet.endpoint(placement.head.node, placement.head.port),
            revision=self.revision_of(launches),
        ), ok=True)

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
        the failure's kind: FailureKind.TEMPORARY or FailureKind.PERMANENT, as the launcher typed it)."""
        outcomes: list[tuple[RankLaunch, StartOutcome]] = []
        for launch in start_order(launches):
            outcome = self.launcher.start(launch)
            outcomes.append((launch, outcome))
            if not outcome.ok:
                break
            verb = DecisionAction.ADOPT if outcome.already_running else DecisionAction.START
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
        if outcome.fenced:  # this host no longer leads (SPEC 14): said in its own word
            self.decide(launch.replica, launch.node, FENCED, message, ok=False)
        self.roll_back(outcomes, message)
        if outcome.port_in_use:
            # The snapshot written after this pass says so, and the next plan picks another port.
            self.taken_ports.setdefault(launch.node, set()).add(outcome.port_in_use)
        return launch, message, outcome.failure or FailureKind.TEMPORARY

    def roll_back(self, outcomes: Sequence[tuple[RankLaunch, StartOutcome]], message: str) -> None:
        """Nothing half-started: take back the ranks that did start, and the one whose node
        stopped answering mid-launch (it may have started; if it cannot be reached now,
        its record is on the node and the next probe finds it)."""
        for l, o in outcomes:
            if not o.ok and o.uncertain:
                undone = self.launcher.stop(l.node, l.replica, l.rank)
                self.decide(l.replica, l.node, DecisionAction.STOP,
                            f"rank {l.rank}: rolled back after losing the node mid-launch ({undone.detail})",
                            ok=undone.ok)
            elif o.ok:
                undone = self.launcher.stop(l.node, l.replica, l.rank)
                self.decide(l.replica, l.node, DecisionAction.STOP, f"rank {l.rank}: rolled back, {message}", ok=undone.ok)
                if undone.ok and l in self.started:
                    self.started.remove(l)
                elif undone.ok:  # an adopted rank: it was in the snapshot, now it is gone
                    self.stopped.append(RankKey(l.node, l.replica, l.rank))

    def restart(self, action: Action) -> ActionOutcome:
        # A crashed rank takes its whole replica down: ranks of a multi-node replica only rendezvous at start.
        targets = [t for t in self.old_targets(action) if self.reachable(t[0])]
        self.stopping(action, f"restart: {action.reason}")
        if not self.stop_ranks(action.replica, targets, f"restart: {action.reason}"):
            return self.fail_action(action, "restart: the crashed copy could not be stopped")
        self.forget(action.replica, targets)
        return self.start(action, reason=f"restart: {action.reason}")
