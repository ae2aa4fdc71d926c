"""Writing an inventory snapshot: an Inventory -> its document (deterministic: sorted, sizes
rounded to the GiB, so status files change only when something observed did) -> its text."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from reconciler.model import Gpu, Inventory, ObservedNode, RunningRank

GIB = 1 << 30


def inventory_to_document(inv: Inventory) -> dict:
    return {"nodes": [node_to_document(n) for n in sorted(inv.nodes, key=lambda n: n.id)]}


def node_to_document(n: ObservedNode) -> dict:
    doc: dict[str, Any] = {
        "id": n.id,
        "state": n.state,
        "reason": n.reason,
        "labels": dict(sorted(n.labels.items())),
        "memory_total_mb": n.memory_total_mb,
        "engines": None if n.engines is None else dict(sorted(n.engines.items())),
        "gpus": [],
        "fabrics": [{"name": f.name, "hcas": list(f.hcas)} for f in sorted(n.fabrics, key=lambda f: f.name)],
        "disks": [
            {"path": k.path, "free_bytes": _round_down_gib(k.free_bytes), "total_bytes": _round_down_gib(k.total_bytes)}
            for k in n.disks
        ],
        "weights": None if n.weights is None else sorted(n.weights),
        "replicas": [],
    }
    # A managed rank reserves its GPUs whole: beside memory_used_mb (the driver's figure), VRAM used
    # on a GPU no rank of ours holds, with no process listed, is held by nobody (SPEC section 9).
    reserved = {i for r in n.replicas if r.alive for i in r.gpus}
    doc["gpus"] = [_gpu_to_document(g, g.index in reserved) for g in sorted(n.gpus, key=lambda g: g.index)]
    doc["replicas"] = [_rank_to_document(r) for r in sorted(n.replicas, key=lambda r: (r.id, r.rank))]
    doc.update(_node_extras(n))
    if n.failure:  # right after the reason it qualifies
        doc = {k: doc[k] for k in ("id", "state", "reason")} | {"failure": n.failure} | doc
    return doc


def _gpu_to_document(g: Gpu, reserved: bool) -> dict[str, Any]:
    """One GPU; `reserved`: a live rank of ours holds it, so all of its memory counts allocated."""
    gd: dict[str, Any] = {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "class": g.gpu_class,
        "memory_total_mb": g.memory_total_mb,
        "memory_used_mb": g.memory_used_mb,
        "allocated_mb": g.memory_total_mb if reserved else 0,
        "nvlink_peers": sorted(g.nvlink_peers),
    }
    if g.processes:
        gd["processes"] = [{"pid": p.pid, "name": p.name, "used_mb": p.used_mb} for p in sorted(g.processes, key=lambda p: p.pid)]
    if g.held_by:
        gd["held_by"] = g.held_by
    gd["health"] = str(g.health)
    if g.health_reason:
        gd["health_reason"] = g.health_reason
    if g.xid_info:
        gd["xid_info"] = list(g.xid_info)
    if g.quarantined is not None:
        q = g.quarantined
        gd["quarantined"] = {"reason": q.reason, "until": utc_text(q.until)} | ({"uuid": q.uuid} if q.uuid else {})
    return gd


def _rank_to_document(r: RunningRank) -> dict[str, Any]:
    rd: dict[str, Any] = {
        "id": r.id,
        "model": r.model,
        "profile": r.profile,
        "rank": r.rank,
        "nnodes": r.nnodes,
        "gpus": list(r.gpus),
        "port": r.port,
        "spec_hash": r.spec_hash,
    }
    if r.pid is not None:
        rd["pid"] = r.pid
    if not r.alive:
        rd["alive"] = False
    if r.slurm_job:
        rd["slurm_job"] = r.slurm_job
    if r.waiting:
        rd["waiting"] = r.waiting
    if r.revision is not None:
        rd["revision"] = r.revision
    return rd


def _node_extras(n: ObservedNode) -> dict[str, Any]:
    """The node's fields written only where they say something, in the order they follow the replicas."""
    extras: dict[str, Any] = {}
    if n.ports_in_use:
        extras["ports_in_use"] = sorted(set(n.ports_in_use))
    if n.cpu_count:
        extras["cpu_count"] = n.cpu_count
    if n.health_checks is not None:
        extras["health_checks"] = {k: str(v) for k, v in sorted(n.health_checks.items())}
    if n.llama_cpp is not None and (n.llama_cpp.server or n.llama_cpp.rpc_server):
        extras["llama_cpp"] = {"server": n.llama_cpp.server, "rpc_server": n.llama_cpp.rpc_server}
    return extras


def _round_down_gib(n: int) -> int:
    # Status files change when a GiB changes, not on every write anywhere on the disk.
    return (n // GIB) * GIB


def utc_text(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def snapshot_text(doc: Any, schema_ref: str | None = None) -> str:
    """A snapshot document as JSON-style YAML: valid YAML (and JSON), one value per line, loaded at JSON speed.

    Block-style YAML of a 4,000-node snapshot (about 7 MB) takes PyYAML's C loader
    several seconds; the same document in this form loads in well under a second.
    """
    header = f"# yaml-language-server: $schema={schema_ref}\n" if schema_ref else ""
    return header + json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
