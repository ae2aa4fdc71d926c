"""Weights as a placement rule (SPEC section 7): a path source without `fetch` is needed on the node."""

from __future__ import annotations

from dataclasses import replace

from reconciler.model import FetchPolicy
from reconciler.decide.placement import Placer, place, summarize
from tests.builders import fleet, gpus, inventory, model, node_spec, observed, profile

P = profile("p", gpus_per_node=8)


def three_nodes(weights_a, weights_b, weights_c):
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"))
    inv = inventory(observed("a", gpu=gpus(8), weights=weights_a), observed("b", gpu=gpus(8), weights=weights_b),
                    observed("c", gpu=gpus(8), weights=weights_c))
    return f, inv


def test_a_node_probed_without_the_weights_is_rejected_naming_the_path():
    f, inv = three_nodes([], ["/models/m"], [])
    m = model("m", P, replicas=2)
    result = place([m], f, inv)
    assert result.outcomes["m-0"].placement.nodes[0].node == "b"
    out = result.outcomes["m-1"]
    assert out.placement is None
    reasons = {r.node: r.reason for r in out.rejections}
    assert reasons["a"] == reasons["c"] == "does not hold the weights at /models/m (the model sets no fetch to copy them)"
    assert reasons["b"].startswith("already hosts m-0")
    line = summarize(out.rejections, 3)[0]
    assert "2 lack the weights /models/m (no fetch) (a, c)" in line


def test_a_node_whose_weights_were_never_probed_is_not_rejected_for_them():
    f, inv = three_nodes(None, ["/models/m"], [])
    result = place([model("m", P, replicas=2)], f, inv)
    assert {o.placement.nodes[0].node for o in result.outcomes.values()} == {"a", "b"}


def test_with_fetch_holding_the_weights_is_only_a_preference():
    f, inv = three_nodes([], ["/models/m"], [])
    m = replace(model("m", P, replicas=3), fetch=FetchPolicy(from_node=True))
    result = place([m], f, inv)
    assert result.outcomes["m-0"].placement.nodes[0].node == "b"  # the holder first
    assert {o.placement.nodes[0].node for o in result.outcomes.values()} == {"a", "b", "c"}


def test_a_hub_id_source_is_never_required_on_the_node():
    f, inv = three_nodes([], [], [])
    result = place([model("m", P, replicas=3, source="org/m")], f, inv)
    assert all(o.placement is not None for o in result.outcomes.values())


def test_a_multi_node_replica_without_fetch_uses_only_nodes_that_may_hold_the_weights():
    pm = profile("pm", gpus_per_node=8, nodes=2)
    fab = {"ib": ["mlx5_0"]}
    f = fleet(*(node_spec(n, fabrics=fab) for n in "abc"))
    inv = inventory(observed("a", gpu=gpus(8), weights=[]), observed("b", gpu=gpus(8), weights=["/models/m"]),
                    observed("c", gpu=gpus(8), weights=None))
    out = Placer(f, inv, [model("m", pm)]).place(model("m", pm), "m-0")
    assert [a.node for a in out.placement.nodes] == ["b", "c"]
    inv_without = inventory(observed("a", gpu=gpus(8), weights=[]), observed("b", gpu=gpus(8), weights=["/models/m"]),
                            observed("c", gpu=gpus(8), weights=[]))
    out = Placer(f, inv_without, [model("m", pm)]).place(model("m", pm), "m-0")
    assert out.placement is None
    assert any(r.node == "a" and "does not hold the weights at /models/m" in r.reason for r in out.rejections)
