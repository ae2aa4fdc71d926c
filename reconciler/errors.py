"""The exception tree. Every error says where it happened.

    ReconcilerError
    ├── UsageError            bad command line (exit 2)
    ├── CatalogInvalid        one or more Problems in the catalog (exit 1)
    ├── InventoryInvalid      one or more Problems in a snapshot (exit 1)
    ├── RenderError           a launch refused: placeholder left, loopback head (names the replica)
    ├── FleetUnreachable      no node of the fleet answered (exit 3)
    ├── StatusWriteError      a file the reconciler writes (status/, its state) could not be written
    └── TransportError        a node could not be reached or a command failed to run (names the node)
        ├── HostKeyError      unknown or changed host key: permanent until an operator acts
        ├── CommandTimeout    a command ran past its deadline (ssh.command_timeout_s)
        └── OutputTooLarge    a node printed more than the reconciler reads for one command

Foreign exceptions (paramiko, socket, OSError, ruamel) are translated into
these at one boundary each, so the CLI can print a message instead of a
traceback for anything a user or a node did.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with an input file, at the position of the offending value."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class ReconcilerError(Exception):
    pass


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
    pass


class StatusWriteError(ReconcilerError, OSError):
    """A status or state file could not be written (a read-only catalog, `status` that is a file...).

    A ReconcilerError, so a command says it in one line; still an OSError, so a caller
    that carries on without the file (the daemon) catches it as it catches any I/O error.
    """

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
    """A node printed more than is read for one command (a hostile or broken node): not read, not kept."""
