"""Management side of the probe: send script.py to nodes, turn reports into an Inventory."""

from __future__ import annotations

import concurrent.futures
import json
import queue
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterable, Mapping, Sequence

from reconciler.errors import BUG, PERMANENT, TEMPORARY, CommandTimeout, OutputTooLarge, TransportError, kind_of
from reconciler.model import (
    Disk,
    FabricAttachment,
    Fleet,
    Gpu,
    GpuProcess,
    Inventory,
    LlamaCppBinaries,
    NodeSpec,
    ObservedNode,
    RunningRank,
    frozen_map,
)
from reconciler.probe.parse import DEFAULT_GID_PREFIX, fabric_name_for_prefix, gpu_class
from reconciler.probe.script import BOOTSTRAP, payload
from reconciler.vocabulary import CheckResult, GpuHealth
from reconciler.transport import KeepsStreams, Transport, TransportPool
from reconciler.vocabulary import NodeState

# The probe's own command line: fixed, no catalog value in it; everything else travels as JSON.
PYTHON = "python3"


@dataclass(frozen=True)
class NodeProbe:
    """One node's outcome: what was observed, what went wrong on the way, how long it took."""

    node: ObservedNode
    warnings: tuple[str, ...] = ()
    reached: bool = True  # the transport ran the probe (False: could not connect at all)
    seconds: float = 0.0
    # False: the pass went on without this node while its probe still ran (FleetProber), so
    # `seconds` is how long the pass waited, not how long the probe took.
    ended: bool = True


@dataclass(frozen=True)
class FleetProbe:
    inventory: Inventory
    results: tuple[NodeProbe, ...]

    @property
    def reached(self) -> int:
        return sum(1 for r in self.results if r.reached)

    def durations(self) -> dict[str, float]:
        """Node id -> seconds its probe took, for every probe that ended (answered or failed)."""
        return {r.node.id: r.seconds for r in self.results if r.ended}


_payload_lock = threading.Lock()


@lru_cache(maxsize=1)
def _build_payload() -> bytes:
    return payload()


def _payload() -> bytes:
    # Built once, under a lock: the probe threads all ask at once on the first pass, and
    # CPython 3.11's ast module is not safe to use from several threads at the same time.
    with _payload_lock:
        return _build_payload()


# The GPU health queries (SPEC section 9) are part of every probe; bench/probe.py turns them off
# to measure what they cost, and nothing else should.
GPU_HEALTH_QUERIES = True


def probe_args(spec: NodeSpec, sources: Iterable[str] | None, owner: str | None = None) -> dict:
    args = {
        "model_dirs": list(spec.model_dirs),
        "sources": None if sources is None else sorted(set(sources)),
        "state_dir": spec.state_dir,
    }
    if owner is not None:
        args["owner"] = owner
    if not GPU_HEALTH_QUERIES:
        args["gpu_health"] = False
    # The node's own waits end well inside the command's deadline, so a hung nvidia-smi or
    # `import sglang` is reported as such (GPUs unknown) instead of the whole node timing out.
    inner = round(max(1.0, min(20.0, float(spec.ssh.command_timeout_s) / 2)), 1)
    if inner < 20.0:
        args["nvidia_smi_timeout_s"] = args["sglang_timeout_s"] = inner
    return args


SESSION_KEY = "llm-reconciler-probe"


def session_command() -> tuple[list[str], bytes]:
    """The argv and preamble of a probe session: `python3 -c BOOTSTRAP --serve`, the program on stdin."""
    body = _payload()
    return [PYTHON, "-c", BOOTSTRAP, "--serve"], str(len(body)).encode() + b"\n" + body


def probe_command(spec: NodeSpec, sources: Iterable[str] | None = None, owner: str | None = None) -> tuple[list[str], bytes]:
    """The argv and stdin that probe `spec`: `python3 - '<json>'` with the script on stdin."""
    args = json.dumps(probe_args(spec, sources, owner), sort_keys=True, separators=(",", ":"))
    return [PYTHON, "-", args], _payload()


