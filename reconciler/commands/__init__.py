"""One module per subcommand; each exposes main(args) -> exit code.

A one-shot command may leave its values to the process's exit (reconciler/teardown.py).
"""

from __future__ import annotations

from pathlib import Path

from reconciler.errors import ReconcilerError


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
