"""status/ as the dashboard reads it: each file parsed once per change, its last good parse kept.

The dashboard never probes and never writes: it reads the files the reconciler wrote.
Those files live in a git working tree people pull and merge into, so one can be
missing, half-merged or hand-edited at any moment. A file that cannot be read now
keeps its last good document on the page, with a line naming the file and why;
a reader never sees a traceback.

Parses are cached by (mtime, size, inode): a 4,000-node nodes.yaml is parsed once
per pass that changed it, not once per page view.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
import yaml_rs

from reconciler import pyyaml_bounded
from reconciler.constants import STATUS_DIR
from reconciler.errors import block_too_deep, parse_json
from reconciler.schemas import first_problem

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader

# The files of SPEC section 2 the pages show (status/models/*.yaml and status/gateway/* beside them).
CATALOG_FILE = "catalog.yaml"
NODES_FILE = "nodes.yaml"
ENDPOINTS_FILE = "endpoints.yaml"
MODELS_DIR = "models"
GATEWAY_DIR = "gateway"
HEAD_TTL_S = 2.0  # how long `git rev-parse HEAD` is trusted: the pages follow a pull within 2 s


class NotAStatusDocument(ValueError):
    """A file that parses but is not the document its name says (a list where a mapping belongs)."""


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _yaml(data: bytes) -> Any:
    return pyyaml_bounded.load(data, _Loader)


def _problem_text(rel: str, exc: Exception) -> str:
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        return f"{rel}{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}"
    if isinstance(exc, UnicodeDecodeError):
        return f"{rel}: not UTF-8 text"
    if isinstance(exc, OSError):
        return f"{rel}: cannot read: {exc.strerror or exc}"
    return f"{rel}: {exc}"


def _last_good(cached: _Cached | None) -> FileRead | None:
    return cached.read if cached is not None and cached.read.doc is not None else None


def _changed_while_read(path: Path, key: tuple[int, int, int], data: bytes) -> bool:
    return _stat_key(path) != key or len(data) != key[1]


def _unreadable(rel: str, exc: Exception, last_good: FileRead | None) -> FileRead:
    """A file that cannot be read now: one line saying why, and its last good document if it had one."""
    problem = _problem_text(rel, exc)
    if last_good is not None:
        problem += "; showing its last good copy"
    return FileRead(rel, last_good.doc if last_good else None, problem, last_good.mtime if last_good else None)


def _mapping(what: str, schema: str, key: str | None = None, kind: type = list) -> Callable[[Any], dict]:
    def check(doc: Any) -> dict:
        if doc is None:
            raise NotAStatusDocument(f"empty, not {what}")
        if not isinstance(doc, dict) or (key is not None and not isinstance(doc.get(key) or kind(), kind)):
            raise NotAStatusDocument(f"not {what}")
        # Against the file's schema too: a page (and status_view) then reads only documents of the shape the
        # reconciler writes, never a hand-edited list where a mapping belongs.
        problem = first_problem(schema, doc, missing_ok=True)
        if problem:
            raise NotAStatusDocument(f"not {what}: {problem}")
        return doc
    return check


CHECK_CATALOG = _mapping("a catalog status document (a mapping)", "status-catalog")
CHECK_NODES = _mapping("an inventory snapshot (a mapping with a `nodes` list)", "inventory", "nodes")
CHECK_MODEL = _mapping("a model status document (a mapping with `replicas`)", "status-model", "replicas")
CHECK_ENDPOINTS = _mapping("an endpoints document (a mapping with `models`)", "status-endpoints", "models", dict)


@dataclass(frozen=True)
class FileRead:
    """One status file as the pages use it."""

    rel: str  # "status/nodes.yaml": how the pages name it
    doc: Any = None  # the last good document; None: never read good
    problem: str | None = None  # why what is on disk now is not what is shown
    mtime: float | None = None  # when the shown document's file was written


@dataclass
class _Cached:
    key: tuple[int, int, int]
    read: FileRead


@dataclass(frozen=True)
class StatusSnapshot:
    """Every status file at one moment, for one render: the pages never mix two passes' reads."""

    root: Path
    catalog: FileRead
    nodes: FileRead
    endpoints: FileRead
    models: tuple[FileRead, ...]  # status/models/*.yaml, by file name
    gateway: tuple[tuple[str, float], ...]  # (status/gateway/<file>, mtime): present, not parsed
    version: str  # changes whenever any file (or HEAD) does: the pages poll it
    updated: float | None  # the newest status file's mtime: when the last pass wrote
    head: str | None  # `git rev-parse HEAD` of the catalog, None outside git
    catalog_revision_at_head: str | None  # the last commit at HEAD that changed the catalog outside status/
    git: bool

    @property
    def problems(self) -> list[str]:
        reads = (self.catalog, self.nodes, self.endpoints, *self.models)
        return [r.problem for r in reads if r.problem]

    @property
    def written(self) -> bool:
        return any(r.doc is not None for r in (self.catalog, self.nodes, self.endpoints, *self.models))