def unreachable(spec: NodeSpec, reason: str, failure: str = TEMPORARY) -> ObservedNode:
    """A node that did not answer, or whose answer cannot be read; `failure` says whether waiting can help."""
    return ObservedNode(id=spec.id, state=NodeState.UNREACHABLE, reason=reason, labels=spec.labels, failure=failure)


def _no_python(rc: int, stderr: str) -> bool:
    # bash: "python3: command not found" (127); sh: "python3: not found" (127)
    return rc == 127 and PYTHON in stderr and "not found" in stderr


def unusable(spec: NodeSpec, reason: str) -> ObservedNode:
    """A node that answered with something the reconciler cannot place on (GPUs unknown, a report it cannot read)."""
    return ObservedNode(id=spec.id, state=NodeState.UNUSABLE, reason=reason, labels=spec.labels, failure=PERMANENT)


def command_timeout(spec: NodeSpec) -> float:
    return float(spec.ssh.command_timeout_s)


def _decode_report(data: bytes):
    """The JSON object a probe printed, or ValueError. Nesting deep enough to exhaust the parser's
    stack (a hostile node) is a ValueError like any other junk, never a RecursionError traceback."""
    try:
        report = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(report, dict):
        raise ValueError("not an object")
    return report


def _from_report(spec: NodeSpec, report: Mapping, started: float, clock, owner: str | None = None) -> NodeProbe:
    try:
        node, warnings = observed_from_report(spec, report, owner=owner)
    except (AttributeError, KeyError, TypeError, ValueError, RecursionError) as exc:
        # Valid JSON of the wrong shape (a probe that is not ours answering): nothing in it can be
        # trusted, its process records included, so the node counts as not answering.
        return NodeProbe(unreachable(spec, f"probe report unreadable ({type(exc).__name__}: {str(exc)[:120]})", PERMANENT), (), True, clock() - started)
    return NodeProbe(node, tuple(warnings), True, clock() - started)


def probe_node(
    spec: NodeSpec,
    transport: Transport,
    *,
    sources: Iterable[str] | None = None,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    owner: str | None = None,
) -> NodeProbe:
    """Probe one node within `timeout` (default: the node's ssh.command_timeout_s).

    owner: the catalog's owner; another owner's process records are not this catalog's
    replicas, and the GPUs and ports they hold are reported taken (None: every record is ours).

    Never raises for anything the node or the network did: see NodeProbe.
    """
    timeout = command_timeout(spec) if timeout is None else timeout
    started = clock()
    open_stream = getattr(transport, "stream", None)
    if open_stream is not None:
        # Warm path: the probe interpreter stays up on the open connection between passes.
        # Anything odd about it falls through to the one-shot probe below, whose
        # exit code and output say what is wrong with the node.
        argv, preamble = session_command()
        request = session_request(spec, sources, owner)
        warm = warm_result(
            spec, lambda: open_stream(SESSION_KEY, argv, preamble=preamble, timeout=timeout).request(request, timeout=timeout),
            timeout, started, clock, owner)
        if warm is not None:
            return warm
    return probe_once(spec, transport, sources=sources, timeout=timeout, started=started, clock=clock, owner=owner)


def session_request(spec: NodeSpec, sources: Iterable[str] | None, owner: str | None = None) -> bytes:
    """One request line for a running probe session: the probe's arguments as JSON."""
    return json.dumps(probe_args(spec, sources, owner), sort_keys=True, separators=(",", ":")).encode()


