"""The exception tree. Every error says where it happened.

    ReconcilerError                                                              kind
    ├── UsageError          bad command line (exit 2)                            permanent
    ├── CatalogInvalid      one or more Problems in the catalog (exit 1)         permanent
    ├── InventoryInvalid    one or more Problems in a snapshot (exit 1)          permanent
    ├── RenderError         a launch refused: placeholder left, loopback head    permanent
    ├── FleetUnreachable    no node of the fleet answered (exit 3)               temporary
    ├── StatusWriteError    a file the reconciler writes could not be written    temporary
    └── TransportError      a node could not be reached or run a command         temporary
        ├── StreamClosed    (transport.py) a long-lived command on a node ended  temporary
        ├── HostKeyError    unknown, changed or revoked host key                 permanent
        ├── CommandTimeout  a command ran past ssh.command_timeout_s             temporary
        └── OutputTooLarge  a node printed more than is read for one command     permanent

Each names where: file:line:column, the node, or the replica.

Foreign exceptions (asyncssh, socket, OSError, ruamel) are translated into
these at one boundary each, so the CLI can print a message instead of a
traceback for anything a user or a node did.

Every failure is one of three kinds (`kind_of`), and callers act on the kind,
never on a message's wording:

    temporary   retrying can help (a timeout, a refused connection, a node that
                printed nothing): retried with capped exponential backoff and
                jitter, per node. `temporary = True` on the class.
    permanent   retrying cannot help until the catalog or the node changes (a
                refused host key, an invalid catalog, a launch that cannot be
                rendered): stalled, and said so. `temporary = False`.
    bug         any other exception: logged with its traceback; the daemon keeps
                running, and the next pass tries again.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with an input file, at the position of the offending value."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


def position_after(before: str | bytes) -> tuple[int, int]:
    """(line, column), from 1, of the point that `before` (all of a file that precedes it) ends at."""
    newline = "\n" if isinstance(before, str) else b"\n"
    return before.count(newline) + 1, len(before) - (before.rfind(newline) + 1) + 1


# What YAML allows in a stream (YAML 1.2, c-printable): tab, line breaks, and the printable characters.
_PRINTABLE_ASCII = bytes([0x09, 0x0A, 0x0D, *range(0x20, 0x7F)])


@functools.cache
def _not_printable() -> re.Pattern:
    # Compiled on first use, by a file that is not ASCII: 3.4 ms that every command paid at start.
    return re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def has_refused_character(data: bytes, text: str) -> bool:
    """Whether `text` (`data` decoded) holds a character YAML does not allow (a control character):
    the reference readers (ruamel, PyYAML) refuse it, yaml_rs takes it into a value. ASCII, nearly
    every file, is checked with bytes.translate (0.5 ms for a 4,000-node fleet.yaml, a tenth of a
    regex search)."""
    if text.isascii():
        return bool(data.translate(None, _PRINTABLE_ASCII))
    return _not_printable().search(text) is not None


def refused_character(text: str, character: str | int) -> tuple[str, tuple[int, int]]:
    """A YAML reader's refused character (ReaderError.character: the character, or its code point, by
    reader) and the (line, column) of its first occurrence in `text`, where the reader stopped: not
    its `position`, which counts bytes in one reader and characters in another."""
    char = character if isinstance(character, str) else chr(character)
    return char, position_after(text[:max(text.find(char), 0)])


# How deep the values of a file the reconciler reads may nest (its own formats need eight levels). Past
# a few hundred the recursive readers and checks run out of Python's stack (ruamel, jsonschema); past
# some ten thousand PyYAML's C loader, and yaml_rs on block nesting, overflow the C stack: a
# segmentation fault, which no `except` catches.
MAX_NESTING = 100
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
# Block nesting needs two columns a level (indentation, `- `, `? `): a line starting with
# 2 * MAX_NESTING of those characters is past it.
_DEEP_BLOCK_LINE = re.compile(rb"^[ \t?:-]{%d}" % (2 * MAX_NESTING), re.MULTILINE)
_BLOCK_CHARS = bytes(0x78 if b in b" \t?:-" else 0x2E for b in range(256))  # such a character -> x
_DEEP_BLOCK_RUN = b"x" * (2 * MAX_NESTING)


def block_too_deep(data: bytes) -> tuple[int, int] | None:
    """(line, column) of a line whose block nesting goes past MAX_NESTING, or None: asked before yaml_rs,
    whose flow nesting is bounded and block nesting is not. A run of those characters that long
    anywhere is looked for first, at C speed (4 ms in a 6 MB snapshot); only a file that has one is
    searched line by line."""
    if data.translate(_BLOCK_CHARS).find(_DEEP_BLOCK_RUN) == -1:
        return None
    line = _DEEP_BLOCK_LINE.search(data)
    return position_after(data[:line.start()]) if line is not None else None


def too_deep(data: bytes) -> tuple[int, int] | None:
    """(line, column) where `data` (YAML or JSON) nests past MAX_NESTING, or None; asked before a recursive
    reader is. Flow brackets are counted across lines (those in quoted strings too: a file that is
    refused for brackets in its strings has a thousand of them), block nesting as block_too_deep does."""
    block = block_too_deep(data)
    brackets = data.translate(None, _NOT_BRACKETS)
    if len(brackets) > MAX_NESTING:  # else they cannot nest that deep: no walk
        depth = 0
        for i, b in enumerate(brackets):
            depth = depth + 1 if b in b"[{" else max(depth - 1, 0)
            if depth > MAX_NESTING:
                # The (MAX_NESTING + 1)th open bracket still open: found again in the data by counting.
                flow = position_after(data[:_nth_bracket(data, i)])
                return min(flow, block) if block is not None else flow
    return block


def parse_json(data: str | bytes) -> Any:
    """json.loads, where JSON nested too deep for its recursion is a ValueError like any other malformed
    JSON: json.loads raises RecursionError, which the `except ValueError` of a reader does not catch
    (a node's answer, an engine's response, a file on disk)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("values nested too deeply to read") from None


