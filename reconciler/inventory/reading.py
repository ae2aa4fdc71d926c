"""Reading an inventory snapshot: the file (JSON or YAML, fast) -> its document -> an Inventory.

Snapshots are machine-written and can be several megabytes at fleet scale, so
they are read with a C-backed parser (JSON, or PyYAML's CSafeLoader) and no
positions; positions are only worth their cost in the human-written catalog.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import yaml_rs

from reconciler.model import (
    Disk,
    FabricAttachment,
    Gpu,
    GpuProcess,
    Inventory,
    LlamaCppBinaries,
    ObservedNode,
    Quarantine,
    RunningRank,
    frozen_map,
)
from reconciler.vocabulary import FailureKind, GpuHealth, NodeState


class SnapshotSyntaxError(ValueError):
    """The reference reader (PyYAML) refused the file: where, and its words."""

    def __init__(self, line: int, column: int, problem: str):
        super().__init__(problem)
        self.line, self.column, self.problem = line, column, problem


def read_snapshot_document(path: str | Path, *, fast: bool = True) -> Any:
    """Parse a snapshot file, JSON or YAML (JSON is tried first: it is also valid YAML, and faster).

    Block YAML (status/nodes.yaml as written) is read with yaml_rs, a Rust parser that reads a
    4,000-node snapshot twenty times faster than PyYAML's C loader, whose objects are built in
    Python. fast=False, or any error from it, reads with PyYAML instead: the reference reader
    (YAML 1.1, as PyYAML writes it) and the one whose errors carry line and column.
    """
    data = Path(path).read_bytes()
    stripped = data.lstrip()
    # Leading comment lines (a `# yaml-language-server: $schema=...` header) do not stop the
    # JSON path: a snapshot written as JSON-style YAML still loads at JSON speed.
    while stripped[:1] == b"#":
        end = stripped.find(b"\n")
        stripped = b"" if end == -1 else stripped[end + 1:].lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            return orjson.loads(stripped)
        except ValueError:  # orjson is strict (no NaN, no integer past 64 bits): the stdlib decides
            try:
                return json.loads(stripped)
            except ValueError:
                pass
    if fast:
        try:
            # A key given twice: the last one wins, as PyYAML (the reference reader) has it.
            return yaml_rs.loads(data.decode("utf-8"), parse_datetime=False,
                                 duplicate_key_policy=yaml_rs.DuplicateKeyPolicy.LastWins)
        except Exception:  # noqa: BLE001 - any refusal: PyYAML reads it again and words the error
            pass
    return _read_with_pyyaml(data)


def _read_with_pyyaml(data: bytes) -> Any:
    """PyYAML's C loader, the reference reader. Imported here: a snapshot that is JSON or that
    yaml_rs reads (every one the reconciler writes) never needs it, and `plan` starts sooner."""
    import yaml

    try:
        return yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise SnapshotSyntaxError(line, col, getattr(exc, "problem", None) or str(exc)) from None


def inventory_from_document(doc: dict) -> Inventory:
    return Inventory(tuple(node_from_document(n) for n in doc.get("nodes") or ()))


def node_from_document(d: dict) -> ObservedNode:
    engines = d.get("engines")
    weights = d.get("weights")
    return ObservedNode(
        id=d["id"],
        state=NodeState(d.get("state", NodeState.READY)),
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
        failure=FailureKind(d["failure"]) if d.get("failure") else None,
        llama_cpp=_llama_cpp_from_doc(d.get("llama_cpp")),
        cpu_count=d.get("cpu_count"),
        health_checks=frozen_map(d["health_checks"]) if isinstance(d.get("health_checks"), dict) else None,
    )


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
        slurm_job=d.get("slurm_job", ""),
        waiting=d.get("waiting", ""),
        revision=d.get("revision"),
    )


def _gpu_from_doc(d: dict) -> Gpu:
    get = d.get
    procs = get("processes")  # most GPUs run nothing: no generator for them (30,000 GPUs at fleet scale)
    # Positional, in Gpu's field order (index, uuid, name, gpu_class, memory total, used, peers, processes,
    # held_by): keywords cost two thirds more per GPU, and a snapshot has 30,000 of them.
    gpu = Gpu(
        d["index"], get("uuid", ""), get("name", ""), get("class", ""), get("memory_total_mb", 0),
        get("memory_used_mb", 0), tuple(get("nvlink_peers") or ()),
        tuple(GpuProcess(p["pid"], p.get("name", ""), p.get("used_mb", 0)) for p in procs) if procs else (),
        get("held_by", ""),
    )
    health = get("health")
    quarantined = get("quarantined")
    if (health is None or health == GpuHealth.OK) and not quarantined and not get("xid_info"):
        return gpu  # a healthy GPU (the common case) costs nothing more
    try:
        verdict = GpuHealth(health or GpuHealth.OK)
    except ValueError:  # not a verdict (a hand-edited memory file): never read as healthy
        verdict = GpuHealth.UNHEALTHY
    return replace(gpu, health=verdict, health_reason=get("health_reason", "") or "",
                   xid_info=tuple(get("xid_info") or ()), quarantined=_quarantine_from_doc(quarantined, gpu.uuid))


def _quarantine_from_doc(d, uuid: str) -> Quarantine | None:
    if not isinstance(d, dict):
        return None
    return Quarantine(str(d.get("reason", "")), _epoch(d.get("until")), str(d.get("uuid", uuid) or uuid))


def _epoch(until) -> float:
    """status/ writes `until` as a UTC time (2026-12-01T21:00:00Z); a number is read as seconds since the epoch."""
    if isinstance(until, (int, float)):
        return float(until)
    try:
        return datetime.strptime(str(until), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return 0.0  # unreadable: expired, so a broken status file never keeps a GPU out


def _llama_cpp_from_doc(d: dict | None) -> LlamaCppBinaries | None:
    if d is None:
        return None
    return LlamaCppBinaries(server=bool(d.get("server", False)), rpc_server=d.get("rpc_server") or None)
