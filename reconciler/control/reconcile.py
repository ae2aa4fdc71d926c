"""One reconcile pass, shared by `reconciler apply` and the daemon: probe -> plan -> act -> status.

The pass is the flat sequence of steps in `run_pass`, in the order they
happen; each step is one call into the module that owns it:

  probe     probe/            the fleet as it is (Inventory)
  plan      plan.py           pure: catalog x inventory x memory -> actions
  act       actor/            effects: each action through the Launcher, a typed outcome each
  judge     readiness.py      pure phase judgement of what was started and what runs
  canary    canary_pass.py    each canary rollout moved on, its checks measured when due
  remember  memory.py         what the next pass needs (backoff, grace, placements)
  status    status.py         written in a `finally`, deferred to the end (Flux's deferred patch):
                              a pass that breaks half-way still says what it saw

Effects go through injected seams (transports, launcher, probe, planner,
render, health), so tests drive real processes through LocalTransport
without SSH and the daemon reuses its connection pool.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Mapping

from reconciler.act.actor.dispatch import Actor
from reconciler.act.actor.work import LogFn, RenderFn
from reconciler.decide.autoscale import AutoscaleState, kept_states, next_pass_at, with_counts
from reconciler.decide.canary import Rollout
from reconciler.act.canary_pass import MeasureFn, rollouts_after, with_canary_wakes
from reconciler.act.observed import observe_replica
from reconciler.act.engine_metrics import (
    ENGINE_SERIES,
    METRICS_TIMEOUT_S,
    EngineLoad,
    LoadSeries,
    LoadTarget,
    LoadUnknown,
    profile_series,
    read_loads,
    series_for,
)
from reconciler.constants import STATUS_DIR
from reconciler.errors import ReconcilerError
from reconciler.act.fetch import Fetcher
from reconciler.act.launcher import Launcher, SshLauncher
from reconciler.act.launcher.slurm_fold import fold_slurm
from reconciler.act.launcher.slurm_launcher import fleet_launcher
from reconciler.record.gateway import handoff
from reconciler.record.memory import (
    PassMemory, attempt_keys, next_drain_check, plan_remembering, remember, started_with_after, with_out_at,
    with_quarantines,
)
from reconciler.model import Catalog, Inventory
from reconciler.owner import catalog_owner
from reconciler.decide.outcomes import Decision, PassResult, ReplicaState, copy_key
from reconciler.decide.placement import Outcome
from reconciler.decide.plan_values import Plan, Waiting, drain_key
from reconciler.observe.probe import FleetProbe, FleetProber, probe_fleet_report
from reconciler.act.readiness import HealthCheck, http_health
from reconciler.engines.render import render_replica
from reconciler.act.scaling import LoadReader, scale_pass
from reconciler.observe.snapshot import inventory_after, ranks_by_replica
from reconciler.record.status.read_back import counts_in_force
from reconciler.record.status.predict import predicted_failures, predicted_pass, unplaced_message
from reconciler.record.status.gateway_files import read_served
from reconciler.record.status.write import write_pass
from reconciler.observe.transport import FleetTransports, Transport, TransportPool
from reconciler.vocabulary import ActionKind, DecisionAction, FailureKind, NodeState, Phase, WaitKind

DRAINING = Phase.DRAINING

# A probe answers the fleet as it is; a FleetProbe also says how long each node's probe took.
ProbeFn = Callable[[Catalog, FleetTransports], "Inventory | FleetProbe"]


class ProbeFleet:
    """The pass's probe, wired once: every node's probe, then Slurm's view of `launcher: slurm` nodes
    folded in (node states, other jobs' GPUs, our jobs); GPUs, engines, fabrics and weights come from
    the probe. `apply` probes each node once (prober None); the daemon hands its FleetProber, which
    outlives a pass so a silent node is not waited on twice. The FleetProbe carries each node's
    probe duration."""

    def __init__(self, prober: FleetProber | None = None, log=None, pending: Callable[[], bool] | None = None):
        self.prober, self.log, self.pending = prober, log, pending

    def __call__(self, catalog: Catalog, transports: FleetTransports) -> FleetProbe:
        sources = sorted({m.source for m in catalog.models})
        owner = catalog_owner(catalog)
        if self.prober is None:
            probed = probe_fleet_report(catalog.fleet, transports, sources=sources, owner=owner)
        else:
            probed = self.prober(catalog.fleet, transports, sources=sources, owner=owner, log=self.log,
                                 interrupt=self.pending)
        return replace(probed, inventory=fold_slurm(catalog, transports, probed.inventory))


class ProbeOnly:
    """A pass's probe of some nodes only (the daemon's wake-up passes, reconcile.wake_nodes): those
    nodes probed afresh by `probe`, every other node as `last` (the inventory the last pass left) has
    it. A pass that looks again at one start every few seconds does not probe a 4,000-node fleet."""

    def __init__(self, probe: ProbeFn, last: Inventory, nodes: frozenset[str]):
        self.probe, self.last, self.nodes = probe, last, nodes

    def __call__(self, catalog: Catalog, transports: FleetTransports) -> "Inventory | FleetProbe":
        wanted = tuple(n for n in catalog.fleet.nodes if n.id in self.nodes)
        if not wanted:
            return self.last
        answer = self.probe(replace(catalog, fleet=replace(catalog.fleet, nodes=wanted)), transports)
        fresh, _ = _probed(answer)
        merged = Inventory(tuple(fresh.node(n.id) or n for n in self.last.nodes))
        return replace(answer, inventory=merged) if isinstance(answer, FleetProbe) else merged


def default_probe(catalog: Catalog, transports: FleetTransports) -> Inventory:
    return ProbeFleet()(catalog, transports).inventory


def _probed(answer: "Inventory | FleetProbe") -> tuple[Inventory, dict[str, float] | None]:
    if isinstance(answer, FleetProbe):
        return answer.inventory, answer.durations()
    return answer, None  # a probe that does not time its nodes (a reused inventory, a test's)


def run_pass(
    catalog: Catalog,
    *,
    transports: "TransportPool | Mapping[str, Transport]",
    dry_run: bool = False,
    now: float | None = None,
    history: PassMemory | None = None,
    log: LogFn = lambda d: None,
    launcher: Launcher | None = None,
    probe: ProbeFn = ProbeFleet(),
    planner: Callable[..., Plan] = plan_remembering,
    render: RenderFn | None = None,
    ready_wait_s: float | None = None,
    write_status: bool = True,
    health: HealthCheck = http_health,
    fetcher: Fetcher | None = None,
    autoscale: LoadReader | None = None,
    ready: Mapping[str, ReplicaState] | None = None,
    measure: "MeasureFn | None" = None,
    epoch: int | None = None,
    may_act: Callable[[], str | None] = lambda: None,
    counts_kept: Mapping[str, AutoscaleState] | None = None,
) -> PassResult:
    """Probe the fleet, plan against the catalog, act on the plan, write status/.

    transports    node id -> Transport, or a pool with `transport_for(spec)`.
    history       the previous pass's `PassResult.memory` (or None: a first pass).
    now           epoch seconds for the plan's backoff and grace periods (default: the clock).
    ready_wait_s  how long to wait for replicas started in this pass to become
                  Ready (default actor.work.APPLY_READY_WAIT_S, capped by each profile's
                  start_timeout_s); the daemon may pass 0 and judge them on later
                  passes. A replace always waits for its new copy (see Actor.replace_wait_s).
    autoscale     how to read Ready replicas' loads (scaling.default_reader; the daemon's): the
                  loads of the replicas `ready` says were Ready (the previous pass's
                  PassResult.replicas) decide each autoscaled model's count for this pass's plan.
                  None (apply): the count in force is kept, so a manual pass never undoes the
                  daemon's scaling.
    measure       a canary's checks (canary_checks.measure, the default): one measurement of each.
    epoch, may_act  the leader's epoch that every start and stop carries for the nodes to fence, and
                  whether it may still act (SPEC 14: the daemon's, under `leader:`); None: no fencing.
    counts_kept   each autoscaled model's count in force as the leaders keep it in etcd (SPEC 14), in
                  place of status/'s (a new leader's clone may hold an older status); None: status/'s.
    A dry run probes and plans, reports what it would do, and changes nothing,
    status files included.
    """
    now = time.time() if now is None else now
    began = time.monotonic()  # `now` plus the pass's own length: when it ended, on now's clock
    memory = history or PassMemory()
    # 0. The count in force of each autoscaled model, as status/ holds it (min without it): the
    #    catalog's `replicas` for this pass. The catalog itself is never written.
    in_force = counts_in_force(catalog) if counts_kept is None else kept_states(catalog, counts_kept)
    fleet_transports = FleetTransports(transports, catalog.fleet)
    launcher = pass_launcher(catalog, fleet_transports, launcher, epoch=epoch, may_act=may_act)

    # 1. Probe: the fleet as it is; how busy each draining copy's engine is (SPEC section 10), and
    #    whether the gateway serves without it yet (SPEC 13's hand-off).
    inventory, probe_seconds = _probed(probe(catalog, fleet_transports))
    memory = with_handoffs(catalog, with_drain_loads(catalog, memory), now)
    # 1b. Autoscale (the daemon): the loads of the replicas the last pass left Ready, read once now,
    #     decide this pass's count; the plan below then starts or stops (drained) what it changes.
    counts = scaled_counts(catalog, in_force, autoscale, ready, now, log)
    catalog = with_counts(catalog, counts)
    # 2. Plan (pure): what to do about it; memory.plan_remembering, which `plan` and `explain` call too,
    #    so they predict it (starts that failed before wait out their backoff, or stay stalled, and
    #    serving copies to be stopped drain first). A drain that begins now never ends in this pass,
    #    however idle: the gateway files without the copy are written at its end (SPEC 13).
    plan = planner(catalog, inventory, now=now, memory=memory)
    result = PassResult(catalog.revision, inventory, plan, dry_run=dry_run, memory=memory, probe_seconds=probe_seconds,
                        autoscale=counts, next_pass_at=next_pass_at(catalog, counts),
                        rollouts=dict(memory.rollouts))
    if dry_run:
        result.decisions = predicted_decisions(plan, log)
        return result

    actor = Actor(catalog, inventory, launcher, render or render_replica, log, ready_wait_s=ready_wait_s, health=health)
    try:
        if write_status:  # status/models rewritten as fetches and stops move, during the pass
            actor.on_change = _progress_writer(catalog, plan, actor, counts, memory.rollouts)
        # 3-4. Fetch, act, judge what was started.
        act_on_plan(actor, plan, fetcher or Fetcher(catalog.fleet, fleet_transports))
        result.decisions = actor.decisions
        # 5. The fleet as the pass left it, and every desired replica's state in it.
        result.inventory, result.replicas = judged_fleet(catalog, inventory, plan, actor, launcher, health)
        # 5c. Canary rollouts (SPEC section 13): the checks measure when due, and each rollout moves on.
        # A rollout's step is a decision of the pass (an abort a failed one: `apply` exits 1 for it); a
        # measurement is only logged (a failure within failure_limit is no failure of the pass).
        steps: list[Decision] = []

        def log_step(d: Decision) -> None:
            if d.action == DecisionAction.ROLLOUT:
                steps.append(d)
            log(d)

        result.replicas, result.rollouts = rollouts_after(catalog, memory.rollouts, result.inventory, result.replicas,
                                                          actor.decisions, now, log=log_step, measure=measure)
        result.decisions = [*actor.decisions, *steps]
        result.next_pass_at = with_canary_wakes(catalog, result.rollouts, result.next_pass_at, now)
        # 6. Remember what the next pass needs.
        result.memory = memory_after(catalog, memory, plan, inventory, result, actor, now)
        # status/nodes.yaml marks the GPUs the crash-loop breaker keeps out (SPEC section 9).
        result.inventory = with_quarantines(result.inventory, result.memory.quarantines, now)
        # The daemon passes again when something this pass left waiting can move (not only on its interval).
        result.next_pass_at = next_pass_wanted(result, ended=now + (time.monotonic() - began),
                                               settle_s=catalog.fleet.gateway_settle_s)
        result.next_pass_nodes = wake_nodes(result)
    finally:
        # 7. Status, deferred: written whatever happened above.
        if write_status:
            write_status_and_hand_off(catalog, result, log, reread_counts=autoscale is None and bool(in_force))
    return result


def pass_launcher(catalog: Catalog, transports: FleetTransports, given: Launcher | None, *, epoch: int | None,
                  may_act: Callable[[], str | None]) -> Launcher:
    """The pass's launcher: the one given (a test's), else SSH's, carrying the leader's epoch and its
    check that it still leads, with `launcher: slurm` nodes routed to Slurm."""
    ssh_launcher = SshLauncher.for_fleet(catalog.fleet, transports, owner=catalog_owner(catalog), epoch=epoch,
                                         may_act=may_act)
    return given or fleet_launcher(catalog, transports, ssh_launcher)


def act_on_plan(actor: Actor, plan: Plan, fetcher: Fetcher) -> None:
    """The plan's effects, through the actor (its decisions in the plan's order)."""
    # 3a. Weights first, to every node a start puts a replica on without them (phase Fetching,
    #     status rewritten as the bytes arrive); a replica whose fetch failed is not started.
    no_weights = actor.fetch_weights(plan.actions, fetcher)
    # 3b. Act: every action at once where nothing orders them, each command under its node's deadline;
    #     decisions in the plan's order. One action's failure never stops the others.
    actor.act_all([a for a in plan.actions if a.replica not in no_weights])
    # 4. Judge what was started: wait (within the budget) for it to be Ready or Failed.
    actor.wait_ready(unjudged_starts(actor))


def judged_fleet(catalog: Catalog, inventory: Inventory, plan: Plan, actor: Actor, launcher: Launcher,
                 health: HealthCheck) -> tuple[Inventory, dict[str, ReplicaState]]:
    """The fleet as the pass left it (the probe's, with what the actor started and stopped, and the
    nodes that stopped answering), and every desired replica's state in it; a start of an earlier
    pass that ran out of time is ended."""
    after = with_unanswered(inventory_after(inventory, actor.started, actor.stopped, actor.pids, actor.taken_ports),
                            actor.effects.unanswered)
    replicas = replica_states(catalog, after, actor.states, plan, launcher, health)
    # 5b. Starts that end: a replica of an earlier pass still not Ready past its start timeout.
    end_stalled_starts(actor, replicas)
    return after, replicas


def memory_after(catalog: Catalog, memory: PassMemory, plan: Plan, probed: Inventory, result: PassResult,
                 actor: Actor, now: float) -> PassMemory:
    """What the next pass needs (pure): memory.remember over what the pass did, with the rollouts it
    left and what each running copy was started with."""
    desired = [rid for m in catalog.models for rid in m.replica_ids()]
    return replace(remember(memory, plan, result.inventory, actor.states, now, desired,
                            attempt_keys=attempt_keys(catalog, probed, plan),
                            quarantine_s=catalog.fleet.gpu_quarantine_s,
                            drains_begun=actor.drains_begun),
                   rollouts=result.rollouts,
                   # What each running copy was started with, kept for its drain (a removed
                   # model's included).
                   started_with=started_with_after(catalog, result.inventory, memory.started_with))


def write_status_and_hand_off(catalog: Catalog, result: PassResult, log: LogFn, *, reread_counts: bool) -> None:
    """status/ for the pass (write_status_at_end); then, SPEC 13, step 1 done: the files without each
    new drain are on disk, so its hand-off counts from now."""
    write_status_at_end(catalog, result, log, reread_counts=reread_counts)
    if result.memory is not None:
        result.memory = with_out_at(result.memory, time.time())


# A replace goes one copy at a time: each step's old copies hand off before the next pass stops them.
MAX_HANDOFF_PASSES = 32


def apply_pass(catalog: Catalog, *, log: LogFn = lambda d: None, history: PassMemory | None = None,
               **kw) -> PassResult:
    """What a one-shot `apply` runs: a pass (run_pass), and where it left draining copies that may stop
    now (idle, or drain_s 0), the wait for their hand-off (at most gateway.settle_s, or until
    `reconciler gateway` serves without them) and one more pass that stops them (SPEC 13), so a replace
    of idle copies completes in one apply. A copy still running requests is left Draining for a later
    pass, as the daemon leaves it; so is one the gateway does not let go. The decisions of every pass."""
    result = run_pass(catalog, log=log, history=history, **kw)
    decisions = list(result.decisions)
    waited: list[str] = []
    for _ in range(MAX_HANDOFF_PASSES):
        if result.memory is None:
            break
        asked = with_drain_loads(catalog, result.memory)
        keys = stoppable_drains(asked)
        if not keys or keys == waited:  # the last pass did not stop them (a stop that failed): no loop
            break
        waited = keys
        for key in keys:
            d = asked.draining[key]
            log(Decision(d.replica, d.nodes[0], "wait", "out of every gateway file, runs no request: waiting for "
                         f"the gateway to serve without it (gateway.settle_s {catalog.fleet.gateway_settle_s:g} s, "
                         "or until reconciler gateway says so)"))
        if not wait_for_handoffs(catalog, asked, keys):
            break
        result = run_pass(catalog, log=log, history=result.memory, **kw)
        decisions += result.decisions
    result.decisions = decisions
    return result


# How soon the daemon looks again at a replica it left Starting (it judges starts on later passes):
# the period of a Kubernetes readiness probe.
START_RECHECK_S = 10.0


def next_pass_wanted(result: PassResult, ended: float, settle_s: float = 0.0) -> float | None:
    """When the pass wants the next one (pure, epoch seconds; `ended`: when this one ended): an
    autoscaling move falls due, a drain's next look or deadline, a wait that ends (a restart backoff, a
    grace period), a start still to be judged. None: the resync interval will do. A wait whose end has
    passed asks for nothing, so a wait that outlives its time never spins the daemon."""
    times = [result.next_pass_at]
    if result.memory is not None:
        times.append(next_drain_check(result.memory.draining, ended, settle_s))
    if result.plan is not None:
        times += [w.until for w in result.plan.waiting if w.until is not None and w.until > ended]
    if any(st.phase == Phase.STARTING for st in result.replicas.values()):
        times.append(ended + START_RECHECK_S)
    known = [t for t in times if t is not None]
    return min(known) if known else None


def wake_nodes(result: PassResult) -> frozenset[str]:
    """The nodes the pass next_pass_wanted asks for is about (pure): those of a start still to be
    judged, of a copy draining, and of a wait that ends (the replica's own, and the nodes a grace
    period waits on to answer). The daemon probes only these for it; every other node stays as this
    pass left it until the resync, which probes every node. An autoscaling move needs none: it
    reads the loads of Ready replicas from their engines, not from the probe."""
    nodes: set[str] = set()
    for st in result.replicas.values():
        if st.phase == Phase.STARTING:
            nodes.update(a.node for a in st.nodes)
    if result.memory is not None:
        for drain in result.memory.draining.values():
            nodes.update(drain.nodes)
    if result.plan is not None:
        for w in result.plan.waiting:
            if w.until is None:
                continue
            nodes.update(w.nodes)
            st = result.replicas.get(w.replica)
            if st is not None:
                nodes.update(a.node for a in st.nodes)
    return frozenset(nodes)


def scaled_counts(catalog: Catalog, in_force: Mapping[str, AutoscaleState], autoscale: LoadReader | None,
                  ready: Mapping[str, ReplicaState] | None, now: float, log: LogFn) -> Mapping[str, AutoscaleState]:
    """Each autoscaled model's count for this pass: the one in force, moved by the loads of the replicas
    the last pass left Ready when the pass autoscales (the daemon's; apply keeps the count in force)."""
    if autoscale is None or not in_force:
        return in_force
    return scale_pass(with_counts(catalog, in_force), ready or {}, in_force, now, autoscale, log)


def unjudged_starts(actor: Actor) -> list[str]:
    """The replicas this pass started that no action has judged yet (a replace judges its own new copy)."""
    return [r for r in actor.pending if r not in actor.states or actor.states[r].phase == Phase.STARTING]


def end_stalled_starts(actor: Actor, replicas: Mapping[str, ReplicaState]) -> None:
    """A replica of an earlier pass still not Ready past its start timeout is stopped, every rank (this
    pass's own were, in wait_ready); the plan restarts it with backoff."""
    for rid, state in replicas.items():
        if state.start_timed_out and rid not in actor.states:
            actor.end_stalled_start(rid, [(a.node, a.rank) for a in state.nodes])


def write_status_at_end(catalog: Catalog, result: PassResult, log: LogFn, *, reread_counts: bool) -> None:
    """status/ for the pass, and the decisions writing it added (a gateway file edited by hand: one
    warning line) logged. reread_counts: this pass (apply) moves no counts, but a daemon may have
    since it began: the count in force is read again, so its count stands."""
    if reread_counts:
        result.autoscale = counts_in_force(catalog)
    written = write_pass(catalog, result)
    result.written = [str(p) for p in written.paths]
    hand_edits = [Decision("-", "-", DecisionAction.WARN, line, ok=True) for line in written.hand_edits]
    result.decisions += hand_edits
    for d in hand_edits:
        log(d)


def with_handoffs(catalog: Catalog, memory: PassMemory, now: float) -> PassMemory:
    """The memory with each drain's hand-off judged (gateway.handoff): `reconciler gateway`'s report
    (status/gateway/served.json) read once, each copy's api_base looked for in it; without a live
    report, gateway.settle_s counted from when the files without the copy were written."""
    if not memory.draining:
        return memory
    served = read_served(catalog.root)
    draining = {}
    for key, d in memory.draining.items():
        spec = catalog.fleet.node(d.nodes[0])
        api_base = spec.data_host.url(d.port, "/v1") if spec is not None else None
        done, why = handoff(d.out_at, api_base, now, catalog.fleet.gateway_settle_s, served)
        draining[key] = replace(d, handed_off=done, handoff_note=why)
    return replace(memory, draining=draining)


def stoppable_drains(memory: PassMemory) -> list[str]:
    """The drains a one-shot `apply` may wait for within its run (SPEC 13): those whose engine runs no
    request now, or whose drain_s is 0, so that only their hand-off to the gateway keeps them."""
    return sorted(k for k, d in memory.draining.items()
                  if d.out_at is not None and ((d.running is not None and d.running <= 0) or d.until <= d.started))


def wait_for_handoffs(catalog: Catalog, memory: PassMemory, keys: list[str], *, clock: Callable[[], float] = time.time,
                      sleep: Callable[[float], None] = time.sleep, poll_s: float = 0.2,
                      gateway_wait_s: float = 120.0) -> bool:
    """Wait (apply only; the daemon never does) until the gateway serves without each of `keys`: at most
    gateway.settle_s for a gateway the user runs, or until `reconciler gateway` says so (at most
    gateway_wait_s: one that never takes the change leaves the copies for a later pass). True when
    every one was handed off."""
    deadline = clock() + max(catalog.fleet.gateway_settle_s, gateway_wait_s)
    while True:
        judged = with_handoffs(catalog, replace(memory, draining={k: memory.draining[k] for k in keys}), clock())
        if all(d.handed_off for d in judged.draining.values()):
            return True
        if clock() >= deadline or _gateway_refused_the_file(catalog):
            return False
        sleep(poll_s)


def _gateway_refused_the_file(catalog: Catalog) -> bool:
    """`reconciler gateway` said it will not serve the litellm.yaml on disk (its LiteLLM failed on it):
    waiting longer in this apply is pointless; the copies stay Draining, with its reason."""
    served = read_served(catalog.root)
    if served is None or not served.refused_sha256:
        return False
    try:
        on_disk = (Path(catalog.root) / STATUS_DIR / "gateway" / "litellm.yaml").read_bytes()
    except OSError:
        return False
    return hashlib.sha256(on_disk).hexdigest() == served.refused_sha256


def with_drain_loads(catalog: Catalog, memory: PassMemory, timeout_s: float = METRICS_TIMEOUT_S) -> PassMemory:
    """The memory with each draining copy's requests running, as its engine's /metrics says now (all at
    once, each under its own deadline). An answer that cannot be trusted (a hang, garbage, no such
    series) leaves `running` None with the reason: that drain then ends at drain_s. A copy is asked by
    the series it was started with (PassMemory.started_with), whatever became of its model since."""
    if not memory.draining:
        return memory
    targets, notes = [], {}
    for key, d in memory.draining.items():
        spec = catalog.fleet.node(d.nodes[0])
        started = memory.started_with.get(copy_key(d.replica, d.nodes[0], d.port))
        # Without a record (a copy older than it), the profile in force; for a removed model's copy
        # not even that: each engine's series is tried in turn.
        model = catalog.model(d.model)
        profile = model.profile(d.profile) if model is not None and d.profile else None
        if started is not None:
            declared = started.metrics
            candidates = [series_for(started.engine, None if declared is None else LoadSeries(
                waiting=declared.waiting, running=declared.running, path=declared.path))]
        elif profile is not None:
            candidates = [profile_series(profile)]
        else:
            candidates = [series_for(d.engine)] if d.engine else list(ENGINE_SERIES.values())
        candidates = [c for c in candidates if c is not None]
        if not candidates or spec is None:
            notes[key] = "no metrics to ask" if not candidates else f"node {d.nodes[0]} is not in fleet.yaml"
            continue
        targets += [LoadTarget(f"{key}#{i}", spec.data_host.bare, d.port, c) for i, c in enumerate(candidates)]
    answered = read_loads(targets, timeout_s=timeout_s)
    answers: dict = {}
    for name, answer in sorted(answered.items()):
        key = name.rsplit("#", 1)[0]
        if not isinstance(answers.get(key), EngineLoad):  # the series the engine does report wins
            answers[key] = answer
    draining = {}
    for key, d in memory.draining.items():
        answer = answers.get(key)
        if isinstance(answer, EngineLoad):
            draining[key] = replace(d, running=answer.running, note="")
        else:
            why = answer.reason if isinstance(answer, LoadUnknown) else notes.get(key, "not asked")
            draining[key] = replace(d, running=None, note=f"its load is unknown ({why})")
    return replace(memory, draining=draining)


def with_unanswered(inventory: Inventory, unanswered: Mapping[str, str]) -> Inventory:
    """Nodes that did not answer a stop in this pass are unreachable in the snapshot it leaves, as the
    probe would have found them: the pass judges their replicas Unknown without asking them again, and
    a commit planned from this snapshot waits for them (grace period) instead of acting on them."""
    if not unanswered:
        return inventory
    return Inventory(tuple(
        replace(n, state=NodeState.UNREACHABLE, reason=f"stopped answering during the pass: {unanswered[n.id]}",
                failure=FailureKind.TEMPORARY)
        if n.id in unanswered and n.state != NodeState.UNREACHABLE else n
        for n in inventory.nodes
    ))


PROGRESS_WRITE_EVERY_S = 2.0


def _progress_writer(catalog: Catalog, plan: Plan, actor: Actor,
                     autoscale: Mapping[str, AutoscaleState],
                     rollouts: Mapping[str, Rollout] | None = None) -> Callable[[], None]:
    """status/models rewritten mid-pass, so a person sees a Fetching replica's bytes done/total (at most
    every PROGRESS_WRITE_EVERY_S) and a Stopping one (at once), during the pass, not only after it."""
    last = [0.0]
    one_at_a_time = threading.Lock()  # actions run at once: each write reads the states as they are then

    def write(force: bool = False) -> None:
        with one_at_a_time:
            now = time.monotonic()
            if not force and now - last[0] < PROGRESS_WRITE_EVERY_S:
                return
            last[0] = now
            # What the plan predicts, with what the actions have settled so far laid over it.
            result = predicted_pass(catalog, plan)
            result.replicas.update(actor.states)
            result.autoscale = dict(autoscale)  # the count in force, so a mid-pass file never reads as min
            result.rollouts = dict(rollouts or {})  # and the rollout as the pass began, not none
            try:
                write_pass(catalog, result, nodes=False)
            except ReconcilerError:
                pass  # the pass's own write at the end reports it

    return write


def predicted_decisions(plan: Plan, log: LogFn) -> list[Decision]:
    """What a dry run reports: each action as it would be done."""
    decisions = []
    for a in plan.actions:
        nodes = ",".join(x.node for x in a.placement.nodes) if a.placement and a.placement.nodes else "-"
        d = Decision(a.replica, nodes, DecisionAction(a.action), f"would {a.action}: {a.reason}")
        decisions.append(d)
        log(d)
    return decisions


def replica_states(
    catalog: Catalog,
    inventory: Inventory,
    acted: Mapping[str, ReplicaState],
    plan: Plan,
    launcher: Launcher,
    health: HealthCheck = http_health,
) -> dict[str, ReplicaState]:
    """Every desired replica's state: from this pass's actions, else observed, else Pending."""
    unplaced = {o.replica: o for o in plan.unplaced}
    records = ranks_by_replica(inventory)
    reasons = {a.replica: a.reason for a in plan.actions}
    waiting = {w.replica: w for w in plan.waiting}
    todo = []
    states: dict[str, ReplicaState] = {}
    for model in catalog.models:
        for rid in model.replica_ids():
            if rid in acted:
                states[rid] = acted[rid]
            else:
                todo.append((rid, model))

    def observe(item):
        rid, model = item
        return rid, model, observe_replica(catalog, current_copy(records.get(rid, []), plan.observed.get(rid)),
                                           rid, model, launcher, health)

    # Health checks are network round trips: ask them concurrently, answer in catalog order.
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(todo)))) as pool:
        for rid, model, state in pool.map(observe, todo):
            w = waiting.get(rid)
            if state is None:
                states[rid] = _not_running_state(rid, model.name, w, plan, unplaced.get(rid), reasons.get(rid))
            else:
                states[rid] = _with_wait(state, w, records.get(rid, ()))
    states.update(draining_states(catalog, plan, states))
    states.update(beside_states(catalog, records, plan, states, launcher, health))
    return states


