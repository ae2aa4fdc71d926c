"""Placement rules (SPEC section 4 and the defaults of section 1), one test per rule, named as the rule."""

from __future__ import annotations

import pytest

from reconciler.model import Assignment, FetchPolicy, Placement
from reconciler.decide.placement import Placer, place, summarize, unfittable_problems
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile


def placed(result, rid):
    out = result.outcomes[rid]
    assert out.placement is not None, f"{rid} unplaced: {[r.reason for r in out.rejections]}"
    return out.placement


def nodes_of(p: Placement):
    return [a.node for a in p.nodes]


def reasons(result, rid, node=None):
    return [r.reason for r in result.outcomes[rid].rejections if node is None or r.node == node]


# ---- the two non-negotiable rules -------------------------------------------


def test_multi_node_replica_never_spans_two_fabrics():
    # ib-a has one free node, ib-b has one free node: two nodes exist, but not on one fabric.
    f = fleet(node_spec("n1", fabrics={"ib-a": ["mlx5_0"]}), node_spec("n2", fabrics={"ib-b": ["mlx5_0"]}))
    inv = inventory(observed("n1", gpu=gpus(8)), observed("n2", gpu=gpus(8)))
    m = model("big", profile("tp16", gpus_per_node=8, nodes=2))
    res = place([m], f, inv)
    assert res.outcomes["big-0"].placement is None
    assert "needs 2 nodes on ib-a, only 1 qualify" in reasons(res, "big-0")
    assert "needs 2 nodes on ib-b, only 1 qualify" in reasons(res, "big-0")


def test_unreachable_node_without_declared_fabric_is_rejected_as_unreachable_not_as_fabricless():
    # Its fabrics would come from the probe, which could not reach it: "no fabric" would be a guess.
    f = fleet(node_spec("n1", fabrics={"ib-a": ["mlx5_0"]}), node_spec("n2"))
    inv = inventory(observed("n1", gpu=gpus(8)), observed("n2", state="unreachable", reason="connection refused"))
    res = place([model("big", profile("tp16", gpus_per_node=8, nodes=2))], f, inv)
    assert reasons(res, "big-0", "n2") == ["node is unreachable: connection refused"]


def test_multi_node_replica_gets_only_its_fabrics_hcas():
    f = fleet(*(node_spec(n, fabrics={"ib-a": ["mlx5_0", "mlx5_1"], "roce": ["mlx5_4"]}) for n in ("n1", "n2")))
    inv = inventory(observed("n1", gpu=gpus(8)), observed("n2", gpu=gpus(8)))
    m = model("big", profile("tp16", gpus_per_node=8, nodes=2))
    p = placed(place([m], f, inv), "big-0")
    assert p.fabric == "ib-a" and p.pool == "ib-a/H100-80GB"
    assert [a.hcas for a in p.nodes] == [("mlx5_0", "mlx5_1"), ("mlx5_0", "mlx5_1")]


def test_tensor_parallel_group_never_mixes_gpu_classes():
    # 4 H100 + 4 A100 on one node: 8 GPUs, but never 8 of one class.
    gs = gpus(4, "H100-80GB") + tuple(g.__class__(**{**g.__dict__, "index": g.index + 4}) for g in gpus(4, "A100-80GB"))
    f = fleet(node_spec("n1"))
    inv = inventory(observed("n1", gpu=gs))
    res = place([model("m", profile("tp8", gpus_per_node=8))], f, inv)
    assert res.outcomes["m-0"].placement is None
    assert reasons(res, "m-0", "n1") == ["has 4 free H100-80GB GPUs, needs 8"]
    res = place([model("m", profile("tp4", gpu_class="A100-80GB", gpus_per_node=4))], f, inv)
    assert placed(res, "m-0").nodes[0].gpus == (4, 5, 6, 7)


def test_node_gpu_class_override_wins_over_probed_class():
    f = fleet(node_spec("n1", gpu_class="L40S-48GB"))
    inv = inventory(observed("n1", gpu=gpus(2, "L40S-45GB")))
    assert placed(place([model("m", profile(gpu_class="L40S-48GB"))], f, inv), "m-0").nodes[0].node == "n1"
    res = place([model("m", profile(gpu_class="L40S-45GB"))], f, inv)
    assert res.outcomes["m-0"].placement is None


# ---- profiles ----------------------------------------------------------------


