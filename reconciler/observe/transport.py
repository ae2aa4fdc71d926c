"""How commands reach a node: an argv in, exit code and bytes out.

Everything that acts on nodes (probe, apply) goes through this interface, so
tests and the `local` transport need no SSH, and the `ssh` package stays the
only one that knows an SSH library. An argv is quoted exactly once, by the transport
that turns it into a remote command line (shlex.join); no caller ever builds a
shell line from catalog values.
"""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from reconciler.errors import CommandTimeout, TransportError
from reconciler.frozen import frozen

if TYPE_CHECKING:
    from reconciler.model import Fleet, NodeSpec


@frozen
class CommandResult:
    rc: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.rc == 0


class StreamClosed(TransportError):
    """A long-lived command on a node ended (or never started) before answering.

    Carries what the command left behind, so a caller can tell "python3 is not
    installed" (rc 127) from a crash.
    """

    temporary = True

    def __init__(self, node: str, message: str, rc: int | None = None, stderr: bytes = b""):
        super().__init__(node, message)
        self.rc = rc
        self.stderr = stderr


class Stream(Protocol):
    """A command kept running on a node, answering one line per request line.

    Transports that keep connections open offer `stream(...)`; the probe uses it
    to leave its interpreter running between passes instead of starting one per
    pass. Optional: callers fall back to `run` when a transport has none.
    """

    def request(self, line: bytes, *, timeout: float) -> bytes: ...

    def close(self) -> None: ...


class SubmittingStream(Stream, Protocol):
    """A Stream whose request can also be made without a thread waiting on it (the SSH event loop)."""

    def submit(self, line: bytes, *, timeout: float) -> "Future[bytes]": ...


class KeepsStreams(ABC):
    """A transport that can say, without any I/O, whether a stream it started is still running,
    so a caller with thousands of nodes asks each for its answer with no thread per node.
    (A base class, not a Protocol: isinstance on it is a plain class check, done per node per pass.)"""

    @abstractmethod
    def open_stream(self, key: str) -> SubmittingStream | None: ...


class Transport(Protocol):
    node_id: str

    @property
    def command_timeout_s(self) -> float:
        """The node's deadline for one command (ssh.command_timeout_s): run's default, and the
        launcher's for each agent call."""
        ...

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult: ...

    def close(self) -> None: ...


class LocalTransport:
    """Runs commands on this machine, for a node declared `transport: local`."""

    def __init__(self, node_id: str, command_timeout_s: float = 30.0):
        self.node_id = node_id
        self.command_timeout_s = float(command_timeout_s)

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        timeout = self.command_timeout_s if timeout is None else timeout
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(self.node_id, f"{argv[0]} ran past {timeout:g}s") from exc
        except OSError as exc:
            raise TransportError(self.node_id, f"cannot run {argv[0]}: {exc.strerror}") from exc
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def close(self) -> None:
        pass


class TransportPool(Protocol):
    """Where transports come from, for the probe and the launcher: the daemon's SSH pool (connections kept
    open between passes), or TransportMap over a fixed mapping."""

    def transport_for(self, spec: "NodeSpec") -> Transport: ...


class TransportMap:
    """A fixed mapping node id -> Transport as a pool (tests, one-shot `apply`)."""

    def __init__(self, transports: Mapping[str, Transport]):
        self.transports = transports

    def transport_for(self, spec: "NodeSpec") -> Transport:
        transport = self.transports.get(spec.id)
        if transport is None:
            raise TransportError(spec.id, "no transport for this node")
        return transport


class FleetTransports:
    """One view of the transports for both consumers: the probe asks `transport_for(spec)`, the launcher `get(id)`."""

    def __init__(self, source: "TransportPool | Mapping[str, Transport]", fleet: "Fleet"):
        # The one place a mapping becomes a pool, so nothing downstream asks what it was given.
        self.pool: TransportPool = TransportMap(source) if isinstance(source, Mapping) else source
        self.fleet = fleet

    def transport_for(self, spec: "NodeSpec") -> Transport:
        return self.pool.transport_for(spec)

    def get(self, node_id: str) -> Transport | None:
        spec = self.fleet.node(node_id)
        if spec is None:
            return None
        return self.pool.transport_for(spec)  # a TransportError here names the node and why
