"""One module per subcommand; each exposes main(args) -> exit code.

A one-shot command that builds a fleet's worth of values (plan, explain: a 4,000-node catalog and
snapshot are millions of objects) may leave them to the process's exit: freeing them one by one
took 0.12 s of a 1.5 s `plan`, for memory the OS takes back at once. cli.run (the `reconciler`
console script and `python -m reconciler`) then flushes stdout and stderr and ends with os._exit.
In any other process (tests, a daemon) leave_to_exit keeps nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.errors import ReconcilerError

_left_to_exit: list[Any] | None = None


def exit_without_teardown() -> None:
    """For cli.run only: values handed to leave_to_exit from now on are kept."""
    global _left_to_exit
    _left_to_exit = []


def leave_to_exit(*values: Any) -> None:
    """Keep these values referenced to the end of the process, which then exits without freeing them."""
    if _left_to_exit is not None:
        _left_to_exit.extend(values)


def left_to_exit() -> bool:
    """Whether the command left values to the exit: the process ends with os._exit."""
    return bool(_left_to_exit)


def catalog_dir(given: str, command: str) -> Path:
    """The catalog directory a command that serves status/ was given (dashboard, gateway): one that
    exists and holds fleet.yaml, models/ or status/; else an error saying what to give."""
    root = Path(given)
    if not root.is_dir():
        raise ReconcilerError(f"{given}: no such catalog directory")
    if not any((root / name).exists() for name in ("fleet.yaml", "models", "status")):
        raise ReconcilerError(f"{given} is not a catalog (no fleet.yaml, models/ or status/ in it); "
                              f"give the catalog directory, e.g. `reconciler {command} path/to/catalog`")
    return root
