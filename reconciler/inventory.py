"""The inventory snapshot (SPEC section 3): documents <-> model, and fast loading.

Snapshots are machine-written and can be several megabytes at fleet scale, so
they are read with a C-backed parser (JSON, or PyYAML's CSafeLoader) and no
positions; positions are only worth their cost in the human-written catalog.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
import yaml_rs

from reconciler.errors import InventoryInvalid, Problem
from reconciler.vocabulary import FailureKind, NodeState
from reconciler.model import (
    Disk,
    FabricAttachment,
    Fleet,
    Gpu,
    GpuProcess,
    Inventory,
    LlamaCppBinaries,
    ObservedNode,
    Quarantine,
    RunningRank,
    frozen_map,
)
from reconciler.vocabulary import GpuHealth
from reconciler.schemas import is_valid, schema, validator

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader

GIB = 1 << 30


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
    return yaml.load(data, Loader=_Loader)


def snapshot_text(doc: Any, schema_ref: str | None = None) -> str:
    """A snapshot document as JSON-style YAML: valid YAML (and JSON), one value per line, loaded at JSON speed.

    Block-style YAML of a 4,000-node snapshot (about 7 MB) takes PyYAML's C loader
    several seconds; the same document in this form loads in well under a second.
    """
    header = f"# yaml-language-server: $schema={schema_ref}\n" if schema_ref else ""
    return header + json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


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


def utc_text(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _llama_cpp_from_doc(d: dict | None) -> LlamaCppBinaries | None:
    if d is None:
        return None
    return LlamaCppBinaries(server=bool(d.get("server", False)), rpc_server=d.get("rpc_server") or None)


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
    # A managed rank reserves its GPUs whole: beside memory_used_mb (the driver's figure), VRAM used
    # on a GPU no rank of ours holds, with no process listed, is held by nobody (SPEC section 9).
    reserved = {i for r in n.replicas if r.alive for i in r.gpus}
    for g in sorted(n.gpus, key=lambda g: g.index):
        gd: dict[str, Any] = {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "class": g.gpu_class,
            "memory_total_mb": g.memory_total_mb,
            "memory_used_mb": g.memory_used_mb,
            "allocated_mb": g.memory_total_mb if g.index in reserved else 0,
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
        if r.slurm_job:
            rd["slurm_job"] = r.slurm_job
        if r.waiting:
            rd["waiting"] = r.waiting
        if r.revision is not None:
            rd["revision"] = r.revision
        doc["replicas"].append(rd)
    if n.ports_in_use:
        doc["ports_in_use"] = sorted(set(n.ports_in_use))
    if n.cpu_count:
        doc["cpu_count"] = n.cpu_count
    if n.health_checks is not None:
        doc["health_checks"] = {k: str(v) for k, v in sorted(n.health_checks.items())}
    if n.llama_cpp is not None and (n.llama_cpp.server or n.llama_cpp.rpc_server):
        doc["llama_cpp"] = {"server": n.llama_cpp.server, "rpc_server": n.llama_cpp.rpc_server}
    if n.failure:  # right after the reason it qualifies
        doc = {k: doc[k] for k in ("id", "state", "reason")} | {"failure": n.failure} | doc
    return doc


def inventory_to_document(inv: Inventory) -> dict:
    return {"nodes": [node_to_document(n) for n in sorted(inv.nodes, key=lambda n: n.id)]}


# --------------------------------------------------------------------------
# Validation: a snapshot given with --inventory is checked before anything trusts it
# --------------------------------------------------------------------------
#
# Fields, types and ranges are schema/inventory.schema.json's to say: a valid snapshot
# costs one pass of jsonschema-rs's check (schemas.is_valid), and only a refused one is walked
# again by jsonschema for every error with its path. Each error is then said the way a
# person reads it, naming the node (`node h100-a1: gpus[2].index: must be at least 0`),
# not as a JSON pointer. What a schema cannot express (unique ids, NVLink peers and
# replica GPUs that exist, a GPU held once) is checked by hand below.
# Positions are only looked up once something is wrong.

_NODE_ID = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# What a required field is, where saying it helps (keyed by the field's schema location).
_REQUIRED_HINT = {
    ("", "nodes"): "the list of observed nodes",
    ("node", "id"): "a node id like h100-a1",
    ("disk", "path"): "the directory measured",
    ("fabric", "name"): "the fabric's name",
}
_TYPE_NAMES = {"integer": "an integer", "string": "a string", "boolean": "true or false", "array": "a list",
               "object": "a mapping"}
# A node's fields in the order problems are listed (the order a snapshot writes them).
_FIELD_ORDER = {k: i for i, k in enumerate(("id", "state", "reason", "labels", "memory_total_mb", "engines", "gpus",
                                            "fabrics", "disks", "weights", "ports_in_use", "replicas"))}

# (node index or -1 for the document, sort key within the node, node id or None, field path, message)
_Error = tuple[int, tuple, "str | None", str, str]


def _describe(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v}"
    if isinstance(v, str):
        return f"the string {v!r}" if len(v) < 40 else "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__


def _valid_id(v) -> bool:
    return isinstance(v, str) and _NODE_ID.match(v) is not None


def _field_path(parts) -> str:
    """("gpus", 2, "index") -> "gpus[2].index"."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _order(parts: tuple, phase: int = 0) -> tuple:
    """Where a problem at this path within a node sorts: by field, NVLink peers after every GPU's own fields."""
    field = _FIELD_ORDER.get(parts[0], len(_FIELD_ORDER)) if parts else -1
    if parts and parts[0] == "gpus" and "nvlink_peers" in parts:
        phase = 1
    item = parts[1] if len(parts) > 1 and isinstance(parts[1], int) else -1
    return (field, phase, item)