def _nth_bracket(data: bytes, n: int) -> int:
    """The offset in `data` of its n-th (from 0) bracket character."""
    seen = 0
    for m in re.finditer(rb"[\[\]{}]", data):
        if seen == n:
            return m.start()
        seen += 1
    return len(data)


from reconciler.vocabulary import FailureKind  # noqa: E402


class ReconcilerError(Exception):
    temporary = False  # see the module docstring: most of these wait for the catalog or the node to change


def kind_of(exc: BaseException) -> FailureKind:
    """temporary, permanent or bug: what a caller does about `exc` (retry, stall, log the traceback)."""
    if isinstance(exc, ReconcilerError):
        return FailureKind.TEMPORARY if exc.temporary else FailureKind.PERMANENT
    return FailureKind.BUG


class UsageError(ReconcilerError):
    pass


class CatalogInvalid(ReconcilerError):
    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class InventoryInvalid(CatalogInvalid):
    pass


class RenderError(ReconcilerError):
    def __init__(self, replica: str, message: str):
        self.replica = replica
        super().__init__(f"{replica}: {message}")


class FleetUnreachable(ReconcilerError):
    temporary = True


class StatusWriteError(ReconcilerError, OSError):
    """A status or state file could not be written (a read-only catalog, `status` that is a file...).

    A ReconcilerError, so a command says it in one line; still an OSError, so a caller
    that carries on without the file (the daemon) catches it as it catches any I/O error.
    """

    temporary = True  # a full disk, a permission fixed by hand: the next pass writes again

    def __init__(self, path: str, reason: str):
        OSError.__init__(self, f"cannot write {path}: {reason}")
        self.path = path
        self.reason = reason
        self.strerror = reason

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.reason}"


class TransportError(ReconcilerError):
    """A node could not run a command. `temporary` tells the caller whether retrying can help."""

    temporary = True

    def __init__(self, node: str, message: str):
        self.node = node
        self.reason = message
        super().__init__(f"{node}: {message}")


class HostKeyError(TransportError):
    temporary = False


class CommandTimeout(TransportError):
    pass


class OutputTooLarge(TransportError):
    """A node printed more than is read for one command (a hostile or broken node): not read, not kept.

    Permanent: the same node prints the same thing next time; it is retried when rechecked."""

    temporary = False