def warm_result(spec: NodeSpec, answer: Callable[[], bytes], timeout: float, started: float, clock, owner: str | None) -> NodeProbe | None:
    """The node's probe from its running session's answer (`answer()` returns the line or raises);
    None when the one-shot probe should say what is wrong instead."""
    try:
        report = _decode_report(answer())
        if "error" not in report:
            return _from_report(spec, report, started, clock, owner)
    except CommandTimeout:
        return NodeProbe(unreachable(spec, f"probe ran past {timeout:g}s"), (), True, clock() - started)
    except OutputTooLarge as exc:
        return NodeProbe(unreachable(spec, f"probe answer unreadable: {exc.reason}", PERMANENT), (), True, clock() - started)
    except concurrent.futures.CancelledError:
        # The request was dropped with its connection (a node cut off the network, the pool closing
        # it): an expected fault, said in words, never a traceback.
        elapsed = clock() - started
        why = f"no answer within {timeout:g} s" if elapsed >= timeout else "the connection closed before the node answered"
        return NodeProbe(unreachable(spec, why), (), True, elapsed)
    except (TransportError, ValueError):
        # StreamClosed, garbage, or a connection that died since the last pass: the one-shot
        # probe reconnects (or, within the backoff, repeats why it cannot) and diagnoses.
        pass
    return None


def probe_once(
    spec: NodeSpec, transport: Transport, *, sources: Iterable[str] | None, timeout: float, started: float,
    clock: Callable[[], float] = time.monotonic, owner: str | None = None,
) -> NodeProbe:
    """The one-shot probe (`python3 -` with the program on stdin), within what is left of `timeout`."""
    argv, stdin = probe_command(spec, sources, owner)
    left = max(1.0, timeout - (clock() - started))
    try:
        result = transport.run(argv, stdin=stdin, timeout=left)
    except CommandTimeout as exc:
        return NodeProbe(unreachable(spec, f"probe ran past {timeout:g}s"), (exc.reason,), True, clock() - started)
    except OutputTooLarge as exc:
        return NodeProbe(unreachable(spec, f"probe answer unreadable: {exc.reason}", PERMANENT), (), True, clock() - started)
    except TransportError as exc:
        return NodeProbe(unreachable(spec, exc.reason, kind_of(exc)), (), False, clock() - started)
    elapsed = clock() - started
    stderr = result.stderr[-4096:].decode(errors="replace").strip()
    if _no_python(result.rc, stderr):
        return NodeProbe(unreachable(spec, "python3 is not on the node's login PATH; the probe needs it", PERMANENT), (stderr,), True, elapsed)
    try:
        report = _decode_report(result.stdout)
    except ValueError:
        shown = (result.stdout[:120] or result.stderr[-200:]).decode(errors="replace").strip()
        why = f"probe exited {result.rc}" if result.rc != 0 else "probe printed something that is not a JSON report"
        # A node whose python3 is something else says the same next time: stalled until it changes.
        return NodeProbe(unreachable(spec, f"{why}: {shown!r}" if shown else why, PERMANENT), (stderr[-500:],) if stderr else (), True, elapsed)
    return _from_report(spec, report, started, clock, owner)


def probe_fleet_report(
    fleet: Fleet,
    pool: TransportPool,
    *,
    sources: Iterable[str] | None = None,
    timeout: float | None = None,
    max_workers: int = 64,
    on_result: Callable[[NodeProbe], None] | None = None,
    owner: str | None = None,
) -> FleetProbe:
    """Probe every node of the fleet concurrently (one thread and one round trip per node),
    each within its own deadline (`timeout`, default each node's ssh.command_timeout_s)."""
    src = None if sources is None else sorted(set(sources))

    def one(spec: NodeSpec) -> NodeProbe:
        r = _probe_one(spec, pool, src, timeout, owner)
        if on_result is not None:
            on_result(r)
        return r

    nodes = list(fleet.nodes)
    if not nodes:
        return FleetProbe(Inventory(()), ())
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(nodes))), thread_name_prefix="probe") as ex:
        results = list(ex.map(one, nodes))
    return FleetProbe(Inventory(tuple(r.node for r in results)), tuple(results))


def _probe_one(spec: NodeSpec, pool: TransportPool, sources, timeout: float | None, owner: str | None = None) -> NodeProbe:
    started = time.monotonic()
    try:
        transport = pool.transport_for(spec)
    except TransportError as exc:
        # Its duration too: a pool may dial here, and a node that does not answer costs its connect timeout.
        return NodeProbe(unreachable(spec, exc.reason, kind_of(exc)), (), False, time.monotonic() - started)
    return probe_node(spec, transport, sources=sources, timeout=timeout, owner=owner)


