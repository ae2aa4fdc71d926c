"""One reconcile pass: probe -> plan -> act -> status, shared by `reconciler apply` and the daemon.

Acting is where the seed's lesson lives: a replica is not "placed" until a
process runs on every node the plan named and the ranks found each other. So:

- a replica's ranks start as one: workers first, head last (the head waits
  for its workers), and if any rank fails to start, the ranks already started
  are stopped again, so nothing is left half-started;
- a rank never starts on a GPU a foreign process uses, or whose memory is
  mostly taken, and the refusal names the process and the MiB;
- Ready means the head answers its health path with 200, asked from here (the
  management host) at the head's data address, and every rank's process is
  alive: a head that answers while a worker is dead is not serving anything;
- records on the nodes are the memory: after a restart, whatever runs is
  adopted as it is (the node agent answers "already running" instead of
  launching a second copy).

Effects go through two injected seams, a Launcher (how ranks reach nodes)
and the probe/plan/render functions, so tests drive real processes through
LocalTransport without SSH and the daemon reuses its connection pool.
"""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from reconciler.errors import ReconcilerError, RenderError, TransportError
from reconciler.launcher import Launcher, SshLauncher, StartOutcome
from reconciler.model import (
    Action,
    Assignment,
    Catalog,
    Fleet,
    Inventory,
    Model,
    ObservedNode,
    Placement,
    Profile,
    RankLaunch,
    RunningRank,
)
from reconciler.transport import Transport

# A GPU whose memory is more than this share used is not clean, even with no process listed
# (nvidia-smi cannot always see processes of other containers).
MOSTLY_USED = 0.5
# `apply` waits at most this long for a started replica to become Ready; past it the
# replica is reported Starting and the next pass (or the daemon) keeps watching.
APPLY_READY_WAIT_S = 300.0
HEALTH_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.2
LOG_LINES_IN_MESSAGE = 10


