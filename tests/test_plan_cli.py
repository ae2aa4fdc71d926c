"""`reconciler plan` and `reconciler explain` end to end: a real catalog in a real git repository, a snapshot file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import REPO, copy_tracked

pytestmark = [pytest.mark.process]

SNAPSHOT = REPO / "catalog" / "status" / "nodes.yaml"


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """The bundled example catalog, committed to a fresh git repository."""
    root = tmp_path / "catalog"
    copy_tracked(REPO / "catalog", root)
    shutil.copytree(REPO / "schema", tmp_path / "schema")  # the files' $schema comments point here
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "catalog")
    return root


def snapshot_doc():
    return yaml.safe_load(SNAPSHOT.read_text())


def write_snapshot(path: Path, doc, as_json=False):
    path.write_text(json.dumps(doc) if as_json else yaml.safe_dump(doc))
    return path


def test_plan_json_has_the_spec_shape_and_the_git_revision(cli, repo):
    r = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["revision"] == git(repo, "rev-parse", "HEAD")
    start = next(a for a in doc["actions"] if a["replica"] == "llama-3-70b-1")
    assert start == {
        "action": "start", "replica": "llama-3-70b-1", "model": "llama-3-70b", "profile": "h100-tp8",
        "fabric": None, "pool": "none/H100-80GB", "reason": "not running",
        "nodes": [{"node": "h100-a1", "rank": 0, "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "hcas": [], "port": 8000}],
    }
    (unplaced,) = doc["unplaced"]
    assert unplaced["replica"] == "deepseek-v3-0"
    assert {"profile": "h100-2x8", "pool": "ib-pod1/H100-80GB", "node": "h100-a2",
            "reason": "has 0 free H100-80GB GPUs, needs 8"} in unplaced["rejections"]


def test_plan_names_the_revision_the_daemon_applies_not_a_later_status_commit(cli, repo):
    from reconciler.catalog.gitrev import GitCatalog

    desired = git(repo, "rev-parse", "HEAD")
    (repo / "status" / "catalog.yaml").write_text("last_applied_revision: x\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "status")
    assert git(repo, "rev-parse", "HEAD") != desired
    r = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--format", "json")
    assert json.loads(r.stdout)["revision"] == desired == GitCatalog.open(repo).catalog_revision()


def test_plan_without_git_has_null_revision(cli, tmp_path):
    root = tmp_path / "cat"
    copy_tracked(REPO / "catalog", root)
    r = cli("plan", str(root), "--inventory", str(SNAPSHOT), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["revision"] is None


def test_plan_reads_json_snapshot_as_well_as_yaml(cli, repo, tmp_path):
    snap = write_snapshot(tmp_path / "nodes.json", snapshot_doc(), as_json=True)
    a = cli("plan", str(repo), "--inventory", str(snap), "--format", "json")
    b = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--format", "json")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_plan_text_is_a_table_with_unplaced_reasons(cli, repo):
    r = cli("plan", str(repo), "--inventory", str(SNAPSHOT))
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["ACTION", "REPLICA", "PROFILE", "NODES", "REASON"]
    assert any(l.split()[:4] == ["start", "llama-3-70b-1", "h100-tp8", "h100-a1[0-7]:8000"] for l in lines)
    assert "  deepseek-v3-0:" in lines
    assert any("nodes fit profile h100-2x8" in l and "h100-a2: 0 free, needs 8" in l for l in lines)


def test_fail_on_unplaced_exits_1_and_says_so(cli, repo):
    r = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--fail-on-unplaced")
    assert r.returncode == 1
    assert "1 replica could not be placed" in r.stderr and "Traceback" not in r.stderr


def test_fail_on_unplaced_exits_0_when_everything_fits(cli, repo):
    (repo / "models" / "deepseek-v3.yaml").unlink()
    r = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--fail-on-unplaced")
    assert r.returncode == 0, r.stdout + r.stderr


LOCAL_FLEET = """\
nodes:
  - id: here
    address: 127.0.0.1
    transport: local
    model_dirs: [/tmp]
"""
LOCAL_MODEL = """\
name: echo
source: echo
profiles:
  - name: cpu
    engine: command
    port: 18777
    command: [python3, -m, reconciler.tiny_server, --port, "${PORT}"]
