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

import dataclasses
import http.client
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from reconciler.errors import ReconcilerError, RenderError, TransportError
from reconciler.inventory import inventory_from_document, inventory_to_document
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
    replica_ordinal,
)
from reconciler.plan import Plan, ReplicaHistory, plan as make_plan
from reconciler.probe import probe_fleet
from reconciler.render import render_replica
from reconciler.status import replica_endpoint, unplaced_message, write_nodes_status, write_plan_status
from reconciler.transport import Transport

# A GPU whose memory is more than this share used is not clean, even with no process listed
# (nvidia-smi cannot always see processes of other containers).
MOSTLY_USED = 0.5
# `apply` waits at most this long for a started replica to become Ready; past it the
# replica is reported Starting and the next pass (or the daemon) keeps watching.
APPLY_READY_WAIT_S = 300.0
HEALTH_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.2
LIVENESS_INTERVAL_S = 1.0
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
    plan: Plan
    decisions: list[Decision] = field(default_factory=list)
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    dry_run: bool = False
    written: list[str] = field(default_factory=list)  # status files whose content changed
    memory: "PassMemory | None" = None  # hand to the next pass as `history`

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
    return (state.model, replica_ordinal(state.model, state.replica) or 0, state.replica)


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


RankRecords = list[tuple[ObservedNode, RunningRank]]


def ranks_by_replica(inventory: Inventory) -> dict[str, RankRecords]:
    """Replica id -> its (node, rank) records, in rank order.

    One walk of the fleet for all replicas: a pass looks up every desired replica,
    and a walk per lookup costs milliseconds each at fleet scale.
    """
    found: dict[str, RankRecords] = {}
    for node in inventory.nodes:
        for rank in node.replicas:
            found.setdefault(rank.id, []).append((node, rank))
    for records in found.values():
        records.sort(key=lambda nr: (nr[1].rank, nr[0].id))
    return found


