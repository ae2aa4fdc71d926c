"""Management side of the probe: send the node-side program (script.py's payload) to nodes, one
node at a time or the fleet at once, and turn their reports (report.py) into an Inventory."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Mapping

from reconciler.errors import CommandTimeout, OutputTooLarge, TransportError, kind_of
from reconciler.model import Fleet, Inventory, NodeSpec, ObservedNode
from reconciler.observe.probe.report import observed_from_report
from reconciler.observe.probe.script import BOOTSTRAP, payload
from reconciler.observe.transport import Transport, TransportPool
from reconciler.vocabulary import FailureKind, NodeState

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


def _args(model_dirs: tuple, state_dir, command_timeout_s: float, sources: tuple | None, owner: str | None) -> dict:
    """What the probe is asked (session_request encodes it): where to look for weights, which
    sources, its state folder, whose records are ours, and its own time limits."""
    args = {
        "model_dirs": list(model_dirs),
        "sources": None if sources is None else sorted(set(sources)),
        "state_dir": state_dir,
    }
    if owner is not None:
        args["owner"] = owner
    if not GPU_HEALTH_QUERIES:
        args["gpu_health"] = False
    # The node's own waits end well inside the command's deadline, so a hung nvidia-smi or
    # `import sglang` is reported as such (GPUs unknown) instead of the whole node timing out.
    inner = round(max(1.0, min(20.0, command_timeout_s / 2)), 1)
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
    return [PYTHON, "-", session_request(spec, sources, owner).decode()], _payload()


def unreachable(spec: NodeSpec, reason: str, failure: FailureKind = FailureKind.TEMPORARY) -> ObservedNode:
    """A node that did not answer, or whose answer cannot be read; `failure` says whether waiting can help."""
    return ObservedNode(id=spec.id, state=NodeState.UNREACHABLE, reason=reason, labels=spec.labels, failure=failure)


def _no_python(rc: int, stderr: str) -> bool:
    # bash: "python3: command not found" (127); sh: "python3: not found" (127)
    return rc == 127 and PYTHON in stderr and "not found" in stderr


def unusable(spec: NodeSpec, reason: str) -> ObservedNode:
    """A node that answered with something the reconciler cannot place on (GPUs unknown, a report it cannot read)."""
    return ObservedNode(id=spec.id, state=NodeState.UNUSABLE, reason=reason, labels=spec.labels, failure=FailureKind.PERMANENT)


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
    except (AttributeError, KeyError, TypeError, ValueError, RecursionError, ArithmeticError) as exc:  # int(Infinity)
        # Valid JSON of the wrong shape (a probe that is not ours answering): nothing in it can be
        # trusted, its process records included, so the node counts as not answering.
        return NodeProbe(unreachable(spec, f"probe report unreadable ({type(exc).__name__}: {str(exc)[:120]})", FailureKind.PERMANENT), (), True, clock() - started)
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
    return _encoded_request(tuple(spec.model_dirs), spec.state_dir, float(spec.ssh.command_timeout_s),
                            None if sources is None else tuple(sources), owner, GPU_HEALTH_QUERIES)


@lru_cache(maxsize=64)
def _encoded_request(model_dirs: tuple, state_dir, command_timeout_s: float, sources: tuple | None,
                     owner: str | None, gpu_health: bool) -> bytes:
    # Every node of a fleet asks with the same few arguments (the catalog's sources among them,
    # hundreds of paths), pass after pass: encoded once, not once per node and pass. gpu_health
    # (GPU_HEALTH_QUERIES, read by _args) is part of the key so that a change of it is seen.
    args = _args(model_dirs, state_dir, command_timeout_s, sources, owner)
    return json.dumps(args, sort_keys=True, separators=(",", ":")).encode()


# The last answer of each node's probe session, by a digest of its bytes, with what it was read as:
# a node that answers what it answered last pass (an idle node, most of a fleet) is not parsed again.
# observed_from_report is pure, so the same bytes, fleet.yaml entry and owner give the same node.
_LAST_ANSWER: dict[str, tuple[bytes, NodeSpec, str | None, NodeProbe]] = {}


def forget_answers_not_of(node_ids: set[str]) -> None:
    """Drop the remembered answers of nodes no longer in the fleet (a daemon lives for months)."""
    # list() copies the keys at once (in C): the event loop's thread may be adding an answer meanwhile.
    for gone in [n for n in list(_LAST_ANSWER) if n not in node_ids]:
        _LAST_ANSWER.pop(gone, None)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def warm_result(spec: NodeSpec, answer: Callable[[], bytes], timeout: float, started: float, clock, owner: str | None) -> NodeProbe | None:
    """The node's probe from its running session's answer (`answer()` returns the line or raises);
    None when the one-shot probe should say what is wrong instead."""
    try:
        data = answer()
        digest = _digest(data)
        last = _LAST_ANSWER.get(spec.id)
        if last is not None and last[0] == digest and last[2] == owner and (last[1] is spec or last[1] == spec):
            return dataclasses.replace(last[3], seconds=clock() - started)
        report = _decode_report(data)
        if "error" not in report:
            probe = _from_report(spec, report, started, clock, owner)
            if probe.node.state != NodeState.UNREACHABLE:  # an unreadable report is read again, to say why
                _LAST_ANSWER[spec.id] = (digest, spec, owner, probe)
            return probe
    except CommandTimeout:
        return NodeProbe(unreachable(spec, f"probe ran past {timeout:g}s"), (), True, clock() - started)
    except OutputTooLarge as exc:
        return NodeProbe(unreachable(spec, f"probe answer unreadable: {exc.reason}", FailureKind.PERMANENT), (), True, clock() - started)
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
        return NodeProbe(unreachable(spec, f"probe answer unreadable: {exc.reason}", FailureKind.PERMANENT), (), True, clock() - started)
    except TransportError as exc:
        return NodeProbe(unreachable(spec, exc.reason, kind_of(exc)), (), False, clock() - started)
    elapsed = clock() - started
    stderr = result.stderr[-4096:].decode(errors="replace").strip()
    if _no_python(result.rc, stderr):
        return NodeProbe(unreachable(spec, "python3 is not on the node's login PATH; the probe needs it", FailureKind.PERMANENT), (stderr,), True, elapsed)
    try:
        report = _decode_report(result.stdout)
    except ValueError:
        shown = (result.stdout[:120] or result.stderr[-200:]).decode(errors="replace").strip()
        why = f"probe exited {result.rc}" if result.rc != 0 else "probe printed something that is not a JSON report"
        # A node whose python3 is something else says the same next time: stalled until it changes.
        return NodeProbe(unreachable(spec, f"{why}: {shown!r}" if shown else why, FailureKind.PERMANENT), (stderr[-500:],) if stderr else (), True, elapsed)
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
