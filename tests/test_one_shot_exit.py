"""A one-shot command leaves its values to the process's exit (reconciler/teardown.py)."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_values_left_to_exit_are_kept_only_under_python_m_reconciler():
    # In a test (or a daemon) nothing is kept: leave_to_exit would otherwise hold every pass's values.
    from reconciler import teardown

    teardown.leave_to_exit(object())
    assert not teardown.left_to_exit()


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


def test_only_plan_and_explain_leave_values_to_the_exit():
    # A command that runs passes (run, apply) or serves (dashboard, gateway) declared one-shot would keep
    # every pass's placer and every reload's fleet.yaml for the life of the process.
    import importlib
    import pkgutil

    import reconciler.commands

    one_shot = {m.name for m in pkgutil.iter_modules(reconciler.commands.__path__) if not m.name.startswith("_")
                and getattr(importlib.import_module(f"reconciler.commands.{m.name}"), "ONE_SHOT", False)}
    assert one_shot == {"plan", "explain"}


def test_a_plan_in_a_long_lived_process_frees_its_working_state(tmp_path):
    """decide.plan hands its placer to leave_to_exit: outside a one-shot command it is freed when plan returns."""
    import gc

    from reconciler import teardown
    from reconciler.catalog import load_catalog
    from reconciler.decide import plan as planning
    from reconciler.observe.inventory import load_inventory

    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text("nodes:\n  - {id: a, address: a.fleet.invalid}\n")
    (tmp_path / "models" / "m.yaml").write_text(
        "name: m\nsource: /w\nreplicas: 1\nprofiles:\n  - {name: p, engine: vllm}\n")
    (tmp_path / "nodes.json").write_text(json.dumps({"nodes": [{"id": "a", "state": "ready", "engines": {"vllm": "0.6"}}]}))
    catalog = load_catalog(tmp_path)
    result = planning.plan(catalog, load_inventory(tmp_path / "nodes.json"))
    assert [a.replica for a in result.actions] == ["m-0"]
    gc.collect()
    assert not teardown.left_to_exit()
    assert [o for o in gc.get_objects() if isinstance(o, planning._Diff)] == []
