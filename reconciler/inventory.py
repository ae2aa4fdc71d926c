"""The inventory snapshot (SPEC section 3): documents <-> model, and fast loading.

Snapshots are machine-written and can be several megabytes at fleet scale, so
they are read with a C-backed parser (JSON, or PyYAML's CSafeLoader) and no
positions; positions are only worth their cost in the human-written catalog.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from pathlib import Path
from typing import Any

import yaml

from reconciler.errors import InventoryInvalid, Problem
from reconciler.model import (
    OBSERVED_STATES,
    Disk,
    FabricAttachment,
    Fleet,
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


# --------------------------------------------------------------------------
# Validation: a snapshot given with --inventory is checked before anything trusts it
# --------------------------------------------------------------------------
#
# A hand check rather than jsonschema: it walks a 4,000-node snapshot in tens of
# milliseconds where a generic validator takes seconds, and it can name the node
# (`node h100-a1: gpus[2].nvlink_peers[0]`) instead of a JSON pointer. It follows
# schema/inventory.schema.json field for field; tests hold the two together.
# Positions are only looked up once something is wrong.

_NODE_ID = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Checker:
    def __init__(self):
        self.errors: list[tuple[str | None, str, str]] = []  # (node id, field path, message)

    def err(self, node, path, msg):
        self.errors.append((node, path, msg))

    def typed(self, node, path, value, kind, *, minimum=None, maximum=None, nullable=False) -> bool:
        if value is None and nullable:
            return True
        ok = {
            "int": _is_int(value),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "list": isinstance(value, list),
            "map": isinstance(value, dict),
        }[kind]
        if not ok:
            names = {"int": "an integer", "str": "a string", "bool": "true or false", "list": "a list", "map": "a mapping"}
            self.err(node, path, f"must be {names[kind]}{' or null' if nullable else ''}, not {_describe(value)}")
            return False
        if minimum is not None and value < minimum:
            self.err(node, path, f"must be at least {minimum}, not {value}")
            return False
        if maximum is not None and value > maximum:
            self.err(node, path, f"must be at most {maximum}, not {value}")
            return False
        return True

    def int_list(self, node, path, value, minimum=0, maximum=None) -> list[int]:
        if not self.typed(node, path, value, "list"):
            return []
        out = []
        for i, v in enumerate(value):
            if self.typed(node, f"{path}[{i}]", v, "int", minimum=minimum, maximum=maximum):
                out.append(v)
        return out


def _gpu_looks_right(g) -> bool:
    """True when a GPU entry has exactly the expected types (peers are checked against indices later)."""
    if type(g) is not dict:
        return False
    idx = g.get("index")
    if type(idx) is not int or idx < 0:
        return False
    if type(g.get("uuid", "")) is not str or type(g.get("name", "")) is not str or type(g.get("class", "")) is not str:
        return False
    total, used = g.get("memory_total_mb", 0), g.get("memory_used_mb", 0)
    if type(total) is not int or type(used) is not int or total < 0 or used < 0:
        return False
    peers = g.get("nvlink_peers")
    if peers is not None and (type(peers) is not list or any(type(p) is not int or p < 0 for p in peers)):
        return False
    return not g.get("processes")


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


def _check_node(c: _Checker, i: int, d) -> str | None:
    where = f"nodes[{i}]"
    if not isinstance(d, dict):
        c.err(None, where, f"must be a mapping, not {_describe(d)}")
        return None
    nid = d.get("id")
    if not isinstance(nid, str) or not _NODE_ID.match(nid):
        c.err(None, f"{where}.id", "is required: a node id like h100-a1" if nid is None else f"is not a valid node id: {_describe(nid)}")
        return None
    n = nid
    state = d.get("state", "ready")
    if state not in OBSERVED_STATES:
        c.err(n, "state", f"must be one of {', '.join(OBSERVED_STATES)}, not {_describe(state)}")
    if "reason" in d:
        c.typed(n, "reason", d["reason"], "str", nullable=True)
    if "labels" in d and c.typed(n, "labels", d["labels"], "map", nullable=True):
        for k, v in (d["labels"] or {}).items():
            c.typed(n, f"labels.{k}", v, "str")
    if "memory_total_mb" in d:
        c.typed(n, "memory_total_mb", d["memory_total_mb"], "int", minimum=0, nullable=True)
    if "engines" in d and c.typed(n, "engines", d["engines"], "map", nullable=True):
        for k, v in (d["engines"] or {}).items():
            c.typed(n, f"engines.{k}", v, "str", nullable=True)
    indices: set[int] = set()
    gpu_list = d.get("gpus")
    if gpu_list is not None and c.typed(n, "gpus", gpu_list, "list"):
        for gi, g in enumerate(gpu_list):
            if _gpu_looks_right(g):
                # The common case, checked in one pass; anything unusual takes the detailed path.
                if g["index"] in indices:
                    c.err(n, f"gpus[{gi}].index", f"GPU index {g['index']} appears twice")
                indices.add(g["index"])
                continue
            gp = f"gpus[{gi}]"
            if not c.typed(n, gp, g, "map"):
                continue
            if "index" not in g:
                c.err(n, f"{gp}.index", "is required")
            elif c.typed(n, f"{gp}.index", g["index"], "int", minimum=0):
                if g["index"] in indices:
                    c.err(n, f"{gp}.index", f"GPU index {g['index']} appears twice")
                indices.add(g["index"])
            for key in ("uuid", "name", "class"):
                if key in g:
                    c.typed(n, f"{gp}.{key}", g[key], "str")
            for key in ("memory_total_mb", "memory_used_mb"):
                if key in g:
                    c.typed(n, f"{gp}.{key}", g[key], "int", minimum=0)
            if "processes" in g and c.typed(n, f"{gp}.processes", g["processes"], "list", nullable=True):
                for pi, p in enumerate(g["processes"] or ()):
                    pp = f"{gp}.processes[{pi}]"
                    if c.typed(n, pp, p, "map"):
                        if "pid" not in p:
                            c.err(n, f"{pp}.pid", "is required")
                        else:
                            c.typed(n, f"{pp}.pid", p["pid"], "int", minimum=0)
                        if "name" in p:
                            c.typed(n, f"{pp}.name", p["name"], "str")
                        if "used_mb" in p:
                            c.typed(n, f"{pp}.used_mb", p["used_mb"], "int", minimum=0)
        for gi, g in enumerate(gpu_list):
            if isinstance(g, dict) and g.get("nvlink_peers") is not None:
                peers = g["nvlink_peers"]
                if type(peers) is list and indices.issuperset(peers) and all(type(p) is int for p in peers):
                    continue
                for pi, peer in enumerate(c.int_list(n, f"gpus[{gi}].nvlink_peers", g["nvlink_peers"])):
                    if peer not in indices:
                        c.err(n, f"gpus[{gi}].nvlink_peers[{pi}]",
                              f"NVLink peer {peer} does not exist (GPU indices: {_ranges(indices)})")
    if "fabrics" in d and c.typed(n, "fabrics", d["fabrics"], "list", nullable=True):
        for fi, f in enumerate(d["fabrics"] or ()):
            fp = f"fabrics[{fi}]"
            if c.typed(n, fp, f, "map"):
                if not isinstance(f.get("name"), str) or not f.get("name"):
                    c.err(n, f"{fp}.name", "is required: the fabric's name")
                if "hcas" in f and c.typed(n, f"{fp}.hcas", f["hcas"], "list", nullable=True):
                    for hi, h in enumerate(f["hcas"] or ()):
                        c.typed(n, f"{fp}.hcas[{hi}]", h, "str")
    if "disks" in d and c.typed(n, "disks", d["disks"], "list", nullable=True):
        for ki, k in enumerate(d["disks"] or ()):
            kp = f"disks[{ki}]"
            if c.typed(n, kp, k, "map"):
                if k.get("path") is None:
                    c.err(n, f"{kp}.path", "is required: the directory measured")
                else:
                    c.typed(n, f"{kp}.path", k["path"], "str")
                for key in ("free_bytes", "total_bytes"):
                    if key in k:
                        c.typed(n, f"{kp}.{key}", k[key], "int", minimum=0)
    if "weights" in d and c.typed(n, "weights", d["weights"], "list", nullable=True):
        for wi, w in enumerate(d["weights"] or ()):
            c.typed(n, f"weights[{wi}]", w, "str")
    if d.get("ports_in_use") is not None:
        c.int_list(n, "ports_in_use", d["ports_in_use"], maximum=65535)
    holders: dict[int, str] = {}
    if "replicas" in d and c.typed(n, "replicas", d["replicas"], "list", nullable=True):
        for ri, r in enumerate(d["replicas"] or ()):
            rp = f"replicas[{ri}]"
            if not c.typed(n, rp, r, "map"):
                continue
            for key in ("id", "model", "profile"):
                if key not in r:
                    c.err(n, f"{rp}.{key}", "is required")
                else:
                    c.typed(n, f"{rp}.{key}", r[key], "str")
            for key, minimum in (("rank", 0), ("nnodes", 1), ("port", 0), ("pid", 0)):
                if key in r:
                    c.typed(n, f"{rp}.{key}", r[key], "int", minimum=minimum, nullable=key == "pid",
                            maximum=65535 if key == "port" else None)
            if "spec_hash" in r:
                c.typed(n, f"{rp}.spec_hash", r["spec_hash"], "str")
            if "alive" in r:
                c.typed(n, f"{rp}.alive", r["alive"], "bool")
            if r.get("gpus") is not None:
                rid = r.get("id")
                for gi, g in enumerate(c.int_list(n, f"{rp}.gpus", r["gpus"])):
                    if gpu_list is not None and g not in indices:
                        c.err(n, f"{rp}.gpus[{gi}]", f"replica {rid} holds GPU {g}, which this node does not have")
                    elif g in holders and holders[g] != rid:
                        c.err(n, f"{rp}.gpus[{gi}]", f"GPU {g} is held by two replicas: {holders[g]} and {rid}")
                    else:
                        holders[g] = rid
    return nid


def _ranges(indices: set[int]) -> str:
    if not indices:
        return "none"
    s = sorted(indices)
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
        return f"{s[0]}-{s[-1]}"
    return ", ".join(map(str, s))


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
    """(node id, field path, message) of every problem with a snapshot document."""
    c = _Checker()
    if not isinstance(doc, dict):
        c.err(None, "(document)", f"must be a mapping with a `nodes` list, not {_describe(doc)}")
    else:
        nodes = doc.get("nodes")
        if nodes is None:
            c.err(None, "nodes", "is required: the list of observed nodes")
        elif c.typed(None, "nodes", nodes, "list"):
            seen: dict[str, int] = {}
            for i, nd in enumerate(nodes):
                nid = _check_node(c, i, nd)
                if nid is None:
                    continue
                if nid in seen:
                    c.err(nid, "id", f"node {nid} appears twice (nodes[{seen[nid]}] and nodes[{i}])")
                seen.setdefault(nid, i)
                if fleet is not None and unknown_nodes == "error" and fleet.node(nid) is None:
                    c.err(nid, "id", f"node {nid} is not in fleet.yaml (a snapshot of another fleet, "
                                     "or a node removed from it: take it out of the snapshot or add it back)")
    return c.errors


def _problems(errors: list[tuple[str | None, str, str]], file: str, text: str | None) -> list[Problem]:
    """The errors as Problems, each on the line of its field when the document's text is given."""
    lines = _Lines(text) if text is not None and errors else None
    problems = []
    for node, path, msg in errors:
        where = f"node {node}: {path}" if node else path
        problems.append(Problem(file, lines.line(node, path) if lines else 1, 1, f"{where}: {msg}"))
    return problems


