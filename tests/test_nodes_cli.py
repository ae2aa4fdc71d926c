"""`reconciler nodes` and `reconciler engine-check` on a namespaced fleet, through the real CLI."""

from __future__ import annotations

import json

import pytest
import yaml

from reconciler.observe.inventory import inventory_from_document, read_snapshot_document
from tests.fleet import fleet  # noqa: F401  (pytest fixture)

pytestmark = [pytest.mark.fleet]

VLLM_VERSIONED = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "0.6.3.post1"; exit 0; fi
touch "$HOME/vllm-served"
"""


@pytest.fixture(scope="module")
def catalog(fleet, tmp_path_factory):  # noqa: F811
    fleet.add_node("gpu-a", gpus=["H100"] * 4, engines=["vllm"], executables={"vllm": VLLM_VERSIONED},
                   fabrics={"ib-a": ["mlx5_0"]}, models=["small"], labels={"zone": "a"})
    fleet.add_node("cpu-b", engines=["llama.cpp", "sglang"])
    fleet.add_node("down-c")
    fleet.kill_sshd("down-c")
    root = tmp_path_factory.mktemp("catalog")
    fleet.fleet_yaml(root)
    (root / "models").mkdir()
    (root / "models" / "small.yaml").write_text(
        f"name: small\nsource: {fleet.models_dir}/small\nprofiles:\n  - name: h100\n    engine: vllm\n    gpu_class: H100-80GB\n"
    )
    return root


def test_nodes_json_is_the_snapshot_and_status_nodes_yaml_is_written(cli, catalog, fleet):  # noqa: F811
    r = cli("nodes", str(catalog), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by_id = {n["id"]: n for n in doc["nodes"]}
    assert by_id["gpu-a"]["engines"] == {"vllm": ""}
    assert [g["class"] for g in by_id["gpu-a"]["gpus"]] == ["H100-80GB"] * 4
    assert by_id["gpu-a"]["weights"] == [f"{fleet.models_dir}/small"]
    assert by_id["gpu-a"]["fabrics"] == [{"name": "ib-a", "hcas": ["mlx5_0"]}]
    assert by_id["cpu-b"]["engines"] == {"llama.cpp": "", "sglang": ""}
    assert by_id["down-c"]["state"] == "unreachable" and "connection refused" in by_id["down-c"]["reason"]
    written = read_snapshot_document(catalog / "status" / "nodes.yaml")
    assert written == doc
    inv = inventory_from_document(written)
    assert inv.node("gpu-a").gpus[0].gpu_class == "H100-80GB" and inv.node("down-c").engines is None
    # nothing of the node's engine ran
    assert not (fleet.node("gpu-a").dir / "home" / "vllm-served").exists()


def test_nodes_rewrites_the_status_file_only_when_the_fleet_changed(cli, catalog):
    assert cli("nodes", str(catalog), "--format", "json").returncode == 0
    path = catalog / "status" / "nodes.yaml"
    before = path.stat().st_mtime_ns
    assert cli("nodes", str(catalog), "--format", "json").returncode == 0
    assert path.stat().st_mtime_ns == before


def test_nodes_table_has_a_row_per_node_with_gpus_engines_and_reasons(cli, catalog):
    r = cli("nodes", str(catalog))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "GPUS", "ENGINES", "FABRICS", "MEMORY", "DISK", "REASON"]
    gpu_a = next(line for line in lines if line.startswith("gpu-a"))
    assert "4x H100-80GB (4 free)" in gpu_a and "vllm" in gpu_a and "ib-a (mlx5_0)" in gpu_a
    down = next(line for line in lines if line.startswith("down-c"))
    assert "unreachable" in down and "connection refused" in down
    assert "2 of 3 nodes reached" in r.stdout


def test_nodes_exits_3_when_no_node_can_be_reached(cli, fleet, tmp_path):  # noqa: F811
    fleet.fleet_yaml(tmp_path, nodes=["down-c"])
    r = cli("nodes", str(tmp_path))
    assert r.returncode == 3
    assert "no node of the fleet could be reached" in r.stderr
    assert yaml.safe_load((tmp_path / "status" / "nodes.yaml").read_text())["nodes"][0]["state"] == "unreachable"


def test_engine_check_runs_the_version_on_purpose(cli, catalog, fleet):  # noqa: F811
    r = cli("engine-check", "gpu-a", "vllm", str(catalog))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "gpu-a: vllm: 0.6.3.post1"
    r = cli("engine-check", "cpu-b", "sglang", str(catalog))
    installed = (fleet.node("cpu-b").dir / "python" / "sglang" / "__init__.py").read_text()
    version = installed.split("__version__ = ", 1)[1].split()[0].strip("\"'")
    assert r.returncode == 0 and r.stdout.strip() == f"cpu-b: sglang: {version}"


def test_engine_check_of_a_missing_engine_unknown_node_and_unreachable_node(cli, catalog):
    r = cli("engine-check", "cpu-b", "vllm", str(catalog))
    assert r.returncode == 1 and "exited 127" in r.stderr
    r = cli("engine-check", "nope", "vllm", str(catalog))
    assert r.returncode == 2 and "no node 'nope'" in r.stderr
    r = cli("engine-check", "gpu-a", "tensorrt", str(catalog))
    assert r.returncode == 2 and "unknown engine" in r.stderr
    r = cli("engine-check", "down-c", "vllm", str(catalog))
    assert r.returncode == 3 and "connection refused" in r.stderr
    assert "Traceback" not in r.stderr
