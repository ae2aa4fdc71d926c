"""plan and explain load the catalog in a forked child while they read the snapshot (_observe)."""

from __future__ import annotations

import shutil

import pytest

from reconciler.catalog import load_catalog
from reconciler.commands._observe import catalog_and_snapshot, load_snapshot
from reconciler.errors import CatalogInvalid, InventoryInvalid
from tests.conftest import REPO

CATALOG = REPO / "catalog"
SNAPSHOT = CATALOG / "status" / "nodes.yaml"


def test_the_catalog_from_the_child_is_the_one_loaded_here(monkeypatch):
    import os
    import threading

    forks = []
    real_fork = os.fork

    def counted_fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counted_fork)
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # whatever else this test process runs
    catalog, inventory = catalog_and_snapshot(str(CATALOG), str(SNAPSHOT))
    assert forks == [1]  # loaded in the child, not in line
    here = load_catalog(CATALOG)
    assert catalog == here  # frozen maps, hosts, profiles: every value travelled
    assert catalog.fleet.nodes[0].labels == here.fleet.nodes[0].labels
    assert inventory == load_snapshot(str(SNAPSHOT), here)


def test_a_catalog_problem_is_raised_here_and_wins_over_a_broken_snapshot(tmp_path):
    snap = tmp_path / "nodes.yaml"
    snap.write_text("nodes: [\n")
    with pytest.raises(CatalogInvalid) as caught:
        catalog_and_snapshot(str(tmp_path / "no-such-catalog"), str(snap))
    assert "catalog directory does not exist" in str(caught.value.problems[0])
    with pytest.raises(InventoryInvalid):
        catalog_and_snapshot(str(CATALOG), str(snap))


def test_beside_other_threads_it_loads_in_line_and_gives_the_same(monkeypatch):
    """No fork() from a process with threads (a lock another thread holds would stay held in the child)."""
    import os
    import threading

    def no_fork():
        raise AssertionError("forked beside other threads")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    catalog, inventory = catalog_and_snapshot(str(CATALOG), str(SNAPSHOT))
    assert catalog == load_catalog(CATALOG) and inventory.nodes


def test_a_check_of_the_catalog_runs_before_the_snapshot_is_judged(tmp_path):
    copy = tmp_path / "catalog"
    shutil.copytree(CATALOG, copy)
    snap = tmp_path / "nodes.yaml"
    snap.write_text("nodes: [\n")

    def refuse(catalog):
        raise LookupError(f"{len(catalog.models)} models")

    with pytest.raises(LookupError, match="models"):
        catalog_and_snapshot(str(copy), str(snap), check=refuse)


def test_polling_the_catalog_process_reads_its_answer_while_other_work_goes_on(tmp_path):
    """A catalog whose answer is past what a pipe holds (the child would wait on the parent to read):
    poll(), called between a snapshot's parts, takes it in and reads it without ever waiting."""
    import time

    import yaml

    from reconciler.commands._observe import catalog_apart

    nodes = [{"id": f"n{i:04d}", "address": f"10.1.{i // 250}.{i % 250 + 1}", "labels": {"rack": f"r{i // 40}"}}
             for i in range(1500)]
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"nodes": nodes}))
    (tmp_path / "models").mkdir()
    with catalog_apart(str(tmp_path)) as child:
        deadline = time.monotonic() + 30
        while not child.reaped and time.monotonic() < deadline:
            child.poll()  # never blocks: what the pipe holds now, and the Catalog once all of it came
            time.sleep(0.01)
        assert child.reaped  # the answer (hundreds of KB) came in through poll() alone
        catalog = child()
    assert [n.id for n in catalog.fleet.nodes] == [n["id"] for n in nodes]