# --------------------------------------------------------------------------
# What a pass reports
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One line of the pass log: what was done (or would be) to which replica where, and why."""

    replica: str
    node: str  # "-" when the decision is about no node in particular
    action: str  # start | stop | replace | adopt | fail | skip | keep
    reason: str
    ok: bool = True

    def __str__(self) -> str:
        return f"{self.replica}  {self.node}  {self.action}  {self.reason}"

    def as_dict(self) -> dict:
        return {"replica": self.replica, "node": self.node, "action": self.action, "reason": self.reason, "ok": self.ok}


@dataclass(frozen=True)
class ReplicaState:
    """A desired replica after the pass: where it runs and how it is doing."""

    replica: str
    model: str
    profile: str | None
    phase: str  # Pending | Starting | Ready | Failed | Stopping | Unknown
    message: str = ""
    nodes: tuple[Assignment, ...] = ()
    endpoint: str | None = None  # http://<head data address>:<port>, when placed


@dataclass
class PassResult:
    revision: str | None
    inventory: Inventory | None
    plan: Any
    decisions: list[Decision] = field(default_factory=list)
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    dry_run: bool = False
    written: list[str] = field(default_factory=list)  # status files whose content changed

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.decisions)

    def endpoints(self) -> dict[str, list[str]]:
        """Model -> URLs of its Ready replicas, in replica order."""
        out: dict[str, list[str]] = {}
        for state in sorted(self.replicas.values(), key=_replica_sort_key):
            if state.phase == "Ready" and state.endpoint:
                out.setdefault(state.model, []).append(state.endpoint)
        return out


def _replica_sort_key(state: ReplicaState):
    tail = state.replica.rsplit("-", 1)[-1]
    return (state.model, int(tail) if tail.isdigit() else 0, state.replica)


# --------------------------------------------------------------------------
# Pure checks
# --------------------------------------------------------------------------


def gpu_problems(launch: RankLaunch, node: ObservedNode | None, *, mostly_used: float = MOSTLY_USED) -> list[str]:
    """Why this rank's GPUs are not clean, one sentence each; empty when they are.

    Memory held by the reconciler's own ranks on the node (a replica being
    replaced) is not held against a GPU: those ranks are stopped first.
    """
    if node is None or not launch.gpus:
        return []
    ours = {g for r in node.replicas for g in r.gpus}
    by_index = {g.index: g for g in node.gpus}
    problems = []
    for index in launch.gpus:
        gpu = by_index.get(index)
        if gpu is None:
            problems.append(f"GPU {index} on {launch.node} was not seen by the probe")
            continue
        for proc in gpu.processes:
            problems.append(
                f"GPU {index} on {launch.node} is used by foreign process {proc.pid} ({proc.name}, {proc.used_mb} MiB)"
            )
        if not gpu.processes and index not in ours and gpu.memory_total_mb > 0:
            if gpu.memory_used_mb > mostly_used * gpu.memory_total_mb:
                problems.append(
                    f"GPU {index} on {launch.node} has {gpu.memory_used_mb} of {gpu.memory_total_mb} MiB in use"
                )
    return problems


def start_order(launches: Sequence[RankLaunch]) -> list[RankLaunch]:
    """Workers first, head last: the head waits for its workers, never the other way round."""
    return sorted(launches, key=lambda l: (l.rank == 0, l.rank))


def host_for_url(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def endpoint_url(fleet: Fleet, node_id: str, port: int) -> str:
    spec = fleet.node(node_id)
    address = spec.data_address if spec is not None else node_id
    return f"http://{host_for_url(address)}:{port}"


def running_ranks(inventory: Inventory, replica: str) -> list[tuple[ObservedNode, RunningRank]]:
    found = []
    for node in inventory.nodes:
        for rank in node.replicas:
            if rank.id == replica:
                found.append((node, rank))
    return sorted(found, key=lambda nr: (nr[1].rank, nr[0].id))


def inventory_after(
    inventory: Inventory,
    started: Iterable[RankLaunch],
    stopped: Iterable[tuple[str, str, int | None]],
    pids: Mapping[tuple[str, str, int], int] | None = None,
) -> Inventory:
    """The snapshot as the pass left the fleet, without probing again: stopped ranks gone, started ones in.

    `pids` maps (node, replica, rank) -> pid of a started rank, so this snapshot
    reads exactly like the next probe's and status/nodes.yaml does not flap.
    """
    stopped = list(stopped)
    started = list(started)
    pids = pids or {}
    nodes = []
    for node in inventory.nodes:
        keep = tuple(
            r
            for r in node.replicas
            if not any(n == node.id and rid == r.id and (rank is None or rank == r.rank) for n, rid, rank in stopped)
        )
        new = tuple(
            RunningRank(
                id=l.replica, model=l.model, profile=l.profile, rank=l.rank, gpus=tuple(l.gpus), port=l.port,
                spec_hash=l.spec_hash, nnodes=l.nnodes, pid=pids.get((l.node, l.replica, l.rank)),
            )
            for l in started
            if l.node == node.id and not any(r.id == l.replica and r.rank == l.rank for r in keep)
        )
        if len(keep) != len(node.replicas) or new:
            # A stopped engine's port is free again (unless a kept rank shares it); a started one's is taken.
            freed = {r.port for r in node.replicas if r not in keep} - {r.port for r in keep}
            ports = (set(node.ports_in_use) - freed) | {l.port for l in started if l.node == node.id}
            node = replace(node, replicas=keep + new, ports_in_use=tuple(sorted(ports)))
        nodes.append(node)
    return Inventory(tuple(nodes))


# --------------------------------------------------------------------------
# Health
# --------------------------------------------------------------------------


def http_health(url: str, path: str, timeout: float = HEALTH_TIMEOUT_S) -> tuple[bool, str]:
    """GET url+path. (True, "") on 200, else (False, what was seen instead)."""
    host_port = url.split("://", 1)[1]
    host, _, port = host_port.rpartition(":")
    host = host.strip("[]")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path or "/", headers={"Connection": "close"})
        resp = conn.getresponse()
        resp.read(4096)
        if resp.status == 200:
            return True, ""
        return False, f"{path} answered {resp.status}"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{path} did not answer: {exc.__class__.__name__}: {exc}"
    finally:
        conn.close()


# --------------------------------------------------------------------------
# Acting
# --------------------------------------------------------------------------

RenderFn = Callable[[Model, Profile, Placement, Fleet, Inventory], list[RankLaunch]]
LogFn = Callable[[Decision], None]


@dataclass
class _Started:
    """A replica launched in this pass, waiting to be judged."""

    launches: list[RankLaunch]
    model: str
    profile: Profile
    placement: Placement
    started_at: float  # monotonic


class Actor:
    """Carries out plan actions through a Launcher, recording a Decision for each step."""

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
        health: Callable[[str, str], tuple[bool, str]] = http_health,
    ):
        self.catalog = catalog
        self.inventory = inventory
        self.launcher = launcher
        self.render = render
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.ready_wait_s = APPLY_READY_WAIT_S if ready_wait_s is None else ready_wait_s
        self.health = health
        self.decisions: list[Decision] = []
        self.states: dict[str, ReplicaState] = {}
        self.started: list[RankLaunch] = []
        self.pids: dict[tuple[str, str, int], int] = {}
        self.stopped: list[tuple[str, str, int | None]] = []
        self.pending: dict[str, _Started] = {}

    # -- bookkeeping

    def decide(self, replica: str, node: str, action: str, reason: str, ok: bool = True) -> None:
        d = Decision(replica, node, action, reason, ok)
        self.decisions.append(d)
        self.log(d)

    def fail(self, replica: str, model: str, profile: str | None, message: str, node: str = "-",
             placement: Placement | None = None) -> None:
        self.decide(replica, node, "fail", message, ok=False)
        self.states[replica] = ReplicaState(
            replica, model, profile, "Failed", message, placement.nodes if placement else (),
            endpoint_url(self.catalog.fleet, placement.head.node, placement.head.port) if placement else None,
        )

    # -- actions

    def act(self, action: Action) -> None:
        kind = action.action
        if kind == "start":
            self.start(action)
        elif kind == "stop":
            self.stop(action)
        elif kind == "replace":
            self.replace_replica(action)
        elif kind == "restart":
            self.stop_existing(action.replica, "restart: " + action.reason)
            self.start(action)
        else:
            self.decide(action.replica, "-", "skip", f"unknown action {kind!r}", ok=False)

    def _model_profile(self, action: Action) -> tuple[Model | None, Profile | None]:
        model = self.catalog.model(action.model)
        if model is None or action.placement is None:
            return model, None
        return model, model.profile(action.placement.profile)

    def start(self, action: Action, *, reason: str | None = None) -> bool:
        placement = action.placement
        model, profile = self._model_profile(action)
        if placement is None or not placement.nodes or model is None or profile is None:
            why = action.reason or "no placement"
            self.decide(action.replica, "-", "skip", f"cannot start: {why}")
            self.states[action.replica] = ReplicaState(action.replica, action.model, None, "Pending", why)
            return False
        try:
            launches = self.render(model, profile, placement, self.catalog.fleet, self.inventory)
        except RenderError as exc:
            self.fail(action.replica, action.model, profile.name, f"launch refused: {exc}", placement=placement)
            return False

        problems = [p for l in launches for p in gpu_problems(l, self.inventory.node(l.node))]
        if problems:
            self.fail(action.replica, action.model, profile.name, "GPUs not clean: " + "; ".join(problems),
                      node=placement.head.node, placement=placement)
            return False

        # Ranks of this replica left from an earlier life (dead, or on other nodes) would
        # collide with the new ones or answer in their place: clear them first, unless
        # every one is alive exactly where the plan wants it (then the agent adopts them).
        wanted = {(l.node, l.rank, l.spec_hash) for l in launches}
        existing = running_ranks(self.inventory, action.replica)
        if existing and not all(r.alive and (n.id, r.rank, r.spec_hash) in wanted for n, r in existing):
            if not self.stop_existing(action.replica, "clearing an earlier, incomplete copy"):
                self.fail(action.replica, action.model, profile.name,
                          "an earlier copy could not be stopped", placement=placement)
                return False

        why = reason or action.reason or "missing"
        outcomes: list[tuple[RankLaunch, StartOutcome]] = []
        for launch in start_order(launches):
            outcome = self.launcher.start(launch)
            outcomes.append((launch, outcome))
            if not outcome.ok:
                break
            verb = "adopt" if outcome.already_running else "start"
            what = "already running, adopted" if outcome.already_running else f"pid {outcome.pid}"
            self.decide(launch.replica, launch.node, verb,
                        f"rank {launch.rank}/{launch.nnodes} port {launch.port} ({what}): {why}")
            if not outcome.already_running:
                self.started.append(launch)
                if outcome.pid is not None:
                    self.pids[(launch.node, launch.replica, launch.rank)] = outcome.pid
        failed = [(l, o) for l, o in outcomes if not o.ok]
        if failed:
            launch, outcome = failed[0]
            message = f"rank {launch.rank} on {launch.node} did not start: {outcome.reason}"
            # Nothing half-started: take back the ranks that did start.
            for l, o in outcomes:
                if o.ok:
                    undone = self.launcher.stop(l.node, l.replica, l.rank)
                    self.decide(l.replica, l.node, "stop", f"rank {l.rank}: rolled back, {message}", ok=undone.ok)
                    if undone.ok and l in self.started:
                        self.started.remove(l)
            self.fail(action.replica, action.model, profile.name, message, node=launch.node, placement=placement)
            return False

        self.pending[action.replica] = _Started(launches, action.model, profile, placement, self.clock())
        self.states[action.replica] = ReplicaState(
            action.replica, action.model, profile.name, "Starting", "", placement.nodes,
            endpoint_url(self.catalog.fleet, placement.head.node, placement.head.port),
        )
        return True

    def stop_ranks(self, replica: str, targets: Sequence[tuple[str, int | None]], reason: str) -> bool:
        """Stop ranks on their nodes, all at once (a multi-node replica goes down as one)."""
        if not targets:
            return True
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            outcomes = list(pool.map(lambda t: self.launcher.stop(t[0], replica, t[1]), targets))
        ok = True
        for (node, rank), outcome in zip(targets, outcomes):
            self.decide(replica, node, "stop", f"{reason} ({outcome.detail})", ok=outcome.ok)
            if outcome.ok:
                self.stopped.append((node, replica, rank))
            ok = ok and outcome.ok
        return ok

    def stop_existing(self, replica: str, reason: str) -> bool:
        targets = sorted({(n.id, None) for n, _ in running_ranks(self.inventory, replica)})
        return self.stop_ranks(replica, targets, reason)

    def stop(self, action: Action) -> None:
        targets = sorted({(n.id, None) for n, _ in running_ranks(self.inventory, action.replica)})
        if action.placement is not None:  # a plan may name the nodes itself
            targets = sorted(set(targets) | {(a.node, None) for a in action.placement.nodes})
        if not targets:
            self.decide(action.replica, "-", "stop", f"nothing running: {action.reason}")
            return
        self.stop_ranks(action.replica, targets, action.reason or "not desired")

    def replace_replica(self, action: Action) -> None:
        placement = action.placement
        old = running_ranks(self.inventory, action.replica)
        if placement is None or not placement.nodes:
            # Nothing fits the new spec: the old replica keeps serving rather than leave a hole.
            self.decide(action.replica, "-", "keep", f"{action.reason}; no placement for the new spec, old one kept")
            return
        old_slots = {(n.id, r.rank) for n, r in old}
        old_gpus = {(n.id, g) for n, r in old for g in r.gpus}
        old_ports = {(n.id, r.port) for n, r in old}
        disjoint = all(
            (a.node, a.rank) not in old_slots
            and not any((a.node, g) in old_gpus for g in a.gpus)
            and (a.node, a.port) not in old_ports
            for a in placement.nodes
        )
        wanted = getattr(action, "start_first", None)
        start_first = disjoint and (wanted is None or bool(wanted)) and self.ready_wait_s > 0 and bool(old)
        old_targets = sorted({(n.id, r.rank) for n, r in old})
        if not start_first:
            if not self.stop_ranks(action.replica, old_targets, f"replace, stopping first: {action.reason}"):
                model, profile = self._model_profile(action)
                self.fail(action.replica, action.model, profile.name if profile else None,
                          "the old copy could not be stopped", placement=placement)
                return
            # The records are gone now: start against an inventory that no longer lists them.
            self.inventory = inventory_after(self.inventory, [], [(n, action.replica, r) for n, r in old_targets])
            self.start(action, reason=f"replace: {action.reason}")
            return
        # Capacity allows: bring the new copy up, and only take the old one away once the new one is Ready.
        inventory_before = self.inventory
        self.inventory = inventory_after(self.inventory, [], [(n, action.replica, r) for n, r in old_targets])
        if not self.start(action, reason=f"replace, new before old: {action.reason}"):
            self.inventory = inventory_before
            return
        state = self.wait_ready([action.replica])[action.replica]
        if state.phase == "Ready":
            self.stop_ranks(action.replica, old_targets, f"replaced by the new copy: {action.reason}")
        else:
            new_targets = [(l.node, l.rank) for l in self.pending[action.replica].launches]
            self.stop_ranks(action.replica, new_targets, "new copy not Ready; old one kept")
            self.inventory = inventory_before
            self.fail(action.replica, action.model, state.profile,
                      f"new copy not Ready ({state.message}); old one kept running", placement=placement)
        self.pending.pop(action.replica, None)

    # -- readiness

    def judge(self, replica: str, started: _Started, *, final: bool) -> ReplicaState | None:
        """Ready, Failed, or (when `final`) Starting; None means: keep waiting."""
        head = next(l for l in started.launches if l.rank == 0)
        url = endpoint_url(self.catalog.fleet, head.node, head.port)
        base = ReplicaState(replica, started.model, started.profile.name, "Starting", "", started.placement.nodes, url)
        answered, seen = self.health(url, head.health_path or started.profile.health_path)
        ranks, dead, unreachable = self.rank_liveness(started.launches)
        if dead:
            return replace(base, phase="Failed", message=self.failure_message(dead, ranks, "exited"))
        if answered and not unreachable:
            return replace(base, phase="Ready")
        elapsed = self.clock() - started.started_at
        if elapsed >= started.profile.start_timeout_s:
            message = self.failure_message(started.launches, ranks, f"not Ready after {started.profile.start_timeout_s:g}s: {seen}")
            return replace(base, phase="Failed", message=message)
        if final:
            return replace(base, message=f"waiting for {seen or 'all ranks'}")
        return None

    def rank_liveness(self, launches: Sequence[RankLaunch]):
        """(RankStates by (node, rank), launches whose process is gone, nodes that did not answer)."""
        states = {}
        unreachable = []
        for node in sorted({l.node for l in launches}):
            replica = launches[0].replica
            try:
                for s in self.launcher.ranks(node, replica, log_lines=LOG_LINES_IN_MESSAGE):
                    states[(node, s.rank)] = s
            except TransportError:
                unreachable.append(node)
        dead = [l for l in launches if l.node not in unreachable and not getattr(states.get((l.node, l.rank)), "alive", False)]
        return states, dead, unreachable

    @staticmethod
    def failure_message(launches: Sequence[RankLaunch], states: Mapping, what: str) -> str:
        parts = []
        for l in launches:
            s = states.get((l.node, l.rank))
            lines = " | ".join(s.log_tail) if s is not None and s.log_tail else "(no log)"
            parts.append(f"rank {l.rank} on {l.node} {what}; last log lines: {lines}")
        return "; ".join(parts)

    def wait_ready(self, replicas: Sequence[str]) -> dict[str, ReplicaState]:
        """Poll started replicas until each is Ready or Failed, or the wait budget runs out."""
        waiting = {r: self.pending[r] for r in replicas if r in self.pending}
        results: dict[str, ReplicaState] = {}
        deadline = self.clock() + self.ready_wait_s
        while waiting:
            final = self.clock() >= deadline
            for replica, started in list(waiting.items()):
                state = self.judge(replica, started, final=final)
                if state is not None:
                    results[replica] = state
                    del waiting[replica]
            if waiting:
                self.sleep(POLL_INTERVAL_S)
        for replica, state in results.items():
            self.states[replica] = state
            self.decide(replica, state.nodes[0].node if state.nodes else "-", "health",
                        state.phase + (f": {state.message}" if state.message else ""), ok=state.phase != "Failed")
        return results


# --------------------------------------------------------------------------
# Phases of replicas this pass did not touch
# --------------------------------------------------------------------------


def observed_state(
    catalog: Catalog,
    inventory: Inventory,
    replica: str,
    model: Model,
    launcher: Launcher,
    health: Callable[[str, str], tuple[bool, str]] = http_health,
    wall_now: float | None = None,
) -> ReplicaState | None:
    """The phase of a replica running from an earlier pass (or an earlier reconciler), or None when none runs."""
    ranks = running_ranks(inventory, replica)
    if not ranks:
        return None
    head_node, head = next(((n, r) for n, r in ranks if r.rank == 0), ranks[0])
    profile = model.profile(head.profile)
    nodes = tuple(Assignment(n.id, r.rank, tuple(r.gpus), (), r.port) for n, r in ranks)
    url = endpoint_url(catalog.fleet, head_node.id, head.port)
    base = ReplicaState(replica, model.name, head.profile, "Unknown", "", nodes, url)
    gone = [n for n, _ in ranks if n.state == "unreachable"]
    if gone:
        return replace(base, message="; ".join(f"node {n.id} unreachable: {n.reason}" for n in gone))
    dead = [(n, r) for n, r in ranks if not r.alive]
    if dead:
        return replace(base, phase="Failed", message="; ".join(f"rank {r.rank} on {n.id} is not running" for n, r in dead))
    missing = head.nnodes - len(ranks)
    if missing > 0:
        return replace(base, phase="Failed", message=f"{missing} of {head.nnodes} ranks are missing")
    path = profile.health_path if profile is not None else "/health"
    answered, seen = health(url, path)
    if answered:
        return replace(base, phase="Ready")
    # Not answering: still starting, or stuck. The record's launch time tells which.
    timeout = profile.start_timeout_s if profile is not None else 900
    try:
        states = launcher.ranks(head_node.id, replica, log_lines=LOG_LINES_IN_MESSAGE)
    except TransportError as exc:
        return replace(base, message=f"{seen}; node {head_node.id}: {exc.reason}")
    mine = next((s for s in states if s.rank == head.rank), None)
    now = time.time() if wall_now is None else wall_now
    if mine is not None and mine.started_at is not None and now - mine.started_at < timeout:
        return replace(base, phase="Starting", message=f"waiting for {seen}")
    tail = " | ".join(mine.log_tail) if mine is not None and mine.log_tail else "(no log)"
    return replace(base, phase="Failed", message=f"not Ready after {timeout:g}s: {seen}; last log lines: {tail}")


# --------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------


def _default_probe(fleet: Fleet, transports: Mapping[str, Transport]) -> Inventory:
    from reconciler import probe  # lands with the probe branch

    return probe.probe_fleet(fleet, transports)


def _default_planner(catalog: Catalog, inventory: Inventory, *, history=None, now=None):
    from reconciler import plan  # lands with the placement branch

    return plan.plan(catalog, inventory, history=history, now=now)


def _default_render(model, profile, placement, fleet, inventory) -> list[RankLaunch]:
    from reconciler.render import render_replica  # lands with the engines branch

    return render_replica(model, profile, placement, fleet, inventory)


def _plan_actions(plan: Any) -> list[Action]:
    return list(getattr(plan, "actions", plan) or [])


def _plan_unplaced(plan: Any) -> dict[str, Any]:
    out = {}
    for u in getattr(plan, "unplaced", None) or []:
        rid = getattr(u, "replica", None) or (u.get("replica") if isinstance(u, dict) else None)
        if rid:
            out[rid] = u
    return out


def run_pass(
    catalog: Catalog,
    *,
    transports: Mapping[str, Transport],
    dry_run: bool = False,
    now: float | None = None,
    history: Any = None,
    log: LogFn = lambda d: None,
    launcher: Launcher | None = None,
    probe: Callable[[Fleet, Mapping[str, Transport]], Inventory] | None = None,
    planner: Callable[..., Any] | None = None,
    render: RenderFn | None = None,
    ready_wait_s: float | None = None,
    write_status: bool = True,
    health: Callable[[str, str], tuple[bool, str]] = http_health,
) -> PassResult:
    """Probe the fleet, plan against the catalog, act on the plan, write status/.

    `ready_wait_s`: how long to wait for replicas started in this pass to
    become Ready (default APPLY_READY_WAIT_S, capped by each profile's
    start_timeout_s); the daemon passes 0 and judges them on later passes.
    A dry run probes and plans, then reports what it would do and changes
    nothing, status files included.
    """
    probe = probe or _default_probe
    planner = planner or _default_planner
    render = render or _default_render
    launcher = launcher or SshLauncher.for_fleet(catalog.fleet, transports)

    inventory = probe(catalog.fleet, transports)
    plan = planner(catalog, inventory, history=history, now=now)
    actions = _plan_actions(plan)
    result = PassResult(catalog.revision, inventory, plan, dry_run=dry_run)

    if dry_run:
        for a in actions:
            nodes = ",".join(x.node for x in a.placement.nodes) if a.placement and a.placement.nodes else "-"
            d = Decision(a.replica, nodes, a.action, f"would {a.action}: {a.reason}")
            result.decisions.append(d)
            log(d)
        return result

    actor = Actor(catalog, inventory, launcher, render, log, ready_wait_s=ready_wait_s, health=health)
    try:
        for action in actions:
            try:
                actor.act(action)
            except ReconcilerError as exc:  # one action's failure never stops the others
                actor.decide(action.replica, "-", action.action, f"failed: {exc}", ok=False)
        actor.wait_ready([r for r in actor.pending if r not in actor.states or actor.states[r].phase == "Starting"])
        result.decisions = actor.decisions
        result.inventory = inventory_after(inventory, actor.started, actor.stopped, actor.pids)
        result.replicas = replica_states(catalog, result.inventory, actor.states, plan, launcher, health)
    finally:
        if write_status:
            from reconciler.pass_status import write_pass_status

            result.written = write_pass_status(catalog, result)
    return result


def replica_states(
    catalog: Catalog,
    inventory: Inventory,
    acted: Mapping[str, ReplicaState],
    plan: Any,
    launcher: Launcher,
    health: Callable[[str, str], tuple[bool, str]] = http_health,
) -> dict[str, ReplicaState]:
    """Every desired replica's state: from this pass's actions, else observed, else Pending."""
    unplaced = _plan_unplaced(plan)
    reasons = {a.replica: a.reason for a in _plan_actions(plan)}
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
        return rid, model, observed_state(catalog, inventory, rid, model, launcher, health)

    # Health checks are network round trips: ask them concurrently, answer in catalog order.
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(todo)))) as pool:
        for rid, model, state in pool.map(observe, todo):
            if state is None:
                why = "no node fits" if rid in unplaced else reasons.get(rid, "not started yet")
                state = ReplicaState(rid, model.name, None, "Pending", why)
            states[rid] = state
    return states