def probe_fleet(fleet: Fleet, pool: TransportPool, *, sources: Iterable[str] | None = None, **kw) -> Inventory:
    return probe_fleet_report(fleet, pool, sources=sources, **kw).inventory


# How long a pass waits on a node that answered last time but not now, once other work is waiting.
STRAGGLER_S = 1.0


class _InFlight:
    __slots__ = ("spec", "started", "done", "result")

    def __init__(self, spec: NodeSpec, started: float):
        self.spec, self.started = spec, started
        self.done = threading.Event()
        self.result: NodeProbe | None = None


# Threads for the probes that must block (a connection to open, the one-shot probe), at most this
# many at once; a node whose probe session is open is asked through its transport's event loop.
BLOCKING_PROBES = 64
# A worker thread idle this long ends: between passes over healthy nodes none is left waiting.
WORKER_IDLE_S = 10.0


class _Workers:
    """A few daemon threads running queued jobs; a job stuck past every deadline never keeps the process from exiting."""

    def __init__(self, size: int, idle_s: float = WORKER_IDLE_S):
        self._size, self._idle_s = size, idle_s
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._idle = self._pending = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._pending += 1
            start = self._threads < self._size and self._pending > self._idle
            if start:
                self._threads += 1
        self._queue.put(job)
        if start:
            threading.Thread(target=self._serve, name="probe-worker", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._pending == 0:  # else a job was queued as the wait ended: take it
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._pending -= 1
            job()


class _OneShot(Exception):
    """The node's probe session did not give a usable answer: the one-shot probe is to say why."""


class FleetProber:
    """The daemon's probe: one bad node never holds a pass back.

    Each node's probe has its own deadline. A node whose probe session is open is asked
    through its transport's event loop, with no thread waiting on it; the others (a
    connection to open, the one-shot probe) run on a few worker threads. A pass waits
    for the nodes that answered last time; a node that did not (down, or its
    previous probe still running) is probed in the background, used if it answers
    while the others are probed, and otherwise reported by its last reason without
    waiting, so a cut or silent node costs the passes over the rest nothing after
    the first. A node going and coming back is logged once each way.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._inflight: dict[str, _InFlight] = {}
        self._down: dict[str, tuple[float, str]] = {}  # node id -> (epoch seconds since, reason)
        self._last_failure: dict[str, str] = {}  # node id -> kind of its last failure
        self._workers = _Workers(BLOCKING_PROBES, WORKER_IDLE_S)

    def down(self) -> dict[str, tuple[float, str]]:
        with self._lock:
            return dict(self._down)

    def _start(self, spec: NodeSpec, pool: TransportPool, sources, owner, log) -> _InFlight:
        job = _InFlight(spec, self._clock())
        with self._lock:
            self._inflight[spec.id] = job  # before the probe starts: it removes itself when it ends
        if not self._ask_session(job, pool, sources, owner, log):
            self._workers.submit(lambda: self._finish(job, log, lambda: _probe_one(spec, pool, sources, None, owner)))
        return job

    def _finish(self, job: _InFlight, log, probe: Callable[[], NodeProbe]) -> None:
        spec = job.spec
        try:
            job.result = probe()
        except _OneShot:
            return  # handed to a worker thread, which finishes the job
        except Exception as exc:  # noqa: BLE001  a bug in the probe: that node unreachable, the daemon goes on
            job.result = NodeProbe(unreachable(spec, f"probe failed: {type(exc).__name__}: {exc}", BUG), (), False)
            if log is not None:
                log("probe.error", node=spec.id, error=f"{type(exc).__name__}: {exc}", msg=traceback.format_exc())
        self._settle(job, log)
        job.done.set()

    def _ask_session(self, job: _InFlight, pool: TransportPool, sources, owner, log) -> bool:
        """Ask the node's running probe session for its report with no thread waiting, where the
        transport keeps one open; False: the probe has to block (connect, start the session)."""
        spec = job.spec
        try:
            transport = pool.transport_for(spec)
        except TransportError:
            return False  # the worker's probe says why
        stream = transport.open_stream(SESSION_KEY) if isinstance(transport, KeepsStreams) else None
        if stream is None:
            return False
        timeout = command_timeout(spec)
        answer = stream.submit(session_request(spec, sources, owner), timeout=timeout)

        def one_shot() -> NodeProbe:
            return probe_once(spec, transport, sources=sources, timeout=timeout, started=job.started, clock=self._clock, owner=owner)

        def from_session() -> NodeProbe:
            warm = warm_result(spec, answer.result, timeout, job.started, self._clock, owner)
            if warm is None:
                self._workers.submit(lambda: self._finish(job, log, one_shot))
                raise _OneShot
            return warm

        # Runs in the event loop's thread once the answer (or its error) is there.
        answer.add_done_callback(lambda _: self._finish(job, log, from_session))
        return True

    def _settle(self, job: _InFlight, log) -> None:
        r = job.result
        node_id = job.spec.id
        with self._lock:
            if self._inflight.get(node_id) is job:
                del self._inflight[node_id]
            was = self._down.get(node_id)
            if r is not None and r.node.failure:
                self._last_failure[node_id] = r.node.failure
            if r is not None and r.node.state in (NodeState.UNREACHABLE, NodeState.UNUSABLE):
                if was is None:
                    self._down[node_id] = (self._wall(), r.node.reason)
                    gone = True
                else:
                    self._down[node_id] = (was[0], r.node.reason)
                    gone = False
                back = None
            else:
                self._down.pop(node_id, None)
                gone, back = False, was
        if log is None:
            return
        if gone:
            log("node.unreachable" if r.node.state == NodeState.UNREACHABLE else "node.unusable", node=node_id, reason=r.node.reason)
        elif back is not None:
            log("node.back", node=node_id, down_s=round(self._wall() - back[0], 1), msg="answers again")

    def __call__(
        self, fleet: Fleet, pool: TransportPool, *, sources: Iterable[str] | None = None,
        owner: str | None = None, log=None, interrupt: Callable[[], bool] | None = None,
    ) -> FleetProbe:
        """One pass's probe. interrupt(): whether other work waits (the daemon has a commit to
        apply), so that a node slow to answer is not waited on past STRAGGLER_S."""
        src = None if sources is None else sorted(set(sources))
        running, down = self._forget_nodes_not_in(fleet)
        jobs: dict[str, _InFlight] = {}
        suspects: set[str] = set()
        for spec in fleet.nodes:
            job = running.get(spec.id)
            if job is not None and job.spec == spec:
                suspects.add(spec.id)  # its last probe has not ended yet: do not wait on it again
            else:
                job = self._start(spec, pool, src, owner, log)
                if spec.id in down:
                    suspects.add(spec.id)
            jobs[spec.id] = job
        self._wait_for_answers([spec for spec in fleet.nodes if spec.id not in suspects], jobs, interrupt)
        results = [self._pass_result(spec, jobs[spec.id]) for spec in fleet.nodes]
        return FleetProbe(Inventory(tuple(r.node for r in results)), tuple(results))

    def _forget_nodes_not_in(self, fleet: Fleet) -> tuple[dict[str, _InFlight], set[str]]:
        """Drop the probes and down-records of nodes that left the fleet; (probes running, nodes down)."""
        with self._lock:
            for gone in set(self._inflight) - {n.id for n in fleet.nodes}:
                del self._inflight[gone]
            for gone in set(self._down) - {n.id for n in fleet.nodes}:
                del self._down[gone]
            return dict(self._inflight), set(self._down)

    def _wait_for_answers(self, specs: list[NodeSpec], jobs: dict[str, _InFlight], interrupt: Callable[[], bool] | None) -> None:
        """Wait for the nodes that answered last time, each within its own deadlines (the margin
        covers a reconnect within them); when other work is waiting (a commit arrived), stop
        waiting on a node whose probe has run past STRAGGLER_S: it is reported as not answering
        (its probe goes on) instead of holding the commit back until its deadline.

        One node at a time, in fleet order: a node that has answered costs one check, so waiting
        on 4,000 nodes does not rescan all of them every tick (that scan took the GIL from the
        event loop thread parsing their answers)."""
        waiting = deque(specs)
        while waiting:
            spec = waiting[0]
            job = jobs[spec.id]
            ran = self._clock() - job.started
            limit = spec.ssh.connect_timeout_s + command_timeout(spec) + 5.0
            if job.done.is_set() or ran >= limit:
                waiting.popleft()
            elif interrupt is not None and ran >= STRAGGLER_S and interrupt():
                waiting.popleft()
            else:
                job.done.wait(min(0.05, limit - ran))

    def _pass_result(self, spec: NodeSpec, job: _InFlight) -> NodeProbe:
        """The node's probe where it ended; else the node as not answering, by its last reason."""
        if job.done.is_set() and job.result is not None:
            return job.result
        with self._lock:
            since, reason = self._down.get(spec.id, (None, ""))
        held = self._last_failure.get(spec.id, TEMPORARY)
        waited = self._clock() - job.started
        # Its last reason as it was: a reason that counted seconds would rewrite status/nodes.yaml every pass.
        why = reason or "no answer yet (its probe is still running)"
        return NodeProbe(unreachable(spec, why, held), (), False, waited, ended=False)