def test_profiles_are_tried_by_descending_priority_first_fit_wins():
    f = fleet(node_spec("n1"), node_spec("n2"))
    inv = inventory(observed("n1", gpu=gpus(8)), observed("n2", gpu=gpus(8, "A100-80GB")))
    m = model("m", profile("low", gpu_class="A100-80GB", priority=1), profile("high", priority=100))
    assert placed(place([m], f, inv), "m-0").profile == "high"


def test_lower_priority_profile_used_when_higher_does_not_fit():
    f = fleet(node_spec("n1"))
    inv = inventory(observed("n1", gpu=gpus(8, "A100-80GB")))
    m = model("m", profile("high", priority=100), profile("low", gpu_class="A100-80GB", priority=1))
    res = place([m], f, inv, explain=["m"])
    assert placed(res, "m-0").profile == "low"
    # explain keeps why the higher-priority profile was skipped
    assert [r.profile for r in res.outcomes["m-0"].rejections] == ["high"]


# ---- preferences ----------------------------------------------------------


def test_single_node_gpu_replicas_bin_pack_onto_fullest_node_that_fits():
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8, busy=range(6))), observed("c", gpu=gpus(8, busy=range(7))))
    p = placed(place([model("m", profile(gpus_per_node=2))], f, inv), "m-0")
    assert nodes_of(p) == ["b"] and p.nodes[0].gpus == (6, 7)


def test_cpu_only_replicas_spread_to_node_with_fewest_replicas():
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"))
    inv = inventory(observed("a"), observed("b"), observed("c"))
    running = [Placement("x-0", "x", "p", None, "none/cpu", (Assignment("a", 0, port=1),)),
               Placement("y-0", "y", "p", None, "none/cpu", (Assignment("b", 0, port=1),))]
    m = model("m", profile("cpu", engine="llama.cpp", gpu_class=None), replicas=2)
    res = place([m], f, inv, running=running)
    assert nodes_of(placed(res, "m-0")) == ["c"]
    assert nodes_of(placed(res, "m-1")) == ["a"]  # a and b tie at one replica each: lowest id
    assert placed(res, "m-0").pool == "none/cpu" and placed(res, "m-0").nodes[0].gpus == ()


def test_cpu_only_vllm_replica_places_on_a_cpu_node():
    f = fleet(node_spec("gpu"), node_spec("cpu"))
    inv = inventory(observed("gpu", gpu=gpus(8)), observed("cpu"))
    m = model("m", profile("cpu", engine="vllm", gpu_class=None))
    p = placed(place([m], f, inv), "m-0")
    assert p.pool == "none/cpu" and p.nodes[0].gpus == ()


def test_multi_node_replicas_take_emptiest_nodes_of_first_fabric_that_holds_them():
    fab = {"ib-b": ["mlx5_0"]}
    f = fleet(node_spec("x1", fabrics={"ib-a": ["m0"]}), node_spec("y1", fabrics=fab), node_spec("y2", fabrics=fab),
              node_spec("y3", fabrics=fab), node_spec("z1", fabrics={"ib-c": ["m0"]}), node_spec("z2", fabrics={"ib-c": ["m0"]}))
    inv = inventory(observed("x1", gpu=gpus(8)), observed("y1", gpu=gpus(8, busy=[0, 1, 2])), observed("y2", gpu=gpus(8)),
                    observed("y3", gpu=gpus(8, busy=[0])), observed("z1", gpu=gpus(8)), observed("z2", gpu=gpus(8)))
    p = placed(place([model("m", profile(gpus_per_node=4, nodes=2))], f, inv), "m-0")
    # ib-a has one node; ib-b is the first in name order with two; emptiest first, rank 0 the emptiest
    assert p.fabric == "ib-b" and nodes_of(p) == ["y2", "y3"]
    assert [a.rank for a in p.nodes] == [0, 1]
    assert p.dist_port is not None and p.dist_port != p.nodes[0].port


def test_nodes_holding_weights_come_first():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8, busy=range(4)), weights=[]), observed("b", gpu=gpus(8), weights=["/models/m"]))
    # bin packing alone would pick a (4 free); the weights on b win
    assert nodes_of(placed(place([model("m")], f, inv), "m-0")) == ["b"]


def test_weights_are_a_preference_never_a_filter():
    # With fetch (SPEC section 7); without it, a path source is a requirement: tests/test_placement_weights.py.
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), weights=[]))
    assert nodes_of(placed(place([model("m", fetch=FetchPolicy(from_node=True))], f, inv), "m-0")) == ["a"]


