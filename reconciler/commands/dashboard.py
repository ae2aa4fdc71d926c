"""`reconciler dashboard [CATALOG] [--address 127.0.0.1:8765]`: status/ as web pages; no SSH, no writes."""

from __future__ import annotations

import sys
from pathlib import Path

from reconciler.constants import Exit
from reconciler.errors import ReconcilerError


def main(args) -> int:
    root = Path(args.catalog)
    if not root.is_dir():
        raise ReconcilerError(f"{args.catalog}: no such catalog directory")
    if not any((root / name).exists() for name in ("fleet.yaml", "models", "status")):
        raise ReconcilerError(f"{args.catalog} is not a catalog (no fleet.yaml, models/ or status/ in it); "
                              "give the catalog directory, e.g. `reconciler dashboard path/to/catalog`")
    from reconciler.dashboard.server import DashboardServer

    server = DashboardServer(args.catalog, args.address)
    where = "" if server.loopback else " (not loopback: anyone who reaches it sees the fleet)"
    print(f"dashboard of {Path(args.catalog).resolve()} at {server.url}{where}; read-only; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    server.serve()
    return Exit.OK