# --------------------------------------------------------------------------
# Report -> ObservedNode (pure)
# --------------------------------------------------------------------------


def _int(v, default=0) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def map_fabrics(spec: NodeSpec, hcas: Sequence[Mapping] | None, warnings: list[str]) -> tuple[FabricAttachment, ...]:
    """HCAs to fabrics: by the fleet's declarations, else by a non-default GID subnet prefix.

    A declared HCA is attached when the node has it; one the node lacks is
    left out, with a warning. When the node has no InfiniBand class at all
    (hcas is None) there is no fact to contradict the declaration, so it is
    kept as declared. Undeclared ACTIVE InfiniBand ports whose subnet prefix
    is not the default join a fabric named after the prefix (`ib-fec0-0-0-1`):
    ports sharing a configured prefix are on one subnet manager's fabric.
    """
    attached: dict[str, list[str]] = {}
    if hcas is None:
        for name, declared in spec.fabrics.items():
            attached[name] = list(declared)
        if spec.fabrics:
            warnings.append("no /sys/class/infiniband on the node: fabric declarations taken as written")
        return tuple(FabricAttachment(n, tuple(h)) for n, h in sorted(attached.items()))
    present = {}
    for port in hcas:
        present.setdefault(port.get("hca"), []).append(port)
    declared_hcas = set()
    for name, declared in sorted(spec.fabrics.items()):
        for hca in declared:
            declared_hcas.add(hca)
            if hca in present:
                attached.setdefault(name, []).append(hca)
            else:
                warnings.append(f"fabric {name}: HCA {hca} is declared but not present on the node")
    for hca, ports in sorted(present.items()):
        if hca in declared_hcas or hca is None:
            continue
        for port in ports:
            prefix = port.get("subnet_prefix")
            if (
                port.get("state") == "ACTIVE"
                and str(port.get("link_layer", "")).lower() == "infiniband"
                and prefix
                and prefix != DEFAULT_GID_PREFIX
            ):
                fabric = attached.setdefault(fabric_name_for_prefix(prefix), [])
                if hca not in fabric:
                    fabric.append(hca)
    return tuple(FabricAttachment(n, tuple(h)) for n, h in sorted(attached.items()))