def test_node_that_never_looked_for_weights_is_neither_preferred_nor_punished():
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"))
    inv = inventory(observed("a", gpu=gpus(8), weights=None), observed("b", gpu=gpus(8), weights=[]),
                    observed("c", gpu=gpus(8), weights=None))
    # a and b tie (unknown ranks with "looked and has none"): lowest id
    assert nodes_of(placed(place([model("m")], f, inv), "m-0")) == ["a"]
    f2 = fleet(node_spec("b"), node_spec("c"))
    inv2 = inventory(observed("b", gpu=gpus(8), weights=[]), observed("c", gpu=gpus(8, busy=range(2)), weights=None))
    # bin packing decides between them, not the unknown weights
    assert nodes_of(placed(place([model("m")], f2, inv2), "m-0")) == ["c"]


def test_replicas_of_one_model_avoid_nodes_already_hosting_it():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8)))
    res = place([model("m", replicas=3)], f, inv)
    assert {nodes_of(placed(res, "m-0"))[0], nodes_of(placed(res, "m-1"))[0]} == {"a", "b"}
    assert res.outcomes["m-2"].placement is None
    assert reasons(res, "m-2", "a") == ["already hosts m-0 of this model"]


def test_spread_preferred_lets_replicas_share_a_node_only_when_needed():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8)))
    res = place([model("m", replicas=3, spread="preferred")], f, inv)
    assert sorted(nodes_of(placed(res, f"m-{i}"))[0] for i in range(3)) == ["a", "a", "b"]


def test_gpus_sharing_an_nvlink_domain_are_preferred():
    f = fleet(node_spec("a"))
    # two domains: {0,1,2,3} with 0 and 1 busy, {4,5,6,7} all free
    inv = inventory(observed("a", gpu=gpus(8, nvlink=[[0, 1, 2, 3], [4, 5, 6, 7]], busy=[0, 1])))
    assert placed(place([model("m", profile(gpus_per_node=4))], f, inv), "m-0").nodes[0].gpus == (4, 5, 6, 7)
    # a pair fits the smaller domain, keeping the whole one for a bigger group
    assert placed(place([model("m", profile(gpus_per_node=2))], f, inv), "m-0").nodes[0].gpus == (2, 3)


def test_gpus_without_topology_fall_back_to_lowest_free_indices():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8, nvlink=[], busy=[0])))
    assert placed(place([model("m", profile(gpus_per_node=3))], f, inv), "m-0").nodes[0].gpus == (1, 2, 3)


def test_ties_are_broken_by_node_id():
    f = fleet(node_spec("n3"), node_spec("n1"), node_spec("n2"))
    inv = inventory(*(observed(n, gpu=gpus(8)) for n in ("n3", "n1", "n2")))
    assert nodes_of(placed(place([model("m")], f, inv), "m-0")) == ["n1"]


# ---- exclusions, each with its reason -----------------------------------------

CASES = [
    # (name, node spec kwargs, observed kwargs, profile kwargs, expected reason, (kind, resource, requested, available))
    ("cordoned", {"state": "cordoned"}, {}, {}, "node is cordoned", ("node_state", "cordoned", None, None)),
    ("drained", {"state": "drained"}, {}, {}, "node is drained", ("node_state", "drained", None, None)),
    ("unreachable", {}, {"state": "unreachable", "reason": "connection timed out"}, {}, "node is unreachable: connection timed out",
     ("node_state", "unreachable", None, None)),
    ("label missing", {}, {}, {"node_selector": {"zone": "a"}}, "lacks label zone=a", ("label", "zone", "a", None)),
    ("label differs", {"labels": {"zone": "b"}}, {}, {"node_selector": {"zone": "a"}}, "lacks label zone=a (has zone=b)",
     ("label", "zone", "a", "b")),
    ("engine", {}, {"engines": ("sglang",)}, {}, "does not have vllm installed", ("engine", "vllm", None, None)),
    ("memory", {}, {"memory_gib": 128}, {"min_memory_gb": 256}, "has 128 GiB of memory, needs 256", ("memory", "memory", 256, 128)),
    ("disk", {}, {"disk_free_gib": 50, "weights": []}, {"min_disk_gb": 150}, "has 50 GiB free on /models for weights it does not hold, needs 150",
     ("disk", "disk", 150, 50)),
    ("gpus", {}, {"gpu": gpus(8, busy=range(4))}, {"gpus_per_node": 8}, "has 4 free H100-80GB GPUs, needs 8", ("gpus", "H100-80GB", 8, 4)),
    ("class", {}, {"gpu": gpus(8, "A100-80GB")}, {}, "has 0 free H100-80GB GPUs, needs 1 (its GPUs are A100-80GB)",
     ("gpus", "H100-80GB", 1, 0)),
]


