"""A one-shot command leaves its values to the process's exit (reconciler/commands/__init__.py)."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_values_left_to_exit_are_kept_only_under_python_m_reconciler():
    # In a test (or a daemon) nothing is kept: leave_to_exit would otherwise hold every pass's values.
    from reconciler import commands

    commands.leave_to_exit(object())
    assert not commands.left_to_exit()


def test_plan_under_python_m_reconciler_writes_everything_and_keeps_its_exit_code(tmp_path):
    """os._exit after the flush: the whole JSON plan arrives, and --fail-on-unplaced still exits 1."""
    (tmp_path / "models").mkdir()
    n = 300
    (tmp_path / "fleet.yaml").write_text("nodes:\n" + "".join(f"  - {{id: n{i}, address: n{i}.fleet.invalid}}\n" for i in range(n)))
    (tmp_path / "models" / "m.yaml").write_text(
        "name: m\nsource: /w\nreplicas: 2\nprofiles:\n  - {name: p, engine: vllm, gpu_class: H100-80GB}\n")
    (tmp_path / "nodes.json").write_text(json.dumps({"nodes": [{"id": f"n{i}", "state": "ready"} for i in range(n)]}))
    r = run_cli("plan", str(tmp_path), "--inventory", str(tmp_path / "nodes.json"), "--format", "json", "--all",
                "--fail-on-unplaced")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)  # complete: it parses
    assert [u["replica"] for u in doc["unplaced"]] == ["m-0", "m-1"]
    assert len(doc["unplaced"][0]["rejections"]) == n
    assert r.stderr.strip() == "reconciler: 2 replicas could not be placed"
