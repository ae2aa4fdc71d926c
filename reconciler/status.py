"""Status files: deterministic YAML, written atomically, only when content changes.

A status file with a timestamp that ticks on every pass turns `git diff
status/` into noise, and people stop reading it. So documents here carry no
clock, keep the key order they were built with, and a write that would not
change a byte does not touch the file at all.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

try:  # the C emitter is several times faster on a fleet-sized nodes.yaml
    from yaml import CSafeDumper as _Dumper
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeDumper as _Dumper


class _StatusDumper(_Dumper):
    """Block style for structure, flow style for short lists of scalars (GPU indices, peers)."""


def _represent_list(dumper: yaml.BaseDumper, data: list) -> yaml.Node:
    flow = all(isinstance(x, (int, float, str, bool)) or x is None for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_StatusDumper.add_representer(list, _represent_list)


def dump_yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_StatusDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def write_if_changed(path: str | os.PathLike, text: str) -> bool:
    """Atomically replace `path` with `text` unless it already holds exactly that. True if written."""
    path = Path(path)
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return True


def write_document(path: str | os.PathLike, doc: Any) -> bool:
    return write_if_changed(path, dump_yaml(doc))
