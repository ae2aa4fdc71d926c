"""`reconciler apply` end to end on this machine: the single-machine example, a real reconcile."""

from __future__ import annotations

import json
import signal
import os
from pathlib import Path

import pytest
import yaml

from reconciler.act.readiness import http_health
from tests.apply_support.local import free_port, is_running, wait_for
from tests.conftest import copy_tracked

pytestmark = [pytest.mark.process]

REPO = Path(__file__).resolve().parent.parent


def private_state(root: Path) -> dict:
    """One-shot apply keeps its memory under XDG_STATE_HOME: this test's, not the user's."""
    return {"XDG_STATE_HOME": str(root.parent / "xdg-state")}


@pytest.fixture
def example(tmp_path):
    """The bundled single-machine example, with its own state dir and a free port."""
    root = tmp_path / "catalog"
    copy_tracked(REPO / "examples" / "single-machine", root)
    fleet = yaml.safe_load((root / "fleet.yaml").read_text())
    fleet["state_dir"] = str(tmp_path / "state")
    (root / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
    model_file = next((root / "models").glob("*.yaml"))
    model = yaml.safe_load(model_file.read_text())
    model["profiles"][0]["port"] = free_port()
    model_file.write_text(yaml.safe_dump(model, sort_keys=False))
    yield root, model, tmp_path / "state"
    for rec in (tmp_path / "state" / "replicas").glob("*.json"):
        pid = json.loads(rec.read_text())["pid"]
        if is_running(pid):
            os.killpg(pid, signal.SIGKILL)


def test_apply_runs_the_single_machine_example_and_shows_its_endpoint(cli, example):
    root, model, state = example
    port = model["profiles"][0]["port"]
    first = cli("apply", str(root), env=private_state(root))
    assert first.returncode == 0, first.stderr
    rid = f"{model['name']}-0"
    assert f"{rid}  local  start  rank 0/1 port {port}" in first.stdout
    assert f"{rid}  local  health  Ready" in first.stdout
    assert f"  {model['name']}  http://127.0.0.1:{port}" in first.stdout
    assert http_health("127.0.0.1", port, "/health")[0]
    status = yaml.safe_load((root / "status" / "models" / f"{model['name']}.yaml").read_text())
    assert status["ready"] == 1 and status["replicas"][0]["phase"] == "Ready"

    again = cli("apply", str(root), env=private_state(root))
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("nothing to do")
    assert len(list((state / "replicas").glob("*.json"))) == 1


def test_apply_dry_run_says_what_it_would_do_and_does_nothing(cli, example):
    root, model, state = example
    result = cli("apply", str(root), "--dry-run", env=private_state(root))
    assert result.returncode == 0, result.stderr
    assert f"{model['name']}-0  local  start  would start" in result.stdout
    assert not (state / "replicas").exists() or not list((state / "replicas").glob("*.json"))
    assert not (root / "status" / "models").exists()


def test_apply_exits_3_when_no_node_can_be_reached(cli, tmp_path):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    closed = free_port()  # nothing listens there: connection refused
    (root / "fleet.yaml").write_text(yaml.safe_dump({
        "ssh": {"port": closed, "connect_timeout_s": 2, "known_hosts": str(tmp_path / "known_hosts")},
        "nodes": [{"id": "gone", "address": "127.0.0.1"}],
    }))
    (tmp_path / "known_hosts").write_text("")
    result = cli("apply", str(root), env=private_state(root))
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "gone" in result.stderr and "Traceback" not in result.stderr


def test_an_invalid_catalog_applies_nothing_and_exits_1(cli, example):
    root, model, state = example
    (root / "models" / "broken.yaml").write_text("name: [unclosed\n")
    result = cli("apply", str(root), env=private_state(root))
    assert result.returncode == 1
    assert "broken.yaml:" in result.stderr and "Traceback" not in result.stderr
    assert not (state / "replicas").exists()


def test_the_pass_after_a_start_with_nothing_changed_writes_no_status_file(example):
    from reconciler.control.reconcile import run_pass
    from reconciler.catalog import load_catalog
    from reconciler.observe.transport import LocalTransport

    root, model, state = example
    catalog = load_catalog(root, with_revision=False)
    transports = {"local": LocalTransport("local")}
    first = run_pass(catalog, transports=transports, ready_wait_s=30)
    assert first.replicas[f"{model['name']}-0"].phase == "Ready"
    before = {p: p.read_bytes() for p in (root / "status").rglob("*.yaml")}
    second = run_pass(catalog, transports=transports, history=first.memory, ready_wait_s=30)
    assert second.decisions == [] and second.written == []
    assert {p: p.read_bytes() for p in (root / "status").rglob("*.yaml")} == before


def test_one_shot_apply_remembers_restarts_between_runs(cli, example):
    root, model, state = example
    rid = f"{model['name']}-0"
    env = private_state(root)
    assert cli("apply", str(root), env=env).returncode == 0
    [record] = (state / "replicas").glob("*.json")
    pid = json.loads(record.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not is_running(pid), what="engine to die")

    restarted = cli("apply", str(root), env=env)
    assert restarted.returncode == 0, restarted.stderr
    assert f"{rid}  local  start" in restarted.stdout and "restart 1" in restarted.stdout
    quiet = cli("apply", str(root), env=env)
    assert quiet.stdout.startswith("nothing to do")
    status = yaml.safe_load((root / "status" / "models" / f"{model['name']}.yaml").read_text())
    assert status["replicas"][0]["restarts"] == 1  # not forgotten by the next run
    assert list((root.parent / "xdg-state" / "llm-reconciler" / "apply-memory").glob("*.json"))


def test_a_health_check_of_a_host_name_python_cannot_encode_is_an_answer_not_a_traceback():
    ok, why = http_health("n" * 64 + ".invalid", 8000, "/health")  # refused before any lookup
    assert not ok and why == "/health did not answer: the host name cannot be encoded as a DNS name"


def test_the_readme_says_how_to_stop_what_its_first_command_started(cli, example):
    import re
    import subprocess

    root, model, state = example
    assert cli("apply", str(root), env=private_state(root)).returncode == 0
    [record] = (state / "replicas").glob("*.json")
    pid = json.loads(record.read_text())["pid"]
    readme = (REPO / "README.md").read_text()
    [stop] = re.findall(r"(?m)^kill -TERM .*$", readme)
    fleet = yaml.safe_load((REPO / "examples" / "single-machine" / "fleet.yaml").read_text())
    assert fleet["state_dir"] in stop  # the line names the example's own state dir ...
    done = subprocess.run(["bash", "-c", stop.replace(fleet["state_dir"], str(state))],  # ... here this test's
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not is_running(pid), what="the example's server to stop")


def test_a_copied_example_leaves_behind_what_a_previous_command_wrote(tmp_path):
    import subprocess

    src = tmp_path / "repo" / "examples" / "single-machine"
    (src / "models").mkdir(parents=True)
    (src / "fleet.yaml").write_text("nodes: []\n")
    (src / "models" / "m.yaml").write_text("name: m\n")
    subprocess.run(["git", "init", "-q"], cwd=src.parent.parent, check=True)
    subprocess.run(["git", "add", "-A"], cwd=src.parent.parent, check=True)
    (src / "status" / "models").mkdir(parents=True)  # what `reconciler apply` leaves
    (src / "status" / "models" / "m.yaml").write_text("phase: Ready\n")
    copied = copy_tracked(src, tmp_path / "copy")
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if p.is_file()) == ["fleet.yaml", "models/m.yaml"]


