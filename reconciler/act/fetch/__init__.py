"""Weights onto the node that needs them (SPEC section 7, `fetch`).

Which way the bytes go:

- node to node, when the target node can log into the source node over SSH by
  itself (its own ~/.ssh key and known_hosts; asked once with `ssh -o
  BatchMode=yes source true` from the target): the target runs `ssh source tar
  -c PATH | tar -x`, so the weights never cross the management host, and a copy
  runs at the speed of the link between the two nodes;
- through the management host otherwise (nodes that cannot reach each other,
  or have no keys for each other): the files are read on the source and written
  on the target in chunks of CHUNK_BYTES, each chunk one command over the
  transports the reconciler already holds, so its memory holds one chunk at most;
- `fetch.command` runs on the target node, with ${MODEL_SOURCE} pointing at the
  temporary path.

Whichever way, a copy is built under a temporary name beside the path
(`.<name>.fetch-<token>/<name>`, see agent.py) and renamed onto the path only
once every file the source listed is there with its size. The probe looks for
the path itself, so a copy killed halfway is never taken for the weights.

`choose_source` is pure (which node to copy from); `Fetcher` does the work.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from reconciler.errors import TransportError, parse_json
from reconciler.model import Fleet, Inventory, Model
from reconciler.engines.render import substitute
from reconciler.observe.transport import Transport
from reconciler.vocabulary import NodeState

# Under the 4 MiB the SSH transport reads of one command's output (ssh.MAX_OUTPUT_BYTES): a chunk is one read.
CHUNK_BYTES = 3 << 20
# Chunks in flight at once through the management host: each is two commands' round trips, so a few
# overlap them (bounded memory: RELAY_IN_FLIGHT chunks).
RELAY_IN_FLIGHT = 4
# How often a node-to-node copy's progress is asked of the target while it runs.
PROGRESS_EVERY_S = 1.0

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


@lru_cache(maxsize=1)
def agent_source() -> str:
    return Path(__file__).with_name("agent.py").read_text()


@dataclass(frozen=True)
class FetchOutcome:
    ok: bool
    node: str
    source_node: str | None  # None for fetch.command
    route: str  # "node to node" | "through the management host" | "command"
    bytes_total: int = 0
    reason: str = ""  # why it failed, with the node's own words

    def __str__(self) -> str:
        frm = f" from {self.source_node}" if self.source_node else ""
        return f"fetched{frm} {self.route}: {gib(self.bytes_total)}" if self.ok else f"fetch failed: {self.reason}"


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 26 else f"{n / (1 << 20):.1f} MiB"


def progress_message(source: str, done: int, total: int) -> str:
    """The Fetching phase's message: bytes done/total, as a person reads them."""
    pct = f" ({100 * done // total}%)" if total else ""
    return f"fetching {source}: {done} of {total} bytes{pct}"


def choose_source(model: Model, target: str, fleet: Fleet, inventory: Inventory) -> str | None:
    """The node to copy the weights from: one that holds them and answers, on a fabric the target is on first,
    then by node id (so plans and logs are deterministic). None when no node holds them."""
    target_spec = fleet.node(target)
    target_obs = inventory.node(target)

    def fabrics(node_id: str) -> set[str]:
        spec, obs = fleet.node(node_id), inventory.node(node_id)
        if spec is not None and spec.fabrics:
            return set(spec.fabrics)
        return {f.name for f in obs.fabrics} if obs is not None else set()

    mine = fabrics(target) if target_spec is not None or target_obs is not None else set()
    holders = []
    for spec in fleet.nodes:
        obs = inventory.node(spec.id)
        if spec.id == target or obs is None or obs.state == NodeState.UNREACHABLE:
            continue
        if obs.weights is not None and model.source in obs.weights:
            holders.append((not (fabrics(spec.id) & mine), spec.id))
    return min(holders)[1] if holders else None