@pytest.mark.parametrize("name,spec_kw,obs_kw,prof_kw,expected,typed", CASES, ids=[c[0] for c in CASES])
def test_node_is_excluded_with_a_reason_naming_the_number(name, spec_kw, obs_kw, prof_kw, expected, typed):
    f = fleet(node_spec("a1", **spec_kw))
    obs_kw = {"gpu": gpus(8), **obs_kw}
    inv = inventory(observed("a1", **obs_kw))
    # Disk is asked of a node that lacks the weights only when it could fetch them (SPEC section 7).
    fetch = FetchPolicy(from_node=True) if name == "disk" else None
    res = place([model("m", profile("p", **prof_kw), fetch=fetch)], f, inv)
    assert res.outcomes["m-0"].placement is None
    r = res.outcomes["m-0"].rejections[0]
    assert (r.profile, r.pool, r.node, r.reason) == ("p", "none/H100-80GB", "a1", expected)
    # The figures behind the message, for anything that reasons about it (summaries, status).
    assert (r.kind, r.why.resource, r.why.requested, r.why.available) == typed


def test_node_without_vllm_is_rejected_with_reason():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8), engines=("sglang",)), observed("b", gpu=gpus(8, busy=range(7))))
    res = place([model("m", profile(gpus_per_node=2))], f, inv)
    assert res.outcomes["m-0"].placement is None
    assert reasons(res, "m-0") == ["does not have vllm installed", "has 1 free H100-80GB GPUs, needs 2"]


def test_node_whose_engines_were_never_probed_is_not_excluded_for_engine():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), engines=None))
    assert placed(place([model("m")], f, inv), "m-0")


def test_command_engine_needs_no_entry_in_node_engines():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", engines=()))
    m = model("m", profile("c", engine="command", gpu_class=None, port=9000, command=("serve",)))
    assert placed(place([m], f, inv), "m-0").nodes[0].port == 9000


def test_disk_is_not_checked_on_a_node_holding_the_weights():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), disk_free_gib=1, weights=["/models/m"]))
    assert placed(place([model("m", profile(min_disk_gb=500))], f, inv), "m-0")


def test_disk_is_not_checked_when_it_was_not_probed():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), disk_free_gib=None))
    assert placed(place([model("m", profile(min_disk_gb=500))], f, inv), "m-0")


def test_disk_checked_is_the_first_model_dir():
    f = fleet(node_spec("a", model_dirs=("/scratch", "/models")))
    # /models has room, but the first model dir (/scratch) was not probed: unchecked, so it fits
    inv = inventory(observed("a", gpu=gpus(8), disk_free_gib=1))
    assert placed(place([model("m", profile(min_disk_gb=500))], f, inv), "m-0")


def test_memory_is_compared_in_gib():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), memory_gib=256))
    assert placed(place([model("m", profile(min_memory_gb=256))], f, inv), "m-0")


def test_gpu_used_by_foreign_process_is_not_free():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(2, busy=[0])))
    assert placed(place([model("m")], f, inv), "m-0").nodes[0].gpus == (1,)


def test_node_missing_from_snapshot_is_unreachable():
    f = fleet(node_spec("a"), node_spec("ghost"))
    inv = inventory(observed("a", gpu=gpus(1)))
    res = place([model("m", replicas=2)], f, inv)
    assert reasons(res, "m-1", "ghost") == ["node is unreachable: missing from the inventory snapshot"]


def test_fabric_membership_from_fleet_declaration_wins_over_observed():
    f = fleet(node_spec("a", fabrics={"ib-x": ["mlx5_9"]}), node_spec("b", fabrics={"ib-x": ["mlx5_9"]}))
    inv = inventory(observed("a", gpu=gpus(8), fabrics={"ib-y": ["mlx5_0"]}), observed("b", gpu=gpus(8), fabrics={"ib-y": ["mlx5_0"]}))
    p = placed(place([model("m", profile(gpus_per_node=8, nodes=2))], f, inv), "m-0")
    assert p.fabric == "ib-x" and p.nodes[0].hcas == ("mlx5_9",)