@dataclass
class _Head:
    when: float = -1e9
    value: tuple[bool, str | None, str | None] = (False, None, None)


class StatusFiles:
    """The status/ directory of one catalog, read on demand with a per-file cache. Thread-safe."""

    def __init__(self, root: str | os.PathLike, clock: Callable[[], float] = time.monotonic):
        self.root = Path(root).resolve()
        self.status = self.root / STATUS_DIR
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._head = _Head()
        self._derived: dict[tuple[str, str], Any] = {}  # (what, version) -> value; see `derived`
        self._nodes = NodeByNodeSnapshot()

    # ------------------------------------------------------------ one file

    def _read(self, path: Path, check: Callable[[Any], Any], parse: Callable[[bytes], Any] = None,
              keep_when_missing: bool = True) -> FileRead | None:
        rel = f"{STATUS_DIR}/{path.relative_to(self.status).as_posix()}"
        key = _stat_key(path)
        cached = self._cache.get(rel)
        if key is None:
            return self._missing(rel, cached, keep_when_missing)
        if cached is not None and cached.key == key:
            return cached.read
        last_good = _last_good(cached)
        try:
            data = path.read_bytes()
            if _changed_while_read(path, key, data):
                # Being written (or replaced) while read: keep what was shown and look again next time.
                return last_good or FileRead(rel, None, f"{rel}: changing while read", None)
            doc = check((parse or _fast_yaml)(data))
            read = FileRead(rel, doc, None, key[0] / 1e9)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one line on the page, never a traceback
            read = _unreadable(rel, exc, last_good)
        self._cache[rel] = _Cached(key, read)
        return read

    def _missing(self, rel: str, cached: _Cached | None, keep_when_missing: bool) -> FileRead | None:
        """A file not there now: its last good copy, when it had one and may keep it; else forgotten."""
        if cached is None or cached.read.doc is None or not keep_when_missing:
            self._cache.pop(rel, None)
            return None
        return FileRead(rel, cached.read.doc, f"{rel}: missing; showing its last good copy", cached.read.mtime)

    # ------------------------------------------------------------ git

    def _git_head(self) -> tuple[bool, str | None, str | None]:
        now = self._clock()
        if now - self._head.when < HEAD_TTL_S:
            return self._head.value
        from reconciler.catalog.gitrev import GitCatalog, GitError

        if not any((d / ".git").exists() for d in (self.root, *self.root.parents)):
            self._head = _Head(now, (False, None, None))  # not in a work tree: no git to ask
            return self._head.value
        try:
            repo = GitCatalog.open(self.root)
            value = (False, None, None) if repo is None else (True, repo.head(), repo.catalog_revision())
        except GitError:
            value = (False, None, None)
        self._head = _Head(now, value)
        return value

    # ------------------------------------------------------------ the whole tree

    def snapshot(self) -> StatusSnapshot:
        with self._lock:
            catalog = self._read_or_empty(CATALOG_FILE, CHECK_CATALOG)
            nodes = self._read_or_empty(NODES_FILE, CHECK_NODES, parse=self._nodes)
            endpoints = self._read_or_empty(ENDPOINTS_FILE, CHECK_ENDPOINTS)
            models = self._read_models()
            gateway = self._gateway()
            git, head, catalog_rev = self._git_head()
            reads = (catalog, nodes, endpoints, *models)
            return StatusSnapshot(
                root=self.root, catalog=catalog, nodes=nodes, endpoints=endpoints, models=tuple(models),
                gateway=gateway, version=self._version(reads, gateway, head, catalog_rev),
                updated=_updated(reads, gateway), head=head, catalog_revision_at_head=catalog_rev, git=git,
            )

    def _read_or_empty(self, name: str, check: Callable[[Any], Any], parse: Callable[[bytes], Any] = None) -> FileRead:
        """status/<name>, or an empty FileRead when it is not there and never was good."""
        return self._read(self.status / name, check, parse=parse) or FileRead(f"{STATUS_DIR}/{name}")

    def _read_models(self) -> list[FileRead]:
        """status/models/*.yaml, by file name; a model file not there now is not shown."""
        model_dir = self.status / MODELS_DIR
        names = sorted(p.name for p in _listdir(model_dir) if p.name.endswith(".yaml"))
        self._forget_removed_models(names)
        models = []
        for name in names:
            read = self._read(model_dir / name, CHECK_MODEL, keep_when_missing=False)
            if read is not None:
                models.append(read)
        return models

    def _forget_removed_models(self, names: list[str]) -> None:
        for gone in [rel for rel in self._cache if rel.startswith(f"{STATUS_DIR}/{MODELS_DIR}/")
                     and rel.rsplit("/", 1)[1] not in names]:
            del self._cache[gone]  # a model removed from the catalog: its file goes, and so does it

    def _gateway(self) -> tuple[tuple[str, float], ...]:
        """(status/gateway/<file>, mtime) of each file there, by name: present, not parsed."""
        return tuple(sorted(
            (f"{STATUS_DIR}/{GATEWAY_DIR}/{p.name}", p.stat().st_mtime) for p in _listdir(self.status / GATEWAY_DIR)
            if p.is_file()))

    def _version(self, reads: tuple[FileRead, ...], gateway: tuple, head: str | None, catalog_rev: str | None) -> str:
        """Changes whenever any file read (its stat key or its problem), the gateway files or HEAD do."""
        keys = [(r.rel, self._cache[r.rel].key if r.rel in self._cache else None, r.problem) for r in reads]
        return hashlib.sha1(repr((keys, gateway, head, catalog_rev)).encode()).hexdigest()[:16]

    def derived(self, what: str, snapshot: StatusSnapshot, build: Callable[[StatusSnapshot], Any]) -> Any:
        """build(snapshot), computed once per version of the files: the fleet index of 4,000 nodes
        and the JSON answers are not rebuilt for every page view."""
        key = (what, snapshot.version)
        with self._lock:
            if key in self._derived:
                return self._derived[key]
        value = build(snapshot)
        with self._lock:
            for old in [k for k in self._derived if k[0] == what]:
                del self._derived[old]
            self._derived[key] = value
        return value