def beside_states(catalog: Catalog, records, plan: Plan, states: Mapping[str, ReplicaState], launcher: Launcher,
                  health: HealthCheck = http_health) -> dict[str, ReplicaState]:
    """The old copies that serve beside their canary copy (SPEC section 13: the stable copies keep serving),
    each judged as a stable copy in every gateway file, under its own key (drain_key), so the replica's
    own state stays the canary's."""
    out = {}
    for rid, where in copies_beside(plan, states).items():
        own = states.get(rid)
        if own is not None and _slots(own.nodes) == _slots(where.nodes):
            continue  # the replica's own state is that copy already (an abort's canary stopping beside it)
        model = catalog.model(where.model)
        slots = _slots(where.nodes)
        ranks = [(n, r) for n, r in records.get(rid, []) if (n.id, r.rank) in slots]
        state = observe_replica(catalog, ranks, rid, model, launcher, health) if ranks and model else None
        if state is not None:
            out[drain_key(rid, (x.node for x in where.nodes))] = replace(state, canary=False)
    return out


def copies_beside(plan: Plan, states: Mapping[str, ReplicaState]) -> dict:
    """replica -> the old copy serving beside its canary: those the plan kept (Plan.beside), and those a
    canary's surge of this pass left running."""
    kept = dict(plan.beside)
    for a in plan.actions:
        st = states.get(a.replica)
        # Whether the canary came Ready or failed to launch, the old copy was left running (a canary not
        # Ready is stopped and the replica's state is the old copy then: beside_states skips it).
        if (a.action == ActionKind.REPLACE and a.keep_previous and a.previous is not None and st is not None
                and {x.node for x in st.nodes} != {x.node for x in a.previous.nodes}):
            kept[a.replica] = a.previous
    return kept