def test_fabric_membership_falls_back_to_observed_attachment():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8), fabrics={"ib-y": ["mlx5_0"]}), observed("b", gpu=gpus(8), fabrics={"ib-y": ["mlx5_1"]}))
    p = placed(place([model("m", profile(gpus_per_node=8, nodes=2))], f, inv), "m-0")
    assert p.fabric == "ib-y" and [a.hcas for a in p.nodes] == [("mlx5_0",), ("mlx5_1",)]


def test_multi_node_without_any_fabric_is_rejected_with_reason():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8)))
    res = place([model("m", profile(gpus_per_node=8, nodes=2))], f, inv)
    assert reasons(res, "m-0") == ["needs 2 nodes on one fabric, but no node is attached to a fabric"]


# ---- ports -------------------------------------------------------------------


def test_port_starts_at_profile_port_and_skips_ports_in_use_and_other_replicas():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), ports_in_use=[8000, 8002]))
    running = [Placement("x-0", "x", "p", None, "none/H100-80GB", (Assignment("a", 0, gpus=(0,), port=8001),))]
    res = place([model("m", replicas=1), model("n", replicas=1)], f, inv, running=running)
    assert sorted([placed(res, "m-0").nodes[0].port, placed(res, "n-0").nodes[0].port]) == [8003, 8004]


def test_multi_node_replica_gets_rendezvous_port_on_its_head_distinct_from_serving_port():
    fab = {"ib": ["mlx5_0"]}
    f = fleet(node_spec("a", fabrics=fab), node_spec("b", fabrics=fab))
    inv = inventory(observed("a", gpu=gpus(8), ports_in_use=[29500]), observed("b", gpu=gpus(8)))
    p = placed(place([model("m", profile(gpus_per_node=8, nodes=2))], f, inv), "m-0")
    assert p.nodes[0].node == "a" and p.dist_port == 29501


# ---- sticky running replicas ------------------------------------------------


def test_running_replicas_keep_their_gpus_and_ports_first():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8)))
    running = [Placement("m-0", "m", "p", None, "none/H100-80GB", (Assignment("a", 0, gpus=(0, 1, 2, 3), port=8000),))]
    res = place([model("m", profile(gpus_per_node=4), replicas=1), model("n", profile(gpus_per_node=4))], f, inv, running=running)
    assert res.outcomes["m-0"].kept and res.outcomes["m-0"].placement == running[0]
    n0 = placed(res, "n-0").nodes[0]
    assert n0.gpus == (4, 5, 6, 7) and n0.port == 8001


# ---- rejections at scale ------------------------------------------------------


def test_unplaced_replicas_of_a_model_report_rejections_once():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(1)))
    res = place([model("m", replicas=4)], f, inv)
    assert placed(res, "m-0")
    assert res.outcomes["m-1"].rejections and res.outcomes["m-1"].rejections_same_as is None
    for rid in ("m-2", "m-3"):
        assert res.outcomes[rid].rejections == () and res.outcomes[rid].rejections_same_as == "m-1"


def test_every_unplaced_replica_has_a_rejection_per_profile():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(1)))
    m = model("m", profile("big", gpus_per_node=8, priority=2), profile("multi", nodes=2, priority=1), profile("cpu", engine="llama.cpp", gpu_class=None), replicas=3)
    res = place([m], f, inv)
    assert placed(res, "m-0").profile == "cpu"
    unplaced = res.outcomes["m-1"]
    assert unplaced.placement is None
    assert {r.profile for r in unplaced.rejections} == {"big", "multi", "cpu"}
    assert res.outcomes["m-2"].rejections_same_as == "m-1"


def test_summary_groups_reasons_with_counts_and_names_nodes():
    specs = [node_spec(f"a{i}", labels={"zone": "a"}) for i in range(1, 9)] + [node_spec(f"b{i}", labels={"zone": "b"}) for i in range(1, 5)]
    inv = inventory(*(observed(s.id, gpu=gpus(8, busy=range(4))) for s in specs))
    res = place([model("m", profile("h100-tp8", gpus_per_node=8, node_selector={"zone": "a"}))], fleet(*specs), inv)
    out = res.outcomes["m-0"]
    (line,) = summarize(out.rejections, out.nodes_considered)
    assert line == ("0/12 nodes fit profile h100-tp8: 8 have too few free H100-80GB GPUs "
                    "(a1: 4 free, needs 8; a2: 4 free, needs 8; a3: 4 free, needs 8; ... 5 more), "
                    "4 lack label zone=a (b1, b2, b3, ... 1 more)")
    (full,) = summarize(out.rejections, out.nodes_considered, show_all=True)
    assert "b4" in full and "a8: 4 free, needs 8" in full


