"""`reconciler dashboard [CATALOG] [--address 127.0.0.1:8765]`: status/ as web pages; no SSH, no writes."""

from __future__ import annotations

import sys
from pathlib import Path

from reconciler.commands import catalog_dir
from reconciler.constants import Exit


def main(args) -> int:
    catalog_dir(args.catalog, "dashboard")
    from reconciler.dashboard.server import DashboardServer

    server = DashboardServer(args.catalog, args.address)
    where = "" if server.loopback else " (not loopback: anyone who reaches it sees the fleet)"
    print(f"dashboard of {Path(args.catalog).resolve()} at {server.url}{where}; read-only; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    server.serve()
    return Exit.OK
