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
