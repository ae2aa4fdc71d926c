"""What a new user sees when they type something wrong: exit codes and messages, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process]



def local_catalog(root: Path) -> Path:
    """A one-node `transport: local` catalog with no models: nothing it does reaches past this machine."""
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(
        f"state_dir: {root / 'state'}\nnodes:\n  - id: here\n    address: 127.0.0.1\n    transport: local\n"
    )
    return root


def test_engine_check_of_an_engine_missing_on_a_local_node_exits_1_not_unreachable(cli, tmp_path):
    catalog = local_catalog(tmp_path / "catalog")
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    r = cli("engine-check", "here", "vllm", str(catalog), env={"PATH": str(empty_path)})
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "here: vllm: cannot run vllm: No such file or directory" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("flag", ["--git-pull", "--commit-status"])
def test_run_with_a_git_flag_on_a_catalog_outside_git_is_a_usage_error_not_silently_ignored(cli, tmp_path, flag):
    catalog = local_catalog(tmp_path / "catalog")
    r = cli("run", str(catalog), flag, "--max-passes", "1", timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{flag} needs the catalog in a git repository" in r.stderr and str(catalog) in r.stderr
    assert not (catalog / "status").exists()  # refused before any pass


def test_validate_reports_a_models_path_that_is_a_file_instead_of_finding_no_models(cli, tmp_path):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "fleet.yaml").write_text("nodes:\n  - id: here\n    address: 127.0.0.1\n    transport: local\n")
    (catalog / "models").write_text("name: oops\n")  # meant models/oops.yaml
    r = cli("validate", str(catalog))
    assert r.returncode == 1, r.stdout
    assert "models:1:1: not a directory; models/ holds one YAML file per model" in r.stderr


def test_inventory_argument_that_is_missing_is_the_same_usage_error_for_validate_and_plan(cli, tmp_path):
    catalog = local_catalog(tmp_path / "catalog")
    for command in (["validate"], ["plan"]):
        r = cli(*command, str(catalog), "--inventory", str(tmp_path / "nope.yaml"))
        assert r.returncode == 2, (command, r.returncode, r.stderr)
        assert f"--inventory {tmp_path / 'nope.yaml'}: no such file" in r.stderr, command


def test_inventory_argument_that_is_a_directory_says_so(cli, tmp_path):
    catalog = local_catalog(tmp_path / "catalog")
    r = cli("plan", str(catalog), "--inventory", str(catalog))
    assert r.returncode == 2
    assert f"--inventory {catalog}: is a directory; give the snapshot file (status/nodes.yaml)" in r.stderr


def test_status_message_of_a_refused_catalog_counts_one_error_in_the_singular(tmp_path):
    from reconciler.control.loop import Daemon
    from reconciler.errors import Problem

    catalog = local_catalog(tmp_path / "catalog")
    d = Daemon(catalog, pass_fn=lambda *a, **k: None)
    d.state.errors = [Problem("models/m.yaml", 6, 11, "replicas: expected an integer")]
    assert "(1 error)" in d.status_document()["message"]
    d.state.errors = d.state.errors * 2
    assert "(2 errors)" in d.status_document()["message"]


def test_nodes_summary_does_not_call_a_reached_node_that_could_not_be_probed_usable(capsys):
    from reconciler.commands.nodes import print_table
    from reconciler.model import Inventory, ObservedNode
    from reconciler.observe.probe import FleetProbe
    from reconciler.observe.probe.collect import NodeProbe

    ok = ObservedNode(id="a", state="ready", memory_total_mb=1024, engines={}, weights=())
    nopy = ObservedNode(id="b", state="unreachable", reason="python3 is not on the node's login PATH; the probe needs it")
    print_table(FleetProbe(Inventory((ok, nopy)), (NodeProbe(ok), NodeProbe(nopy, reached=True))))
    out = capsys.readouterr().out
    assert "2 of 2 nodes reached; 1 could not be probed (b: see REASON)" in out


def test_a_status_directory_that_cannot_be_written_is_a_message_not_a_traceback(cli, tmp_path):
    catalog = local_catalog(tmp_path / "catalog")
    (catalog / "status").write_text("")  # a file where status/ should be: every status write fails
    snapshot = tmp_path / "nodes.yaml"
    snapshot.write_text("nodes:\n  - id: here\n    state: ready\n")
    for command in (["plan", str(catalog), "--inventory", str(snapshot), "--write-status"], ["nodes", str(catalog)]):
        r = cli(*command)
        assert "Traceback" not in r.stderr, (command, r.stderr)
        assert r.returncode == 1, (command, r.returncode)
        assert f"reconciler: cannot write {catalog / 'status'}/" in r.stderr and "Not a directory" in r.stderr, r.stderr


def test_status_write_error_is_still_an_oserror_for_callers_that_carry_on(tmp_path):
    from reconciler.errors import ReconcilerError
    from reconciler.record.status.files import write_if_changed

    (tmp_path / "status").write_text("")
    with pytest.raises(OSError) as err:
        write_if_changed(tmp_path / "status" / "x.yaml", "a: 1\n")
    assert isinstance(err.value, ReconcilerError) and err.value.strerror == "Not a directory"


def test_plan_with_only_unplaced_replicas_does_not_say_every_replica_runs_where_it_should(cli, tmp_path):
    catalog = local_catalog(tmp_path / "catalog")
    (catalog / "models" / "big.yaml").write_text(
        "name: big\nsource: /models/big\nprofiles:\n  - name: h100\n    engine: vllm\n    gpu_class: H100-80GB\n"
    )
    snapshot = tmp_path / "nodes.yaml"
    snapshot.write_text("nodes:\n  - id: here\n    state: ready\n    engines: {vllm: ''}\n    gpus: []\n")
    r = cli("plan", str(catalog), "--inventory", str(snapshot))
    assert r.returncode == 0, r.stderr
    assert "every replica runs where it should" not in r.stdout
    assert r.stdout.startswith("no action to take: 1 replica cannot be placed (below)")
    assert "big-0" in r.stdout


def test_applied_status_of_an_unplaced_replica_matches_the_predicted_one_and_apply_says_why(cli, tmp_path):
    # plan --write-status in a pull request and the daemon's status afterwards must agree, or
    # every status commit rewrites the message; and apply must say why nothing started.
    catalog = local_catalog(tmp_path / "catalog")
    (catalog / "models" / "big.yaml").write_text(
        "name: big\nsource: /models/big\nprofiles:\n  - name: huge\n    engine: command\n    command: [x]\n"
        "    port: 9999\n    gpu_class: H100-80GB\n    gpus_per_node: 64\n"
    )
    r = cli("apply", str(catalog))
    assert r.returncode == 0, r.stderr
    assert "big-0" in r.stdout and "cannot be placed: 0/1 nodes fit profile huge" in r.stdout
    assert "nothing to do" not in r.stdout
    applied = (catalog / "status" / "models" / "big.yaml").read_text()
    assert "message: 'cannot be placed: 0/1 nodes fit profile huge" in applied
    p = cli("plan", str(catalog), "--inventory", str(catalog / "status" / "nodes.yaml"), "--write-status")
    assert p.returncode == 0, p.stderr
    assert (catalog / "status" / "models" / "big.yaml").read_text() == applied


def test_nodes_table_on_a_narrow_terminal_folds_only_the_reason_column(monkeypatch):
    import io
    import re
    import sys

    from reconciler.commands.nodes import print_table
    from reconciler.model import Disk, Inventory, ObservedNode
    from reconciler.observe.probe import FleetProbe
    from reconciler.observe.probe.collect import NodeProbe

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    ok = ObservedNode(id="gpu-a", state="ready", memory_total_mb=24105, engines={"llama.cpp": "", "vllm": ""},
                      disks=(Disk("/models", 79 << 30, 251 << 30),), weights=())
    nopy = ObservedNode(id="nopy", state="unreachable", reason="python3 is not on the node's login PATH; the probe needs it")
    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", "110")
    print_table(FleetProbe(Inventory((ok, nopy)), (NodeProbe(ok), NodeProbe(nopy))))
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    row = next(line for line in text.splitlines() if line.startswith("nopy"))
    assert row.split()[:2] == ["nopy", "unreachable"], text
    assert "79 GiB free of 251 GiB" in text and "llama.cpp, vllm" in text
    words = " ".join(text.split())
    assert "python3 is not on the node's login PATH; the probe needs it" in re.sub(r"\s+", " ", words), text


def test_nodes_shows_an_unusable_nodes_gpus_as_unknown_and_says_a_failure_is_permanent():
    from reconciler.commands.nodes import row
    from reconciler.model import ObservedNode

    smi = ObservedNode(id="smi", state="unusable", reason="GPUs unknown: nvidia-smi printed an unexpected format",
                       failure="permanent", memory_total_mb=1024)
    cells = row(smi)
    assert cells[1:3] == ["unusable", "?"]
    assert cells[-1] == "GPUs unknown: nvidia-smi printed an unexpected format (permanent)"
    cut = ObservedNode(id="cut", state="unreachable", reason="timed out connecting", failure="temporary")
    assert row(cut)[-1] == "timed out connecting"


def test_validate_in_a_directory_that_is_no_catalog_says_so_once_instead_of_walking_everything_below(cli, tmp_path):
    # A user who runs `reconciler validate` in the wrong directory (a home, /tmp) must not get a
    # "looks like a model file" line for every YAML file of every project below it.
    for project in ("a", "b/c"):
        (tmp_path / project / "models").mkdir(parents=True)
        (tmp_path / project / "models" / "m.yaml").write_text("name: m\nsource: /x\nprofiles: []\n")
    r = cli("validate", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"fleet.yaml:1:1: missing: {tmp_path} is not a catalog; a catalog is a directory with fleet.yaml and models/",
        "1 problem found",
    ]


def test_output_cut_short_by_a_closed_pipe_is_not_a_traceback(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    # 2,000 nodes that all reject one replica: a JSON plan far larger than a pipe's buffer,
    # read by a consumer that stops after one byte. Planned offline: nothing is dialled.
    n = 2000
    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text("nodes:\n" + "".join(f"  - {{id: n{i}, address: n{i}.fleet.invalid}}\n" for i in range(n)))
    (tmp_path / "models" / "m.yaml").write_text(
        "name: m\nsource: /w\nprofiles:\n  - {name: p, engine: vllm, gpu_class: H100-80GB}\n")
    snapshot = tmp_path / "nodes.json"
    snapshot.write_text(json.dumps({"nodes": [{"id": f"n{i}", "state": "ready"} for i in range(n)]}))
    proc = subprocess.run(
        f"{sys.executable} -m reconciler plan . --inventory nodes.json --format json --all | head -c 1",
        shell=True, capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout == "{"
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
