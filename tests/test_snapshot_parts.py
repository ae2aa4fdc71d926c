"""A block-style snapshot read in parts (inventory.reading.read_snapshot_parts): the same Inventory
and the same problems as the whole document gives, whatever the file holds."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import yaml

from reconciler.errors import InventoryInvalid
from reconciler.observe.inventory import load_inventory, read_snapshot_document
from reconciler.observe.inventory import reading
from reconciler.observe.inventory.reading import SNAPSHOT_PARTS, read_snapshot_parts
from reconciler.record.status.files import dump_yaml
from tests.builders import fleet, node_spec
from tests.conftest import REPO

EXAMPLE = yaml.safe_load((REPO / "catalog" / "status" / "nodes.yaml").read_text())
COUNT = 40
IDS = [f"node-{i:03d}" for i in range(COUNT)]
FLEET = fleet(*(node_spec(i) for i in IDS))


def _doc() -> dict:
    nodes = []
    for i, nid in enumerate(IDS):
        node = copy.deepcopy(EXAMPLE["nodes"][i % len(EXAMPLE["nodes"])])
        node["id"] = nid
        nodes.append(node)
    return {"nodes": nodes}


@pytest.fixture
def in_parts(monkeypatch):
    """Every snapshot of the block shape is read in parts, however small (the test files are)."""
    monkeypatch.setattr(reading, "PARTS_MIN_BYTES", 0)


def _whole(monkeypatch, path, fleet_=FLEET):
    """What the one-document reading gives (no file is read in parts)."""
    with monkeypatch.context() as m:
        m.setattr(reading, "PARTS_MIN_BYTES", 1 << 60)
        try:
            return load_inventory(path, fleet_)
        except InventoryInvalid as exc:
            return [(p.line, p.message) for p in exc.problems]


def _parts(path, fleet_=FLEET):
    try:
        return load_inventory(path, fleet_)
    except InventoryInvalid as exc:
        return [(p.line, p.message) for p in exc.problems]


def test_a_status_snapshot_is_read_in_parts_and_reads_as_its_json(tmp_path, in_parts):
    doc = _doc()
    (tmp_path / "nodes.yaml").write_text("# yaml-language-server: $schema=x.json\n" + dump_yaml(doc))
    (tmp_path / "nodes.json").write_text(json.dumps(doc))
    parts = list(read_snapshot_parts(tmp_path / "nodes.yaml"))
    assert len(parts) == SNAPSHOT_PARTS
    assert [n for p in parts for n in p["nodes"]] == doc["nodes"]
    inv = load_inventory(tmp_path / "nodes.yaml", FLEET)
    assert [n.id for n in inv.nodes] == IDS
    assert inv == load_inventory(tmp_path / "nodes.json", FLEET)


@pytest.mark.parametrize("text", [
    "nodes: []\n",
    "---\nnodes:\n- id: node-000\n",
    "nodes:\n- id: node-000\nreason: another top-level key\n",
    "nodes:\n  - id: node-000\n  - id: node-001\n",  # items indented: not the shape status/ writes
    '{"nodes": [{"id": "node-000"}, {"id": "node-001"}]}\n',
], ids=["empty", "document marker", "another key", "indented items", "json"])
def test_a_file_of_any_other_shape_is_one_document(tmp_path, in_parts, text):
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    assert list(read_snapshot_parts(path)) == [read_snapshot_document(path)]


def test_an_alias_of_an_anchor_in_another_part_is_read_whole(tmp_path, in_parts, monkeypatch):
    doc = _doc()
    text = dump_yaml(doc).replace("- id: node-000\n", "- id: node-000\n  labels: &shared {zone: z9}\n", 1)
    text = text.replace("- id: node-039\n", "- id: node-039\n  labels: *shared\n", 1)
    text = text.replace("  labels:\n", "  labels_seen:\n")  # the original labels of those two, renamed away
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    with pytest.raises(reading.PartUnreadable):
        list(read_snapshot_parts(path))
    inv = load_inventory(path, FLEET)
    assert dict(inv.node("node-039").labels) == {"zone": "z9"} == dict(inv.node("node-000").labels)
    assert inv == _whole(monkeypatch, path)


def test_a_quoted_value_whose_lines_reach_column_0_is_read_as_pyyaml_reads_it(tmp_path, in_parts, monkeypatch):
    # PyYAML reads a double-quoted scalar whose next line starts at column 0; cut there, the part
    # before holds half a string and does not parse, and the whole file is read again.
    doc = _doc()
    doc["nodes"][19]["reason"] = "to be cut"
    text = dump_yaml(doc).replace("reason: to be cut\n", 'reason: "first half\n- id: still the reason"\n', 1)
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    with pytest.raises(reading.PartUnreadable):
        list(read_snapshot_parts(path))
    inv = load_inventory(path, FLEET)
    assert inv.node("node-019").reason == "first half - id: still the reason"
    assert inv == _whole(monkeypatch, path)


def test_a_problem_in_a_later_part_is_said_with_its_line_as_the_whole_file_says_it(tmp_path, in_parts, monkeypatch):
    doc = _doc()
    doc["nodes"][35]["gpus"][0]["index"] = -1
    doc["nodes"][36]["state"] = "asleep"
    path = tmp_path / "nodes.yaml"
    path.write_text(dump_yaml(doc))
    got = _parts(path)
    assert isinstance(got, list) and got == _whole(monkeypatch, path)
    said = [m for _, m in got]
    assert said[0] == "node node-035: gpus[0].index: must be at least 0, not -1"
    assert said[-1].startswith("node node-036: state: must be one of") and said[-1].endswith("not the string 'asleep'")
    assert got[0][0] > 1  # placed on a line of node-035, not at the top of the file


def test_a_node_id_given_in_two_parts_is_said_as_the_whole_file_says_it(tmp_path, in_parts, monkeypatch):
    doc = _doc()
    doc["nodes"][38]["id"] = "node-001"
    path = tmp_path / "nodes.yaml"
    path.write_text(dump_yaml(doc))
    got = _parts(path)
    assert got == _whole(monkeypatch, path)
    assert any("node node-001 appears twice (nodes[1] and nodes[38])" in m for _, m in got)


def test_no_parsing_thread_outlives_a_refused_part(tmp_path, in_parts):
    doc = _doc()
    doc["nodes"][3]["state"] = "asleep"  # a problem in the first part: the caller stops there
    path = tmp_path / "nodes.yaml"
    path.write_text(dump_yaml(doc))
    before = threading.active_count()
    with pytest.raises(InventoryInvalid):
        load_inventory(path, FLEET)
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("snapshot-parts")]


def test_a_part_that_is_not_utf8_is_read_whole_and_said_as_before(tmp_path, in_parts, monkeypatch):
    doc = _doc()
    doc["nodes"][30]["reason"] = "to be broken"
    path = tmp_path / "nodes.yaml"
    path.write_bytes(dump_yaml(doc).encode().replace(b"reason: to be broken", b"reason: broken \xff here"))
    with pytest.raises(reading.PartUnreadable):
        list(read_snapshot_parts(path))
    got = _parts(path)
    assert isinstance(got, list) and got == _whole(monkeypatch, path)
    line = path.read_bytes()[:path.read_bytes().index(b"\xff")].count(b"\n") + 1
    assert got == [(line, "not valid YAML or JSON: not UTF-8 text (byte 0xff)")]


def test_a_character_the_reference_reader_refuses_is_said_on_its_line_and_column(tmp_path):
    path = tmp_path / "nodes.yaml"
    path.write_text("nodes:\n- id: node-000\n  reason: é, then a bell \x07 here\n")
    with pytest.raises(reading.SnapshotSyntaxError) as err:
        read_snapshot_document(path, fast=False)  # PyYAML, as a refused snapshot is read again
    assert (err.value.line, err.value.column) == (3, 26)
    assert err.value.problem == "character U+0007 is not allowed in YAML"


@pytest.mark.parametrize("text, where, char", [
    ("nodes:\n- id: node-000\n  reason: a bell \x07 here\n", (3, 18), "U+0007"),
    ("nodes:\n- id: node-000\n  reason: 'é, then an escape \x1b[0m'\n", (3, 30), "U+001B"),
])
def test_a_character_yaml_does_not_allow_is_refused_by_the_fast_reader_too(tmp_path, text, where, char):
    """yaml_rs takes a control character into a value; the snapshot is read as the reference
    reader reads it, whichever reader would be fastest: refused, and said where."""
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    with pytest.raises(reading.SnapshotSyntaxError) as err:
        read_snapshot_document(path)
    assert (err.value.line, err.value.column) == where
    assert err.value.problem == f"character {char} is not allowed in YAML"


def test_a_part_with_a_character_yaml_does_not_allow_is_read_whole_and_said_where(tmp_path, in_parts, monkeypatch):
    doc = _doc()
    doc["nodes"][30]["reason"] = "to be broken"
    path = tmp_path / "nodes.yaml"
    path.write_text(dump_yaml(doc).replace("reason: to be broken", "reason: broken \x07 here"))
    with pytest.raises(reading.PartUnreadable):
        list(read_snapshot_parts(path))
    got = _parts(path)
    line = path.read_text()[:path.read_text().index("\x07")].count("\n") + 1
    assert got == _whole(monkeypatch, path) == [(line, "not valid YAML or JSON: character U+0007 is not allowed in YAML")]