def _slots(assignments) -> set[tuple[str, int]]:
    return {(x.node, x.rank) for x in assignments}


def current_copy(ranks, observed):
    """The replica's records less a second copy beside it (a replace's old copy draining, a stale copy
    left on a node that came back): the copy the plan took for the replica is the one judged and listed."""
    if observed is None or len(ranks) <= len(observed.nodes):
        return ranks
    where = {(a.node, a.rank) for a in observed.nodes}
    return [(n, r) for n, r in ranks if (n.id, r.rank) in where] or ranks


def draining_states(catalog: Catalog, plan: Plan, states: Mapping[str, ReplicaState]) -> dict[str, ReplicaState]:
    """Replicas no longer desired (a scale down, a removed model) that drain before they stop: Draining,
    where they run, so status shows them until they are gone (a desired one is judged with the others)."""
    out = {}
    for w in plan.waiting:
        if w.kind is not WaitKind.DRAINING or w.replica in states:
            continue
        where = plan.observed.get(w.replica)
        head = where.nodes[0] if where is not None and where.nodes else None
        out[w.replica] = ReplicaState(
            w.replica, w.model, where.profile if where else None, DRAINING, w.reason, where.nodes if where else (),
            catalog.fleet.endpoint(head.node, head.port) if head is not None else None)
    return out


