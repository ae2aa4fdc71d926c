"""Arithmetic on the observed snapshot (Inventory), pure: who runs where, and the fleet after a pass.

The act stage changes the fleet and must report the snapshot as it left it
without probing again; these functions compute that, and the checks a start
makes against what the probe saw.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from reconciler.model import Inventory, ObservedNode, RankKey, RankLaunch, RunningRank

# A GPU whose memory is more than this share used is not clean, even with no process listed
# (nvidia-smi cannot always see processes of other containers).
MOSTLY_USED = 0.5

RankRecords = list[tuple[ObservedNode, RunningRank]]


def ranks_by_replica(inventory: Inventory) -> dict[str, RankRecords]:
    """Replica id -> its (node, rank) records, in rank order.

    One walk of the fleet for all replicas: a pass looks up every desired replica,
    and a walk per lookup costs milliseconds each at fleet scale.
    """
    found: dict[str, RankRecords] = {}
    for node in inventory.nodes:
        for rank in node.replicas:
            found.setdefault(rank.id, []).append((node, rank))
    for records in found.values():
        records.sort(key=lambda nr: (nr[1].rank, nr[0].id))
    return found


def inventory_after(
    inventory: Inventory,
    started: Iterable[RankLaunch],
    stopped: Iterable[RankKey],
    pids: Mapping[RankKey, int] | None = None,
    taken_ports: Mapping[str, Iterable[int]] | None = None,
) -> Inventory:
    """The snapshot as the pass left the fleet, without probing again: stopped ranks gone, started ones in.

    `pids` maps (node, replica, rank) -> pid of a started rank, so this snapshot
    reads exactly like the next probe's and status/nodes.yaml does not flap.
    """
    pids = pids or {}
    taken_ports = taken_ports or {}
    # Grouped by node first: a first pass at fleet scale starts thousands of ranks on thousands of nodes.
    started_on: dict[str, list[RankLaunch]] = {}
    for l in started:
        started_on.setdefault(l.node, []).append(l)
    stopped_on: dict[str, list[tuple[str, int | None]]] = {}
    for n, rid, rank in stopped:
        stopped_on.setdefault(n, []).append((rid, rank))
    return Inventory(tuple(
        _node_after(node, started_on.get(node.id, ()), stopped_on.get(node.id, ()), pids, set(taken_ports.get(node.id, ())))
        for node in inventory.nodes
    ))


def _node_after(node: ObservedNode, here: Sequence[RankLaunch], gone: Sequence[tuple[str, int | None]],
                pids: Mapping[RankKey, int], taken: set[int]) -> ObservedNode:
    """One node as the pass left it: its stopped ranks gone, its started ones in, their ports."""
    keep = tuple(
        r for r in node.replicas if not any(rid == r.id and (rank is None or rank == r.rank) for rid, rank in gone)
    )
    new = tuple(
        RunningRank(
            id=l.replica, model=l.model, profile=l.profile, rank=l.rank, gpus=tuple(l.gpus), port=l.port,
            spec_hash=l.spec_hash, nnodes=l.nnodes, pid=pids.get((l.node, l.replica, l.rank)), revision=l.revision,
        )
        for l in here
        if not any(r.id == l.replica and r.rank == l.rank for r in keep)
    )
    if len(keep) == len(node.replicas) and not new and not taken - set(node.ports_in_use):
        return node
    # A stopped engine's port is free again (unless a kept rank shares it); a started one's is taken.
    freed = {r.port for r in node.replicas if r not in keep} - {r.port for r in keep}
    ports = (set(node.ports_in_use) - freed) | {l.port for l in here} | taken
    return replace(node, replicas=keep + new, ports_in_use=tuple(sorted(ports)))


def gpu_problems(launch: RankLaunch, node: ObservedNode | None, *, mostly_used: float = MOSTLY_USED) -> list[str]:
    """Why this rank's GPUs are not clean, one sentence each; empty when they are.

    Memory held by the reconciler's own ranks on the node (a replica being
    replaced) is not held against a GPU: those ranks are stopped first.
    """
    if node is None or not launch.gpus:
        return []
    ours = {g for r in node.replicas for g in r.gpus}
    by_index = {g.index: g for g in node.gpus}
    problems = []
    for index in launch.gpus:
        gpu = by_index.get(index)
        if gpu is None:
            problems.append(f"GPU {index} on {launch.node} was not seen by the probe")
            continue
        for proc in gpu.processes:
            problems.append(
                f"GPU {index} on {launch.node} is used by foreign process {proc.pid} ({proc.name}, {proc.used_mb} MiB)"
            )
        if not gpu.processes and index not in ours and gpu.memory_total_mb > 0:
            if gpu.memory_used_mb > mostly_used * gpu.memory_total_mb:
                problems.append(
                    f"GPU {index} on {launch.node} has {gpu.memory_used_mb} of {gpu.memory_total_mb} MiB in use"
                )
    return problems


def start_order(launches: Sequence[RankLaunch]) -> list[RankLaunch]:
    """Workers first, head last: the head waits for its workers, never the other way round."""
    return sorted(launches, key=lambda l: (l.rank == 0, l.rank))
