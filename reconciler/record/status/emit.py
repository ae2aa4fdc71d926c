"""Block YAML for status files, written straight from the document, byte for byte what PyYAML's
status dumper writes (files.dump_yaml), for the documents status files are made of.

PyYAML first turns a document into a graph of nodes and events, several objects per scalar: a
4,000-node status/nodes.yaml took 3.7 s and 320 MB at its peak (tracemalloc), most of the daemon's
peak memory at fleet scale. Status documents are dicts, lists and short scalars, so this writes
their lines directly and asks PyYAML only what it alone decides, once per distinct string: whether
a string needs quotes. Anything outside that (a long line PyYAML would fold, a string with a line
break or a character outside printable ASCII, a key PyYAML would write as a complex key, a type
other than dict, list, str, int, float, bool and None) raises Unsupported, and the caller falls back
to PyYAML for the whole document. tests/test_status_emit.py compares the two on generated documents.
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from typing import Any

# PyYAML's width for status files (files.dump_yaml); a plain or quoted scalar that takes a line past
# it is folded there, which is left to PyYAML.
WIDTH = 1000
# PyYAML writes a key of about 128 characters or more as a complex key (`? key`; libyaml past 128,
# PyYAML's own emitter from 128 on).
MAX_SIMPLE_KEY = 128


class Unsupported(Exception):
    """The document has something this emitter does not write as PyYAML would: use PyYAML."""


# Printable ASCII, no space at either end: the strings this emitter quotes or leaves plain itself.
_SIMPLE = re.compile(r"[!-~](?:[ -~]*[!-~])?\Z")
# What stops a string from being plain (PyYAML's analyze_scalar, for strings _SIMPLE accepts).
_FIRST_INDICATOR = frozenset("#,[]{}&*!|>'\"%@`")
_FLOW_INDICATORS = re.compile(r"[,?\[\]{}:]| #")
_BLOCK_INDICATORS = re.compile(r": | #|:\Z")


@functools.cache
def _resolves_to_str(s: str) -> bool:
    """Whether PyYAML reads `s` back as a string (not a bool, number, null or timestamp): only then
    may it be written without quotes."""
    import yaml

    return yaml.resolver.Resolver().resolve(yaml.ScalarNode, s, (True, False)) == "tag:yaml.org,2002:str"


@functools.lru_cache(maxsize=65536)
def _string(s: str, flow: bool) -> str:
    """A string scalar as PyYAML writes it in block (flow False) or flow context."""
    if not s:
        return "''"  # plain, it would read back as null
    if not _SIMPLE.match(s):
        raise Unsupported(f"string {s[:40]!r}")
    first = s[0]
    block_indicators = (first in _FIRST_INDICATOR or s.startswith(("---", "...")) or _BLOCK_INDICATORS.search(s)
                        or (first in "?:-" and (len(s) == 1 or s[1] == " ")))
    flow_indicators = block_indicators or first in "?:" or _FLOW_INDICATORS.search(s, 1)
    plain = not (flow_indicators if flow else block_indicators)
    if plain and _resolves_to_str(s):
        return s
    return "'" + s.replace("'", "''") + "'"


def _float(f: float) -> str:
    # PyYAML's represent_float.
    if f != f:
        return ".nan"
    if f in (float("inf"), float("-inf")):
        return ".inf" if f > 0 else "-.inf"
    text = repr(f).lower()
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    return text


def _scalar(v: Any, flow: bool) -> str:
    t = type(v)
    if t is str:
        return _string(v, flow)
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v)
    if v is None:
        return "null"
    if t is float:
        return _float(v)
    if isinstance(v, StrEnum):  # the status dumper writes one as the string it is
        return _string(str(v), flow)
    raise Unsupported(f"a {t.__name__}")


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float))  # bool is an int; StrEnum a str


def _key(k: Any) -> str:
    if type(k) is not str and not isinstance(k, StrEnum):
        raise Unsupported(f"key {k!r}")
    if len(k) >= MAX_SIMPLE_KEY:
        raise Unsupported("a long key")
    return _scalar(k, False)


def _flow_list(items: list) -> str:
    return "[" + ", ".join(_scalar(x, True) for x in items) + "]"


def _inline(v: Any) -> str | None:
    """The text of a value that stays on its key's (or dash's) line; None for a nested block."""
    if type(v) is dict:
        return None if v else "{}"
    if type(v) is list:
        # The status dumper writes a list of scalars (an empty one too) in flow style.
        return _flow_list(v) if all(_is_scalar(x) for x in v) else None
    if _is_scalar(v):
        return _scalar(v, False)
    raise Unsupported(f"a {type(v).__name__}")


def _mapping(d: dict, indent: int, lead: str, out: list[str]) -> None:
    """The mapping's lines at `indent`; the first one starts with `lead` (a sequence's dash) when given."""
    pad = " " * indent
    for i, (k, v) in enumerate(d.items()):
        head = (lead if i == 0 and lead else pad) + _key(k) + ":"
        text = _inline(v)
        if text is not None:
            out.append(head + " " + text)
        elif type(v) is dict:
            out.append(head)
            _mapping(v, indent + 2, "", out)
        else:
            out.append(head)
            _sequence(v, indent, "", out)  # a block list in a mapping is not indented (PyYAML's indentless)


def _sequence(items: list, indent: int, lead: str, out: list[str]) -> None:
    pad = " " * indent
    for i, v in enumerate(items):
        dash = (lead if i == 0 and lead else pad) + "- "
        text = _inline(v)
        if text is not None:
            out.append(dash + text)
        elif type(v) is dict:
            _mapping(v, indent + 2, dash, out)
        else:
            _sequence(v, indent + 2, dash, out)


def emit(doc: Any) -> str:
    """`doc` (a dict or a list) as block YAML, as files.dump_yaml's PyYAML writes it; Unsupported
    where this emitter would not write what PyYAML writes."""
    out: list[str] = []
    if type(doc) is dict:
        if not doc:
            return "{}\n"
        _mapping(doc, 0, "", out)
    elif type(doc) is list:
        if all(_is_scalar(x) for x in doc):
            out.append(_flow_list(doc))
        else:
            _sequence(doc, 0, "", out)
    else:
        raise Unsupported(f"a {type(doc).__name__} document")
    if any(len(line) > WIDTH for line in out):
        raise Unsupported("a line PyYAML would fold")
    out.append("")
    return "\n".join(out)