def _not_running_state(rid: str, model: str, w: Waiting | None, plan: Plan, unplaced: Outcome | None,
                       action_reason: str | None) -> ReplicaState:
    """A desired replica nothing was found running for: Unknown where its node does not answer, else Pending."""
    if w is not None and w.kind is WaitKind.NODE_UNREACHABLE:
        # Its node does not answer: we cannot say how it is, only where it was.
        where = plan.observed.get(rid)
        return ReplicaState(rid, model, where.profile if where else None, Phase.UNKNOWN, w.reason, where.nodes if where else ())
    if w is not None and w.kind in (WaitKind.START_BACKOFF, WaitKind.STALLED):
        # Its last start failed: Failed, with the kind that decides when it is tried again.
        return ReplicaState(rid, model, None, Phase.FAILED, w.reason, failure=predicted_failures(plan)[rid])
    if unplaced is not None:
        why = unplaced_message(unplaced)
    else:
        why = action_reason if action_reason is not None else (w.reason if w else "not started yet")
    return ReplicaState(rid, model, None, Phase.PENDING, why)


def _with_wait(state: ReplicaState, w: Waiting | None, records) -> ReplicaState:
    """An observed replica's state, with why the plan holds it (if it does) added to its message."""
    if w is None:
        return state
    said = w.reason
    if w.kind is WaitKind.BACKOFF and state.phase == Phase.FAILED and w.next_step:
        said = w.next_step  # the observed state already says which ranks died (and their last lines): once is enough
    message = f"{state.message}; {said}" if state.message else w.reason
    if w.kind is WaitKind.DRAINING and state.phase == Phase.READY:
        # Serving still, but out of every gateway file: the plan stops it once its requests end.
        return replace(state, phase=DRAINING, message=message)
    if w.kind in (WaitKind.ONE_AT_A_TIME, WaitKind.UPDATE_POLICY):
        # Serving, on the spec it was started with: the message says it is the old one, and why it waits.
        return replace(state, message=message)
    if state.phase not in (Phase.FAILED, Phase.UNKNOWN):
        return state
    phase = state.phase
    if phase == Phase.FAILED and w.kind is WaitKind.NODE_UNREACHABLE and all(r.alive for _, r in records):
        # The plan holds it because a node of it does not answer: the ranks there are
        # unseen, not dead. Failed stays for a rank seen dead on a node that answers.
        phase = Phase.UNKNOWN
    return replace(state, phase=phase, message=message)

