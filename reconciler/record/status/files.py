"""Status files as bytes on disk: deterministic YAML, written atomically, only when content changes.

A status file with a timestamp that ticks on every pass turns `git diff status/` into noise, and
people stop reading it. So documents carry no clock, keep the key order they were built with, and a
write that would not change a byte does not touch the file at all.
"""

from __future__ import annotations

import functools
import os
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable

from reconciler.constants import STATUS_DIR
from reconciler.errors import StatusWriteError
from reconciler.record.status.emit import Unsupported, emit


@functools.cache
def _status_dumper() -> type:
    """PyYAML's dumper for status/: block style for structure, flow style for short lists of scalars
    (GPU indices, peers), a StrEnum as the string it is (a phase reads `Ready`, not a tag). Made on
    first use: `plan` and `validate` write no status file and need no PyYAML."""
    import yaml

    base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # the C emitter: several times faster on nodes.yaml

    class StatusDumper(base):
        pass

    def represent_list(dumper, data: list):
        flow = all(isinstance(x, (int, float, str, bool)) or x is None for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)

    StatusDumper.add_representer(list, represent_list)
    StatusDumper.add_multi_representer(StrEnum, lambda dumper, data: dumper.represent_str(str(data)))
    return StatusDumper


def dump_yaml(doc: Any) -> str:
    """The document as status files hold it: emit.py's direct writer, and PyYAML where that writer
    says it would not write the same bytes."""
    try:
        return emit(doc)
    except Unsupported:
        return pyyaml_dump(doc)


def pyyaml_dump(doc: Any) -> str:
    import yaml

    return yaml.dump(doc, Dumper=_status_dumper(), sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def write_if_changed(path: str | os.PathLike, text: str) -> bool:
    """Atomically replace `path` with `text` unless it already holds exactly that. True if written.

    StatusWriteError when the file system refuses (read-only catalog, `status` a plain file):
    a message naming the file, not an OSError traceback.
    """
    path = Path(path)
    try:
        return _write_if_changed(path, text.encode())
    except OSError as exc:
        raise StatusWriteError(str(path), exc.strerror or str(exc)) from None


def _write_if_changed(path: Path, data: bytes) -> bool:
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; status files are read by gateways, dashboards and monitors
        # running as other users, so they get the mode any new file gets here (0644 under umask 022).
        os.fchmod(fd, 0o666 & ~_umask())
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


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return mask


# path -> (key, text) as this process last wrote it. An idle pass hands on an equal document:
# comparing keys takes milliseconds where rendering a 4,000-node snapshot again took seconds
# (PyYAML's representer is Python even with the C emitter; the pass memory's JSON half a second).
_LAST_WRITTEN: dict[Path, tuple[Any, str]] = {}


def write_rendered(path: str | os.PathLike, key: Any, render: Callable[[], str]) -> bool:
    """write_if_changed(path, render()), rendering only when `key` differs from the key of what this
    process last wrote to path. key must be a value no later change can alter (a repr, a tuple of
    frozen values), so a caller mutating its document cannot make the cache lie."""
    path = Path(path)
    last = _LAST_WRITTEN.get(path)
    text = last[1] if last is not None and last[0] == key else render()
    # Still compared with the file itself: an edit or a checkout under us is written over.
    written = write_if_changed(path, text)
    _LAST_WRITTEN[path] = (key, text)
    return written


def write_document(path: str | os.PathLike, doc: Any) -> bool:
    """Write doc as YAML to path unless the file already holds it; True if written."""
    return write_rendered(path, repr(doc), lambda: dump_yaml(doc))


def status_dir(catalog_root: str | os.PathLike) -> Path:
    """<catalog>/status, refusing to write anywhere it (or status/models) leads outside the catalog,
    with its .gitignore for the temporaries every write goes through.

    A committed `status` symlink to /etc, or to another repository, would otherwise have the
    reconciler rewrite files there on every pass.
    """
    root = Path(catalog_root)
    real_root = root.resolve()
    d = root / STATUS_DIR
    for p in (d, d / "models"):
        real = p.resolve()
        if not real.is_relative_to(real_root):
            link = f" (a symbolic link to {os.readlink(p)})" if p.is_symlink() else ""
            raise StatusWriteError(str(p), f"it leads outside the catalog{link}, to {real}; refusing to write there "
                                   "(status/ is the reconciler's own: remove the link)")
    try:
        write_if_changed(d / ".gitignore", _IGNORE_TEMPORARIES)
    except StatusWriteError:
        pass  # status/ itself cannot be written: the status file written next says so, naming itself
    return d


# Every status file is written through a hidden `.<name>.*.tmp` beside it and renamed into place.
# Without this, a person's `git add -A` in the deployed checkout can list such a file and then
# fail with "unable to stat" when the rename removes it; git skips ignored files without a stat.
_IGNORE_TEMPORARIES = "# written by the reconciler: its half-written status files, renamed into place when whole\n.*.tmp\n"