def _rank(rec: Mapping) -> RunningRank:
    return RunningRank(
        id=str(rec["id"]),
        model=str(rec["model"]),
        profile=str(rec["profile"]),
        rank=_int(rec.get("rank")),
        gpus=tuple(int(g) for g in rec.get("gpus") or ()),
        port=_int(rec.get("port")),
        spec_hash=str(rec.get("spec_hash", "")),
        nnodes=_int(rec.get("nnodes"), 1),
        pid=rec.get("pid") if isinstance(rec.get("pid"), int) else None,
        alive=bool(rec.get("alive")),
        revision=rec.get("revision") if isinstance(rec.get("revision"), str) else None,
    )


def is_own(rec: Mapping, owner: str | None) -> bool:
    """Whether a process record is this catalog's (SPEC 7 Ownership). A record without an owner
    predates ownership and belongs to whichever catalog runs its replica; owner None: all are."""
    return owner is None or rec.get("owner") in (None, owner)


def observed_from_report(spec: NodeSpec, report: Mapping, *, owner: str | None = None) -> tuple[ObservedNode, list[str]]:
    """Join one node's probe report with its fleet.yaml entry. Pure.

    Another owner's records are not replicas of this catalog: never stopped, adopted or
    counted; the GPUs and the port of each of its live ranks are reported taken.
    """
    # What a node says is kept bounded: a few dozen warnings of a few hundred characters.
    warnings = [str(w)[:500] for w in list(report.get("warnings") or ())[:50]]
    gpus = _lost_named(_gpus(spec, report, warnings))
    replicas, foreign = _split_records(report, owner, warnings)
    gpus = _with_foreign_processes(gpus, foreign)
    state, reason, failure = _gpu_verdict(spec, report)
    engines = report.get("engines")
    weights = report.get("weights")
    node = ObservedNode(
        id=spec.id,
        state=state,
        reason=reason,
        failure=failure,
        labels=spec.labels,
        memory_total_mb=report.get("memory_total_mb") if isinstance(report.get("memory_total_mb"), int) else None,
        engines=None if not isinstance(engines, dict) else frozen_map({str(k): str(v or "") for k, v in sorted(engines.items())}),
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        fabrics=map_fabrics(spec, report.get("hcas"), warnings),
        disks=tuple(
            Disk(str(d["path"]), _int(d.get("free_bytes")), _int(d.get("total_bytes"))) for d in report.get("disks") or ()
        ),
        weights=None if weights is None else tuple(sorted(str(w) for w in weights)),
        replicas=tuple(sorted(replicas, key=lambda r: (r.id, r.rank))),
        ports_in_use=tuple(sorted(set(int(p) for p in report.get("ports_in_use") or ())
                                  | {r.port for r, _ in foreign if r.port})),
        llama_cpp=_llama_cpp(report.get("llama_cpp")),
        cpu_count=_positive_int(report.get("cpu_count")),
        health_checks=_health_checks(report.get("health_checks")),
    )
    return node, warnings


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _gpus(spec: NodeSpec, report: Mapping, warnings: list[str]) -> list[Gpu]:
    """The report's GPUs; an entry that cannot be read is left out, with a warning."""
    gpus = []
    for g in report.get("gpus") or ():
        try:
            gpus.append(_gpu(spec, g))
        except (KeyError, TypeError, ValueError) as exc:
            warnings.append(f"unreadable GPU entry in the probe report: {exc}")
    return gpus