def load_inventory(path: str | Path, fleet: Fleet | None = None, *, unknown_nodes: str = "error") -> Inventory:
    """Read and check a snapshot (YAML or JSON); InventoryInvalid lists every problem.

    Nodes not in the fleet are dropped when unknown_nodes == "ignore".
    """
    path = Path(path)
    try:
        doc = read_snapshot_document(path)
    except OSError as exc:
        raise InventoryInvalid([Problem(str(path), 1, 1, f"cannot read the snapshot: {exc.strerror or exc}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        msg = getattr(exc, "problem", None) or str(exc)
        raise InventoryInvalid([Problem(str(path), line, col, f"not valid YAML or JSON: {msg}")]) from None
    except UnicodeDecodeError:
        raise InventoryInvalid([Problem(str(path), 1, 1, "not valid YAML or JSON: not UTF-8 text")]) from None
    errors = _check_document(doc, fleet, unknown_nodes)
    if errors:
        # Only a broken snapshot is read again as text, to place each problem on its line.
        raise InventoryInvalid(_problems(errors, str(path), path.read_text(errors="replace")))
    inv = inventory_from_document(doc)
    if fleet is not None and unknown_nodes == "ignore":
        known = {n.id for n in fleet.nodes}
        inv = Inventory(tuple(n for n in inv.nodes if n.id in known))
    return inv
