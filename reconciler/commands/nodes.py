"""`reconciler nodes [CATALOG] [--format text|json]`: probe the fleet, show it, write status/nodes.yaml.

Exit 3 only when no node at all could be reached; unreachable nodes are
listed with their reason and the others are shown as probed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from collections import Counter

from reconciler.catalog import load_catalog
from reconciler.commands._observe import print_probe_warnings
from reconciler.constants import Exit
from reconciler.observe.inventory import inventory_to_document
from reconciler.act.launcher.slurm_fold import fold_slurm
from reconciler.record.memory import load_memory, memory_path, with_quarantines
from reconciler.model import Fleet, ObservedNode
from reconciler.owner import catalog_owner
from reconciler.decide.placement.capacity import gpu_unusable
from reconciler.observe.probe import FleetProbe, probe_fleet_report
from reconciler.observe.ssh import TransportPool
from reconciler.record.status.write import status_snapshot, write_nodes_status
from reconciler.vocabulary import GpuHealth, NodeState

GIB = 1 << 30


def main(args) -> int:
    catalog = load_catalog(args.catalog, with_revision=False)
    sources = sorted({m.source for m in catalog.models})
    with TransportPool() as pool:
        result = _probe(catalog.fleet, pool, sources, catalog_owner(catalog))
        # Slurm's node states and other jobs' GPUs, on `launcher: slurm` nodes.
        result = replace(result, inventory=fold_slurm(catalog, pool, result.inventory))
    # The crash-loop breaker's quarantines (kept by apply's memory) are marked, as a pass marks them.
    quarantines = load_memory(memory_path(str(catalog.root))).quarantines
    result = replace(result, inventory=with_quarantines(result.inventory, quarantines, time.time()))
    # What is printed is what status/nodes.yaml holds, so either can feed `plan --inventory`.
    snapshot = status_snapshot(result.inventory, catalog.models)
    write_nodes_status(catalog.root, snapshot)

    print_probe_warnings(result)
    if args.format == "json":
        print(json.dumps(inventory_to_document(snapshot), indent=2))
    else:
        print_table(result, catalog.fleet)
    if catalog.fleet.nodes and result.reached == 0:
        print("reconciler: no node of the fleet could be reached", file=sys.stderr)
        return Exit.UNREACHABLE
    return Exit.OK


def _probe(fleet, pool, sources, owner) -> FleetProbe:
    if not sys.stderr.isatty() or not fleet.nodes:
        return probe_fleet_report(fleet, pool, sources=sources, owner=owner)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("probing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[last]}"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    ) as progress:
        task = progress.add_task("probe", total=len(fleet.nodes), last="")
        return probe_fleet_report(
            fleet, pool, sources=sources, owner=owner, on_result=lambda r: progress.update(task, advance=1, last=r.node.id)
        )


def free_gpus(node: ObservedNode, cordoned: frozenset[int] = frozenset()) -> set[int]:
    held = {g for r in node.replicas if r.alive for g in r.gpus}
    return {g.index for g in node.gpus if g.index not in held and not g.processes and not g.held_by
            and not gpu_unusable(g, g.index in cordoned, False)}


# One character per GPU (SPEC section 9), the worst that holds first.
FREE, HELD, FOREIGN, UNHEALTHY, QUARANTINED, CORDONED = ".", "#", "f", "x", "q", "c"


def gpu_chars(node: ObservedNode, cordoned: frozenset[int] = frozenset()) -> str:
    """`..#x` : free, held by a replica, foreign (another process or scheduler job, or memory held
    by no process), unhealthy or lost, quarantined, cordoned in fleet.yaml; in index order."""
    held = {g for r in node.replicas if r.alive for g in r.gpus}
    out = []
    for g in sorted(node.gpus, key=lambda g: g.index):
        if g.health != GpuHealth.OK:
            out.append(UNHEALTHY)
        elif g.quarantined is not None:
            out.append(QUARANTINED)
        elif g.index in cordoned:
            out.append(CORDONED)
        elif g.index in held:
            out.append(HELD)
        elif g.processes or g.held_by or gpu_unusable(g, False, False):
            out.append(FOREIGN)
        else:
            out.append(FREE)
    return "".join(out)


def bad_gpu_lines(node: ObservedNode, cordoned: frozenset[int] = frozenset()) -> list[str]:
    """`h100-a1 gpu3 x Xid 79 at ...: GPU has fallen off the bus` for each GPU that takes no work and why."""
    held = {g for r in node.replicas if r.alive for g in r.gpus}
    lines = []
    chars = gpu_chars(node, cordoned)
    for g, c in zip(sorted(node.gpus, key=lambda g: g.index), chars):
        if c in (FREE, HELD) or (c == FOREIGN and (g.processes or g.held_by)):
            continue
        why = gpu_unusable(g, g.index in cordoned, g.index in held)
        lines.append(f"{node.id} gpu{g.index} {c} {why}")
    return lines


def gpu_summary(node: ObservedNode, cordoned: frozenset[int] = frozenset()) -> str:
    if node.state in (NodeState.UNREACHABLE, NodeState.UNUSABLE):  # unknown, which is not the same as none
        return "?"
    if not node.gpus:
        return "-"
    free = free_gpus(node, cordoned)
    by_class = Counter(g.gpu_class for g in node.gpus)
    free_by_class = Counter(g.gpu_class for g in node.gpus if g.index in free)
    counts = ", ".join(f"{n}x {cls} ({free_by_class[cls]} free)" for cls, n in sorted(by_class.items()))
    return f"{counts} {gpu_chars(node, cordoned)}"


def _size(n: int) -> str:
    if n >= 1024 * GIB:
        return f"{n / (1024 * GIB):.1f} TiB"
    return f"{n // GIB} GiB"


def row(node: ObservedNode, cordoned: frozenset[int] = frozenset()) -> list[str]:
    unreachable = node.state == NodeState.UNREACHABLE
    engines = "?" if node.engines is None else (", ".join(sorted(node.engines)) or "-")
    fabrics = ", ".join(f"{f.name} ({', '.join(f.hcas)})" for f in node.fabrics) or ("?" if unreachable else "-")
    memory = "?" if node.memory_total_mb is None else _size(node.memory_total_mb * (1 << 20))
    disk = "?" if unreachable else "-"
    if node.disks:
        d = node.disks[0]
        disk = f"{_size(d.free_bytes)} free of {_size(d.total_bytes)}"
    # A permanent failure says so: it stays until the node, known_hosts or the catalog changes.
    reason = f"{node.reason} (permanent)" if node.failure == "permanent" and node.reason else node.reason
    return [node.id, node.state, gpu_summary(node, cordoned), engines, fabrics, memory, disk, reason]


HEADERS = ["NODE", "STATE", "GPUS", "ENGINES", "FABRICS", "MEMORY", "DISK", "REASON"]


def _cordoned(fleet: Fleet | None, node_id: str) -> frozenset[int]:
    spec = fleet.node(node_id) if fleet is not None else None
    return frozenset(spec.cordon_gpus) if spec is not None else frozenset()


def print_table(result: FleetProbe, fleet: Fleet | None = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    tty = sys.stdout.isatty()
    table = Table(box=box.SIMPLE_HEAD if tty else None, show_edge=False, pad_edge=False)
    nodes = sorted(result.inventory.nodes, key=lambda n: n.id)
    rows = [row(node, _cordoned(fleet, node.id)) for node in nodes]
    for i, h in enumerate(HEADERS):
        # Short columns stay whole (an "unreacha/ble" fold helps nobody); the free-text REASON
        # column takes what the terminal has left and folds.
        if h == "REASON":
            table.add_column(h, overflow="fold", ratio=1)
        else:
            table.add_column(h, no_wrap=True, min_width=max([len(h)] + [len(r[i]) for r in rows]))
    for node, cells in zip(nodes, rows):
        style = "red" if node.state == NodeState.UNREACHABLE else ("yellow" if node.state != NodeState.READY else None)
        table.add_row(*cells, style=style)
    # Off a terminal (CI logs, pipes) nothing wraps: a row per node stays greppable.
    console = Console(file=sys.stdout, width=None if tty else 100_000, no_color=not tty, highlight=False)
    console.print(table)
    reached, total = result.reached, len(result.results)
    summary = f"{reached} of {total} node{'s' * (total != 1)} reached"
    # Reached over SSH but not probed (no python3, a probe that printed garbage): say so, or
    # "5 of 5 reached" reads as all well above a row that says unreachable.
    unprobed = sorted(r.node.id for r in result.results if r.reached and r.node.state == NodeState.UNREACHABLE)
    if unprobed:
        summary += f"; {len(unprobed)} could not be probed ({', '.join(unprobed)}: see REASON)"
    console.print(summary)
    bad = [line for node in nodes for line in bad_gpu_lines(node, _cordoned(fleet, node.id))]
    if bad:  # each GPU that takes no work, and why (. free  # held  f foreign  x unhealthy  q quarantined  c cordoned)
        console.print("GPUs that take no work:")
        for line in bad:
            console.print("  " + line, markup=False)
