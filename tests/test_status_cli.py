"""`reconciler status` on status files as the reconciler writes them: colours on a terminal only, bad files in one line."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import yaml

from tests.conftest import REPO
import pytest

pytestmark = [pytest.mark.process]

MODEL = {
    "name": "m", "desired": 2, "ready": 1,
    "replicas": [
        {"id": "m-0", "profile": "p", "phase": "Ready", "nodes": [
            {"node": "n1", "rank": 0, "gpus": [0, 1], "port": 8000, "endpoint": "http://10.0.0.1:8000"}],
         "message": "", "restarts": 0},
        {"id": "m-1", "profile": "p", "phase": "Failed", "nodes": [
            {"node": "n2", "rank": 0, "gpus": [3], "port": 8000, "endpoint": "http://10.0.0.2:8000"}],
         "message": "exited 1; restart in 20s:\nCUDA out of memory", "restarts": 2},
    ],
}


def catalog_with_status(root, models=(MODEL,)):
    (root / "status" / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text("nodes: []\n")
    (root / "status" / "catalog.yaml").write_text("last_applied_revision: 3c1e2d\nmessage: revision 3c1e2d applied\n")
    for m in models:
        (root / "status" / "models" / f"{m['name']}.yaml").write_text(yaml.safe_dump(m))
    return root


def test_phases_are_coloured_on_a_terminal_and_plain_when_piped(tmp_path, cli):
    root = catalog_with_status(tmp_path)
    piped = cli("status", str(root))
    assert "\x1b" not in piped.stdout
    assert piped.stdout.splitlines()[0] == "revision 3c1e2d"
    row = next(line for line in piped.stdout.splitlines() if line.startswith("m ") and " m-1 " in line).split()
    assert row[:6] == ["m", "m-1", "Failed", "n2[3]:8000", "http://10.0.0.2:8000", "2"]
    assert " ".join(row[6:]) == "exited 1; restart in 20s: CUDA out of memory"  # one line per replica
    assert piped.stdout.splitlines()[-1] == "1 model, 1 of 2 replicas Ready"

    primary, secondary = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "reconciler", "status", str(root)], stdout=secondary,
                          stderr=subprocess.PIPE, env=env, timeout=60)
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the other end is closed and drained
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    assert proc.returncode == 0, proc.stderr
    text = out.decode()
    assert "\x1b[32mReady" in text and "\x1b[31mFailed" in text  # green, red


def test_a_broken_status_file_is_one_line_naming_it(tmp_path, cli):
    root = catalog_with_status(tmp_path)
    (root / "status" / "models" / "m.yaml").write_text("name: m\nreplicas: [\n")
    r = cli("status", str(root))
    assert r.returncode == 1
    [line] = r.stderr.splitlines()
    assert line.startswith(f"reconciler: {root}/status/models/m.yaml:") and "not valid YAML" in line


def test_a_status_file_of_the_wrong_shape_is_one_line_naming_the_field(tmp_path, cli):
    # Each once a traceback: a rank that is a string, warnings that are a number.
    bad_rank = dict(MODEL, replicas=[dict(MODEL["replicas"][0], nodes=["n1"])])
    root = catalog_with_status(tmp_path / "a", models=(bad_rank,))
    r = cli("status", str(root))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [(f"reconciler: {root}/status/models/m.yaml: not a model status document: "
                                      "replicas[0].nodes[0]: 'n1' is not of type 'object'")]
    root = catalog_with_status(tmp_path / "b")
    (root / "status" / "catalog.yaml").write_text("last_applied_revision: 3c1e2d\nwarnings: 5\n")
    r = cli("status", str(root), "--format", "json")
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"reconciler: {root}/status/catalog.yaml: not a catalog status document: warnings: 5 is not of type 'array'"]
    # What the reader can do without (an older writer's file, one a person trimmed) is no problem.
    (root / "status" / "catalog.yaml").write_text("last_applied_revision: 3c1e2d\n")
    assert cli("status", str(root)).returncode == 0


def test_json_is_the_spec_shape(tmp_path, cli):
    import json

    root = catalog_with_status(tmp_path)
    doc = json.loads(cli("status", str(root), "--format", "json").stdout)
    assert doc == {"revision": "3c1e2d", "models": [{k: MODEL[k] for k in ("name", "desired", "ready", "replicas")}]}