def _gpu(spec: NodeSpec, g: Mapping) -> Gpu:
    total = _int(g.get("memory_total_mb"))
    health, reason = _health(g)
    if int(g["index"]) in spec.cordon_gpus:
        reason = "; ".join(r for r in (reason, CORDONED_REASON) if r)
    return Gpu(
        index=int(g["index"]),
        uuid=str(g.get("uuid", "")),
        name=str(g.get("name", "")),
        gpu_class=spec.gpu_class or gpu_class(str(g.get("name", "")), total),
        memory_total_mb=total,
        memory_used_mb=_int(g.get("memory_used_mb")),
        nvlink_peers=tuple(sorted(int(p) for p in g.get("nvlink_peers") or ())),
        processes=tuple(
            GpuProcess(int(p["pid"]), str(p.get("name", "")), _int(p.get("used_mb")))
            for p in g.get("processes") or ()
        ),
        health=health,
        health_reason=reason,
        xid_info=tuple(_said(x, 200) for x in list(g.get("xid_info") or ())[:3]),
    )


CORDONED_REASON = "cordoned in fleet.yaml"


def _said(text, limit: int) -> str:
    """What a node said, kept to one printable line."""
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in str(text)[:limit])


def _health(g: Mapping) -> tuple[GpuHealth, str]:
    """The node's verdict on one GPU. A word that is not a verdict is no verdict: the GPU is taken
    as unhealthy with that said, never as healthy (the probe that would have said ok did not)."""
    said = g.get("health", GpuHealth.OK)
    reason = _said(g.get("health_reason", "") or "", 300)
    try:
        health = GpuHealth(said)
    except ValueError:
        return GpuHealth.UNHEALTHY, f"the probe reported health {_said(said, 40)!r}"
    if health != GpuHealth.OK and not reason:
        reason = f"the probe reported it {health}"
    return health, reason if health != GpuHealth.OK else ""


