"""The inventory snapshot (SPEC section 3): documents <-> model, and fast loading.

Snapshots are machine-written and can be several megabytes at fleet scale, so
they are read with a C-backed parser (JSON, or PyYAML's CSafeLoader) and no
positions; positions are only worth their cost in the human-written catalog.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from reconciler.model import (
    Disk,
    FabricAttachment,
    Gpu,
    GpuProcess,
    Inventory,
    ObservedNode,
    RunningRank,
    frozen_map,
)

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader

GIB = 1 << 30


def read_snapshot_document(path: str | Path) -> Any:
    """Parse a snapshot file, JSON or YAML (JSON is tried first: it is also valid YAML, and faster)."""
    data = Path(path).read_bytes()
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            return json.loads(data)
        except ValueError:
            pass
    return yaml.load(data, Loader=_Loader)


def _rank_from_doc(d: dict) -> RunningRank:
    return RunningRank(
        id=d["id"],
        model=d["model"],
        profile=d["profile"],
        rank=d.get("rank", 0),
        gpus=tuple(d.get("gpus") or ()),
        port=d.get("port", 0),
        spec_hash=d.get("spec_hash", ""),
        nnodes=d.get("nnodes", 1),
        pid=d.get("pid"),
        alive=d.get("alive", True),
    )


def _gpu_from_doc(d: dict) -> Gpu:
    return Gpu(
        index=d["index"],
        uuid=d.get("uuid", ""),
        name=d.get("name", ""),
        gpu_class=d.get("class", ""),
        memory_total_mb=d.get("memory_total_mb", 0),
        memory_used_mb=d.get("memory_used_mb", 0),
        nvlink_peers=tuple(d.get("nvlink_peers") or ()),
        processes=tuple(GpuProcess(p["pid"], p.get("name", ""), p.get("used_mb", 0)) for p in d.get("processes") or ()),
    )


def node_from_document(d: dict) -> ObservedNode:
    engines = d.get("engines")
    weights = d.get("weights")
    return ObservedNode(
        id=d["id"],
        state=d.get("state", "ready"),
        reason=d.get("reason", "") or "",
        labels=frozen_map(d.get("labels")),
        memory_total_mb=d.get("memory_total_mb"),
        engines=None if engines is None else frozen_map({k: ("" if v is None else str(v)) for k, v in engines.items()}),
        gpus=tuple(_gpu_from_doc(g) for g in d.get("gpus") or ()),
        fabrics=tuple(FabricAttachment(f["name"], tuple(f.get("hcas") or ())) for f in d.get("fabrics") or ()),
        disks=tuple(Disk(k["path"], k.get("free_bytes", 0), k.get("total_bytes", 0)) for k in d.get("disks") or ()),
        weights=None if weights is None else tuple(weights),
        replicas=tuple(_rank_from_doc(r) for r in d.get("replicas") or ()),
        ports_in_use=tuple(d.get("ports_in_use") or ()),
    )


def inventory_from_document(doc: dict) -> Inventory:
    return Inventory(tuple(node_from_document(n) for n in doc.get("nodes") or ()))


def _round_down_gib(n: int) -> int:
    # Status files change when a GiB changes, not on every write anywhere on the disk.
    return (n // GIB) * GIB


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
    for g in sorted(n.gpus, key=lambda g: g.index):
        gd: dict[str, Any] = {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "class": g.gpu_class,
            "memory_total_mb": g.memory_total_mb,
            "memory_used_mb": g.memory_used_mb,
            "nvlink_peers": sorted(g.nvlink_peers),
        }
        if g.processes:
            gd["processes"] = [{"pid": p.pid, "name": p.name, "used_mb": p.used_mb} for p in sorted(g.processes, key=lambda p: p.pid)]
        doc["gpus"].append(gd)
    for r in sorted(n.replicas, key=lambda r: (r.id, r.rank)):
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
        doc["replicas"].append(rd)
    if n.ports_in_use:
        doc["ports_in_use"] = sorted(set(n.ports_in_use))
    return doc


def inventory_to_document(inv: Inventory) -> dict:
    return {"nodes": [node_to_document(n) for n in sorted(inv.nodes, key=lambda n: n.id)]}
