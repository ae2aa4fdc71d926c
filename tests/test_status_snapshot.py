"""status/nodes.yaml keeps of each node's listening ports only those placement hands out, so that
listeners that come and go (a browser, a test server) do not rewrite it every pass."""

from __future__ import annotations

from reconciler.model import Inventory, ObservedNode
from reconciler.record.status.write import status_snapshot, write_nodes_status
from tests.builders import model, profile


def test_only_ports_in_placement_windows_are_kept_and_an_unchanged_node_is_handed_on_as_is():
    models = [model("m", profile("p", port=8000))]
    busy = ObservedNode(id="a", ports_in_use=(22, 7999, 8000, 8511, 8512, 29499, 29500, 30011, 30012, 45000))
    quiet = ObservedNode(id="b", ports_in_use=(8001, 29501))
    idle = ObservedNode(id="c")
    snap = status_snapshot(Inventory((busy, quiet, idle)), models)
    a, b, c = snap.nodes
    assert a.ports_in_use == (8000, 8511, 29500, 30011)  # [8000, 8512) and [29500, 30012)
    assert b is quiet and c is idle


def test_an_idle_pass_rewrites_no_nodes_yaml_and_a_changed_node_does(tmp_path):
    models = [model("m", profile("p", port=8000))]
    inv = Inventory((ObservedNode(id="a", ports_in_use=(22, 8000)),))
    assert write_nodes_status(tmp_path, inv, models)
    assert not write_nodes_status(tmp_path, Inventory((ObservedNode(id="a", ports_in_use=(22, 8000, 41234)),)), models)
    assert write_nodes_status(tmp_path, Inventory((ObservedNode(id="a", ports_in_use=(8001,)),)), models)
    assert "ports_in_use: [8001]" in (tmp_path / "status" / "nodes.yaml").read_text()
