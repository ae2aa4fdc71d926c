"""Files nested too deep to read: each reader says where, and no reader crashes.

PyYAML's C loader composes nested values by recursion in C: a file some ten thousand brackets deep
overflowed the C stack, a segmentation fault of `validate`, `plan` or `status` (and of a daemon
validating a pushed revision). ruamel, jsonschema and json.loads recurse in Python and raised
RecursionError past every `except ValueError`. Each reads only what nests at most
errors.MAX_NESTING deep now, and says where a file goes past it.
"""

from __future__ import annotations

import shutil

import pytest

from reconciler.errors import MAX_NESTING, parse_json, too_deep
from tests.catalog_files import FLEET, MODEL, write_catalog
from tests.conftest import REPO

pytestmark = [pytest.mark.process]

DEEP = 100_000  # past PyYAML's C stack (it overflowed at some 30,000 brackets)


def test_too_deep_finds_flow_and_block_nesting_and_passes_the_reconcilers_own_files():
    assert too_deep(b"a: [[1]]\nb:\n  - - x\n") is None
    assert too_deep(b"x: " + b"[" * 500 + b"]" * 500) == (1, 4 + MAX_NESTING)  # the first bracket past the bound
    assert too_deep(b"a: 1\nb:\n" + b"- " * 300 + b"x\n") == (3, 1)
    assert too_deep(b'{"a": [' + b"{" * MAX_NESTING + b"}" * MAX_NESTING + b"]}") is not None
    assert too_deep(b'{"a": [' + b"{" * (MAX_NESTING - 2) + b"}" * (MAX_NESTING - 2) + b"]}") is None
    for path in (REPO / "catalog" / "status" / "nodes.yaml", REPO / "catalog" / "fleet.yaml",
                 *(REPO / "catalog" / "models").iterdir()):
        assert too_deep(path.read_bytes()) is None, path


def test_json_nested_past_the_stack_is_a_value_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json("[" * DEEP + "]" * DEEP)


def test_validate_says_where_a_model_file_nests_too_deep_even_one_pyyaml_reads(tmp_path, cli):
    # An anchor sends a file to PyYAML's C loader first: the one that crashed.
    deep = MODEL + "x: &a 1\nextra: " + "[" * DEEP + "]" * DEEP + "\n"
    root = write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": deep})
    r = cli("validate", str(root))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[0] == (f"models/llama.yaml:14:{8 + MAX_NESTING}: values nested more than "
                                        f"{MAX_NESTING} levels deep (a catalog file needs six)")


SNAPSHOTS = {
    "deep.json": '{"nodes": [' + "[" * DEEP + "]" * DEEP + "]}",  # past orjson's bound: the stdlib, then PyYAML
    "mid.json": '{"nodes": [' + "[" * 1000 + "]" * 1000 + "]}",  # orjson reads it; jsonschema's wording recursed
    "deep.yaml": "nodes:\n" + "- " * DEEP + "x\n",
}


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_plan_refuses_a_snapshot_nested_too_deep_at_its_line(tmp_path, cli, name):
    snapshot = tmp_path / name
    snapshot.write_text(SNAPSHOTS[name])
    r = cli("plan", str(REPO / "catalog"), "--inventory", str(snapshot))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{snapshot}:" in r.stderr and f"values nested more than {MAX_NESTING} levels deep" in r.stderr


def test_status_says_which_status_file_nests_too_deep(tmp_path, cli):
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "catalog", root)
    (root / "status" / "models").mkdir()
    (root / "status" / "models" / "m.yaml").write_text("name: m\nreplicas:\n" + "- " * DEEP + "x\n")
    r = cli("status", str(root))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"reconciler: {root}/status/models/m.yaml:3:1: not valid YAML: values nested more "
                                     f"than {MAX_NESTING} levels deep (the reconciler's files need eight)"]


def test_validate_says_where_a_block_nested_model_file_goes_too_deep(tmp_path, cli):
    # No anchor: yaml_rs reads it first, and overflowed its stack on block nesting this deep.
    root = write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": MODEL + "extra:\n" + "- " * DEEP + "x\n"})
    r = cli("validate", str(root))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[0] == (f"models/llama.yaml:14:1: values nested more than {MAX_NESTING} levels deep "
                                        "(a catalog file needs six)")


def test_the_dashboard_keeps_the_last_good_copy_of_a_status_file_nested_too_deep(tmp_path):
    import subprocess
    import sys

    # In a child process: a crash would be a segmentation fault, which would take pytest with it.
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "catalog", root)
    (root / "status" / "models").mkdir()
    (root / "status" / "models" / "m.yaml").write_text("name: m\nreplicas: []\n")
    code = f"""
import sys, warnings
warnings.simplefilter("ignore")
from pathlib import Path
from starlette.testclient import TestClient
from reconciler.dashboard.app import create_app
client = TestClient(create_app({str(root)!r}))
assert client.get("/models").status_code == 200
Path({str(root / "status" / "models" / "m.yaml")!r}).write_text("name: m\\nreplicas:\\n" + "- " * {DEEP} + "x\\n")
for url in ("/", "/models", "/api/status"):
    assert client.get(url).status_code == 200, url
print(client.get("/api/version").json()["problems"])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert (f"status/models/m.yaml:3:1: not valid YAML: values nested more than {MAX_NESTING} levels deep"
            in r.stdout), r.stdout


def test_a_pass_memory_in_etcd_nested_too_deep_is_forgotten_like_any_unreadable_one():
    from reconciler.commands.run import _etcd_memory_store
    from reconciler.decide.outcomes import PassMemory

    class Stored:  # etcd's answer for the key, as EtcdClient hands it on: the bytes a daemon wrote there
        def load_state(self, key):
            return b"[" * DEEP + b"]" * DEEP

    load, _ = _etcd_memory_store(Stored(), lambda *args, **kw: None)
    assert load(None) == PassMemory()
