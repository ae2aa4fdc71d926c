"""status/gateway/: the files gateways and monitors read (SPEC section 10), written where their
content changed, with a hand edit since the last write detected and said; and what `reconciler
gateway` reports it serves (SPEC section 13)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Mapping

from reconciler.record import gateway
from reconciler.model import Catalog
from reconciler.decide.outcomes import ReplicaState
from reconciler.record.status.files import dump_yaml, status_dir, write_if_changed
from reconciler.errors import parse_json


GATEWAY_DIR = "gateway"


LITELLM_FILE = "litellm.yaml"


PROMETHEUS_FILE = "prometheus.json"


DIGESTS_FILE = ".written"


def render_litellm(doc: dict) -> str:
    return gateway.LITELLM_HEADER + dump_yaml(doc)


def render_prometheus(groups: list[dict]) -> str:
    return json.dumps(groups, indent=2) + "\n"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_gateway_files(catalog_root: str | os.PathLike, catalog: Catalog,
                        replicas: Mapping[str, ReplicaState]) -> tuple[list[Path], list[str]]:
    """Write both files where their content changed; (paths written, one warning per file that had
    been edited by hand since it was written). StatusWriteError when the file system refuses."""
    directory = status_dir(catalog_root) / GATEWAY_DIR
    texts = {
        LITELLM_FILE: render_litellm(gateway.litellm_document(catalog, replicas)),
        PROMETHEUS_FILE: render_prometheus(gateway.prometheus_targets(catalog, replicas)),
    }
    digests_path = directory / DIGESTS_FILE
    try:
        written_before = parse_json(digests_path.read_text())
        if not isinstance(written_before, dict):
            written_before = {}
    except (OSError, ValueError):
        written_before = {}
    written, warnings = [], []
    for name, text in texts.items():
        path = directory / name
        try:
            on_disk = path.read_bytes()
        except OSError:
            on_disk = None
        if on_disk is not None and on_disk != text.encode() and written_before.get(name) not in (None, _digest(on_disk)):
            warnings.append(f"status/{GATEWAY_DIR}/{name} was edited by hand; written over from the catalog "
                            "(change the catalog instead)")
        if write_if_changed(path, text):
            written.append(path)
    digests = {name: _digest(text.encode()) for name, text in texts.items()}
    if digests != written_before:
        write_if_changed(digests_path, json.dumps(digests, indent=2, sort_keys=True) + "\n")
    return written, warnings


def read_served(catalog_root: str | os.PathLike) -> gateway.Served | None:
    """status/gateway/served.json, what `reconciler gateway` says it serves; None without one."""
    path = status_dir(catalog_root) / GATEWAY_DIR / gateway.SERVED_FILE
    try:
        doc, touched = parse_json(path.read_text()), path.stat().st_mtime
    except (OSError, ValueError):
        return None
    served = gateway.Served.from_document(doc)
    # Its mtime is the heartbeat: the gateway touches the file rather than rewrite it, so a daemon that
    # commits status/ commits only what changed.
    return None if served is None else dataclasses.replace(served, alive_at=max(served.alive_at, touched))


def write_served(catalog_root: str | os.PathLike, served: gateway.Served) -> bool:
    return write_if_changed(status_dir(catalog_root) / GATEWAY_DIR / gateway.SERVED_FILE,
                            json.dumps(served.as_document(), indent=2, sort_keys=True) + "\n")
