"""Reading an inventory snapshot: the file (JSON or YAML, fast) -> its document -> an Inventory.

Snapshots are machine-written and can be several megabytes at fleet scale, so
they are read with a compiled parser (orjson, or yaml_rs for YAML; PyYAML only as the
reference reader) and no positions; positions are only worth their cost in the human-written
catalog. Block YAML, five times slower to parse than JSON, is read in parts, a thread ahead of
the caller's checks (read_snapshot_parts).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import orjson
import yaml_rs

from reconciler.errors import block_too_deep, has_refused_character, parse_json, position_after, refused_character
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


class PartUnreadable(ValueError):
    """One part of a snapshot read in parts did not parse: the caller reads the whole file again."""


# How many parts a block-style snapshot is read in (read_snapshot_parts): enough that the first
# part's parse, the one nothing overlaps, is small; few enough that each is worth a thread's hand-off.
SNAPSHOT_PARTS = 8
# Below this size a snapshot is read whole: its parse costs less than the thread it would overlap.
PARTS_MIN_BYTES = 256 * 1024
# A line at column 0 of a `nodes:` list's body that is not an item's start, a comment or blank (another
# top-level key, a `---` or `...` marker, a directive): the file is of some other shape, read whole.
_NOT_AN_ITEM_LINE = re.compile(rb"\n(?:[^ \t\r\n#-]|-[^ \r\n])")
_NODES_KEY = re.compile(rb"nodes:[ \t]*\r?\n")


def read_snapshot_document(path: str | Path, *, fast: bool = True) -> Any:
    """Parse a snapshot file, JSON or YAML (JSON is tried first: it is also valid YAML, and faster).

    Block YAML (status/nodes.yaml as written) is read with yaml_rs, a Rust parser that reads a
    4,000-node snapshot twenty times faster than PyYAML's C loader, whose objects are built in
    Python. fast=False, or any error from it, reads with PyYAML instead: the reference reader
    (YAML 1.1, as PyYAML writes it) and the one whose errors carry line and column.
    """
    return _document(Path(path).read_bytes(), fast)


def _document(data: bytes, fast: bool = True) -> Any:
    stripped = _after_comments(data)
    if stripped[:1] in (b"{", b"["):
        try:
            return orjson.loads(stripped)
        except ValueError:  # orjson is strict (no NaN, no integer past 64 bits): the stdlib decides
            try:
                return parse_json(stripped)
            except ValueError:  # nested past the stack too: PyYAML words it below
                pass
    if fast and block_too_deep(data) is None:  # yaml_rs would overflow its stack: PyYAML's reader says where
        try:
            text = data.decode("utf-8")
            # A character YAML does not allow: yaml_rs would take it, PyYAML refuses it and says where.
            if not has_refused_character(data, text):
                # A key given twice: the last one wins, as PyYAML (the reference reader) has it.
                return yaml_rs.loads(text, parse_datetime=False,
                                     duplicate_key_policy=yaml_rs.DuplicateKeyPolicy.LastWins)
        except Exception:  # noqa: BLE001 - any refusal: PyYAML reads it again and words the error
            pass
    return _read_with_pyyaml(data)


def _after_comments(data: bytes) -> bytes:
    """The file from its first line that is not a comment: leading comment lines (a
    `# yaml-language-server: $schema=...` header) do not stop the JSON path, so a snapshot written
    as JSON-style YAML still loads at JSON speed."""
    stripped = data.lstrip()
    while stripped[:1] == b"#":
        end = stripped.find(b"\n")
        stripped = b"" if end == -1 else stripped[end + 1:].lstrip()
    return stripped


def read_snapshot_parts(path: str | Path) -> Iterator[Any]:
    """The snapshot's document, as read_snapshot_document reads it, in parts whose `nodes` lists,
    joined, are the document's: the caller checks and builds one part while the next is parsed.

    Only block YAML that is a `nodes:` list and nothing else (status/nodes.yaml as the reconciler
    writes it) comes in parts, SNAPSHOT_PARTS `{"nodes": [...]}` documents cut at item starts and
    parsed by yaml_rs a thread ahead: yaml_rs lets go of the GIL for part of its work (about half at
    4,000 nodes; a second parsing thread gains nothing), so the parse of a block snapshot, five times
    JSON's, partly hides behind the caller's work on the part before. Anything else is one document. PartUnreadable when a part does not parse (an alias of an
    anchor in another part, a quoted scalar cut in two, a broken file): the caller reads the whole file
    again with read_snapshot_document, which reads it as one document or words its error.
    """
    data = Path(path).read_bytes()
    parts = _block_node_parts(data) if len(data) >= PARTS_MIN_BYTES else None
    if parts is not None and block_too_deep(data) is not None:  # yaml_rs would overflow its stack: see _document
        parts = None
    if parts is None:
        yield _document(data)
        return
    from concurrent.futures import ThreadPoolExecutor  # here: a JSON snapshot never needs it, and plan starts sooner

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-parts") as pool:
        ahead = [pool.submit(_parse_part, part) for part in parts]
        try:
            for future in ahead:
                yield {"nodes": future.result()}
        finally:
            for future in ahead:  # the caller stopped early (a bad part): nothing more is parsed
                future.cancel()


def _block_node_parts(data: bytes) -> list[bytes] | None:
    """The item texts of a snapshot that is a block `nodes:` list and nothing else, cut into up to
    SNAPSHOT_PARTS runs of whole items (each a YAML sequence of its own); None for any other shape.
    Bytes, searched at memchr speed (a regex anchored at every line start walks every character);
    each part is decoded where it is parsed."""
    head = _after_comments(data)
    key = _NODES_KEY.match(head)
    if key is None:
        return None
    body = head[key.end():]
    if not body.startswith(b"- ") or _NOT_AN_ITEM_LINE.search(body):
        return None
    cuts = [0]
    step = len(body) // SNAPSHOT_PARTS
    for k in range(1, SNAPSHOT_PARTS):
        at = body.find(b"\n- ", max(cuts[-1], k * step))
        if at == -1:
            break
        cuts.append(at + 1)
    cuts.append(len(body))
    return [body[a:b] for a, b in zip(cuts, cuts[1:]) if a < b]


def _parse_part(part: bytes) -> list:
    try:
        text = part.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PartUnreadable(str(exc)) from None
    if has_refused_character(part, text):  # yaml_rs would take it; PyYAML, reading the whole file, says where
        raise PartUnreadable("a character YAML does not allow")
    try:
        items = yaml_rs.loads(text, parse_datetime=False, duplicate_key_policy=yaml_rs.DuplicateKeyPolicy.LastWins)
    except Exception as exc:  # noqa: BLE001 - any refusal: the whole file is read again
        raise PartUnreadable(str(exc)) from None
    if not isinstance(items, list):
        raise PartUnreadable("a part is not a list of nodes")
    return items


def _read_with_pyyaml(data: bytes) -> Any:
    """PyYAML's C loader, the reference reader. Imported here: a snapshot that is JSON or that
    yaml_rs reads (every one the reconciler writes) never needs it, and `plan` starts sooner."""
    import yaml

    from reconciler import pyyaml_bounded

    try:
        return pyyaml_bounded.load(data, getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.reader.ReaderError as exc:  # bytes YAML does not take: said where, in a person's words
        raise _reader_error(data, exc) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        raise SnapshotSyntaxError(line, col, getattr(exc, "problem", None) or str(exc)) from None


def _reader_error(data: bytes, exc) -> SnapshotSyntaxError:
    """PyYAML's ReaderError (bytes that are not UTF-8, a control character) on the line and column it
    is at, instead of its `in "<byte string>", position N` (whose unit depends on the reader)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as bad:  # placed by characters, as the problems of a readable file are
        line, col = position_after(data[:bad.start].decode("utf-8"))
        return SnapshotSyntaxError(line, col, f"not UTF-8 text (byte 0x{data[bad.start]:02x})")
    char, (line, col) = refused_character(text, exc.character)
    return SnapshotSyntaxError(line, col, f"character U+{ord(char):04X} is not allowed in YAML")


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
