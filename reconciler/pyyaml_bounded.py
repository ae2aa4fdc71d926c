"""PyYAML's loaders, refusing first what nests too deep for them.

PyYAML's C loader composes nested values by recursion in C: a file some ten thousand brackets
deep overflows the C stack, a segmentation fault that no `except` catches (a catalog file or a
snapshot anyone can write). Every PyYAML read of a file goes through load() here, which says
such a file is a YAML error at the line and column where it nests past errors.MAX_NESTING, so
each caller's `except yaml.YAMLError` words it as it words any other.

Imported where PyYAML is: a command whose files yaml_rs or orjson read never loads either.
"""

from __future__ import annotations

from typing import Any

import yaml

from reconciler.errors import MAX_NESTING, too_deep


class NestedTooDeep(yaml.MarkedYAMLError):
    """A file whose values nest past errors.MAX_NESTING; problem_mark is where."""


def load(data: bytes | str, loader: type) -> Any:
    """yaml.load(data, Loader=loader), or NestedTooDeep."""
    spot = too_deep(data if isinstance(data, bytes) else data.encode("utf-8", errors="replace"))
    if spot is not None:
        line, column = spot
        mark = yaml.Mark("<file>", 0, line - 1, column - 1, None, None)
        raise NestedTooDeep(problem=f"values nested more than {MAX_NESTING} levels deep (the reconciler's files "
                                    "need eight)", problem_mark=mark)
    return yaml.load(data, Loader=loader)
