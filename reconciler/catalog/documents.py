"""Layer 1 of the catalog's checks: bytes and YAML. A file is read only if it is a regular file
inside the catalog and not too large; it is UTF-8, parses, and holds a mapping at the top, or it
is a Problem at its line and column. Three readers, fastest first: yaml_rs (Rust, YAML 1.2 as
ruamel reads it, no positions) for a file that is fine; PyYAML's C loader for a file with anchors,
aliases or tags (yaml_rs copies what an alias names, so an alias "bomb" would be expanded before
it could be refused; PyYAML shares it and _too_many_values counts it); and ruamel's round-trip
loader with positions, to say where a problem is.
"""

from __future__ import annotations

import errno
import functools
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml_rs

from reconciler.errors import (MAX_NESTING, Problem, block_too_deep, has_refused_character, position_after,
                               refused_character, too_deep)

# ruamel (the positioned reader) and PyYAML (the reader of anchors and aliases) are imported where
# they are used: a catalog that yaml_rs reads and that has no problem needs neither, and together
# they were a third of the code `plan` loaded before it read a file.

# Bounds on what one catalog file may cost to read. A 4,000-node fleet.yaml is a few MiB and a
# few hundred thousand values; past these a file is refused, not read (a YAML alias "bomb" is a
# few hundred bytes that expand to billions of values for whatever walks them next).
MAX_FILE_BYTES = 32 << 20
MAX_VALUES = 1_000_000


@dataclass
class Document:
    """One parsed file: its relative path and the ruamel tree that knows positions."""

    rel: str
    data: Any

    def at(self, path: tuple, message: str, *, key: bool = False) -> Problem:
        line, col = position(self.data, path, key=key)
        return Problem(self.rel, line, col, message)


def position(root: Any, path: tuple, *, key: bool = False) -> tuple[int, int]:
    """1-based line and column of the value at `path` (or of its key, with key=True).

    Falls back to the deepest container that exists, so a missing field points
    at the mapping that lacks it.
    """
    if not hasattr(root, "lc"):  # read without positions (yaml_rs, PyYAML): nothing to point at
        return 1, 1
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    node = root
    line, col = 0, 0
    if isinstance(root, (CommentedMap, CommentedSeq)):
        line, col = root.lc.line, root.lc.col
    for i, step in enumerate(path):
        last = i == len(path) - 1
        try:
            if isinstance(node, CommentedMap) and step in node:
                kl, kc = node.lc.key(step)
                vl, vc = node.lc.value(step)
                line, col = (kl, kc) if (key and last) else (vl, vc)
                node = node[step]
            elif isinstance(node, CommentedSeq) and isinstance(step, int) and 0 <= step < len(node):
                line, col = node.lc.item(step)
                node = node[step]
            else:
                break
        except (KeyError, TypeError, AttributeError):
            break
    return line + 1, col + 1


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    return y