class Fetcher:
    """Copies weights between nodes through their transports; at most `max_parallel` copies of one model at once.

    transports: node id -> Transport (a FleetTransports works). One Fetcher serves a whole pass
    (or the daemon's life), so its per-model caps hold across the replicas being started.
    """

    def __init__(self, fleet: Fleet, transports, *, chunk_bytes: int = CHUNK_BYTES, python: str = "python3",
                 clock: Callable[[], float] = time.monotonic):
        self.fleet = fleet
        self.transports = transports
        self.chunk_bytes = chunk_bytes
        self.python = python
        self.clock = clock
        self._caps: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()
        self.in_flight: dict[str, int] = {}  # model -> copies running now (for tests and status)
        self.most_in_flight: dict[str, int] = {}

    # -- plumbing

    def _transport(self, node: str) -> Transport:
        t = self.transports.get(node)
        if t is None:
            raise TransportError(node, "no transport for this node")
        return t

    def _agent(self, node: str, request: dict, *, stdin: bytes | None = None, timeout: float = 60.0,
               raw: bool = False):
        argv = [self.python, "-I", "-S", "-c", agent_source(), json.dumps(request, separators=(",", ":"))]
        result = self._transport(node).run(argv, stdin=stdin, timeout=timeout)
        if result.rc != 0:
            last = (result.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
            raise TransportError(node, f"fetch agent failed (exit {result.rc}): {last}")
        if raw:
            return result.stdout
        try:
            answer = parse_json(result.stdout)
        except ValueError:
            raise TransportError(node, "fetch agent answered something that is not JSON") from None
        return answer

    def _cap(self, model: Model) -> threading.BoundedSemaphore:
        with self._lock:
            cap = self._caps.get(model.name)
            if cap is None:
                limit = model.fetch.max_parallel if model.fetch is not None else 1
                cap = self._caps[model.name] = threading.BoundedSemaphore(limit)
            return cap

    def _count(self, model: str, delta: int) -> None:
        with self._lock:
            now = self.in_flight.get(model, 0) + delta
            self.in_flight[model] = now
            self.most_in_flight[model] = max(self.most_in_flight.get(model, 0), now)

    # -- the copy

    def fetch(self, model: Model, target: str, source_node: str | None, *, progress: ProgressFn = lambda d, t: None,
              timeout_s: float = 900.0) -> FetchOutcome:
        """Put `model.source` on `target`; never raises for a node's failure (the outcome says why)."""
        policy = model.fetch
        with self._cap(model):
            self._count(model.name, +1)
            try:
                if policy is not None and policy.command is not None:
                    return self._by_command(model, target, timeout_s)
                if source_node is None:
                    return FetchOutcome(False, target, None, "-", reason=f"no node of the fleet holds {model.source}")
                return self._copy(model, target, source_node, progress, timeout_s)
            except TransportError as exc:
                return FetchOutcome(False, target, source_node, "-", reason=f"node {exc.node}: {exc.reason}")
            finally:
                self._count(model.name, -1)

    def _by_command(self, model: Model, target: str, timeout_s: float) -> FetchOutcome:
        token = secrets.token_hex(4)
        begun = self._agent(target, {"op": "begin", "path": model.source, "token": token})
        if not begun.get("ok"):
            return FetchOutcome(False, target, None, "command", reason=begun.get("reason", ""))
        try:
            argv = [substitute(a, {"MODEL_SOURCE": begun["staged"]}) for a in model.fetch.command]
        except KeyError as exc:  # validate refuses these; a catalog built another way still must not run one
            return FetchOutcome(False, target, None, "command", reason=f"unknown placeholder ${{{exc.args[0]}}}")
        ran = self._agent(target, {"op": "run", "argv": argv}, timeout=timeout_s)
        if not ran.get("ok"):
            self._agent(target, {"op": "abort", "path": model.source, "token": token})
            return FetchOutcome(False, target, None, "command", reason=ran.get("reason", ""))
        done = self._agent(target, {"op": "finish", "path": model.source, "token": token, "files": None})
        if not done.get("ok"):
            return FetchOutcome(False, target, None, "command", reason=done.get("reason", ""))
        return FetchOutcome(True, target, None, "command")

    def _copy(self, model: Model, target: str, source: str, progress: ProgressFn, timeout_s: float) -> FetchOutcome:
        path = model.source
        listed = self._agent(source, {"op": "manifest", "path": path})
        if not listed.get("ok"):
            return FetchOutcome(False, target, source, "-", reason=f"node {source}: {listed.get('reason', '')}")
        files, total = listed["files"], int(listed["total"])
        token = secrets.token_hex(4)
        begun = self._agent(target, {"op": "begin", "path": path, "token": token})
        if not begun.get("ok"):
            return FetchOutcome(False, target, source, "-", reason=f"node {target}: {begun.get('reason', '')}")
        progress(0, total)
        spec = self.fleet.node(source)
        reach = {"address": spec.data_address.strip("[]") if spec else source,
                 "port": spec.ssh.port if spec else None, "user": spec.ssh.user if spec else None,
                 "connect_timeout_s": spec.ssh.connect_timeout_s if spec else 10}
        direct = self._agent(target, {"op": "reach", **reach}, timeout=float(reach["connect_timeout_s"]) + 15).get("ok")
        try:
            if direct:
                route = "node to node"
                why = self._pull(target, path, token, reach, total, progress, timeout_s)
            else:
                route = "through the management host"
                why = self._relay(source, target, path, token, files, total, progress)
        except TransportError:
            self._abort(target, path, token)
            raise
        if why:
            self._abort(target, path, token)
            return FetchOutcome(False, target, source, route, total, why)
        done = self._agent(target, {"op": "finish", "path": path, "token": token, "files": files})
        if not done.get("ok"):
            self._abort(target, path, token)
            return FetchOutcome(False, target, source, route, total, f"node {target}: {done.get('reason', '')}")
        progress(total, total)
        return FetchOutcome(True, target, source, route, total)

    def _abort(self, target: str, path: str, token: str) -> None:
        try:
            self._agent(target, {"op": "abort", "path": path, "token": token})
        except TransportError:
            pass  # the next copy's `begin` removes what is left

    def _pull(self, target, path, token, reach, total, progress, timeout_s) -> str:
        answer: dict = {}
        failure: list[BaseException] = []

        def run():
            try:
                answer.update(self._agent(target, {"op": "pull", "path": path, "token": token, **reach}, timeout=timeout_s))
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        worker = threading.Thread(target=run, name=f"fetch-{target}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(PROGRESS_EVERY_S)
            if worker.is_alive():
                try:
                    seen = self._agent(target, {"op": "progress", "path": path, "token": token}, timeout=30)
                    progress(min(int(seen.get("done", 0)), total), total)
                except TransportError:
                    pass  # progress is a courtesy; the copy itself decides
        if failure:
            raise failure[0]
        return "" if answer.get("ok") else f"node {target}: {answer.get('reason', 'no answer')}"

    def _relay(self, source, target, path, token, files, total, progress) -> str:
        chunks = [(rel, offset, min(self.chunk_bytes, size - offset))
                  for rel, size in files for offset in (range(0, size, self.chunk_bytes) if size else (0,))]
        done = [0]
        lock = threading.Lock()

        def one(chunk) -> str:
            rel, offset, length = chunk
            data = self._agent(source, {"op": "read", "path": path, "rel": rel, "offset": offset, "length": length},
                               raw=True) if length else b""
            if len(data) != length:
                return f"node {source}: {rel or path} ended after {offset + len(data)} bytes while copying"
            wrote = self._agent(target, {"op": "write", "path": path, "token": token, "rel": rel, "offset": offset},
                                stdin=data)
            if not wrote.get("ok"):
                return f"node {target}: {wrote.get('reason', 'write failed')}"
            with lock:
                done[0] += length
                progress(done[0], total)
            return ""

        with ThreadPoolExecutor(max_workers=RELAY_IN_FLIGHT) as pool:
            for why in pool.map(one, chunks):
                if why:
                    return why
        return ""


__all__ = ["CHUNK_BYTES", "FetchOutcome", "Fetcher", "choose_source", "progress_message"]