class NodeByNodeSnapshot:
    """nodes.yaml parsed again only where it changed.

    The status writer puts each node at the top of the `nodes:` list, one block per node
    (`- id: ...` at column 0, everything of that node indented below it). A pass that changes a
    few nodes of 4,000 changes a few blocks: those are parsed, the others' documents are reused
    (parsing the whole 6 MB takes 0.6 s, most of the time a page takes to follow a pass). Any
    layout but that one, or a block that does not parse as one node on its own (an alias to
    another block, a scalar that happens to hold a line starting with `- `), and the whole file is
    parsed as before, so the answer is always the whole file's.
    """

    HEAD = b"nodes:\n"

    def __init__(self) -> None:
        self._blocks: dict[bytes, Any] = {}  # a node's block, as written -> its document

    def __call__(self, data: bytes) -> Any:
        blocks = self._split(data)
        parsed = self._parse_new(blocks) if blocks is not None else None
        if parsed is None:
            self._blocks = {}
            return _fast_yaml(data)
        known = self._blocks
        self._blocks = {b: known[b] if b in known else parsed[b] for b in blocks}
        # A fresh list of the (shared, never mutated) node documents: the pages only read them.
        return {"nodes": [self._blocks[b] for b in blocks]}

    def _parse_new(self, blocks: list[bytes]) -> dict[bytes, Any] | None:
        """The documents of the blocks not parsed before, by block; None when they do not parse as one
        node each (the whole file is parsed again then)."""
        missing = [b for b in dict.fromkeys(blocks) if b not in self._blocks]
        if not missing:
            return {}
        docs = _parse_blocks(b"".join(missing))
        if not isinstance(docs, list) or len(docs) != len(missing) or not all(isinstance(d, dict) for d in docs):
            return None
        return dict(zip(missing, docs))

    def _split(self, data: bytes) -> list[bytes] | None:
        if not data.startswith(self.HEAD + b"- "):
            return None
        parts = data[len(self.HEAD):].split(b"\n- ")
        return [parts[0] + b"\n"] + [b"- " + p + b"\n" for p in parts[1:]]


def _parse_blocks(data: bytes) -> Any:
    """Node blocks parsed by yaml_rs; None when it refuses them (the whole file again: PyYAML words its error)."""
    if block_too_deep(data) is not None:  # yaml_rs would overflow its stack
        return None
    try:
        return yaml_rs.loads(data.decode("utf-8"), parse_datetime=False,
                             duplicate_key_policy=yaml_rs.DuplicateKeyPolicy.LastWins)
    except Exception:  # noqa: BLE001 - the whole file again: PyYAML words its error
        return None


def _fast_yaml(data: bytes) -> Any:
    """A status file as reconciler.observe.inventory reads a snapshot: JSON when it is JSON, block YAML
    through yaml_rs (4,000 nodes and 10,000 replicas of status files in 0.8 s, where PyYAML's C
    loader takes 5 s), PyYAML for anything yaml_rs refuses, so an error carries PyYAML's line and column."""
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            return parse_json(stripped)
        except ValueError:
            pass
    if block_too_deep(data) is not None:  # yaml_rs would overflow its stack: PyYAML's reader says where
        return _yaml(data)
    try:
        return yaml_rs.loads(data.decode("utf-8"), parse_datetime=False,
                             duplicate_key_policy=yaml_rs.DuplicateKeyPolicy.LastWins)
    except Exception:  # noqa: BLE001 - PyYAML reads it again and words the error
        return _yaml(data)


def _updated(reads: tuple[FileRead, ...], gateway: tuple[tuple[str, float], ...]) -> float | None:
    """The newest mtime of the files shown: when the last pass wrote."""
    mtimes = [r.mtime for r in reads if r.mtime is not None] + [m for _, m in gateway]
    return max(mtimes) if mtimes else None


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
