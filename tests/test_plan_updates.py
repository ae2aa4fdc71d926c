"""Spec changes on a fleet with little or no spare room (SPEC section 7, Updates), offline: plan only.

The rule every case checks: a replace never leaves a desired replica unplaced that would have
fit without it. Surge only into room no missing replica of any model needs; otherwise replace
in place (stop, then start on the same nodes and GPUs), one replica at a time per model.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.model import UpdatePolicy, spec_hash
from reconciler.decide.plan import plan
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

P8 = profile("p", gpus_per_node=8)


def kinds(p):
    return [(a.action, a.replica) for a in p.actions]


def action(p, rid):
    return next(a for a in p.actions if a.replica == rid)


def nodes_gpus(placement):
    return [(a.node, a.gpus) for a in placement.nodes]


def old(rid, m, prof="p", gpus_=range(8), **kw):
    return rank(rid, m, prof, gpus=tuple(gpus_), spec_hash="old-spec", **kw)


def test_a_full_fleet_replaces_in_place_and_never_reports_the_missing_replica_unplaced():
    # The failing case of issue 12: m-0 runs an old spec on a, m-1 is not running, no spare node.
    f = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]), observed("b", gpu=gpus(8)))
    p = plan(catalog(f, model("m", P8, replicas=2)), inv)
    assert p.unplaced == ()
    assert kinds(p) == [("replace", "m-0"), ("start", "m-1")]
    r = action(p, "m-0")
    assert nodes_gpus(r.placement) == nodes_gpus(r.previous) == [("a", tuple(range(8)))]
    assert r.stop_first and "in place" in r.reason
    assert nodes_gpus(action(p, "m-1").placement) == [("b", tuple(range(8)))]


def test_surge_goes_into_room_nobody_is_missing():
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"))
    m = model("m", P8, replicas=2)
    h = spec_hash(m, P8)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]),
                    observed("b", gpu=gpus(8), replicas=[rank("m-1", "m", "p", gpus=range(8), spec_hash=h)]),
                    observed("c", gpu=gpus(8)))
    p = plan(catalog(f, m), inv)
    (r,) = p.actions
    assert (r.action, r.stop_first, r.reason) == ("replace", False, "spec changed")  # new copy first, then the old goes
    assert nodes_gpus(r.placement) == [("c", tuple(range(8)))]


def test_surge_never_takes_room_another_models_missing_replica_needs():
    f = fleet(node_spec("a"), node_spec("b"))
    m, n = model("m", P8, replicas=1), model("n", P8, replicas=1)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]), observed("b", gpu=gpus(8)))
    p = plan(catalog(f, m, n), inv)
    assert p.unplaced == ()
    assert nodes_gpus(action(p, "n-0").placement) == [("b", tuple(range(8)))]
    r = action(p, "m-0")
    assert r.stop_first and nodes_gpus(r.placement) == [("a", tuple(range(8)))]


def test_a_multi_node_replica_is_replaced_in_place_as_one_unit():
    fab = {"ib": ["mlx5_0"]}
    mp = profile("mp", gpus_per_node=8, nodes=2)
    f = fleet(node_spec("a", fabrics=fab), node_spec("b", fabrics=fab))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("mm-0", "mm", "mp", r=0, nnodes=2, port=8000)]),
                    observed("b", gpu=gpus(8), replicas=[old("mm-0", "mm", "mp", r=1, nnodes=2, port=8001)]))
    p = plan(catalog(f, model("mm", mp)), inv)
    (r,) = p.actions
    assert r.action == "replace" and r.stop_first
    assert [(a.node, a.rank, a.gpus) for a in r.placement.nodes] == [("a", 0, tuple(range(8))), ("b", 1, tuple(range(8)))]
    assert r.placement.fabric == "ib" and r.placement.dist_port is not None
    assert p.unplaced == ()


def test_a_full_fleet_of_old_replicas_is_rolled_one_replica_at_a_time_per_model():
    f = fleet(*(node_spec(x) for x in "abcd"))
    inv = inventory(*(observed(x, gpu=gpus(8), replicas=[old(f"m-{i}", "m")]) for i, x in enumerate("abcd")))
    p = plan(catalog(f, model("m", P8, replicas=4)), inv)
    assert kinds(p) == [("replace", "m-0")]
    assert p.unplaced == ()
    assert [w.replica for w in p.waiting] == ["m-1", "m-2", "m-3"]
    assert all("runs the old spec" in w.reason and "m-0" in w.reason for w in p.waiting)


def test_several_models_compete_for_one_spare_node_first_by_name_and_nobody_is_unplaced():
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"))
    m, n = model("m", P8), model("n", P8)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]),
                    observed("b", gpu=gpus(8), replicas=[old("n-0", "n")]), observed("c", gpu=gpus(8)))
    p = plan(catalog(f, m, n), inv)
    assert p.unplaced == ()
    rm, rn = action(p, "m-0"), action(p, "n-0")
    assert not rm.stop_first and nodes_gpus(rm.placement) == [("c", tuple(range(8)))]
    assert rn.stop_first and nodes_gpus(rn.placement) == [("b", tuple(range(8)))]


def test_a_missing_replica_of_a_bigger_model_keeps_its_room_from_a_small_models_surge():
    p4 = profile("p4", gpus_per_node=4)
    f = fleet(node_spec("a"), node_spec("b"))
    small, big = model("small", p4), model("big", P8)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("small-0", "small", "p4", gpus_=range(4))]),
                    observed("b", gpu=gpus(8)))
    p = plan(catalog(f, small, big), inv)
    assert p.unplaced == ()
    assert nodes_gpus(action(p, "big-0").placement) == [("b", tuple(range(8)))]
    r = action(p, "small-0")  # a surge never shares a node with its old copy (same replica id): in place
    assert r.stop_first and nodes_gpus(r.placement) == [("a", (0, 1, 2, 3))]


def test_a_new_spec_of_another_shape_is_placed_in_place_on_the_same_node_when_it_fits_there():
    p4, p8 = profile("p", gpus_per_node=4), P8
    f = fleet(node_spec("a"), node_spec("b"))
    n = model("n", p8)
    hn = spec_hash(n, p8)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m", gpus_=range(4))]),
                    observed("b", gpu=gpus(8), replicas=[rank("n-0", "n", "p", gpus=range(8), spec_hash=hn)]))
    p = plan(catalog(f, model("m", p8), n), inv)
    (r,) = p.actions
    assert r.stop_first and nodes_gpus(r.placement) == [("a", tuple(range(8)))]
    assert p4.gpus_per_node == 4  # the old copy's shape


def test_max_unavailable_replaces_in_place_even_when_there_is_room_to_surge():
    f = fleet(node_spec("a"), node_spec("b"))
    m = replace(model("m", P8), update=UpdatePolicy(max_surge=0, max_unavailable=1))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]), observed("b", gpu=gpus(8)))
    (r,) = plan(catalog(f, m), inv).actions
    assert r.stop_first and nodes_gpus(r.placement) == [("a", tuple(range(8)))]


def test_surge_only_on_a_full_fleet_waits_and_says_why():
    f = fleet(node_spec("a"))
    m = replace(model("m", P8), update=UpdatePolicy(max_surge=1, max_unavailable=0))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]))
    p = plan(catalog(f, m), inv)
    assert p.actions == () and p.unplaced == ()
    (w,) = p.waiting
    assert w.replica == "m-0" and "no room to surge" in w.reason and "max_unavailable is 0" in w.reason
    assert p.outcomes["m-0"].kept


@pytest.mark.parametrize("surge,unavailable,expect", [(0, 2, 2), (2, 0, 2), (1, 1, 2), (3, 0, 3)])
def test_an_explicit_update_policy_sets_how_many_replicas_change_at_once(surge, unavailable, expect):
    spare = surge  # nodes free for surging
    names = [f"n{i}" for i in range(4 + spare)]
    f = fleet(*(node_spec(x) for x in names))
    inv = inventory(*(observed(x, gpu=gpus(8), replicas=[old(f"m-{i}", "m")] if i < 4 else []) for i, x in enumerate(names)))
    m = replace(model("m", P8, replicas=4), update=UpdatePolicy(max_surge=surge, max_unavailable=unavailable))
    p = plan(catalog(f, m), inv)
    assert len([a for a in p.actions if a.action == "replace"]) == expect
    assert p.unplaced == ()
    surged = [a for a in p.actions if not a.stop_first]
    assert len(surged) == min(surge, expect)


def test_max_unavailable_counts_replicas_that_are_already_down():
    f = fleet(*(node_spec(x) for x in "abc"))
    m = replace(model("m", P8, replicas=3), update=UpdatePolicy(max_surge=0, max_unavailable=1))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[old("m-0", "m")]),
                    observed("b", gpu=gpus(8), replicas=[old("m-1", "m")]),
                    observed("c", gpu=gpus(8, busy=range(8))))
    p = plan(catalog(f, m), inv)
    # m-2 cannot be placed (c is taken by a foreign process): one replica is already unavailable
    assert [o.replica for o in p.unplaced if o.model == "m"] == ["m-2"]
    assert [a for a in p.actions if a.action == "replace"] == []
    assert any(w.replica == "m-0" and "max_unavailable" in w.reason for w in p.waiting)


def test_a_replace_never_leaves_unplaced_a_replica_that_would_have_fit_without_it():
    # Same fleet twice: once with every running replica current, once with every one on an old spec.
    p4 = profile("p4", gpus_per_node=4)
    mp = profile("mp", gpus_per_node=8, nodes=2)
    fab = {"ib": ["mlx5_0"]}
    f = fleet(*(node_spec(f"n{i}", fabrics=fab) for i in range(6)))
    models = [model("a", P8, replicas=2), model("b", p4, replicas=3), model("c", mp, replicas=1)]
    hashes = {m.name: spec_hash(m, m.profiles[0]) for m in models}
    layout = {"n0": [("a-0", "a", "p", range(8))], "n1": [("b-0", "b", "p4", range(4))],
              "n2": [("a-1", "a", "p", range(8))], "n5": [("b-1", "b", "p4", range(4, 8))]}

    def inv(current: bool):
        nodes = []
        for i in range(6):
            nid = f"n{i}"
            ranks = [rank(rid, mn, pn, gpus=g, port=8000 + j, spec_hash=hashes[mn] if current else "old")
                     for j, (rid, mn, pn, g) in enumerate(layout.get(nid, []))]
            nodes.append(observed(nid, gpu=gpus(8), replicas=ranks, fabrics=fab))
        return inventory(*nodes)

    without = plan(catalog(f, *models), inv(True))
    during = plan(catalog(f, *models), inv(False))
    assert {o.replica for o in during.unplaced} <= {o.replica for o in without.unplaced}
    assert {a.replica for a in during.actions if a.action == "start"} == {a.replica for a in without.actions if a.action == "start"}
    assert {a.replica for a in during.actions if a.action == "replace"} == {"a-0", "b-0"}  # one per model