def test_a_crashed_replica_waiting_for_its_backoff_keeps_the_reason_it_died_in_status(cli, example):
    root, model, state = example
    model_file = next((root / "models").glob("*.yaml"))
    model["profiles"][0]["command"] = ["python3", "-c", "import sys; print('CUDA out of memory (fake)', flush=True); sys.exit(3)"]
    model_file.write_text(yaml.safe_dump(model, sort_keys=False))
    env = private_state(root)
    messages = []
    for _ in range(3):  # start (dies), restart at once (dies), then wait out the backoff
        cli("apply", str(root), env=env)
        replica = yaml.safe_load((root / "status" / "models" / f"{model['name']}.yaml").read_text())["replicas"][0]
        messages.append(replica["message"])
    assert "waiting for backoff" in messages[-1], messages
    assert "CUDA out of memory (fake)" in messages[-1], messages


def test_apply_writes_status_catalog_yaml_like_the_daemon(cli, example):
    import subprocess

    import jsonschema

    root, model, state = example
    assert cli("apply", str(root), env=private_state(root)).returncode == 0
    doc = yaml.safe_load((root / "status" / "catalog.yaml").read_text())
    schema = json.loads((REPO / "schema" / "status-catalog.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["last_applied_revision"] is None and doc["errors"] == []
    assert doc["message"] == "not a git repository: the directory is applied as it is"

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=root,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "catalog")
    (root / "models" / "notes.txt").write_text("uncommitted")  # an edit apply applies anyway
    assert cli("apply", str(root), env=private_state(root)).returncode == 0
    doc = yaml.safe_load((root / "status" / "catalog.yaml").read_text())
    jsonschema.validate(doc, schema)
    head = git("rev-parse", "HEAD")
    assert doc["last_applied_revision"] == doc["last_attempted_revision"] == head
    assert doc["message"] == f"revision {head[:12]} applied by reconciler apply"
    assert doc["uncommitted_changes"] == ["models/notes.txt"]
    assert doc["warnings"] == ["reconciler apply applied the working tree, uncommitted changes included: models/notes.txt"]
    # What `status` shows first is that revision.
    assert cli("status", str(root)).stdout.splitlines()[0] == f"revision {head}"


def test_each_replica_in_status_names_the_revision_its_processes_were_started_from(cli, example):
    import subprocess

    root, model, state = example

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=root,
                              check=True, capture_output=True, text=True).stdout.strip()

    def replica():
        return yaml.safe_load((root / "status" / "models" / f"{model['name']}.yaml").read_text())["replicas"][0]

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "catalog")
    first = git("rev-parse", "HEAD")
    assert cli("apply", str(root), env=private_state(root)).returncode == 0
    assert replica()["revision"] == first
    [record] = (state / "replicas").glob("*.json")
    assert json.loads(record.read_text())["revision"] == first  # kept on the node, with the rank

    (root / "README.md").write_text("a note\n")  # a new revision that changes no spec
    git("commit", "-qam", "docs")
    second = git("rev-parse", "HEAD")
    assert cli("apply", str(root), env=private_state(root)).stdout.startswith("nothing to do")
    assert replica()["revision"] == first  # still the processes of the first revision
    assert yaml.safe_load((root / "status" / "catalog.yaml").read_text())["last_applied_revision"] == second

    model_file = next((root / "models").glob("*.yaml"))
    model["profiles"][0]["env"]["TINY_NOTE"] = "v2"  # a spec change: replaced
    model_file.write_text(yaml.safe_dump(model, sort_keys=False))
    git("commit", "-qam", "spec")
    third = git("rev-parse", "HEAD")
    assert cli("apply", str(root), env=private_state(root)).returncode == 0
    assert replica()["revision"] == third and replica()["phase"] == "Ready"