"""


def test_plan_without_inventory_probes_the_fleet(cli, tmp_path):
    # A local-transport node is probed on this machine: no SSH, no address but loopback.
    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text(LOCAL_FLEET)
    (tmp_path / "models" / "echo.yaml").write_text(LOCAL_MODEL)
    r = cli("plan", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    (start,) = json.loads(r.stdout)["actions"]
    assert start["replica"] == "echo-0" and start["nodes"][0]["node"] == "here"


def test_plan_without_inventory_exits_3_when_no_node_answers(cli, tmp_path):
    (tmp_path / "models").mkdir()
    # A local node whose state dir cannot be created and whose python3 is missing from PATH.
    (tmp_path / "fleet.yaml").write_text(LOCAL_FLEET)
    (tmp_path / "models" / "echo.yaml").write_text(LOCAL_MODEL)
    r = cli("plan", str(tmp_path), env={"PATH": str(tmp_path / "no-such-bin")})
    assert r.returncode == 3, r.stderr
    assert "no node of the fleet could be reached" in r.stderr and "Traceback" not in r.stderr


def test_missing_inventory_file_is_a_usage_error(cli, repo):
    r = cli("plan", str(repo), "--inventory", str(repo / "nope.yaml"))
    assert r.returncode == 2 and "no such file" in r.stderr


BAD = [
    ("gpu held twice", lambda d: d["nodes"][0].__setitem__("replicas", [
        {"id": "x-0", "model": "x", "profile": "p", "gpus": [0], "port": 1, "spec_hash": "a"},
        {"id": "y-0", "model": "y", "profile": "p", "gpus": [0], "port": 2, "spec_hash": "b"}]),
     "node a100-b1: replicas[1].gpus[0]: GPU 0 is held by two replicas: x-0 and y-0"),
    ("nvlink peer missing", lambda d: d["nodes"][0]["gpus"][2].__setitem__("nvlink_peers", [9]),
     "node a100-b1: gpus[2].nvlink_peers[0]: NVLink peer 9 does not exist (GPU indices: 0-7)"),
    ("wrong type", lambda d: d["nodes"][1].__setitem__("memory_total_mb", "lots"),
     "node a100-b2: memory_total_mb: must be an integer or null, not the string 'lots'"),
    ("bad state", lambda d: d["nodes"][1].__setitem__("state", "sleepy"),
     "node a100-b2: state: must be one of ready, cordoned, drained, unreachable, unusable, not the string 'sleepy'"),
    ("duplicate id", lambda d: d["nodes"][1].__setitem__("id", "a100-b1"),
     "node a100-b1: id: node a100-b1 appears twice (nodes[0] and nodes[1])"),
]


@pytest.mark.parametrize("name,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_inconsistent_snapshot_is_refused_naming_node_and_field(cli, repo, tmp_path, name, mutate, message):
    doc = snapshot_doc()
    mutate(doc)
    snap = write_snapshot(tmp_path / "nodes.yaml", doc)
    r = cli("plan", str(repo), "--inventory", str(snap))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    line = next(l for l in r.stderr.splitlines() if message in l)
    assert line.startswith(f"{snap}:")
    assert int(line.split(":")[1]) > 1  # a real line, near the node


def test_a_node_retired_from_fleet_yaml_but_still_in_the_snapshot_is_ignored_with_one_warning(cli, repo):
    fleet = repo / "fleet.yaml"
    text = fleet.read_text()
    block = text[text.index("  - id: l40s-c2"):text.index("  - id: cpu-d1")]
    fleet.write_text(text.replace(block, ""))  # the pull request that retires l40s-c2
    before = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--format", "json")
    assert before.returncode == 0, before.stderr
    assert before.stderr.splitlines() == [
        f"reconciler: warning: {SNAPSHOT}: node l40s-c2 is not in fleet.yaml: ignored"]
    doc = json.loads(before.stdout)
    assert all(n["node"] != "l40s-c2" for a in doc["actions"] for n in a["nodes"])
    assert all(r["node"] != "l40s-c2" for u in doc["unplaced"] for r in u.get("rejections", []))
    for command in (("validate", "--inventory"), ("explain", "qwen2.5-7b", "--inventory")):
        r = cli(*command[:-1], str(repo), command[-1], str(SNAPSHOT))
        assert "l40s-c2 is not in fleet.yaml: ignored" in r.stderr and "Traceback" not in r.stderr


def test_snapshot_that_is_not_yaml_is_refused_with_position(cli, repo, tmp_path):
    snap = tmp_path / "nodes.yaml"
    snap.write_text("nodes:\n  - id: a\n   bad: [\n")
    r = cli("plan", str(repo), "--inventory", str(snap))
    assert r.returncode == 1 and "not valid YAML or JSON" in r.stderr and "Traceback" not in r.stderr


def test_snapshot_read_beside_the_catalog_reports_as_before(cli, repo, tmp_path):
    """The catalog loads in a child process while the snapshot is read (_observe.catalog_apart): a
    broken snapshot still says where, a broken catalog is still the only thing reported, and explain's
    unknown model is still a usage error."""
    snap = tmp_path / "nodes.yaml"
    snap.write_text("nodes:\n  - id: a\n   bad: [\n")
    r = cli("plan", str(repo), "--inventory", str(snap), "--format", "json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{snap}:3:") and "not valid YAML or JSON" in r.stderr
    (repo / "fleet.yaml").write_text((repo / "fleet.yaml").read_text().replace("nodes:", "nodez:", 1))
    both = cli("plan", str(repo), "--inventory", str(snap), "--format", "json")
    assert both.returncode == 1 and "fleet.yaml" in both.stderr
    assert "not valid YAML or JSON" not in both.stderr and "Traceback" not in both.stderr
    r = cli("explain", "qwen2.5-7b", str(repo), "--inventory", str(SNAPSHOT))
    assert r.returncode == 1 and "fleet.yaml" in r.stderr and "Traceback" not in r.stderr
    (repo / "fleet.yaml").write_text((repo / "fleet.yaml").read_text().replace("nodez:", "nodes:", 1))
    r = cli("explain", "no-such-model", str(repo), "--inventory", str(snap))
    assert r.returncode == 2 and "model no-such-model is not in the catalog" in r.stderr
    assert "not valid YAML or JSON" not in r.stderr


def test_write_status_writes_predicted_status_that_matches_the_schemas(cli, repo):
    r = cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--write-status")
    assert r.returncode == 0, r.stderr
    status = repo / "status"
    llama = yaml.safe_load((status / "models" / "llama-3-70b.yaml").read_text())
    model_schema = json.loads((REPO / "schema" / "status-model.schema.json").read_text())
    jsonschema.Draft202012Validator(model_schema).validate(llama)
    assert llama["desired"] == 2
    phases = {r["id"]: r["phase"] for r in llama["replicas"]}
    assert phases["llama-3-70b-1"] == "Pending"
    started = next(r for r in llama["replicas"] if r["id"] == "llama-3-70b-1")
    assert started["nodes"][0]["endpoint"] == "http://10.1.1.11:8000"
    deepseek = yaml.safe_load((status / "models" / "deepseek-v3.yaml").read_text())
    jsonschema.Draft202012Validator(model_schema).validate(deepseek)
    assert deepseek["replicas"][0]["rejections"] and deepseek["replicas"][0]["message"].startswith("cannot be placed")
    endpoints = yaml.safe_load((status / "endpoints.yaml").read_text())
    jsonschema.Draft202012Validator(json.loads((REPO / "schema" / "status-endpoints.schema.json").read_text())).validate(endpoints)
    assert set(endpoints["models"]) == {"deepseek-v3", "embedder", "llama-3-70b", "phi-3-mini-gguf", "qwen2.5-7b"}
    # a second identical run rewrites nothing
    before = {p: p.stat().st_mtime_ns for p in status.rglob("*.yaml")}
    assert cli("plan", str(repo), "--inventory", str(SNAPSHOT), "--write-status").returncode == 0
    assert {p: p.stat().st_mtime_ns for p in status.rglob("*.yaml")} == before


def test_explain_tells_where_each_replica_went_or_why_not(cli, repo):
    r = cli("explain", "deepseek-v3", str(repo), "--inventory", str(SNAPSHOT))
    assert r.returncode == 0, r.stderr
    assert "deepseek-v3-0: cannot be placed" in r.stdout
    assert "h100-2x8 @ ib-pod1/H100-80GB/h100-a2: has 0 free H100-80GB GPUs, needs 8" in r.stdout
    r = cli("explain", "llama-3-70b", str(repo), "--inventory", str(SNAPSHOT))
    assert "llama-3-70b-1: would start on h100-a1[0-7]:8000 (profile h100-tp8, pool none/H100-80GB)" in r.stdout


def test_explain_unknown_model_is_a_usage_error(cli, repo):
    r = cli("explain", "nope", str(repo), "--inventory", str(SNAPSHOT))
    assert r.returncode == 2 and "model nope is not in the catalog" in r.stderr


def test_validate_with_inventory_reports_a_model_that_can_never_fit(cli, repo):
    (repo / "models" / "huge.yaml").write_text(
        "name: huge\nsource: org/huge\nprofiles:\n  - name: tp16\n    engine: vllm\n    gpu_class: H100-80GB\n    gpus_per_node: 16\n"
    )
    r = cli("validate", str(repo), "--inventory", str(SNAPSHOT))
    assert r.returncode == 1
    assert "needs 16 H100-80GB GPUs per node, the most any node has is 8" in r.stderr
    # at the field to change: gpus_per_node of profile tp16, line 7
    assert "models/huge.yaml:7:5: model huge can never be placed" in r.stderr


def test_explain_names_the_profiles_a_placed_replica_skipped(cli, repo, tmp_path):
    # Every H100 taken by a foreign process: llama-3-70b falls back to its A100 profile.
    doc = snapshot_doc()
    for n in doc["nodes"]:
        for g in n.get("gpus") or ():
            if g["class"] == "H100-80GB":
                g["processes"] = [{"pid": 4242, "name": "train.py", "used_mb": 70000}]
    snap = write_snapshot(tmp_path / "nodes.yaml", doc)
    r = cli("explain", "llama-3-70b", str(repo), "--inventory", str(snap))
    assert r.returncode == 0, r.stderr
    assert "profiles that did not fit first:" in r.stdout
    assert "nodes fit profile h100-tp8" in r.stdout and "have too few free H100-80GB GPUs" in r.stdout