def _health_checks(reported) -> Mapping[str, str] | None:
    if not isinstance(reported, dict):
        return None
    checks = {}
    for name in ("ecc", "remap", "xid"):
        try:
            checks[name] = CheckResult(reported.get(name, CheckResult.UNREADABLE))
        except ValueError:
            checks[name] = CheckResult.UNREADABLE
    return frozen_map(checks)


def _lost_named(gpus: list[Gpu]) -> list[Gpu]:
    """A GPU the driver cannot name (lost, or no handle) has no name: on a node whose other GPUs are
    all one model (the common case) it takes theirs, so a rejection counts it among that class's GPUs."""
    names = {(g.name, g.gpu_class, g.memory_total_mb) for g in gpus if g.name and g.memory_total_mb}
    if len(names) != 1 or all(g.name for g in gpus):
        return gpus
    (name, cls, total), = names
    return [replace(g, name=name, gpu_class=cls, memory_total_mb=total) if not g.name else g for g in gpus]


def _split_records(report: Mapping, owner: str | None,
                   warnings: list[str]) -> tuple[list[RunningRank], list[tuple[RunningRank, str]]]:
    """The node's process records: (this catalog's ranks, [(another owner's live rank, who it is)])."""
    ours: list[RunningRank] = []
    foreign: list[tuple[RunningRank, str]] = []
    for rec in report.get("replicas") or ():
        try:
            rank = _rank(rec)
        except (KeyError, TypeError, ValueError) as exc:
            warnings.append(f"managed-process record {rec.get('file', '?')} lacks {exc}")
            continue
        if is_own(rec, owner):
            ours.append(rank)
        elif rank.alive:
            foreign.append((rank, f"{rank.id} rank {rank.rank} of owner {str(rec.get('owner'))[:40]}"))
    return ours, foreign


def _with_foreign_processes(gpus: list[Gpu], foreign: Sequence[tuple[RunningRank, str]]) -> list[Gpu]:
    """Each GPU another owner's live rank holds carries that rank as a process (taken, to placement)."""
    for rank, who in foreign:
        for i, g in enumerate(gpus):
            if g.index in rank.gpus and not any(p.pid == rank.pid for p in g.processes):
                gpus[i] = replace(g, processes=g.processes + (GpuProcess(rank.pid or 0, who, 0),))
    return gpus


def _gpu_verdict(spec: NodeSpec, report: Mapping) -> tuple[str, str, str]:
    """(state, reason, failure) of the node, given what its probe said about its GPUs."""
    gpu_error = report.get("gpu_error")
    if not gpu_error:
        return spec.state, "", ""
    # nvidia-smi is there but said nothing usable (garbage, a hang): the node's GPUs are
    # unknown, not absent. Placing on it as a GPU-less node would be a guess; what runs
    # there stays (its records were read), nothing new goes there.
    said = "".join(c if c.isascii() and c.isprintable() else "?" for c in str(gpu_error)[:300])
    return (NodeState.UNUSABLE if spec.state == NodeState.READY else spec.state), f"GPUs unknown: {said}", PERMANENT


def _llama_cpp(reported) -> LlamaCppBinaries | None:
    if not isinstance(reported, dict):
        return None
    rpc = reported.get("rpc_server")
    return LlamaCppBinaries(server=reported.get("server") is True, rpc_server=rpc if isinstance(rpc, str) and rpc else None)
