"""The synchronous face of SSH: one SshTransport per node, kept by a TransportPool across passes.

One persistent connection per node (the daemon probes and applies over the same connections
every pass), reopened with backoff when it breaks. Callers block on a command's result; the
connection itself lives in the pool's one event loop, so an idle node costs no thread.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Callable, Coroutine, Sequence, TypeVar

from reconciler.errors import TransportError
from reconciler.model import NodeSpec
from reconciler.vocabulary import TransportKind
from reconciler.observe.ssh import remote
from reconciler.observe.ssh.config import resolve_target
from reconciler.observe.ssh.connect import Link, _Connector, _Shared
from reconciler.observe.ssh.loop import LoopClosed
from reconciler.observe.transport import CommandResult, KeepsStreams, LocalTransport, Transport

T = TypeVar("T")
# A node refused for a permanent reason (its host key) is not reconnected to on every pass; it is
# tried again when known_hosts changes, or after this long (an operator may fix the node itself).
PERMANENT_RECHECK_S = 300.0


class _Backoff:
    """When a node that failed may be tried again: capped exponential for temporary failures,
    stalled until known_hosts changes (or PERMANENT_RECHECK_S) for permanent ones."""

    def __init__(self, known_hosts: str, min_s: float, max_s: float, jitter: Callable[[], float]):
        self._known_hosts = known_hosts
        self._min, self._max, self._jitter = min_s, max_s, jitter
        self._failures = 0
        self._retry_at = 0.0
        self.last_error: TransportError | None = None
        self._trust_when_failed: tuple | None = None  # known_hosts as it was when a host key was refused

    def _trust_stamp(self) -> tuple | None:
        try:
            st = os.stat(self._known_hosts)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def check(self, now: float) -> None:
        """Raise the last error again while the node is still within its backoff."""
        err = self.last_error
        if err is not None and not err.temporary and self._trust_stamp() != self._trust_when_failed:
            self._retry_at = now  # known_hosts was edited (a key trusted, a line removed): try now
        if err is not None and now < self._retry_at:
            # Broken recently: do not hammer it on every call; say why it is down.
            raise type(err)(err.node, err.reason)

    def failed(self, exc: TransportError, now: float) -> None:
        self._failures += 1
        if exc.temporary:
            # Shortened by up to a quarter at random, so nodes that failed together (a switch
            # reboot) do not all come back in lockstep.
            delay = min(self._max, self._min * (2 ** (self._failures - 1)))
            delay *= 1.0 - 0.25 * self._jitter()
        else:
            # Permanent (a refused host key): stalled until known_hosts or the node's
            # fleet.yaml entry changes (a new entry is a new transport), rechecked rarely.
            delay = PERMANENT_RECHECK_S
            self._trust_when_failed = self._trust_stamp()
        self._retry_at = now + delay
        self.last_error = exc

    def succeeded(self) -> None:
        self._failures = 0
        self.last_error = None


class SshTransport(KeepsStreams):
    """transport.Transport over one persistent SSH connection to one node."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        connector: _Connector | None = None,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ):
        if connector is None:  # standalone use; a TransportPool shares one connector among its nodes
            connector = _Connector(_Shared(None, 4))
        self.node_id = node.id
        self.node = node
        try:
            self.target = resolve_target(node.address, node.ssh, connector.shared.config)
        except ValueError as exc:  # a bad Port in ~/.ssh/config: this node cannot be reached, the others can
            raise TransportError(node.id, str(exc)) from None
        self._connector = connector
        self._loop = connector.shared.loop
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._link: Link | None = None
        self._clock = clock
        self._backoff = _Backoff(self.target.known_hosts, min_backoff_s, max_backoff_s, jitter)
        self._streams: dict[str, tuple[Link, remote.RemoteStream]] = {}
        # Commands abandoned at their deadline, "<pid> <start time>", ended when the node answers again.
        self._abandoned: set[str] = set()
        self._reaping = False

    # -- connection -------------------------------------------------------

    def _connected(self) -> Link:
        # One connect at a time per node, under its own lock: self._lock guards the state only, so
        # closing the pool (release) never waits out a connect in flight (up to connect_timeout_s).
        with self._connecting:
            with self._lock:
                if self._link is not None and self._link.active:
                    return self._link
                if self._link is not None:
                    self._link.close()
                    self._link = None
                    # Whatever ran on the dead connection may live on at the node (sshd there has not
                    # noticed): end it once a new connection is up.
                    self._drop_streams()
            now = self._clock()
            self._backoff.check(now)
            try:
                link = self._connector.open(self.node_id, self.target, self.node.ssh)
            except LoopClosed:
                raise TransportError(self.node_id, "connection closed (the transport is closing)") from None
            except TransportError as exc:
                self._backoff.failed(exc, now)
                raise
            self._backoff.succeeded()
            with self._lock:
                self._link = link
            return link

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.active

    def connect(self) -> None:
        """Open the connection now (it is otherwise opened by the first command)."""
        self._connected()

    def _drop_streams(self) -> None:
        # Called with self._lock held. Closing a channel reaches the node only over a live
        # connection: each stream's command is remembered, to be ended if it is still there
        # when the node answers again (a stream that did end is told apart by its start time).
        for _, stream in self._streams.values():
            process = stream.take_process()
            if process is not None:
                self._abandoned.add(process)
            stream.close()
        self._streams.clear()

    def release(self) -> Link | None:
        """Forget the connection (its streams' commands remembered as abandoned) and hand it over to close."""
        with self._lock:
            self._drop_streams()
            link, self._link = self._link, None
        return link

    def close(self) -> None:
        link = self.release()
        if link is not None:
            link.close()

    # -- commands ---------------------------------------------------------

    @property
    def command_timeout_s(self) -> float:
        return float(self.node.ssh.command_timeout_s)

    def _abandon(self, process: str) -> None:
        with self._lock:
            self._abandoned.add(process)

    @property
    def abandoned(self) -> frozenset[str]:
        """Commands left running on the node past their deadline, not yet ended there."""
        with self._lock:
            return frozenset(self._abandoned)

    def _call(self, coro: Coroutine[object, object, T]) -> T:
        try:
            return self._loop.run(coro)
        except LoopClosed:
            raise TransportError(self.node_id, "connection closed (the transport is closing)") from None

    def _reap(self, link: Link) -> None:
        """End on the node the commands abandoned at their deadline: it answers again."""
        with self._lock:
            if self._reaping or not self._abandoned:
                return
            self._reaping = True
            todo = sorted(self._abandoned)
        try:
            result = self._call(remote.run_command(
                link.conn, self.node_id, remote.reap_argv(todo), None, min(self.command_timeout_s, remote.REAP_TIMEOUT_S),
                open_timeout=self.target.connect_timeout_s, abandon=lambda process: None, wrap=False))
            if result.rc == 0:
                with self._lock:
                    self._abandoned.difference_update(todo)
        except (TransportError, remote.NotStarted):
            pass  # still not answering: tried again with the next command
        finally:
            with self._lock:
                self._reaping = False

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run argv on the node; `timeout` (default ssh.command_timeout_s) bounds it, sending stdin included."""
        if not argv:
            raise ValueError("empty argv")
        timeout = self.command_timeout_s if timeout is None else timeout
        for attempt in (1, 2):
            link = self._connected()
            self._reap(link)
            try:
                return self._call(remote.run_command(
                    link.conn, self.node_id, argv, stdin, timeout,
                    open_timeout=self.target.connect_timeout_s, abandon=self._abandon))
            except remote.NotStarted as exc:
                # The connection died between uses (node rebooted, sshd restarted):
                # nothing ran yet, so one fresh connection and one retry are safe.
                self.close()
                if attempt == 2:
                    raise TransportError(self.node_id, f"connection lost: {exc}") from None
        raise AssertionError("unreachable")

    def open_stream(self, key: str) -> remote.RemoteStream | None:
        """The stream named `key` if it is running on the open connection now (no I/O: None otherwise)."""
        with self._lock:
            held = self._streams.get(key)
            if held is not None and held[0] is self._link and held[0].active and held[1].alive and not self._abandoned:
                return held[1]
        return None

    def stream(self, key: str, argv: Sequence[str], *, preamble: bytes = b"", timeout: float | None = None) -> remote.RemoteStream:
        """The running stream named `key`, started with argv (and `preamble` sent first) if it is not running.

        It lives as long as the connection: a reconnect starts it afresh, and
        closing the connection ends it (the remote command sees end of input).
        """
        timeout = self.command_timeout_s if timeout is None else timeout
        link = self._connected()
        self._reap(link)
        with self._lock:
            held = self._streams.get(key)
            if held is not None and held[0] is link and held[1].alive:
                return held[1]
            if held is not None:
                held[1].close()
                del self._streams[key]
        try:
            stream = self._call(remote.open_stream(
                link.conn, self.node_id, argv, preamble, timeout=min(timeout, self.target.connect_timeout_s),
                loop=self._loop, abandon=self._abandon))
        except remote.NotStarted as exc:
            self.close()
            raise TransportError(self.node_id, f"connection lost: {exc}") from None
        with self._lock:
            self._streams[key] = (link, stream)
        return stream


class TransportPool:
    """One transport per node, kept open across passes. `transport_for(node)` is what callers use.

    Local nodes get a LocalTransport; others an SshTransport whose connection
    is opened on first use and reused after. A node whose fleet.yaml entry
    changed gets a fresh transport. All SSH connections of a pool live in one
    event loop thread.
    """

    def __init__(
        self,
        *,
        ssh_config_path: str | None = None,
        max_handshakes: int = 32,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ):
        self._shared = _Shared(ssh_config_path, max_handshakes)
        self._connector = _Connector(self._shared)
        self._lock = threading.Lock()
        self._transports: dict[str, tuple[NodeSpec, Transport]] = {}
        self._backoff = (min_backoff_s, max_backoff_s)

    def transport_for(self, node: NodeSpec) -> Transport:
        with self._lock:
            held = self._transports.get(node.id)
            if held is not None and held[0] == node:
                return held[1]
            if held is not None:
                held[1].close()
            t: Transport
            if node.transport == TransportKind.LOCAL:
                t = LocalTransport(node.id, node.ssh.command_timeout_s)
            else:
                t = SshTransport(
                    node, connector=self._connector, min_backoff_s=self._backoff[0], max_backoff_s=self._backoff[1]
                )
            self._transports[node.id] = (node, t)
            return t

    def forget(self, node_id: str) -> None:
        with self._lock:
            held = self._transports.pop(node_id, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        with self._lock:
            held = list(self._transports.values())
            self._transports.clear()
        links = []
        for _, t in held:
            if isinstance(t, SshTransport):
                link = t.release()
                if link is not None:
                    links.append(link)
            else:
                t.close()
        # Jump hosts last: the connections above ran through them.
        for link in links + self._connector.close():
            link.close()
        self._shared.loop.close()

    def __enter__(self) -> "TransportPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