def _definition_name(subschema: dict) -> str:
    """Which $defs entry of the snapshot schema this is ("" for the document itself)."""
    defs = schema("inventory")["$defs"]
    return next((name for name, d in defs.items() if d is subschema), "")


def _schema_message(err) -> tuple[tuple, str]:
    """(path of the field, message) for one jsonschema error, worded as the hand check always worded it."""
    parts = tuple(err.absolute_path)
    if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "id":
        return parts, f"is not a valid node id: {_describe(err.instance)}"
    if len(parts) == 5 and parts[2] == "fabrics" and parts[4] == "name":
        return parts, "is required: the fabric's name"
    if err.validator == "type":
        types = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        if not parts:
            return parts, f"must be a mapping with a `nodes` list, not {_describe(err.instance)}"
        if parts == ("nodes",) and err.instance is None:
            return parts, f"is required: {_REQUIRED_HINT['', 'nodes']}"
        names = [_TYPE_NAMES[t] for t in types if t != "null"]
        return parts, f"must be {' or '.join(names)}{' or null' if 'null' in types else ''}, not {_describe(err.instance)}"
    if err.validator == "minimum":
        return parts, f"must be at least {err.validator_value}, not {err.instance}"
    if err.validator == "maximum":
        return parts, f"must be at most {err.validator_value}, not {err.instance}"
    if err.validator == "enum":
        return parts, f"must be one of {', '.join(map(str, err.validator_value))}, not {_describe(err.instance)}"
    return parts, err.message


def _required_messages(err) -> list[tuple[tuple, str]]:
    """(path, message) of each field the object lacks: read from the schema and the document, not
    from jsonschema's sentences (it says each missing field in an error of its own)."""
    hint_of = _definition_name(err.schema)
    out = []
    for missing in [f for f in err.validator_value if f not in err.instance]:
        hint = _REQUIRED_HINT.get((hint_of, missing))
        out.append((tuple(err.absolute_path) + (missing,), "is required" + (f": {hint}" if hint else "")))
    return out


