"""Where plan and explain get the observed state from: a snapshot file, or a live probe.

`--inventory FILE` plans from a snapshot with no SSH at all (what a pull
request check uses). Without it the fleet is probed now, the same way
`reconciler nodes` and the daemon do, so a plan never rests on stale facts.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from reconciler.errors import FleetUnreachable, UsageError
from reconciler.inventory import load_inventory, read_snapshot
from reconciler.model import Catalog, Inventory


def observe(catalog: Catalog, inventory_path: str | None, prefetched: "SnapshotPrefetch | None" = None) -> Inventory:
    if inventory_path is not None:
        check_inventory_path(inventory_path)
        return load_snapshot(inventory_path, catalog, prefetched)
    return probe_fleet(catalog)


class SnapshotPrefetch:
    """The --inventory file read and parsed on a thread while the catalog loads (a context manager).

    yaml_rs parses block YAML with the GIL released, so on a second core a 4,000-node
    status/nodes.yaml is mostly read by the time the catalog is; JSON (orjson holds the GIL)
    gains little and loses nothing. Only the reading moves: the document is checked against the
    fleet afterwards, as before, and a snapshot that cannot be read says so only when asked,
    after any problem of the catalog, as without the thread.
    """

    def __init__(self, inventory_path: str | None):
        self._result: list = []
        self._thread = None
        if inventory_path is not None and Path(inventory_path).is_file():
            self._thread = threading.Thread(target=self._read, args=(inventory_path,), name="snapshot-read",
                                            daemon=True)

    def _read(self, path: str) -> None:
        try:
            self._result.append((read_snapshot(path), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that asks (InventoryInvalid, OSError ...)
            self._result.append((None, exc))

    def __enter__(self) -> "SnapshotPrefetch":
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._thread.join()  # a file being read: never long, and no thread outlives the command

    @property
    def started(self) -> bool:
        return self._thread is not None

    def document(self):
        """The document read_snapshot gave, or its exception raised here."""
        self._thread.join()
        doc, exc = self._result[0]
        if exc is not None:
            raise exc
        return doc


def load_snapshot(inventory_path: str, catalog: Catalog, prefetched: SnapshotPrefetch | None = None) -> Inventory:
    """The snapshot, less the nodes fleet.yaml no longer has (SPEC section 3).

    A pull request that retires a node removes it from fleet.yaml while the committed
    snapshot still lists it: that is ignored, said once on stderr, exit code unchanged.
    """
    dropped: list[str] = []
    document = prefetched.document if prefetched is not None and prefetched.started else None
    inventory = load_inventory(inventory_path, catalog.fleet, unknown_nodes="ignore", dropped=dropped,
                               document=document)
    if dropped:
        names = ", ".join(dropped)
        print(f"reconciler: warning: {inventory_path}: node{'s' * (len(dropped) != 1)} {names} "
              f"{'are' if len(dropped) != 1 else 'is'} not in fleet.yaml: ignored", file=sys.stderr)
    return inventory


def check_inventory_path(inventory_path: str) -> None:
    """A wrong --inventory argument is a usage error (exit 2), the same for every command that takes one."""
    path = Path(inventory_path)
    if path.is_dir():
        raise UsageError(f"--inventory {inventory_path}: is a directory; give the snapshot file (status/nodes.yaml)")
    if not path.is_file():
        raise UsageError(f"--inventory {inventory_path}: no such file")


def probe_fleet(catalog: Catalog) -> Inventory:
    from reconciler.launcher.slurm_launcher import fold_slurm
    from reconciler.probe import probe_fleet_report
    from reconciler.ssh import TransportPool

    from reconciler.owner import catalog_owner

    sources = sorted({m.source for m in catalog.models})
    with TransportPool() as pool:
        result = probe_fleet_report(catalog.fleet, pool, sources=sources, owner=catalog_owner(catalog))
        inventory = fold_slurm(catalog, pool, result.inventory)
    print_probe_warnings(result)
    if catalog.fleet.nodes and result.reached == 0:
        raise FleetUnreachable("no node of the fleet could be reached; pass --inventory FILE to plan from a snapshot")
    return inventory


def print_probe_warnings(result) -> None:
    """What the probe noticed but did not fail on, node by node, on stderr."""
    for r in sorted(result.results, key=lambda r: r.node.id):
        for warning in r.warnings:
            print(f"{r.node.id}: warning: {warning}", file=sys.stderr)