def test_nodes_failing_for_the_same_reason_share_one_reason_value():
    # An unplaced replica at fleet scale carries a rejection per node: the same reason is one value, said
    # in words once; a figure that differs (4 free vs 6 free, 8 vs 8.0) is a reason of its own.
    from reconciler.decide.placement.rules import shared_reason
    from reconciler.model import RejectKind

    specs = [node_spec(f"a{i}", labels={"zone": "a"}) for i in range(1, 4)] + [node_spec(f"b{i}", labels={"zone": "b"}) for i in range(1, 3)]
    inv = inventory(*(observed(s.id, gpu=gpus(8, busy=range(4 if s.id != "a3" else 2))) for s in specs))
    res = place([model("m", profile("h100-tp8", gpus_per_node=8, node_selector={"zone": "a"}))], fleet(*specs), inv)
    why = {r.node: r.why for r in res.outcomes["m-0"].rejections}
    assert why["a1"] is why["a2"] and why["b1"] is why["b2"]
    assert why["a3"] is not why["a1"] and why["a3"].available == 6 and why["a1"].available == 4
    assert shared_reason(RejectKind.MEMORY, "memory", 8, 4) is not shared_reason(RejectKind.MEMORY, "memory", 8.0, 4)


# ---- placer: start-before-stop support ----------------------------------------


def test_release_frees_gpus_ports_and_presence():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8)))
    m = model("m", profile(gpus_per_node=8))
    placer = Placer(f, inv, [m])
    first = placer.place(m, "m-0").placement
    assert placer.place(m, "m-1").placement is None
    placer.release(first)
    again = placer.place(m, "m-1").placement
    assert again.nodes[0].gpus == first.nodes[0].gpus and again.nodes[0].port == first.nodes[0].port


# ---- models that can never fit --------------------------------------------------


def test_model_needing_more_gpus_per_node_than_any_node_has_is_a_problem():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8)))
    c = catalog(f, model("huge", profile("tp16", gpus_per_node=16)), model("ok"))
    problems = unfittable_problems(c, inv)
    assert len(problems) == 1
    assert problems[0].file == "models/huge.yaml"
    assert "needs 16 H100-80GB GPUs per node, the most any node has is 8" in problems[0].message


def test_model_fits_when_one_profile_can_even_if_busy_now():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8, busy=range(8))))
    c = catalog(f, model("m", profile("tp16", gpus_per_node=16, priority=1), profile("tp8", gpus_per_node=8)))
    assert unfittable_problems(c, inv) == []


def test_more_replicas_than_nodes_that_could_ever_hold_one_is_a_problem():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(8)))
    problems = unfittable_problems(catalog(f, model("m", replicas=3)), inv)
    assert len(problems) == 1 and "asks for 3 replicas, but only 2 nodes" in problems[0].message
    assert unfittable_problems(catalog(f, model("m", replicas=3, spread="preferred")), inv) == []


def test_releasing_one_of_two_colocated_replicas_keeps_the_node_marked_as_hosting_the_model():
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("b", gpu=gpus(1)))
    shared = model("m", replicas=2, spread="preferred")
    placer = Placer(f, inv, [shared])
    first = placer.place(shared, "m-0").placement
    second = placer.place(shared, "m-1").placement
    assert [first.nodes[0].node, second.nodes[0].node] == ["b", "a"]
    third = placer.place(shared, "m-2").placement
    assert third.nodes[0].node == "a"  # both nodes host it now: preferred spread shares the one with room
    placer.release(third)
    strict = model("m", replicas=3)
    out = placer.place(strict, "m-3")
    assert out.placement is None and "already hosts m-1 of this model" in [r.reason for r in out.rejections]


def test_unfittable_problem_points_at_the_field_to_change():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8)))
    c = catalog(f, model("huge", profile("tp16", gpus_per_node=16)))
    asked = []

    def locate(file, path):
        asked.append((file, path))
        return 7, 5

    (problem,) = unfittable_problems(c, inv, locate=locate)
    assert asked == [("models/huge.yaml", ("profiles", "tp16", "gpus_per_node"))]
    assert (problem.line, problem.column) == (7, 5)