def _schema_errors(doc) -> list[_Error]:
    """Every schema error of a refused document, as (node index, order, node id, path, message)."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    out: list[_Error] = []
    required_seen: set[int] = set()
    messages: list[tuple[tuple, str]] = []
    for err in validator("inventory").iter_errors(doc):
        if err.validator != "required":
            messages.append(_schema_message(err))
        elif id(err.instance) not in required_seen:
            required_seen.add(id(err.instance))
            messages += _required_messages(err)
    for parts, msg in messages:
        if len(parts) < 2 or parts[0] != "nodes" or not isinstance(parts[1], int):
            out.append((-1, (), None, _field_path(parts) or "(document)", msg))
            continue
        i, rest = parts[1], parts[2:]
        nid = nodes[i].get("id") if isinstance(nodes[i], dict) else None
        if not _valid_id(nid):
            # A node without a usable id is reported once, by its position; its other fields wait.
            if rest[:1] in ((), ("id",)):
                out.append((i, (-1,), None, _field_path(parts), msg))
            continue
        out.append((i, _order(rest), nid, _field_path(rest), msg))
    return out


def _ranges(indices: set[int]) -> str:
    if not indices:
        return "none"
    s = sorted(indices)
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
        return f"{s[0]}-{s[-1]}"
    return ", ".join(map(str, s))


def _is_index(v) -> bool:
    return type(v) is int and v >= 0


def _clean_gpu_indices(gpu_list) -> set[int] | None:
    """The node's GPU indices when none repeats and every NVLink peer is one of them, at set speed (a
    4,000-node snapshot has 30,000 GPUs); None when anything is off, for _gpu_errors to say what."""
    try:
        listed = [g["index"] for g in gpu_list]
        indices = set(listed)
        if len(indices) != len(listed) or not all(type(x) is int and x >= 0 for x in listed):
            return None
        for g in gpu_list:
            peers = g.get("nvlink_peers")
            if peers and (type(peers) is not list or not indices.issuperset(peers)):
                return None
    except (KeyError, TypeError, AttributeError):
        return None
    return indices


def _gpu_errors(i: int, nid: str, gpu_list) -> tuple[set[int], list[_Error]]:
    """The node's GPU indices, and GPU indices given twice or NVLink peers that are no GPU of the node."""
    clean = _clean_gpu_indices(gpu_list) if type(gpu_list) is list else None
    if clean is not None:
        return clean, []
    out: list[_Error] = []
    indices: set[int] = set()
    gpus = [g if isinstance(g, dict) else {} for g in gpu_list] if isinstance(gpu_list, list) else []
    for gi, g in enumerate(gpus):
        idx = g.get("index")
        if _is_index(idx):
            if idx in indices:
                out.append((i, _order(("gpus", gi)), nid, f"gpus[{gi}].index", f"GPU index {idx} appears twice"))
            indices.add(idx)
    for gi, g in enumerate(gpus):
        peers = g.get("nvlink_peers")
        for pi, peer in enumerate(peers if isinstance(peers, list) else ()):
            if _is_index(peer) and peer not in indices:
                out.append((i, _order(("gpus", gi), 1), nid, f"gpus[{gi}].nvlink_peers[{pi}]",
                            f"NVLink peer {peer} does not exist (GPU indices: {_ranges(indices)})"))
    return indices, out


def _replica_gpu_errors(i: int, nid: str, replicas, indices: set[int] | None) -> list[_Error]:
    """Replica GPUs the node does not have (indices None: the node lists no GPUs), or that two replicas hold."""
    out: list[_Error] = []
    holders: dict[int, str] = {}
    for ri, r in enumerate(replicas if isinstance(replicas, list) else ()):
        gpus = r.get("gpus") if isinstance(r, dict) else None
        rid = r.get("id") if isinstance(r, dict) else None
        for gi, g in enumerate(gpus if isinstance(gpus, list) else ()):
            if not _is_index(g):
                continue
            where = (i, _order(("replicas", ri)), nid, f"replicas[{ri}].gpus[{gi}]")
            if indices is not None and g not in indices:
                out.append(where + (f"replica {rid} holds GPU {g}, which this node does not have",))
            elif g in holders and holders[g] != rid:
                out.append(where + (f"GPU {g} is held by two replicas: {holders[g]} and {rid}",))
            else:
                holders[g] = rid
    return out


def _cross_field_errors(doc, fleet: Fleet | None, unknown_nodes: str) -> list[_Error]:
    """What the schema cannot say, over whatever parts of the document have the right shape."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    out: list[_Error] = []
    seen: dict[str, int] = {}
    for i, nd in enumerate(nodes if isinstance(nodes, list) else ()):
        nid = nd.get("id") if isinstance(nd, dict) else None
        if not _valid_id(nid):
            continue
        for field in ("labels", "engines"):
            keys = nd.get(field)
            for k in keys if isinstance(keys, dict) else ():
                if not isinstance(k, str):  # JSON keys are strings; YAML's need not be
                    out.append((i, _order((field,)), nid, f"{field}.{k}", f"the key must be a string, not {_describe(k)}"))
        gpu_list = nd.get("gpus")
        indices, gpu_errors = _gpu_errors(i, nid, gpu_list)
        out += gpu_errors
        out += _replica_gpu_errors(i, nid, nd.get("replicas"), indices if gpu_list is not None else None)
        last = (len(_FIELD_ORDER) + 1,)
        if nid in seen:
            out.append((i, last, nid, "id", f"node {nid} appears twice (nodes[{seen[nid]}] and nodes[{i}])"))
        seen.setdefault(nid, i)
        if fleet is not None and unknown_nodes == "error" and fleet.node(nid) is None:
            out.append((i, last, nid, "id", f"node {nid} is not in fleet.yaml (a snapshot of another fleet, "
                                            "or a node removed from it: take it out of the snapshot or add it back)"))
    return out


class _Lines:
    """Best-effort lines for problems in a snapshot's text, built in one pass over it.

    A node's problem goes to the first line naming its field after the node's `id`
    line; failing that, to the `id` line itself.
    """

    _ID = re.compile(r"""(?m)["']?\bid["']?\s*:\s*["']?([a-z0-9][a-z0-9-]*)["']?\s*(?:,|}|$)""")

    def __init__(self, text: str):
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.ids: dict[str, int] = {}
        for m in self._ID.finditer(text):
            self.ids.setdefault(m.group(1), m.start())

    def line(self, node: str | None, path: str) -> int:
        start = self.ids.get(node, 0) if node is not None else 0
        if node is not None and node not in self.ids:
            return 1
        pos = start
        key = re.match(r"^(?:nodes\[\d+\]\.)?([a-z_]+)", path)
        if key and key.group(1) != "id":
            k = self.text.find(key.group(1), start, start + 200_000)
            if k != -1:
                pos = k
        return bisect_right(self.starts, pos)


