"""Snapshot validation: the fast hand check names node and field, and agrees with schema/inventory.schema.json."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml

from reconciler.errors import InventoryInvalid
from reconciler.observe.inventory import load_inventory, validate_inventory_document
from tests.builders import fleet, node_spec
from tests.conftest import REPO

SCHEMA = json.loads((REPO / "schema" / "inventory.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
EXAMPLE = yaml.safe_load((REPO / "catalog" / "status" / "nodes.yaml").read_text())
FLEET = fleet(*(node_spec(n["id"]) for n in EXAMPLE["nodes"]))


def n0(d):
    return d["nodes"][0]


# (name, mutation, fragment of the hand check's message; None: the document stays valid)
MUTATIONS = [
    ("unchanged", lambda d: None, None),
    ("extra field is allowed", lambda d: n0(d).__setitem__("kernel", "6.8"), None),
    ("nulls where allowed", lambda d: n0(d).update(engines=None, weights=None, memory_total_mb=None), None),
    ("extensions", lambda d: n0(d).update(ports_in_use=[22, 8000], replicas=[
        {"id": "a-0", "model": "a", "profile": "p", "rank": 0, "nnodes": 2, "pid": 7, "alive": False, "gpus": [0]}]), None),
    ("nodes missing", lambda d: d.pop("nodes"), "nodes: is required"),
    ("nodes not a list", lambda d: d.__setitem__("nodes", {"a": 1}), "nodes: must be a list"),
    ("id missing", lambda d: n0(d).pop("id"), "nodes[0].id: is required"),
    ("id malformed", lambda d: n0(d).__setitem__("id", "Bad_Id"), "is not a valid node id"),
    ("state", lambda d: n0(d).__setitem__("state", "asleep"), "state: must be one of"),
    ("label not a string", lambda d: n0(d)["labels"].__setitem__("zone", 3), "labels.zone: must be a string"),
    ("gpu index negative", lambda d: n0(d)["gpus"][0].__setitem__("index", -1), "gpus[0].index: must be at least 0"),
    ("gpu index bool", lambda d: n0(d)["gpus"][0].__setitem__("index", True), "gpus[0].index: must be an integer"),
    ("gpu missing index", lambda d: n0(d)["gpus"][0].pop("index"), "gpus[0].index: is required"),
    ("peer not int", lambda d: n0(d)["gpus"][0].__setitem__("nvlink_peers", ["x"]), "nvlink_peers[0]: must be an integer"),
    ("engines not map", lambda d: n0(d).__setitem__("engines", ["vllm"]), "engines: must be a mapping or null"),
    ("disk path missing", lambda d: n0(d)["disks"][0].pop("path"), "disks[0].path: is required"),
    ("disk path not a string", lambda d: n0(d)["disks"][0].__setitem__("path", 5), "disks[0].path: must be a string, not the number 5"),
    ("fabric name missing", lambda d: n0(d).__setitem__("fabrics", [{"hcas": ["mlx5_0"]}]), "fabrics[0].name: is required"),
    ("replica without model", lambda d: n0(d).__setitem__("replicas", [{"id": "a-0", "profile": "p"}]), "replicas[0].model: is required"),
    ("replica nnodes zero", lambda d: n0(d).__setitem__("replicas", [{"id": "a-0", "model": "a", "profile": "p", "nnodes": 0}]),
     "replicas[0].nnodes: must be at least 1"),
    ("port out of range", lambda d: n0(d).__setitem__("ports_in_use", [70000]), "ports_in_use[0]: must be at most 65535"),
    ("replica port out of range", lambda d: n0(d).__setitem__("replicas", [{"id": "a-0", "model": "a", "profile": "p", "port": 65536}]),
     "replicas[0].port: must be at most 65535"),
    ("alive not bool", lambda d: n0(d).__setitem__("replicas", [{"id": "a-0", "model": "a", "profile": "p", "alive": "yes"}]),
     "replicas[0].alive: must be true or false"),
]


@pytest.mark.parametrize("name,mutate,fragment", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_hand_check_agrees_with_the_json_schema(name, mutate, fragment):
    doc = copy.deepcopy(EXAMPLE)
    mutate(doc)
    problems = validate_inventory_document(doc, FLEET)
    schema_ok = VALIDATOR.is_valid(doc)
    if fragment is None:
        assert problems == [] and schema_ok
    else:
        assert not schema_ok, "the schema must refuse what the hand check refuses"
        assert any(fragment in p.message for p in problems), [p.message for p in problems]


# Consistency rules a schema cannot express: the hand check alone.
CONTRADICTIONS = [
    ("gpu held by two replicas", lambda d: n0(d).__setitem__("replicas", [
        {"id": "a-0", "model": "a", "profile": "p", "gpus": [1]}, {"id": "b-0", "model": "b", "profile": "p", "gpus": [1]}]),
     "node a100-b1: replicas[1].gpus[0]: GPU 1 is held by two replicas: a-0 and b-0"),
    ("replica holds a gpu the node lacks", lambda d: n0(d).__setitem__("replicas", [
        {"id": "a-0", "model": "a", "profile": "p", "gpus": [12]}]),
     "node a100-b1: replicas[0].gpus[0]: replica a-0 holds GPU 12, which this node does not have"),
    ("nvlink peer does not exist", lambda d: n0(d)["gpus"][3].__setitem__("nvlink_peers", [0, 8]),
     "node a100-b1: gpus[3].nvlink_peers[1]: NVLink peer 8 does not exist (GPU indices: 0-7)"),
    ("duplicate gpu index", lambda d: n0(d)["gpus"][1].__setitem__("index", 0),
     "node a100-b1: gpus[1].index: GPU index 0 appears twice"),
    ("duplicate node id", lambda d: d["nodes"][1].__setitem__("id", "a100-b1"),
     "node a100-b1: id: node a100-b1 appears twice (nodes[0] and nodes[1])"),
    ("node not in the fleet", lambda d: n0(d).__setitem__("id", "stranger"), "node stranger: id: node stranger is not in fleet.yaml"),
]


@pytest.mark.parametrize("name,mutate,message", CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_self_contradicting_snapshot_is_refused_naming_node_and_field(name, mutate, message):
    doc = copy.deepcopy(EXAMPLE)
    mutate(doc)
    assert any(p.message.startswith(message) for p in validate_inventory_document(doc, FLEET))


def test_gpu_indices_far_apart_are_listed_not_spanned():
    # Wording the missing peer once built the range between the lowest and highest index: 2**63 overflowed.
    doc = copy.deepcopy(EXAMPLE)
    n0(doc)["gpus"][7]["index"] = 2**63
    n0(doc)["gpus"][3]["nvlink_peers"] = [8]
    assert ("node a100-b1: gpus[3].nvlink_peers[0]: NVLink peer 8 does not exist (GPU indices: 0, 1, 2, 3, 4, 5, 6, "
            "9223372036854775808)") in [p.message for p in validate_inventory_document(doc, FLEET)]


def test_every_problem_is_reported_not_just_the_first(tmp_path):
    doc = copy.deepcopy(EXAMPLE)
    doc["nodes"][0]["state"] = "asleep"
    doc["nodes"][2]["gpus"][0]["nvlink_peers"] = [99]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InventoryInvalid) as err:
        load_inventory(path, FLEET)
    assert len(err.value.problems) == 2
    ids = [doc["nodes"][0]["id"], doc["nodes"][2]["id"]]
    assert [p.message.split(":")[0] for p in err.value.problems] == [f"node {i}" for i in ids]
    # lines point into the file, at or after the node they name
    lines = path.read_text().splitlines()
    for p, nid in zip(err.value.problems, ids):
        assert any(f"id: {nid}" in l for l in lines[: p.line])


def test_unknown_nodes_can_be_ignored_as_spec_section_3_says(tmp_path):
    doc = copy.deepcopy(EXAMPLE)
    doc["nodes"][0]["id"] = "stranger"
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps(doc))
    inv = load_inventory(path, FLEET, unknown_nodes="ignore")
    assert inv.node("stranger") is None and len(inv.nodes) == len(EXAMPLE["nodes"]) - 1


def test_every_field_of_the_snapshot_schema_is_described():
    undocumented = []

    def walk(node, where):
        if not isinstance(node, dict):
            return
        for name, sub in (node.get("properties") or {}).items():
            if "description" not in sub:
                undocumented.append(f"{where}.{name}")
            walk(sub, f"{where}.{name}")
        walk(node.get("items"), f"{where}[]")
        for name, sub in (node.get("$defs") or {}).items():
            walk(sub, f"$defs.{name}")

    walk(SCHEMA, "")
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert undocumented == []


# Several problems on several nodes at once, to hold the order and wording of the whole list.
def _many(d):
    n0(d)["state"] = None
    n0(d)["gpus"][2]["memory_used_mb"] = -5
    n0(d)["gpus"][4]["processes"] = [{"name": 3}]
    n0(d)["replicas"] = [{"id": "a-0", "model": "a", "profile": "p", "gpus": [0, 99], "pid": "x"},
                         {"id": "b-0", "model": "b", "profile": "p", "gpus": [0]}]
    d["nodes"][1]["fabrics"] = [{"name": ""}, "ib0"]
    d["nodes"][1]["weights"] = ["/m/a", 7]
    d["nodes"][1]["disks"] = [{"path": "/m", "free_bytes": 1.5}]
    d["nodes"][2]["id"] = 12
    d["nodes"].append("not a node")


GOLDEN_CASES = [(m[0], m[1]) for m in MUTATIONS + CONTRADICTIONS] + [
    ("many at once", _many),
    ("nodes null", lambda d: d.__setitem__("nodes", None)),
    ("replica without model and profile", lambda d: n0(d).__setitem__("replicas", [{"id": "a-0"}, {}])),
]
GOLDEN_MESSAGES = REPO / "tests" / "data" / "golden" / "inventory-messages.json"


def test_every_message_reads_as_before():
    """The whole list of problems, word for word, in order, as the hand-written checker said them
    (written once from it, before the schema took over: tests/data/golden/inventory-messages.json)."""
    got = {}
    for name, mutate in GOLDEN_CASES:
        doc = copy.deepcopy(EXAMPLE)
        mutate(doc)
        got[name] = [p.message for p in validate_inventory_document(doc, FLEET)]
    want = json.loads(GOLDEN_MESSAGES.read_text())
    assert got == {name: want[name] for name, _ in GOLDEN_CASES}
    assert [p.message for p in validate_inventory_document(["a list"], FLEET)] == want["document not a mapping"]


def test_problems_are_placed_on_the_lines_of_their_fields(tmp_path):
    doc = copy.deepcopy(EXAMPLE)
    _many(doc)
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(InventoryInvalid) as err:
        load_inventory(path, FLEET)
    want = json.loads(GOLDEN_MESSAGES.read_text())["many at once (lines)"]
    assert [[p.line, p.message] for p in err.value.problems] == want


def test_block_yaml_reads_as_json_does(tmp_path):
    from reconciler.record.status.files import dump_yaml

    doc = copy.deepcopy(EXAMPLE)
    (tmp_path / "nodes.yaml").write_text(dump_yaml(doc))
    (tmp_path / "nodes.json").write_text(json.dumps(doc))
    assert load_inventory(tmp_path / "nodes.yaml", FLEET) == load_inventory(tmp_path / "nodes.json", FLEET)


def test_values_yaml_1_1_and_1_2_read_differently_are_read_as_pyyaml_writes_them(tmp_path):
    # PyYAML (YAML 1.1) writes these strings unquoted; a YAML 1.2 reader sees numbers in them.
    # The snapshot is read again by PyYAML when the fast reading is refused.
    doc = copy.deepcopy(EXAMPLE)
    n0(doc)["labels"] = {"rack": "1e3", "0o17": "x"}
    n0(doc)["reason"] = "0o17"
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert "rack: 1e3" in path.read_text()
    node = load_inventory(path, FLEET).node(n0(doc)["id"])
    assert dict(node.labels) == {"rack": "1e3", "0o17": "x"} and node.reason == "0o17"