def _decode(rel: str, raw: bytes) -> tuple[str | None, Problem | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line, col = position_after(raw[: exc.start])
        return None, Problem(rel, line, col, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")


def parse_yaml_text(rel: str, text: str) -> tuple[Any, Problem | None]:
    """Parse YAML keeping positions; a syntax problem becomes a Problem at its mark."""
    if text.lstrip("\ufeff").strip() == "" or all(
        not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()
    ):
        return None, Problem(rel, 1, 1, "file is empty; expected a mapping of fields")
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    from ruamel.yaml.reader import ReaderError

    deep = too_deep(text.encode("utf-8", errors="replace"))
    if deep is not None:  # ruamel builds nested values by recursion: a few hundred levels exhaust it
        return None, Problem(rel, *deep, f"values nested more than {MAX_NESTING} levels deep (a catalog file "
                                         "needs six)")
    try:
        return _yaml().load(text), None
    except ReaderError as exc:  # a character YAML does not allow: placed at its first one in the text
        char, (line, col) = refused_character(text, exc.character)
        return None, Problem(rel, line, col, f"character U+{ord(char):04X} is not allowed in YAML; remove it "
                                             "or write it as an escape in a double-quoted string")
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = (exc.problem or str(exc)).strip()
        lines = text.splitlines()
        if mark and mark.line < len(lines) and "\t" in lines[mark.line]:
            tab_col = lines[mark.line].index("\t") + 1
            return None, Problem(rel, line, tab_col, "tab character; YAML indents with spaces only")
        if "duplicate key" in problem or "found duplicate key" in str(exc):
            key = re.search(r'duplicate key "?([^"\s]+)"?', str(exc))
            name = f" '{key.group(1)}'" if key else ""
            return None, Problem(rel, line, col, f"duplicate key{name}; each key may appear once in a mapping")
        return None, Problem(rel, line, col, f"YAML syntax error: {problem}")
    except YAMLError as exc:  # errors without a mark
        return None, Problem(rel, 1, 1, f"YAML error: {exc}")


def describe_value(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def file_problem(root: Path, path: Path, rel: str) -> Problem | None:
    """Why `path` is not read at all: outside the catalog (through a symlink, its own or a
    directory's), not a regular file (a FIFO would block forever), or too large. Its content is
    never read for this, so never printed."""
    real = path.resolve()
    if not real.is_relative_to(root):
        return Problem(rel, 1, 1, f"symbolic link points outside the catalog ({real}); catalog files must live in the catalog")
    try:
        st = real.stat()
    except OSError as exc:
        return Problem(rel, 1, 1, f"cannot read: {exc.strerror}")
    if not stat.S_ISREG(st.st_mode):
        return Problem(rel, 1, 1, "not a regular file; catalog files are YAML files")
    if st.st_size > MAX_FILE_BYTES:
        return Problem(rel, 1, 1, f"file is {st.st_size >> 20} MiB; catalog files are refused above {MAX_FILE_BYTES >> 20} MiB")
    return None


def read_bounded(path: Path) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)  # it may have grown since it was checked
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES >> 20} MiB")
    return raw


def _too_many_values(data: Any, limit: int = MAX_VALUES) -> bool:
    """Whether `data`, with every YAML alias expanded, holds more than `limit` values (or refers
    to itself). Sizes are kept per shared object, so the cost is that of the file as written,
    however much its aliases multiply."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        item, children_done = stack.pop()
        key = id(item)
        if key in sizes:
            continue
        values = list(item.values()) if isinstance(item, dict) else item if isinstance(item, list) else []
        kids = [v for v in values if isinstance(v, (dict, list))]
        if not children_done:
            open_.add(key)
            stack.append((item, True))
            for k in kids:
                if id(k) in open_:
                    return True  # an alias to an enclosing value: it never ends
                if id(k) not in sizes:
                    stack.append((k, False))
            continue
        open_.discard(key)
        sizes[key] = min(limit + 1, len(values) + sum(sizes[id(k)] for k in kids))
    return sizes.get(id(data), 0) > limit


_TOO_MANY_VALUES = (f"expands to more than {MAX_VALUES:,} values (YAML anchors and aliases repeated "
                    "into each other); refused")


def read_positioned(root: Path, path: Path, rel: str) -> tuple[Document | None, list[Problem]]:
    problem = file_problem(root, path, rel)
    if problem:
        return None, [problem]
    try:
        raw = read_bounded(path)
    except OSError as exc:
        return None, [Problem(rel, 1, 1, f"cannot read: {exc.strerror}")]
    text, problem = _decode(rel, raw)
    if problem:
        return None, [problem]
    data, problem = parse_yaml_text(rel, text)
    if problem:
        return None, [problem]
    from ruamel.yaml.comments import CommentedMap

    if not isinstance(data, CommentedMap):
        kind = "a list" if isinstance(data, list) else describe_value(data)
        line, col = position(data, ())
        return None, [Problem(rel, line, col, f"expected a mapping of fields at the top of the file, found {kind}")]
    if _too_many_values(data):
        return None, [Problem(rel, 1, 1, _TOO_MANY_VALUES)]
    return Document(rel, data), []


@functools.cache
def _fast_loader() -> type:
    """PyYAML's C loader, refusing duplicate keys (the positioned path then reports them), reading
    scalars as YAML 1.2 does. Made on first use (a file with anchors, aliases or tags)."""
    import yaml

    class FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass

    def no_duplicates(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        if len(keys) != len(set(map(repr, keys))):
            raise yaml.YAMLError("duplicate key")
        return loader.construct_mapping(node, deep=deep)

    FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicates)
    # YAML 1.1 readings the round-trip (1.2) loader does not share: yes/no/on/off are strings there,
    # 0755 is decimal, 1:30 is a string. Leave them as strings here too; any real mismatch fails the
    # schema and the positioned path decides.
    FastLoader.yaml_implicit_resolvers = {
        k: [(t, r) for t, r in v if t not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp",
                                             "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for k, v in FastLoader.yaml_implicit_resolvers.items()
    }
    FastLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    # Plain decimals only (no octal 0755, no 1_000, no 1:30): anything else stays a string here.
    FastLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"),
                                     list("-+0123456789"))
    FastLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^[-+]?[0-9]+[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return FastLoader


def read_fast(root: Path, path: Path, rel: str) -> tuple[Document | None, list[Problem]]:
    """read_positioned without positions; any oddity is a Problem so the positioned path runs instead."""
    if file_problem(root, path, rel) is not None:
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    import yaml

    from reconciler import pyyaml_bounded

    try:
        raw = read_bounded(path)
        data = pyyaml_bounded.load(raw.decode("utf-8"), _fast_loader())
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    if not isinstance(data, dict) or any(not isinstance(k, str) for k in data) or _too_many_values(data):
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    return Document(rel, data), []


# Anchors, aliases and tags where a token starts: a file with any of them goes to PyYAML. A match
# inside a quoted string or a comment only costs that file the slower reader.
_NEEDS_PYYAML = re.compile(r"(?:^|[\s\[{,])[&*!]")


def read_native(root: Path, path: Path, rel: str) -> tuple[Document | None, list[Problem]]:
    """read_positioned without positions, by yaml_rs: a 4,000-node fleet.yaml in 0.05 s, where PyYAML's
    C loader builds its objects in Python (0.6 s). Any oddity is a Problem, so the positioned path runs."""
    if file_problem(root, path, rel) is not None:
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    try:
        raw = read_bounded(path)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    if has_refused_character(raw, text):  # yaml_rs would read it into a value: ruamel says where it is
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    if block_too_deep(raw) is not None:  # yaml_rs would overflow its stack: the positioned reader says where
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    if ("&" in text or "*" in text or "!" in text) and _NEEDS_PYYAML.search(text):  # `in` first: C speed
        return read_fast(root, path, rel)
    try:
        # Dates as dates, as ruamel reads them: a schema that wants a string then refuses one.
        data = yaml_rs.loads(text, parse_datetime=True)
    except Exception:  # noqa: BLE001 - any refusal: the positioned reader reads it again and words the error
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    # Without aliases every value is written out, each in at least one character: a file shorter
    # than the bound cannot hold more values than it, and is not walked to count them.
    too_many = len(text) > MAX_VALUES and _too_many_values(data)
    if not isinstance(data, dict) or any(not isinstance(k, str) for k in data) or too_many:
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    return Document(rel, data), []
