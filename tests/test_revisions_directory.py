"""A catalog that is not a git repository is loaded again only when one of its files changed: an
idle pass does not parse a 10,000-node fleet.yaml again, and an edit is still seen at the next pass."""

from __future__ import annotations

import io
import os
from pathlib import Path

from reconciler.catalog import load_catalog
from reconciler.control.log import EventLog
from reconciler.control.revisions import DaemonState, Revisions

FLEET = "nodes:\n  - id: n1\n    address: 10.0.0.1\n"
MODEL = "name: m\nsource: /models/m\nreplicas: 1\nprofiles:\n  - name: cpu\n    engine: llama.cpp\n    port: 8080\n"


def revisions(root: Path) -> tuple[Revisions, list[str]]:
    loads: list[str] = []

    def load(path: str):
        loads.append(path)
        return load_catalog(path, with_revision=False)

    return Revisions(root, None, load, EventLog(stream=io.StringIO()), DaemonState(), git_pull=False), loads


def test_an_unchanged_directory_is_not_loaded_again_and_an_edit_is(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "models" / "m.yaml").write_text(MODEL)
    revs, loads = revisions(tmp_path)
    assert revs.load_revision() is False and len(loads) == 1
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "nodes.yaml").write_text("nodes: []\n")  # the daemon's own output: not the catalog
    assert revs.load_revision() is False and len(loads) == 1
    (tmp_path / "models" / "m.yaml").write_text(MODEL.replace("replicas: 1", "replicas: 2"))
    assert revs.load_revision() is False and len(loads) == 2
    assert revs.state.in_force.models[0].replicas == 2
    (tmp_path / "models" / "n.yaml").write_text(MODEL.replace("name: m", "name: n").replace("/m", "/n"))
    assert revs.load_revision() is False and len(loads) == 3 and len(revs.state.in_force.models) == 2


def test_a_refused_directory_stays_refused_unread_until_it_is_fixed(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "models" / "m.yaml").write_text(MODEL.replace("replicas: 1", "replicas: many"))
    revs, loads = revisions(tmp_path)
    assert revs.load_revision() is True and revs.state.errors
    assert revs.load_revision() is True and len(loads) == 1 and revs.state.errors
    path = tmp_path / "models" / "m.yaml"
    before = path.stat()
    path.write_text(MODEL)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same mtime: ctime and size still tell
    assert revs.load_revision() is False and len(loads) == 2 and revs.state.errors == []