def inventory_after(
    inventory: Inventory,
    started: Iterable[RankLaunch],
    stopped: Iterable[tuple[str, str, int | None]],
    pids: Mapping[tuple[str, str, int], int] | None = None,
    taken_ports: Mapping[str, Iterable[int]] | None = None,
) -> Inventory:
    """The snapshot as the pass left the fleet, without probing again: stopped ranks gone, started ones in.

    `pids` maps (node, replica, rank) -> pid of a started rank, so this snapshot
    reads exactly like the next probe's and status/nodes.yaml does not flap.
    """
    pids = pids or {}
    taken_ports = taken_ports or {}
    # Grouped by node first: a first pass at fleet scale starts thousands of ranks on thousands of nodes.
    started_on: dict[str, list[RankLaunch]] = {}
    for l in started:
        started_on.setdefault(l.node, []).append(l)
    stopped_on: dict[str, list[tuple[str, int | None]]] = {}
    for n, rid, rank in stopped:
        stopped_on.setdefault(n, []).append((rid, rank))
    nodes = []
    for node in inventory.nodes:
        gone = stopped_on.get(node.id, ())
        here = started_on.get(node.id, ())
        keep = tuple(
            r for r in node.replicas if not any(rid == r.id and (rank is None or rank == r.rank) for rid, rank in gone)
        )
        new = tuple(
            RunningRank(
                id=l.replica, model=l.model, profile=l.profile, rank=l.rank, gpus=tuple(l.gpus), port=l.port,
                spec_hash=l.spec_hash, nnodes=l.nnodes, pid=pids.get((l.node, l.replica, l.rank)),
            )
            for l in here
            if not any(r.id == l.replica and r.rank == l.rank for r in keep)
        )
        taken = set(taken_ports.get(node.id, ()))
        if len(keep) != len(node.replicas) or new or taken - set(node.ports_in_use):
            # A stopped engine's port is free again (unless a kept rank shares it); a started one's is taken.
            freed = {r.port for r in node.replicas if r not in keep} - {r.port for r in keep}
            ports = (set(node.ports_in_use) - freed) | {l.port for l in here} | taken
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
    except (OSError, http.client.HTTPException, UnicodeError) as exc:  # UnicodeError: a host name idna refuses
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
    ranks_checked_at: float | None = None  # monotonic; liveness is a round trip per node, asked less often


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
        self.probed = inventory  # as the probe saw it
        self.inventory = inventory  # as this pass has changed it so far
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
        self.taken_ports: dict[str, set[int]] = {}
        self.stopped: list[tuple[str, str, int | None]] = []
        self.pending: dict[str, _Started] = {}
        self._ranks: tuple[Inventory, dict[str, RankRecords]] | None = None  # index of self.inventory

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
            replica_endpoint(self.catalog.fleet, placement.head.node, placement.head.port) if placement else None,
        )

    def fail_action(self, action: Action, message: str) -> None:
        """fail() with the profile and placement the action names."""
        _, profile = self._model_profile(action)
        self.fail(action.replica, action.model, profile.name if profile else None, message, placement=action.placement)

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
            self.restart(action)
        else:
            self.decide(action.replica, "-", "skip", f"unknown action {kind!r}", ok=False)

    def old_targets(self, action: Action) -> list[tuple[str, int]]:
        """(node, rank) of the copy an action supersedes: the plan's `previous`, else what the records show."""
        if action.previous is not None and action.previous.nodes:
            return sorted({(a.node, a.rank) for a in action.previous.nodes})
        return self.recorded_targets(action.replica)

    def recorded_targets(self, replica: str) -> list[tuple[str, int]]:
        """(node, rank) of every record of the replica in the working snapshot."""
        return sorted({(n.id, r.rank) for n, r in self.ranks_of(replica)})

    def ranks_of(self, replica: str) -> RankRecords:
        """The replica's records in the working snapshot, indexed again only when the snapshot changed."""
        if self._ranks is None or self._ranks[0] is not self.inventory:
            self._ranks = (self.inventory, ranks_by_replica(self.inventory))
        return self._ranks[1].get(replica, [])

    def reachable(self, node_id: str) -> bool:
        node = self.inventory.node(node_id)
        return node is not None and node.state != "unreachable"

    def forget(self, replica: str, targets: Iterable[tuple[str, int | None]]) -> None:
        """Drop stopped ranks from the working snapshot, so later checks do not trip over them."""
        self.inventory = inventory_after(self.inventory, [], [(n, replica, r) for n, r in targets])

    def restart(self, action: Action) -> None:
        # A crashed rank takes its whole replica down: ranks of a multi-node replica only rendezvous at start.
        targets = [t for t in self.old_targets(action) if self.reachable(t[0])]
        if not self.stop_ranks(action.replica, targets, f"restart: {action.reason}"):
            self.fail_action(action, "restart: the crashed copy could not be stopped")
            return
        self.forget(action.replica, targets)
        self.start(action, reason=f"restart: {action.reason}")

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

        # Against the snapshot as probed: memory our own ranks held then (stopped since, in a
        # restart or a replace) is ours to reuse, not a foreign tenant's.
        problems = [p for l in launches for p in gpu_problems(l, self.probed.node(l.node))]
        if problems:
            self.fail(action.replica, action.model, profile.name, "GPUs not clean: " + "; ".join(problems),
                      node=placement.head.node, placement=placement)
            return False

        # Ranks of this replica left from an earlier life (dead, or on other nodes) would
        # collide with the new ones or answer in their place: clear them first, unless
        # every one is alive exactly where the plan wants it (then the agent adopts them).
        wanted = {(l.node, l.rank, l.spec_hash) for l in launches}
        # Ranks on unreachable nodes cannot be cleared now; the plan stops them as stale copies when they return.
        existing = [(n, r) for n, r in self.ranks_of(action.replica) if n.state != "unreachable"]
        if existing and not all(r.alive and (n.id, r.rank, r.spec_hash) in wanted for n, r in existing):
            targets = sorted({(n.id, r.rank) for n, r in existing})
            if not self.stop_ranks(action.replica, targets, "clearing an earlier, incomplete copy"):
                self.fail(action.replica, action.model, profile.name,
                          "an earlier copy could not be stopped", placement=placement)
                return False
            self.forget(action.replica, targets)

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
        failed = next(((l, o) for l, o in outcomes if not o.ok), None)
        if failed is not None:
            launch, outcome = failed
            message = f"rank {launch.rank} on {launch.node} did not start: {outcome.reason}"
            self.roll_back(outcomes, message)
            if outcome.port_in_use:
                # The snapshot written after this pass says so, and the next plan picks another port.
                self.taken_ports.setdefault(launch.node, set()).add(outcome.port_in_use)
            self.fail(action.replica, action.model, profile.name, message, node=launch.node, placement=placement)
            return False

        self.pending[action.replica] = _Started(launches, action.model, profile, placement, self.clock())
        self.states[action.replica] = ReplicaState(
            action.replica, action.model, profile.name, "Starting", "", placement.nodes,
            replica_endpoint(self.catalog.fleet, placement.head.node, placement.head.port),
        )
        return True

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
                    self.stopped.append((l.node, l.replica, l.rank))

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

    def stop(self, action: Action) -> None:
        # The plan names the exact ranks (a stale copy is stopped, the current one on other nodes is not).
        if action.placement is not None and action.placement.nodes:
            targets = sorted({(a.node, a.rank) for a in action.placement.nodes})
        else:
            targets = self.recorded_targets(action.replica)
        if not targets:
            self.decide(action.replica, "-", "stop", f"nothing running: {action.reason}")
            return
        self.stop_ranks(action.replica, targets, action.reason or "not desired")

    def replace_replica(self, action: Action) -> None:
        placement = action.placement
        if placement is None or not placement.nodes:
            # Nothing fits the new spec: the old replica keeps serving rather than leave a hole.
            self.decide(action.replica, "-", "keep", action.reason or "no placement for the new copy; old one kept")
            return
        old = self.old_targets(action)
        old_live = [t for t in old if self.reachable(t[0])]
        new_slots = {(a.node, a.rank) for a in placement.nodes}
        # Starting first needs the new ranks' records to be distinct from the old ones (same replica id).
        start_first = bool(old) and not action.stop_first and not (new_slots & set(old))
        if not start_first:
            if not self.stop_ranks(action.replica, old_live, f"replace, old copy first: {action.reason}"):
                self.fail_action(action, "replace: the old copy could not be stopped")
                return
            self.forget(action.replica, old_live)
            self.start(action, reason=f"replace: {action.reason}")
            return
        # Capacity allows: bring the new copy up, and take the old one away only once the new one is Ready.
        before = self.inventory
        self.forget(action.replica, old)
        if not self.start(action, reason=f"replace, new copy first: {action.reason}"):
            self.inventory = before
            return
        state = self.wait_ready([action.replica], budget_s=self.replace_wait_s(action))[action.replica]
        if state.phase == "Ready":
            self.stop_ranks(action.replica, old_live, f"replaced by the new copy: {action.reason}")
        else:
            new_targets = [(l.node, l.rank) for l in self.pending[action.replica].launches]
            self.stop_ranks(action.replica, new_targets, "new copy not Ready; old copy kept")
            for launch in self.pending[action.replica].launches:
                if launch in self.started:
                    self.started.remove(launch)
            self.inventory = before
            message = f"new copy not Ready ({state.message}); old copy kept running"
            self.fail(action.replica, action.model, state.profile, message, placement=placement)
            # What serves is the old copy: report it as it is, so its endpoint stays listed.
            model = self.catalog.model(action.model)
            kept = (observed_state(self.catalog, ranks_by_replica(before).get(action.replica, []), action.replica, model,
                                   self.launcher, self.health) if model else None)
            if kept is not None:
                self.states[action.replica] = replace(kept, message=f"replacement failed: {message}")
        self.pending.pop(action.replica, None)

    def replace_wait_s(self, action: Action) -> float:
        """A replacement waits for its new copy inside the pass (even for the daemon): the old copy must not
        go before the new one serves, and must not stay beside it for longer than one pass."""
        _, profile = self._model_profile(action)
        timeout = profile.start_timeout_s if profile is not None else APPLY_READY_WAIT_S
        return min(timeout, APPLY_READY_WAIT_S)

    # -- readiness

    def judge(self, replica: str, started: _Started, *, final: bool) -> ReplicaState | None:
        """Ready, Failed, or (when `final`) Starting; None means: keep waiting."""
        head = next(l for l in started.launches if l.rank == 0)
        url = replica_endpoint(self.catalog.fleet, head.node, head.port)
        base = ReplicaState(replica, started.model, started.profile.name, "Starting", "", started.placement.nodes, url)
        answered, seen = self.health(url, head.health_path or started.profile.health_path)
        now = self.clock()
        elapsed = now - started.started_at
        timed_out = elapsed >= started.profile.start_timeout_s
        # Health is one cheap local request; liveness is a round trip to every node of the replica.
        # Ask liveness when it decides something (the head answers, time is up), else once a second,
        # which is soon enough to notice a rank that crashed while loading.
        due = started.ranks_checked_at is None or now - started.ranks_checked_at >= LIVENESS_INTERVAL_S
        if not (answered or timed_out or final or due):
            return None
        started.ranks_checked_at = now
        ranks, dead, unreachable = self.rank_liveness(started.launches)
        if dead:
            return replace(base, phase="Failed", message=self.failure_message(dead, ranks, "exited"))
        if answered and not unreachable:
            return replace(base, phase="Ready")
        if timed_out:
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

    def wait_ready(self, replicas: Sequence[str], budget_s: float | None = None) -> dict[str, ReplicaState]:
        """Poll started replicas until each is Ready or Failed, or the wait budget runs out."""
        waiting = {r: self.pending[r] for r in replicas if r in self.pending}
        results: dict[str, ReplicaState] = {}
        deadline = self.clock() + (self.ready_wait_s if budget_s is None else budget_s)
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
    ranks: RankRecords,
    replica: str,
    model: Model,
    launcher: Launcher,
    health: Callable[[str, str], tuple[bool, str]] = http_health,
    wall_now: float | None = None,
) -> ReplicaState | None:
    """The phase of a replica running from an earlier pass (or an earlier reconciler), or None when none runs.

    ranks: the replica's records in the snapshot (ranks_by_replica).
    """
    if not ranks:
        return None
    head_node, head = next(((n, r) for n, r in ranks if r.rank == 0), ranks[0])
    profile = model.profile(head.profile)
    nodes = tuple(Assignment(n.id, r.rank, tuple(r.gpus), (), r.port) for n, r in ranks)
    url = replica_endpoint(catalog.fleet, head_node.id, head.port)
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


