"""Commands on a node over an open asyncssh connection, in the event loop: what they print,
bounded, and what to end on the node when one is left behind at its deadline.

Everything here runs in the pool's event loop (reconciler.observe.ssh.loop); RemoteStream is the one
object other threads hold, and it reaches its channel only through the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shlex
from typing import Callable, Sequence

import asyncssh

from reconciler.errors import CommandTimeout, OutputTooLarge, TransportError
from reconciler.observe.ssh.loop import EventLoop, LoopClosed
from reconciler.observe.transport import CommandResult, StreamClosed

# Every command runs under this POSIX sh prologue (shell builtins only: a node's login PATH
# may hold nothing else): it prints "<pid> <start time>" (the
# kernel's start time of the process, field 22 of /proc/<pid>/stat) on its first line of
# stdout, then execs the command, which keeps that pid. A command abandoned at its deadline
# (a cut link, a silent node) is then ended on the node when the node answers again, and
# only if that pid still is the process we started (pids are reused).
_PROLOGUE = (
    'p=$$; s=; read -r s 2>/dev/null </proc/$p/stat; s=${s##*") "}; '
    't=$(set -- $s; echo "${20}"); echo "$p ${t:-?}"; exec "$@"'
)
# Ends each "<pid> <start time>" given, where that process still has that start time.
_REAP = (
    'for e; do p=${e%% *}; t=${e#* }; s=; read -r s 2>/dev/null </proc/$p/stat || continue; '
    's=${s##*") "}; [ "$(set -- $s; echo "${20}")" = "$t" ] && kill -TERM "$p"; done; exit 0'
)
# The most a node may print for one command (or one stream answer): a probe report of a
# large node is tens of KiB; what is read from a node never grows without bound.
MAX_OUTPUT_BYTES = 4 << 20
_STDERR_KEPT = 64 << 10


def wrapped(argv: Sequence[str]) -> str:
    """The remote command line for argv: the prologue, then argv quoted once."""
    return shlex.join(["/bin/sh", "-c", _PROLOGUE, "llm-reconciler", *argv])


def _split_header(out: bytes) -> tuple[str | None, bytes]:
    """("<pid> <start>", rest) when out starts with the prologue's line, else (None, out)."""
    head, sep, rest = out.partition(b"\n")
    parts = head.split(b" ")
    if sep and len(parts) == 2 and parts[0].isdigit() and (parts[1].isdigit() or parts[1] == b"?"):
        return head.decode(), rest
    return None, out


REAP_TIMEOUT_S = 10.0


def reap_argv(processes: Sequence[str]) -> list[str]:
    """The command that ends each abandoned "<pid> <start time>" (run unwrapped)."""
    return ["/bin/sh", "-c", _REAP, "llm-reconciler", *processes]


class NotStarted(Exception):
    """No channel could be opened on the connection: nothing ran, so a fresh connection may retry."""


class _Output(asyncssh.SSHClientSession):
    """What one remote command sends back, kept bounded: stdout unread up to MAX_OUTPUT_BYTES
    (past that the channel is closed and the command counts as too large), the tail of stderr."""

    def __init__(self, header: bool):
        self.out = bytearray()  # grown in place: bytes += would copy the whole buffer per chunk
        self.err = bytearray()
        self.header = header  # the prologue's line is still to come
        self.process: str | None = None  # "<pid> <start time>" once the prologue's line arrived
        self.too_large = False
        self.eof = False
        self.exit_status: int | None = None
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self.changed = asyncio.Event()  # something arrived, or the channel ended
        self._chan: asyncssh.SSHClientChannel | None = None
        self._scanned = 0  # bytes of out known to hold no newline

    def connection_made(self, chan) -> None:
        self._chan = chan

    def data_received(self, data: bytes, datatype) -> None:
        if datatype == asyncssh.EXTENDED_DATA_STDERR:
            self.err += data
            del self.err[:-_STDERR_KEPT]
            return
        if self.too_large:
            return
        self.out += data
        if self.header and (b"\n" in self.out or len(self.out) > 64):
            self.process, rest = _split_header(bytes(self.out))
            self.out, self.header, self._scanned = bytearray(rest), False, 0
        if len(self.out) > MAX_OUTPUT_BYTES:
            self.too_large = True
            self.out, self._scanned = bytearray(), 0
            if self._chan is not None:
                self._chan.close()
        self.changed.set()

    def eof_received(self) -> bool:
        self.eof = True
        self.changed.set()
        return False

    def exit_status_received(self, status: int) -> None:
        self.exit_status = status

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        self.changed.set()

    def finish_header(self) -> None:
        if self.header:  # ended before the prologue's line was complete
            self.process, rest = _split_header(bytes(self.out))
            self.out, self.header = bytearray(rest), False

    def take_line(self) -> bytes | None:
        i = self.out.find(b"\n", self._scanned)
        if i < 0:
            self._scanned = len(self.out)
            return None
        line = bytes(self.out[:i])
        del self.out[:i + 1]
        self._scanned = 0
        return line


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def _open(conn: asyncssh.SSHClientConnection, command: str, header: bool, timeout: float):
    try:
        return await asyncio.wait_for(
            conn.create_session(lambda: _Output(header), command, encoding=None), max(0.01, timeout))
    except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        raise NotStarted(_why(exc)) from None


def _send(chan, data: bytes | None) -> None:
    # A command that exits without reading its input closes the channel first: its output and
    # exit status still say what happened, so a refused write is not an error of its own.
    try:
        if data:
            chan.write(data)
        chan.write_eof()
    except (OSError, asyncssh.Error):
        pass