def validate_inventory_document(doc, fleet: Fleet | None = None, *, file: str = "<inventory>",
                                text: str | None = None, unknown_nodes: str = "error") -> list[Problem]:
    """Every problem with a snapshot document, each naming the node and the field.

    unknown_nodes: "error" (plan/explain --inventory: a snapshot that names a node
    fleet.yaml does not have is most likely the wrong file) or "ignore" (SPEC section
    3, for a daemon whose fleet changed under a snapshot it wrote itself).
    """
    return _problems(_check_document(doc, fleet, unknown_nodes), file, text)


def _check_document(doc, fleet: Fleet | None, unknown_nodes: str) -> list[tuple[str | None, str, str]]:
    """(node id, field path, message) of every problem with a snapshot document, in document order."""
    errors = [] if is_valid("inventory")(doc) else _schema_errors(doc)
    errors += _cross_field_errors(doc, fleet, unknown_nodes)
    errors.sort(key=lambda e: (e[0], e[1]))  # stable: within one place, schema errors first
    return [(node, path, msg) for _, _, node, path, msg in errors]


def _problems(errors: list[tuple[str | None, str, str]], file: str, text: str | None) -> list[Problem]:
    """The errors as Problems, each on the line of its field when the document's text is given."""
    lines = _Lines(text) if text is not None and errors else None
    problems = []
    for node, path, msg in errors:
        where = f"node {node}: {path}" if node else path
        problems.append(Problem(file, lines.line(node, path) if lines else 1, 1, f"{where}: {msg}"))
    return problems


def _read_snapshot(path: Path, fast: bool = True) -> Any:
    try:
        return read_snapshot_document(path, fast=fast)
    except OSError as exc:
        raise InventoryInvalid([Problem(str(path), 1, 1, f"cannot read the snapshot: {exc.strerror or exc}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        msg = getattr(exc, "problem", None) or str(exc)
        raise InventoryInvalid([Problem(str(path), line, col, f"not valid YAML or JSON: {msg}")]) from None
    except UnicodeDecodeError:
        raise InventoryInvalid([Problem(str(path), 1, 1, "not valid YAML or JSON: not UTF-8 text")]) from None


def load_inventory(path: str | Path, fleet: Fleet | None = None, *, unknown_nodes: str = "error",
                   dropped: list[str] | None = None) -> Inventory:
    """Read and check a snapshot (YAML or JSON); InventoryInvalid lists every problem.

    Nodes not in the fleet are dropped when unknown_nodes == "ignore", and their ids
    appended to `dropped` when it is given (so the caller can say which).
    """
    path = Path(path)
    doc = _read_snapshot(path)
    errors = _check_document(doc, fleet, unknown_nodes)
    if errors:
        # A refused snapshot is read again by the reference reader (a value YAML 1.1 and 1.2
        # read differently, such as 0o17 or 1e3, is a string to PyYAML), and only a broken
        # snapshot is read again as text, to place each problem on its line.
        doc = _read_snapshot(path, fast=False)
        errors = _check_document(doc, fleet, unknown_nodes)
    if errors:
        raise InventoryInvalid(_problems(errors, str(path), path.read_text(errors="replace")))
    inv = inventory_from_document(doc)
    if fleet is not None and unknown_nodes == "ignore":
        known = {n.id for n in fleet.nodes}
        if dropped is not None:
            dropped.extend(n.id for n in inv.nodes if n.id not in known)
        inv = Inventory(tuple(n for n in inv.nodes if n.id in known))
    return inv