class FleetTransports:
    """One view of the transports for both consumers: the probe asks `transport_for(spec)`, the launcher `get(id)`.

    Accepts a mapping node id -> Transport (tests, `apply`) or a pool with
    `transport_for(spec)` (the SSH pool the daemon keeps open between passes).
    """

    def __init__(self, source: Any, fleet: Fleet):
        self.source = source
        self.fleet = fleet

    def transport_for(self, spec) -> Transport:
        if hasattr(self.source, "transport_for"):
            return self.source.transport_for(spec)
        transport = self.source.get(spec.id)
        if transport is None:
            raise TransportError(spec.id, "no transport for this node")
        return transport

    def get(self, node_id: str) -> Transport | None:
        spec = self.fleet.node(node_id)
        if spec is None:
            return None
        return self.transport_for(spec)  # a TransportError here names the node and why


@dataclass(frozen=True)
class PassMemory:
    """What one pass hands to the next: the daemon keeps it in memory, a one-shot `apply` starts empty.

    history            the plan's per-replica restart bookkeeping (Plan.history)
    unreachable_since  node id -> epoch seconds it was first seen unreachable
    last_seen          the last snapshot in which each node answered (records of nodes unreachable now)
    placed_on          replica id -> nodes it was last placed on (which copy is current when two are found)
    """

    history: Mapping[str, ReplicaHistory] = field(default_factory=dict)
    unreachable_since: Mapping[str, float] = field(default_factory=dict)
    last_seen: Inventory | None = None
    placed_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def remember(
    memory: PassMemory,
    plan: Plan | None,
    inventory: Inventory,
    acted: Mapping[str, "ReplicaState"],
    now: float,
    desired: Iterable[str] | None = None,
) -> PassMemory:
    """The memory after a pass (pure)."""
    desired = None if desired is None else set(desired)
    unreachable = {}
    last_nodes = []
    for node in inventory.nodes:
        if node.state == "unreachable":
            unreachable[node.id] = memory.unreachable_since.get(node.id, now)
            previous = memory.last_seen.node(node.id) if memory.last_seen is not None else None
            if previous is not None:
                last_nodes.append(previous)
        else:
            last_nodes.append(node)
    placed_on = dict(memory.placed_on)
    for rid, state in acted.items():
        if state.nodes and state.phase != "Failed":
            placed_on[rid] = tuple(a.node for a in state.nodes)
    if desired is not None:  # forget replicas no longer wanted, so the memory does not grow forever
        placed_on = {rid: nodes for rid, nodes in placed_on.items() if rid in desired}
    return PassMemory(
        history=dict(plan.history if plan is not None else memory.history),
        unreachable_since=unreachable,
        last_seen=Inventory(tuple(last_nodes)),
        placed_on=placed_on,
    )


