"""Where plan and explain get the observed state from: a snapshot file, or a live probe.

`--inventory FILE` plans from a snapshot with no SSH at all (what a pull
request check uses). Without it the fleet is probed now, the same way
`reconciler nodes` and the daemon do, so a plan never rests on stale facts.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import os
import pickle
import signal
import sys
import threading
import traceback
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterator

from reconciler.catalog import load_catalog
from reconciler.errors import FleetUnreachable, InventoryInvalid, ReconcilerError, UsageError
from reconciler.observe.inventory import drop_unknown_nodes, load_inventory
from reconciler.model import Catalog, Inventory


def observe(catalog: Catalog, inventory_path: str | None) -> Inventory:
    if inventory_path is not None:
        check_inventory_path(inventory_path)
        return load_snapshot(inventory_path, catalog)
    return probe_fleet(catalog)


def load_snapshot(inventory_path: str, catalog: Catalog) -> Inventory:
    """The snapshot, less the nodes fleet.yaml no longer has (SPEC section 3).

    A pull request that retires a node removes it from fleet.yaml while the committed
    snapshot still lists it: that is ignored, said once on stderr, exit code unchanged.
    """
    return _without_retired_nodes(load_inventory(inventory_path, unknown_nodes="ignore"), catalog, inventory_path)


def _without_retired_nodes(inventory: Inventory, catalog: Catalog, inventory_path: str) -> Inventory:
    dropped: list[str] = []
    inventory = drop_unknown_nodes(inventory, catalog.fleet, dropped)
    if dropped:
        names = ", ".join(dropped)
        print(f"reconciler: warning: {inventory_path}: node{'s' * (len(dropped) != 1)} {names} "
              f"{'are' if len(dropped) != 1 else 'is'} not in fleet.yaml: ignored", file=sys.stderr)
    return inventory


def catalog_and_snapshot(catalog_dir: str, inventory_path: str | None,
                         check: Callable[[Catalog], None] = lambda catalog: None) -> tuple[Catalog, Inventory]:
    """load_catalog(catalog_dir), check(catalog), then observe(catalog, inventory_path), with what is
    reported unchanged: a problem of the catalog (or one `check` raises) is the only one said.

    With a snapshot file, on a system with fork(), the catalog is loaded by a child process while
    this one reads the snapshot (catalog_apart): each is a third of a 4,000-node `plan`, neither
    needs the other until the snapshot's retired nodes are dropped, and Python runs one of them at a
    time per process. The catalog comes back pickled (0.06 s to read at 4,000 nodes)."""
    # fork() only from a process with one thread: a lock another thread held (the import lock, a
    # logging handler's) would stay held in the child forever. The CLI has one; a test or a
    # dashboard calling this beside its server threads loads in line.
    alone = hasattr(os, "fork") and threading.active_count() == 1
    if inventory_path is None or not Path(inventory_path).is_file() or not alone:
        catalog = load_catalog(catalog_dir)
        check(catalog)
        return catalog, observe(catalog, inventory_path)
    with catalog_apart(catalog_dir) as catalog_later:
        try:
            inventory = load_inventory(inventory_path, unknown_nodes="ignore", between_parts=catalog_later.poll)
            unreadable = None
        except InventoryInvalid as exc:  # said only once the catalog is known to be fine
            inventory, unreadable = None, exc
        catalog = catalog_later()
    check(catalog)
    if unreadable is not None:
        raise unreadable
    return catalog, _without_retired_nodes(inventory, catalog, inventory_path)


class CatalogProcess:
    """The child loading the catalog: poll() takes in what it has sent so far without waiting (and,
    once it has sent all, reads the Catalog); calling it waits for the rest and returns the Catalog,
    or raises what load_catalog raised."""

    def __init__(self, pid: int, read_end: int):
        self.pid = pid
        self.reaped = False
        self._fd = read_end
        os.set_blocking(read_end, False)
        self._data = bytearray()
        self._outcome: tuple | None = None

    def poll(self) -> None:
        """Read what the pipe holds now; never waits (__call__ makes the pipe blocking first, to read it
        to its end). The child's answer is a megabyte at fleet scale,
        past what a pipe buffers: read as the snapshot's parts parse, it is whole by the time the
        snapshot is, and its reading (0.02 s) is done while the parser works, not after."""
        while self._outcome is None:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                return
            if not chunk:
                self._finish()
                return
            self._data += chunk

    def __call__(self) -> Catalog:
        if self._outcome is None:
            os.set_blocking(self._fd, True)
            self.poll()  # blocking now: reads up to the child's end
        kind, value = self._outcome
        if kind == "error":
            raise value
        if kind == "crash":
            raise RuntimeError(f"loading the catalog failed:\n{value}")
        if kind == "nothing":
            raise ReconcilerError("loading the catalog failed: its process ended without an answer")
        return value

    def _finish(self) -> None:
        os.waitpid(self.pid, 0)
        self.reaped = True
        self._outcome = pickle.loads(self._data) if self._data else ("nothing", None)
        self._data = bytearray()


@contextlib.contextmanager
def catalog_apart(catalog_dir: str) -> Iterator[CatalogProcess]:
    """load_catalog(catalog_dir) in a forked child; yields the CatalogProcess to poll and to wait for.
    The child never outlives the block."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: load, send, and leave without running anything of the parent's
        code = 0
        try:
            os.close(read_end)
            try:
                outcome: tuple = ("catalog", load_catalog(catalog_dir))
            except ReconcilerError as exc:
                outcome = ("error", exc)
            except BaseException:  # noqa: BLE001 - a bug: its traceback, said by the parent
                outcome = ("crash", traceback.format_exc())
            # Pickled whole before the first write: written as it goes, the pickling would stall on
            # the full pipe until the parent, busy with the snapshot, starts to read.
            data = io.BytesIO()
            _catalog_pickler(data).dump(outcome)
            with os.fdopen(write_end, "wb") as out:
                out.write(data.getbuffer())
        except BaseException:  # noqa: BLE001 - nothing may escape into the parent's code
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    child = CatalogProcess(pid, read_end)
    try:
        yield child
    finally:
        os.close(read_end)
        if not child.reaped:  # never waited for (this process was interrupted): stopped, and reaped
            try:  # (once reaped, its pid may be another process's: never signalled then)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _catalog_pickler(out) -> pickle.Pickler:
    """A pickler for a Catalog: its read-only mappings (model.frozen_map) travel as the dicts they wrap."""
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _reduce_mapping}
    return pickler


def _reduce_mapping(m: MappingProxyType) -> tuple:
    # The dict is copied once, here, and wrapped as it is at the other end (frozen_map would copy it
    # again): 8,600 maps in a 4,000-node catalog.
    return _wrapped, (m.copy(),)


def _wrapped(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


def check_inventory_path(inventory_path: str) -> None:
    """A wrong --inventory argument is a usage error (exit 2), the same for every command that takes one."""
    path = Path(inventory_path)
    if path.is_dir():
        raise UsageError(f"--inventory {inventory_path}: is a directory; give the snapshot file (status/nodes.yaml)")
    if not path.is_file():
        raise UsageError(f"--inventory {inventory_path}: no such file")


def probe_fleet(catalog: Catalog) -> Inventory:
    from reconciler.act.launcher.slurm_fold import fold_slurm
    from reconciler.observe.probe import probe_fleet_report
    from reconciler.observe.ssh import TransportPool

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
