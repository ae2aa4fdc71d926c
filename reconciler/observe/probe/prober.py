"""The daemon's probe of the fleet (FleetProber): every node's probe on its own deadline, a
node that does not answer reported by its last reason instead of holding a pass back."""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import deque
from typing import Callable, Iterable

from reconciler.errors import TransportError
from reconciler.model import Fleet, Inventory, NodeSpec
from reconciler.observe.probe.collect import (
    SESSION_KEY,
    FleetProbe,
    NodeProbe,
    _probe_one,
    command_timeout,
    forget_answers_not_of,
    probe_once,
    session_request,
    unreachable,
    warm_result,
)
from reconciler.observe.transport import KeepsStreams, TransportPool
from reconciler.vocabulary import FailureKind, NodeState


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
            del job  # not held while idle: what it ran (a node's probe and its result) goes now


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
            job.result = NodeProbe(unreachable(spec, f"probe failed: {type(exc).__name__}: {exc}", FailureKind.BUG), (), False)
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
        # Runs in the event loop's thread once the answer (or its error) is there. The answer is the
        # callback's argument, not a name the callback closes over: a Future whose callback holds it
        # is a reference cycle, and at 10,000 nodes the collector then walked the whole heap (1.1-1.9 s)
        # about once a pass to free some 40 objects per node that reference counting frees at once.
        answer.add_done_callback(
            lambda done: self._finish(job, log, lambda: self._from_session(job, log, done, transport, sources, owner)))
        return True

    def _from_session(self, job: _InFlight, log, answer, transport, sources, owner) -> NodeProbe:
        """The node's probe from its session's answer; else (raising _OneShot) the one-shot probe is handed
        to a worker thread, to say what is wrong."""
        spec = job.spec
        timeout = command_timeout(spec)
        warm = warm_result(spec, answer.result, timeout, job.started, self._clock, owner)
        if warm is not None:
            return warm

        def one_shot() -> NodeProbe:
            return probe_once(spec, transport, sources=sources, timeout=timeout, started=job.started, clock=self._clock, owner=owner)

        self._workers.submit(lambda: self._finish(job, log, one_shot))
        raise _OneShot

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
        ids = {n.id for n in fleet.nodes}
        forget_answers_not_of(ids)
        with self._lock:
            for gone in set(self._inflight) - ids:
                del self._inflight[gone]
            for gone in set(self._down) - ids:
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
        held = self._last_failure.get(spec.id, FailureKind.TEMPORARY)
        waited = self._clock() - job.started
        # Its last reason as it was: a reason that counted seconds would rewrite status/nodes.yaml every pass.
        why = reason or "no answer yet (its probe is still running)"
        return NodeProbe(unreachable(spec, why, held), (), False, waited, ended=False)
