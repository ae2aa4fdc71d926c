"""fleet.yaml's Slurm surface (SPEC section 8): `slurm:`, `launcher:`, `slurm_name`, `owner:`."""

from __future__ import annotations

import subprocess

import pytest

from reconciler.catalog import load_catalog
from reconciler.owner import catalog_owner
from tests.catalog_files import MODEL, problems_of, write_catalog

pytestmark = [pytest.mark.process]

FLEET = """\
slurm:
  submit_via: login1
  partition: gpu
  account: inference
  extra_args: ["--constraint=h100"]
nodes:
  - id: login1
    address: 10.9.0.1
  - id: a1
    address: 10.9.0.2
    launcher: slurm
    slurm_name: gpu-a1
  - id: a2
    address: 10.9.0.3
    launcher: slurm
"""


def test_slurm_section_and_node_fields_build_the_fleet(tmp_path):
    catalog = load_catalog(write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": MODEL}))
    slurm = catalog.fleet.slurm
    assert (slurm.submit_via, slurm.partition, slurm.account, slurm.qos) == ("login1", "gpu", "inference", None)
    assert slurm.time_limit == "UNLIMITED"
    assert slurm.extra_args == ("--constraint=h100",)
    nodes = {n.id: n for n in catalog.fleet.nodes}
    assert nodes["login1"].launcher == "ssh"
    assert (nodes["a1"].launcher, nodes["a1"].slurm_node_name) == ("slurm", "gpu-a1")
    assert nodes["a2"].slurm_node_name == "a2"  # default: the node id


CASES = {
    "submit_via_names_no_node": (
        FLEET.replace("submit_via: login1", "submit_via: login9"),
        "fleet.yaml:2:15",
        "submit_via 'login9' is neither a node id of this fleet nor `local`",
    ),
    "launcher_slurm_without_slurm_section": (
        "nodes:" + FLEET.split("nodes:")[1],
        "fleet.yaml:6:15",
        "node a1: launcher: slurm needs a `slurm:` section",
    ),
    "unknown_launcher": (
        FLEET.replace("launcher: slurm\n    slurm_name", "launcher: pbs\n    slurm_name"),
        "fleet.yaml:11:15",
        "launcher: string 'pbs' is not one of: ssh, slurm",
    ),
    "two_nodes_one_slurm_name": (
        FLEET.replace("slurm_name: gpu-a1", "slurm_name: a2"),
        "fleet.yaml:13:9",
        "node a2: Slurm node a2 is also node a1",
    ),
    "unknown_slurm_field": (
        FLEET.replace("partition: gpu", "partiton: gpu"),
        "fleet.yaml:3:3",
        "unknown field 'partiton' (did you mean 'partition'?)",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_slurm_mistake_is_reported_at_its_position(tmp_path, name):
    fleet, where, phrase = CASES[name]
    problems = problems_of(write_catalog(tmp_path, {"fleet.yaml": fleet, "models/llama.yaml": MODEL}))
    matching = [p for p in problems if p.startswith(where) and phrase in p]
    assert matching, f"expected {where} ... {phrase!r}, got {problems}"


def test_owner_is_fleet_yaml_owner_else_the_repositorys_first_commit_on_every_clone(tmp_path):
    origin = write_catalog(tmp_path / "origin", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["-C", str(origin), "init", "-q"], check=True)
    subprocess.run(git + ["-C", str(origin), "add", "."], check=True)
    subprocess.run(git + ["-C", str(origin), "commit", "-qm", "first"], check=True)
    first = subprocess.run(["git", "-C", str(origin), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (origin / "models/llama.yaml").write_text(MODEL.replace("replicas: 2", "replicas: 3"))
    subprocess.run(git + ["-C", str(origin), "commit", "-qam", "second"], check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)
    assert catalog_owner(load_catalog(origin)) == first[:12]
    assert catalog_owner(load_catalog(clone)) == first[:12]
    (clone / "fleet.yaml").write_text("owner: team-a\n" + FLEET)
    assert catalog_owner(load_catalog(clone)) == "team-a"