def memory_to_document(memory: PassMemory) -> dict:
    """PassMemory as JSON-able data, so one-shot `apply` runs remember backoff and grace periods."""
    return {
        "history": {rid: dataclasses.asdict(h) for rid, h in sorted(memory.history.items())},
        "unreachable_since": dict(sorted(memory.unreachable_since.items())),
        "last_seen": inventory_to_document(memory.last_seen) if memory.last_seen is not None else None,
        "placed_on": {rid: list(nodes) for rid, nodes in sorted(memory.placed_on.items())},
    }


def memory_from_document(doc: Any) -> PassMemory:
    """The inverse of memory_to_document; anything unreadable is forgotten, never an error."""
    try:
        return PassMemory(
            history={rid: ReplicaHistory(**h) for rid, h in (doc.get("history") or {}).items()},
            unreachable_since={n: float(t) for n, t in (doc.get("unreachable_since") or {}).items()},
            last_seen=inventory_from_document(doc["last_seen"]) if doc.get("last_seen") else None,
            placed_on={rid: tuple(nodes) for rid, nodes in (doc.get("placed_on") or {}).items()},
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        return PassMemory()


def _default_probe(catalog: Catalog, transports: FleetTransports) -> Inventory:
    return probe_fleet(catalog.fleet, transports, sources=sorted({m.source for m in catalog.models}))


def _default_planner(catalog: Catalog, inventory: Inventory, *, now: float, memory: PassMemory) -> Plan:
    return make_plan(
        catalog, inventory, now=now, history=memory.history, unreachable_since=memory.unreachable_since,
        last_seen=memory.last_seen, placed_on=memory.placed_on,
    )


def run_pass(
    catalog: Catalog,
    *,
    transports: Any,
    dry_run: bool = False,
    now: float | None = None,
    history: PassMemory | None = None,
    log: LogFn = lambda d: None,
    launcher: Launcher | None = None,
    probe: Callable[[Catalog, FleetTransports], Inventory] | None = None,
    planner: Callable[..., Plan] | None = None,
    render: RenderFn | None = None,
    ready_wait_s: float | None = None,
    write_status: bool = True,
    health: Callable[[str, str], tuple[bool, str]] = http_health,
) -> PassResult:
    """Probe the fleet, plan against the catalog, act on the plan, write status/.

    transports    node id -> Transport, or a pool with `transport_for(spec)`.
    history       the previous pass's `PassResult.memory` (or None: a first pass).
    now           epoch seconds for the plan's backoff and grace periods (default: the clock).
    ready_wait_s  how long to wait for replicas started in this pass to become
                  Ready (default APPLY_READY_WAIT_S, capped by each profile's
                  start_timeout_s); the daemon may pass 0 and judge them on later
                  passes. A replace always waits for its new copy (see Actor.replace_wait_s).
    A dry run probes and plans, reports what it would do, and changes nothing,
    status files included. Status is written in a `finally`: a pass that
    breaks half-way still says what it saw.
    """
    probe = probe or _default_probe
    planner = planner or _default_planner
    render = render or render_replica
    now = time.time() if now is None else now
    memory = history or PassMemory()
    fleet_transports = FleetTransports(transports, catalog.fleet)
    launcher = launcher or SshLauncher.for_fleet(catalog.fleet, fleet_transports)

    inventory = probe(catalog, fleet_transports)
    plan = planner(catalog, inventory, now=now, memory=memory)
    result = PassResult(catalog.revision, inventory, plan, dry_run=dry_run, memory=memory)

    if dry_run:
        for a in plan.actions:
            nodes = ",".join(x.node for x in a.placement.nodes) if a.placement and a.placement.nodes else "-"
            d = Decision(a.replica, nodes, a.action, f"would {a.action}: {a.reason}")
            result.decisions.append(d)
            log(d)
        return result

    actor = Actor(catalog, inventory, launcher, render, log, ready_wait_s=ready_wait_s, health=health)
    try:
        for action in plan.actions:
            try:
                actor.act(action)
            except ReconcilerError as exc:  # one action's failure never stops the others
                actor.decide(action.replica, "-", action.action, f"failed: {exc}", ok=False)
        actor.wait_ready([r for r in actor.pending if r not in actor.states or actor.states[r].phase == "Starting"])
        result.decisions = actor.decisions
        result.inventory = inventory_after(inventory, actor.started, actor.stopped, actor.pids, actor.taken_ports)
        result.replicas = replica_states(catalog, result.inventory, actor.states, plan, launcher, health)
        desired = [rid for m in catalog.models for rid in m.replica_ids()]
        result.memory = remember(memory, plan, result.inventory, actor.states, now, desired)
    finally:
        if write_status:
            result.written = _write_status(catalog, result)
    return result


def replica_states(
    catalog: Catalog,
    inventory: Inventory,
    acted: Mapping[str, ReplicaState],
    plan: Plan,
    launcher: Launcher,
    health: Callable[[str, str], tuple[bool, str]] = http_health,
) -> dict[str, ReplicaState]:
    """Every desired replica's state: from this pass's actions, else observed, else Pending."""
    unplaced = {o.replica: o for o in plan.unplaced}
    records = ranks_by_replica(inventory)
    reasons = {a.replica: a.reason for a in plan.actions}
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
        return rid, model, observed_state(catalog, records.get(rid, []), rid, model, launcher, health)

    waiting = {w.replica: w for w in plan.waiting}
    observed = plan.observed

    # Health checks are network round trips: ask them concurrently, answer in catalog order.
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(todo)))) as pool:
        for rid, model, state in pool.map(observe, todo):
            w = waiting.get(rid)
            if state is None and w is not None and "unreachable" in w.reason:
                # Its node does not answer: we cannot say how it is, only where it was.
                where = observed.get(rid)
                state = ReplicaState(rid, model.name, where.profile if where else None, "Unknown", w.reason,
                                     where.nodes if where else ())
            elif state is None:
                why = unplaced_message(unplaced[rid]) if rid in unplaced else reasons.get(rid, w.reason if w else "not started yet")
                state = ReplicaState(rid, model.name, None, "Pending", why)
            elif w is not None and state.phase in ("Failed", "Unknown"):
                phase = state.phase
                if phase == "Failed" and "unreachable" in w.reason and all(r.alive for _, r in records.get(rid, ())):
                    # The plan holds it because a node of it does not answer: the ranks there are
                    # unseen, not dead. Failed stays for a rank seen dead on a node that answers.
                    phase = "Unknown"
                state = replace(state, phase=phase,
                                message=f"{state.message}; {w.reason}" if state.message else w.reason)
            states[rid] = state
    return states


def _write_status(catalog: Catalog, result: PassResult) -> list[str]:
    """Write status/ for this pass (models, endpoints, nodes); returns the files whose content changed.

    Models and endpoints go through status.py's writer, the same one `plan
    --write-status` uses, so a predicted status and an applied one have one
    shape; here it gets the phases and messages the pass observed.
    """
    phases = {rid: st.phase for rid, st in result.replicas.items()}
    messages = {rid: st.message for rid, st in result.replicas.items() if st.message}
    # The pass observed every replica, so its messages are the whole story: without the plan's
    # action reasons ("start: not running") a replica started in this pass reads the same as
    # in the next, quiet one, and status does not change for nothing.
    observed_plan = replace(result.plan, actions=(), waiting=())
    written = write_plan_status(catalog.root, catalog, observed_plan, phases, messages)
    if result.inventory is not None:
        written += write_nodes_status(catalog.root, result.inventory, catalog.models)
    return [str(p) for p in written]