async def run_command(
    conn: asyncssh.SSHClientConnection, node_id: str, argv: Sequence[str], stdin: bytes | None,
    timeout: float, *, open_timeout: float, abandon: Callable[[str], None], wrap: bool = True,
) -> CommandResult:
    """Run argv on the node within `timeout`, sending stdin included; NotStarted if no channel opened."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    chan, out = await _open(conn, wrapped(argv) if wrap else shlex.join(argv), wrap, min(timeout, open_timeout))
    try:
        _send(chan, stdin)
        try:
            lost = await asyncio.wait_for(asyncio.shield(out.closed), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            # Sending blocks while the node does not read (a full window, a cut link): the
            # command's deadline covers sending its input too.
            sending = chan.get_write_buffer_size() > 0
            what = f"sending {argv[0]} its input took past" if sending else f"{argv[0]} ran past"
            raise _left_behind(out, abandon, CommandTimeout(node_id, f"{what} {timeout:g}s")) from None
        if out.too_large:
            raise _left_behind(out, abandon, OutputTooLarge(
                node_id, f"{argv[0]} printed more than {MAX_OUTPUT_BYTES >> 20} MiB; not read"))
        if lost is not None:
            raise _left_behind(out, abandon, TransportError(
                node_id, f"connection lost while running {argv[0]}: {_why(lost)}"))
    finally:
        chan.close()
    out.finish_header()
    # No exit status means the remote command died on a signal; report it like OpenSSH does.
    return CommandResult(255 if out.exit_status is None else out.exit_status, bytes(out.out), bytes(out.err))


def _left_behind(out: _Output, abandon: Callable[[str], None], exc: Exception) -> Exception:
    """exc, once the command (which may outlive its channel on the node) is remembered to be ended there."""
    if out.process is not None:
        abandon(out.process)
        out.process = None
    return exc


async def open_stream(
    conn: asyncssh.SSHClientConnection, node_id: str, argv: Sequence[str], preamble: bytes,
    *, timeout: float, loop: EventLoop, abandon: Callable[[str], None],
) -> "RemoteStream":
    chan, out = await _open(conn, wrapped(argv), True, timeout)
    if preamble:
        try:
            chan.write(preamble)
        except (OSError, asyncssh.Error):
            pass  # ended at once: the first request says how (StreamClosed, with its exit status)
    return RemoteStream(node_id, loop, chan, out, abandon)


class RemoteStream:
    """transport.Stream over one SSH channel: a command that answers a line per request line."""

    def __init__(self, node_id: str, loop: EventLoop, chan, out: _Output, abandon: Callable[[str], None]):
        self.node_id = node_id
        self._loop = loop
        self._chan = chan
        self._out = out
        self._abandon = abandon
        self._turn = asyncio.Lock()  # one request at a time: answers come back in order

    @property
    def alive(self) -> bool:
        return not self._out.closed.done() and not self._out.eof and not self._out.too_large

    def request(self, line: bytes, *, timeout: float) -> bytes:
        try:
            return self._loop.run(self.ask(line, timeout))
        except LoopClosed:
            raise TransportError(self.node_id, "connection closed (the transport is closing)") from None

    def submit(self, line: bytes, *, timeout: float) -> "concurrent.futures.Future[bytes]":
        """request() without a thread waiting: a Future that holds the answer or the error."""
        return self._loop.submit(self.ask(line, timeout))

    async def ask(self, line: bytes, timeout: float) -> bytes:
        async with self._turn:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            try:
                self._chan.write(line if line.endswith(b"\n") else line + b"\n")
            except (OSError, asyncssh.Error) as exc:
                self._give_up()
                raise TransportError(self.node_id, f"connection lost: {_why(exc)}") from None
            while True:
                self._out.changed.clear()
                answer = self._answer(timeout, deadline - loop.time())
                if answer is not None:
                    return answer
                try:
                    async with asyncio.timeout(max(0.0, deadline - loop.time())):
                        await self._out.changed.wait()
                except TimeoutError:
                    pass

    def _answer(self, timeout: float, left: float) -> bytes | None:
        """The next answer line; None to wait for more; raises when there will be none."""
        out = self._out
        line = out.take_line()
        if line is not None:
            return line
        if out.too_large:
            self._give_up()
            raise OutputTooLarge(self.node_id, f"answered with more than {MAX_OUTPUT_BYTES >> 20} MiB and no end of line; not read")
        if out.closed.done():
            self.close()
            raise StreamClosed(self.node_id, f"command ended (exit {out.exit_status})", out.exit_status, bytes(out.err))
        if left <= 0:
            sending = self._chan.get_write_buffer_size() > 0
            self._give_up()
            if sending:
                raise CommandTimeout(self.node_id, f"sending the request took past {timeout:g}s")
            raise CommandTimeout(self.node_id, f"no answer within {timeout:g}s")
        return None

    def _give_up(self) -> None:
        """Close the channel and have the command ended on the node, should closing not reach it."""
        if self._out.process is not None:
            self._abandon(self._out.process)
            self._out.process = None
        self._chan.close()

    def take_process(self) -> str | None:
        """The command's "<pid> <start time>", handed over once (to be ended on the node if it outlives us)."""
        process, self._out.process = self._out.process, None
        return process

    def close(self) -> None:
        self._loop.call(self._chan.close)
