"""Checking an inventory snapshot before anything trusts it (a snapshot given with --inventory),
every problem worded for a person and placed on its line; load_inventory reads and checks one."""

from __future__ import annotations

import re
from bisect import bisect_right
from contextlib import closing
from pathlib import Path
from typing import Any, Callable

from reconciler.errors import MAX_NESTING, InventoryInvalid, Problem, too_deep
from reconciler.observe.inventory.reading import (
    PartUnreadable,
    SnapshotSyntaxError,
    inventory_from_document,
    node_from_document,
    read_snapshot_document,
    read_snapshot_parts,
)
from reconciler.model import Fleet, Inventory, ObservedNode
from reconciler.schemas import field_path, is_valid, schema, validator
from reconciler.teardown import leave_to_exit


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
            out.append((-1, (), None, field_path(parts) or "(document)", msg))
            continue
        i, rest = parts[1], parts[2:]
        nid = nodes[i].get("id") if isinstance(nodes[i], dict) else None
        if not _valid_id(nid):
            # A node without a usable id is reported once, by its position; its other fields wait.
            if rest[:1] in ((), ("id",)):
                out.append((i, (-1,), None, field_path(parts), msg))
            continue
        out.append((i, _order(rest), nid, field_path(rest), msg))
    return out


def _ranges(indices: set[int]) -> str:
    if not indices:
        return "none"
    s = sorted(indices)
    # Distinct and sorted: a run exactly when the ends are len-1 apart (no list of the range: an
    # index of 2**63 in a snapshot would ask for one that large).
    if len(s) > 2 and s[-1] - s[0] == len(s) - 1:
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
    except SnapshotSyntaxError as exc:
        raise InventoryInvalid([Problem(str(path), exc.line, exc.column, f"not valid YAML or JSON: {exc.problem}")]) from None
    except UnicodeDecodeError:
        raise InventoryInvalid([Problem(str(path), 1, 1, "not valid YAML or JSON: not UTF-8 text")]) from None


def load_inventory(path: str | Path, fleet: Fleet | None = None, *, unknown_nodes: str = "error",
                   dropped: list[str] | None = None, between_parts: Callable[[], None] | None = None) -> Inventory:
    """Read and check a snapshot (YAML or JSON); InventoryInvalid lists every problem.

    Nodes not in the fleet are dropped when unknown_nodes == "ignore", and their ids
    appended to `dropped` when it is given (so the caller can say which). With "ignore" the
    fleet is needed for that drop only: load with fleet None, then drop_unknown_nodes.
    between_parts: called after each part of a snapshot read in parts is built, while the next
    parses (the caller's other work that must not wait; it must not wait either).
    """
    path = Path(path)
    inv = _load_in_parts(path, fleet, unknown_nodes, between_parts)
    if inv is None:
        inv = _load_whole(path, fleet, unknown_nodes)
    if fleet is not None and unknown_nodes == "ignore":
        inv = drop_unknown_nodes(inv, fleet, dropped)
    return inv


def _load_in_parts(path: Path, fleet: Fleet | None, unknown_nodes: str,
                   between_parts: Callable[[], None] | None = None) -> Inventory | None:
    """The snapshot checked and built part by part as read_snapshot_parts parses it, when every part
    is fine; None when anything is not (a part that does not parse or has a problem, a node id in
    two parts, a file that cannot be read): _load_whole then reads it again as one document and says
    its problems as before, with their lines."""
    nodes: list[ObservedNode] = []
    try:
        with closing(read_snapshot_parts(path)) as parts:
            for part in parts:
                if _check_document(part, fleet, unknown_nodes):
                    return None
                nodes.extend(node_from_document(n) for n in part.get("nodes") or ())
                leave_to_exit(part)  # its parsed document, freed by the exit in a one-shot command
                if between_parts is not None:
                    between_parts()
    except (PartUnreadable, SnapshotSyntaxError, OSError, UnicodeDecodeError, RecursionError):  # see _load_whole
        return None
    if len({n.id for n in nodes}) != len(nodes):
        return None
    return Inventory(tuple(nodes))


def _load_whole(path: Path, fleet: Fleet | None, unknown_nodes: str) -> Inventory:
    # orjson reads JSON nested up to 1,024 deep; jsonschema, wording what is wrong with it, recurses
    # past Python's stack long before. A snapshot needs eight levels.
    deep = _too_deep(path)
    if deep is not None:
        raise InventoryInvalid([Problem(str(path), *deep, f"values nested more than {MAX_NESTING} levels deep "
                                                          "(a snapshot needs eight)")])
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
    return inventory_from_document(doc)


def _too_deep(path: Path) -> tuple[int, int] | None:
    try:
        return too_deep(path.read_bytes())
    except OSError:  # said by the reader, as it always was
        return None


def drop_unknown_nodes(inv: Inventory, fleet: Fleet, dropped: list[str] | None = None) -> Inventory:
    """The inventory without the nodes fleet.yaml does not have; their ids appended to `dropped`."""
    known = {n.id for n in fleet.nodes}
    kept = tuple(n for n in inv.nodes if n.id in known)
    if dropped is not None:
        dropped.extend(n.id for n in inv.nodes if n.id not in known)
    return inv if len(kept) == len(inv.nodes) else Inventory(kept)
