"""The catalog's fast read (C loader, no positions) yields exactly what the positioned read does."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler import catalog as cat
from tests.conftest import REPO

CATALOGS = [REPO / "catalog", *sorted(p for p in (REPO / "examples").iterdir() if (p / "fleet.yaml").exists())]


def load(root: Path, reader):
    fleet, models = cat._load(root.resolve(), reader)
    return fleet, models


@pytest.mark.parametrize("root", CATALOGS, ids=[p.name for p in CATALOGS])
def test_fast_read_equals_positioned_read(root):
    assert load(root, cat._read_fast) == load(root, cat._read)


TRICKY = {
    "yes/no/on are strings, as in YAML 1.2": ("labels: {a: yes, b: no, c: on}", {"a": "yes", "b": "no", "c": "on"}),
    "leading zero is not octal": ("labels: {a: '0755'}", {"a": "0755"}),
}


def fleet_with(tmp_path, labels_line, extra_node_field=""):
    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text(
        f"nodes:\n  - id: a\n    address: 10.0.0.1\n    {labels_line}\n{extra_node_field}"
    )
    return tmp_path


@pytest.mark.parametrize("name", list(TRICKY))
def test_yaml_1_1_readings_do_not_leak_into_the_fast_read(tmp_path, name):
    line, expected = TRICKY[name]
    root = fleet_with(tmp_path, line)
    assert dict(cat.load_catalog(root, with_revision=False).fleet.nodes[0].labels) == expected


def test_duplicate_key_falls_back_to_positioned_errors(tmp_path):
    root = fleet_with(tmp_path, "labels: {a: x}", "    labels: {b: y}\n")
    with pytest.raises(cat.CatalogInvalid) as err:
        cat.load_catalog(root, with_revision=False)
    (problem,) = err.value.problems
    assert problem.file == "fleet.yaml" and problem.line == 5 and "duplicate key" in problem.message


def test_octal_looking_number_is_read_as_the_positioned_reader_reads_it(tmp_path):
    root = fleet_with(tmp_path, "labels: {a: x}", "    ssh: {port: 0022}\n")
    fast_fails = cat._read_fast(root, root / "fleet.yaml", "fleet.yaml")
    assert fast_fails[0] is not None and fast_fails[0].data["nodes"][0]["ssh"]["port"] == "0022"  # a string: the schema refuses it
    # so the catalog is read again with positions, and the answer is the positioned reader's
    assert cat.load_catalog(root, with_revision=False).fleet == cat._load(root.resolve(), cat._read)[0]


# The native reader (yaml_rs, YAML 1.2 as ruamel reads it) is what load_catalog tries first.
from reconciler.catalog import documents  # noqa: E402
from reconciler.errors import CatalogInvalid  # noqa: E402


@pytest.mark.parametrize("root", CATALOGS, ids=[p.name for p in CATALOGS])
def test_native_read_equals_positioned_read(root):
    assert load(root, documents.read_native) == load(root, cat._read)


def _kind(value):
    """A scalar's kind and value as a schema sees them (ruamel's ScalarInt is an int, and so on)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind.__name__, value
    return type(value).__name__, value


def _outcome(load_it):
    try:
        return load_it()
    except CatalogInvalid as exc:
        return [str(p) for p in exc.problems]


@pytest.mark.parametrize("text", ["0022", "0o17", "0x1f", "1_000", "1:30", "1e3", ".5", "yes", "No", "on", "~",
                                  "null", "true", "False", "2001-12-14", ".inf", "-0", "07"])
def test_the_native_reader_reads_each_scalar_as_the_positioned_reader_does(tmp_path, text):
    root = fleet_with(tmp_path, f"labels: {{a: {text}}}")
    native, problems = documents.read_native(root, root / "fleet.yaml", "fleet.yaml")
    positioned, _ = cat._read(root, root / "fleet.yaml", "fleet.yaml")
    assert not problems
    got = native.data["nodes"][0]["labels"]["a"]
    want = positioned.data["nodes"][0]["labels"]["a"]
    assert _kind(got) == _kind(want)


@pytest.mark.parametrize("text", ["12:30:00", "2001-12-14", "2001-12-14T21:59:43Z", "0o17", "yes"])
def test_a_value_the_readers_disagree_on_loads_as_the_positioned_reader_says(tmp_path, text):
    # yaml_rs reads 12:30:00 as a time, ruamel as a string: the schema refuses the time, so the
    # catalog is read again with positions and loads (or is refused) exactly as that reading says.
    root = fleet_with(tmp_path, f"labels: {{a: {text}}}")
    assert _outcome(lambda: cat.load_catalog(root, with_revision=False).fleet) == _outcome(
        lambda: cat._load(root.resolve(), cat._read)[0])


def test_anchors_and_aliases_go_to_the_reader_that_shares_what_an_alias_names(tmp_path):
    # yaml_rs copies an alias's value: an alias "bomb" would be expanded before it could be counted.
    root = fleet_with(tmp_path, "labels: &l {a: x}", "  - id: b\n    address: 10.0.0.2\n    labels: *l\n")
    doc, problems = documents.read_native(root, root / "fleet.yaml", "fleet.yaml")
    assert not problems
    nodes = doc.data["nodes"]
    assert nodes[0]["labels"] is nodes[1]["labels"]  # PyYAML's reading: one object, named twice
    assert cat.load_catalog(root, with_revision=False).fleet.nodes[1].labels == {"a": "x"}
