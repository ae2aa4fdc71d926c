"""The JSON Schemas (the source of truth for fields), each read and compiled once per process.

They live inside the package (reconciler/schema/), so an installed wheel reads them from any
directory; the clone's top-level schema/ is a symbolic link to that folder, where editors and
`# yaml-language-server: $schema=` comments find them: one copy, nothing to keep in step.

Two validators per schema, for two jobs: jsonschema-rs (Rust) answers "is this
document valid?" (a 4,000-node snapshot: 0.02 s, against 0.4 s for fastjsonschema's
compiled Python and 4.6 s for jsonschema), and only for a document it refuses does
jsonschema walk it again, to list every error with its path. jsonschema stays the
reference: a document jsonschema-rs refuses and jsonschema finds nothing wrong with
is accepted (Rust's `$` does not match before a final newline, Python's does).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import jsonschema_rs

if TYPE_CHECKING:
    import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"


@cache
def schema(name: str) -> dict:
    """reconciler/schema/<name>.schema.json (the clone's schema/), parsed."""
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())


@cache
def is_valid(name: str) -> Callable[[Any], bool]:
    """A fast yes/no check against the schema; it never changes the document (defaults are not filled in)."""
    check = jsonschema_rs.validator_for(schema(name)).is_valid

    def valid(doc: Any) -> bool:
        try:
            return check(doc)
        except ValueError:  # what JSON cannot hold (a YAML mapping with a number for a key): refused
            return False

    return valid


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """The full validator: every error, each with its path, for documents is_valid refused."""
    import jsonschema  # a fifth of a second to import, and only a refused document needs it

    return jsonschema.Draft202012Validator(schema(name))


def first_problem(name: str, doc: Any, *, missing_ok: bool = False) -> str | None:
    """None when `doc` is valid against the schema; else its first problem (in document order) as one
    line, `field.path[2]: what is wrong`: for documents the reconciler wrote that someone may have
    edited or half-merged since (status/), said in a line rather than met as a crash further on.
    missing_ok: a required field that is absent is no problem (a reader that takes what is there, and
    a file an older version or a person wrote), a value of the wrong type still is."""
    if is_valid(name)(doc):
        return None
    key = next(non_string_keys(doc), None)
    if key is not None:
        return f"{field_path(key[:-1]) or '(document)'}: the key {key[-1]!r} is not a string"
    try:
        errors = sorted((e for e in validator(name).iter_errors(doc) if not (missing_ok and e.validator == "required")),
                        key=lambda e: [(p, "") if isinstance(p, int) else (-1, str(p)) for p in e.absolute_path])
    except RecursionError:  # jsonschema walks (and words) a value by recursion: JSON can nest deeper
        return "values nested too deeply to read"
    if not errors:  # refused by jsonschema-rs alone (see the module's docstring): accepted
        return None
    err = errors[0]
    message = err.message if len(err.message) <= 200 else err.message[:200] + "..."
    return f"{field_path(err.absolute_path) or '(document)'}: {message}"


def non_string_keys(doc: Any) -> Iterator[tuple]:
    """The path of every mapping key that is not a string, in document order (YAML allows numbers,
    booleans, null as keys; JSON does not, and jsonschema walks past them). A loop, not recursion: a
    file nested a thousand deep is walked too."""
    stack: list[tuple[tuple, Any, bool]] = [((), doc, False)]  # (path, value, the path ends in a bad key)
    while stack:
        path, value, bad_key = stack.pop()
        if bad_key:
            yield path
        elif isinstance(value, dict):
            stack.extend((path + (k,), v, not isinstance(k, str)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((path + (i,), v, False) for i, v in reversed(list(enumerate(value))))


def field_path(parts) -> str:
    """("gpus", 2, "index") -> "gpus[2].index"."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out
