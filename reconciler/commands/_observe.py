"""Where plan and explain get the observed state from: the seam between offline planning and probing.

`--inventory FILE` plans from a snapshot with no SSH at all. Without it, the
fleet should be probed (reconciler.probe, built separately); until that is
wired in here, the last snapshot the reconciler wrote, CATALOG/status/nodes.yaml,
is used and the user is told so.
"""

from __future__ import annotations

import sys
from pathlib import Path

from reconciler.errors import UsageError
from reconciler.inventory import load_inventory
from reconciler.model import Catalog, Inventory


def observe(catalog: Catalog, catalog_dir: str, inventory_path: str | None) -> Inventory:
    if inventory_path is not None:
        if not Path(inventory_path).is_file():
            raise UsageError(f"--inventory {inventory_path}: no such file")
        return load_inventory(inventory_path, catalog.fleet, unknown_nodes="error")
    return probe_fleet(catalog, catalog_dir)


def probe_fleet(catalog: Catalog, catalog_dir: str) -> Inventory:
    """SEAM: replace the body with the live probe (reconciler.probe) once it lands."""
    snapshot = Path(catalog_dir) / "status" / "nodes.yaml"
    if snapshot.is_file():
        print(f"reconciler: planning from {snapshot} (the last probe's snapshot); "
              "pass --inventory FILE to choose one", file=sys.stderr)
        # The reconciler's own snapshot: nodes since removed from fleet.yaml are ignored (SPEC section 3).
        return load_inventory(snapshot, catalog.fleet, unknown_nodes="ignore")
    raise UsageError(
        f"no inventory: pass --inventory FILE (a snapshot such as status/nodes.yaml), "
        f"or run `reconciler nodes {catalog_dir}` first to write {snapshot}"
    )
