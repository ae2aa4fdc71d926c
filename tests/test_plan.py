"""The diff of desired against observed replicas: each rule of issue 6's plan, named as the rule."""

from __future__ import annotations

from reconciler.decide.backoff import BACKOFF_CAP_S, Backoff, backoff_delay
from reconciler.model import spec_hash
from reconciler.decide.plan import plan
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

P = profile("p", gpus_per_node=4)
M = model("m", P, replicas=2)
H = spec_hash(M, P)


def two_nodes(*, a=(), b=(), a_state="ready", b_obs=None, c=False):
    specs = [node_spec("a", state=a_state), node_spec("b")] + ([node_spec("c")] if c else [])
    nodes = [observed("a", gpu=gpus(8), replicas=a), b_obs or observed("b", gpu=gpus(8), replicas=b)]
    if c:
        nodes.append(observed("c", gpu=gpus(8)))
    return fleet(*specs), inventory(*nodes)


def kinds(p):
    return [(a.action, a.replica) for a in p.actions]


def test_missing_replicas_are_started():
    f, inv = two_nodes()
    p = plan(catalog(f, M), inv)
    assert kinds(p) == [("start", "m-0"), ("start", "m-1")]
    assert {a.placement.nodes[0].node for a in p.actions} == {"a", "b"}
    assert all(a.reason == "not running" for a in p.actions)


def test_replica_running_with_unchanged_spec_on_healthy_node_is_left_alone():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(4, 5, 6, 7), port=8123, spec_hash=H)],
                       b=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)])
    p = plan(catalog(f, M), inv)
    assert p.actions == ()
    assert p.outcomes["m-0"].kept and p.outcomes["m-0"].placement.nodes[0].port == 8123


def test_cordoned_node_keeps_what_runs_on_it():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)], a_state="cordoned")
    p = plan(catalog(f, M), inv)
    assert kinds(p) == [("start", "m-1")]
    assert p.actions[0].placement.nodes[0].node == "b"


def test_replicas_of_a_removed_model_are_stopped():
    f, inv = two_nodes(a=[rank("old-0", "old", "x", gpus=(0,), spec_hash="zz")])
    p = plan(catalog(f, model("m", P, replicas=0)), inv)
    assert kinds(p) == [("stop", "old-0")]
    assert p.actions[0].reason == "model removed from the catalog"
    assert [a.node for a in p.actions[0].placement.nodes] == ["a"]


def test_scaling_down_stops_highest_ordinals_first():
    ranks_a = [rank(f"m-{i}", "m", "p", gpus=(i,), port=8000 + i, spec_hash=H) for i in (0, 2, 11)]
    ranks_b = [rank(f"m-{i}", "m", "p", gpus=(i,), port=8000 + i, spec_hash=H) for i in (1, 3)]
    f, inv = two_nodes(a=ranks_a, b=ranks_b)
    p = plan(catalog(f, model("m", P, replicas=2)), inv)
    assert kinds(p) == [("stop", "m-11"), ("stop", "m-3"), ("stop", "m-2")]
    assert all(a.reason == "scaled down to 2 replicas" for a in p.actions)


def test_nothing_is_stopped_that_has_no_node_record():
    # A foreign process on a GPU is only a busy GPU, never something to stop.
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8, busy=[0])))
    p = plan(catalog(f, model("m", P, replicas=0)), inv)
    assert p.actions == ()


def test_spec_change_replaces_starting_new_copy_before_stopping_old_when_room():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")], c=True)
    m = model("m", P, replicas=1)
    p = plan(catalog(f, m), inv)
    (a,) = p.actions
    assert (a.action, a.reason, a.stop_first) == ("replace", "spec changed", False)
    assert a.placement.nodes[0].node != "a"  # beside the old copy, never on its nodes
    assert [n.node for n in a.previous.nodes] == ["a"]


def test_spec_change_stops_old_copy_first_when_only_its_room_fits():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(4), replicas=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")]))
    p = plan(catalog(f, model("m", P, replicas=1)), inv)
    (a,) = p.actions
    assert a.action == "replace" and a.stop_first
    assert a.placement.nodes[0].gpus == (0, 1, 2, 3)
    assert "stopped first" in a.reason


def test_spec_change_with_no_room_anywhere_keeps_old_copy_and_says_why():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(4), replicas=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")]))
    big = profile("p", gpus_per_node=8)
    p = plan(catalog(f, model("m", big, replicas=1)), inv)
    (a,) = p.actions
    assert a.action == "replace" and a.placement is None and "old copy keeps running" in a.reason
    assert [o.replica for o in p.unplaced] == ["m-0"]
    # the reasons are those against the fleet without the old copy: even its room is not enough
    assert p.unplaced[0].rejections[0].reason == "has 4 free H100-80GB GPUs, needs 8"


def test_spec_changes_are_rolled_out_one_replica_at_a_time_per_model():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")],
                       b=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")], c=True)
    p = plan(catalog(f, M), inv)
    assert kinds(p) == [("replace", "m-0")]
    assert [w.replica for w in p.waiting] == ["m-1"]
    assert "waiting for m-0 to be replaced first" in p.waiting[0].reason


def test_profile_removed_from_catalog_replaces_the_replica():
    f, inv = two_nodes(a=[rank("m-0", "m", "gone", gpus=(0, 1, 2, 3), spec_hash="x")])
    p = plan(catalog(f, model("m", P, replicas=1)), inv)
    assert kinds(p) == [("replace", "m-0")]
    assert p.actions[0].reason.startswith("profile gone is no longer in the catalog")


def test_replicas_on_a_drained_node_are_moved_elsewhere():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)], a_state="drained")
    p = plan(catalog(f, model("m", P, replicas=1)), inv)
    (a,) = p.actions
    assert (a.action, a.reason) == ("replace", "node a is drained")
    assert a.placement.nodes[0].node == "b" and not a.stop_first


def test_dead_rank_is_restarted_in_place_and_counted():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H, alive=False)])
    p = plan(catalog(f, model("m", P, replicas=1)), inv, now=1000)
    (a,) = p.actions
    assert a.action == "restart" and a.placement.nodes[0].gpus == (0, 1, 2, 3)
    assert "rank 0 on a is dead" in a.reason
    assert p.backoff["m-0"] == Backoff(restarts=1, streak=1, last_restart=1000)
    assert p.restarts == {"m-0": 1}


def test_crash_loop_waits_out_an_exponential_backoff():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H, alive=False)])
    c = catalog(f, model("m", P, replicas=1))
    hist = {"m-0": Backoff(restarts=3, streak=3, last_restart=1000)}
    waiting = plan(c, inv, now=1000 + backoff_delay(3) - 1, backoff=hist)
    assert waiting.actions == ()
    (w,) = waiting.waiting
    assert "waiting for backoff until 1970-01-01T00:17:20Z" in w.reason and w.until == 1040
    assert waiting.backoff["m-0"] == hist["m-0"]
    again = plan(c, inv, now=1040, backoff=hist)
    assert kinds(again) == [("restart", "m-0")]
    assert again.backoff["m-0"].restarts == 4


def test_backoff_is_capped():
    assert [backoff_delay(n) for n in range(1, 5)] == [10, 20, 40, 80]
    assert backoff_delay(30) == BACKOFF_CAP_S


def test_backoff_resets_after_a_quiet_spell_but_restart_count_stays():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)])
    hist = {"m-0": Backoff(restarts=5, streak=5, last_restart=0)}
    p = plan(catalog(f, model("m", P, replicas=1)), inv, now=10_000, backoff=hist)
    assert p.backoff["m-0"] == Backoff(restarts=5, streak=0, last_restart=0)


def test_missing_rank_of_multi_node_replica_restarts_it():
    fab = {"ib": ["mlx5_0"]}
    mp = profile("mp", gpus_per_node=8, nodes=2)
    mm = model("mm", mp)
    h = spec_hash(mm, mp)
    f = fleet(node_spec("a", fabrics=fab), node_spec("b", fabrics=fab))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("mm-0", "mm", "mp", gpus=range(8), spec_hash=h, nnodes=2)]),
                    observed("b", gpu=gpus(8)))
    p = plan(catalog(f, mm), inv, now=5)
    (a,) = p.actions
    # where rank 1 ran is unknown: the replica is placed again as a whole, and it counts as a restart
    assert a.action == "replace" and "rank 1 is missing" in a.reason
    assert a.stop_first and [n.node for n in a.placement.nodes] == ["a", "b"] and a.placement.fabric == "ib"
    assert p.backoff["mm-0"].restarts == 1


def test_replicas_on_unreachable_node_wait_out_the_grace_period():
    b_obs = observed("b", state="unreachable", reason="timed out")
    f, inv = two_nodes(b_obs=b_obs)
    last = inventory(observed("b", gpu=gpus(8), replicas=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)]))
    m = model("m", P, replicas=2)
    p = plan(catalog(f, m), inv, now=100, unreachable_since={"b": 0}, grace_s=300, last_seen=last)
    assert kinds(p) == [("start", "m-0")]
    assert [w.replica for w in p.waiting] == ["m-1"] and "grace 300 s" in p.waiting[0].reason


def test_replicas_on_node_unreachable_past_grace_are_placed_elsewhere():
    b_obs = observed("b", state="unreachable", reason="timed out")
    specs = fleet(node_spec("a"), node_spec("b"))
    inv = inventory(observed("a", gpu=gpus(8)), b_obs)
    last = inventory(observed("b", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)]))
    p = plan(catalog(specs, model("m", P, replicas=1)), inv, now=400, unreachable_since={"b": 0}, grace_s=300, last_seen=last)
    (a,) = p.actions
    assert a.action == "replace" and a.reason == "node b unreachable for 400 s (grace 300 s)"
    assert a.placement.nodes[0].node == "a"


def test_stale_copy_on_a_returning_node_is_stopped():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)],
                       b=[rank("m-0", "m", "p", gpus=(4, 5, 6, 7), spec_hash=H)])
    p = plan(catalog(f, model("m", P, replicas=1)), inv, placed_on={"m-0": ("a",)})
    (a,) = p.actions
    assert a.action == "stop" and a.reason == "stale copy: the replica runs on a"
    assert [n.node for n in a.placement.nodes] == ["b"]


def test_actions_are_ordered_stops_restarts_replaces_starts():
    f = fleet(node_spec("a"), node_spec("b"), node_spec("c"), node_spec("d"))
    inv = inventory(
        observed("a", gpu=gpus(8), replicas=[rank("old-0", "old", "x", gpus=(0,), spec_hash="q"),
                                              rank("m-0", "m", "p", gpus=(4, 5, 6, 7), spec_hash="stale")]),
        observed("b", gpu=gpus(8), replicas=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H, alive=False)]),
        observed("c", gpu=gpus(8)), observed("d", gpu=gpus(8)),
    )
    p = plan(catalog(f, model("m", P, replicas=3)), inv, now=0)
    assert kinds(p) == [("stop", "old-0"), ("restart", "m-1"), ("replace", "m-0"), ("start", "m-2")]


def test_nodes_not_in_the_fleet_are_ignored():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8)), observed("stranger", gpu=gpus(8), replicas=[rank("x-0", "x", "p", spec_hash="q")]))
    p = plan(catalog(f, model("m", P, replicas=1)), inv)
    assert kinds(p) == [("start", "m-0")]
    assert "x-0" not in p.observed


def test_unreachable_node_first_seen_now_says_how_long_it_may_stay_so():
    b_obs = observed("b", state="unreachable", reason="timed out",
                     replicas=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)])
    f, inv = two_nodes(b_obs=b_obs)
    p = plan(catalog(f, M), inv, now=50)
    assert [w.reason for w in p.waiting] == ["node b unreachable; replaced elsewhere if it stays unreachable for 300 s"]
    assert p.outcomes["m-1"].kept and kinds(p) == [("start", "m-0")]


def test_dead_rank_of_multi_node_replica_restarts_all_ranks_in_place_with_a_rendezvous_port():
    fab = {"ib": ["mlx5_0"]}
    mp = profile("mp", gpus_per_node=8, nodes=2)
    mm = model("mm", mp)
    h = spec_hash(mm, mp)
    f = fleet(node_spec("a", fabrics=fab), node_spec("b", fabrics=fab))
    inv = inventory(
        observed("a", gpu=gpus(8), ports_in_use=[8000, 29500],
                 replicas=[rank("mm-0", "mm", "mp", gpus=range(8), spec_hash=h, nnodes=2)]),
        observed("b", gpu=gpus(8), replicas=[rank("mm-0", "mm", "mp", r=1, gpus=range(8), spec_hash=h, nnodes=2, alive=False)]),
    )
    p = plan(catalog(f, mm), inv, now=5)
    (a,) = p.actions
    assert a.action == "restart" and "rank 1 on b is dead" in a.reason
    assert [(x.node, x.rank, x.hcas) for x in a.placement.nodes] == [("a", 0, ("mlx5_0",)), ("b", 1, ("mlx5_0",))]
    assert a.placement.fabric == "ib" and a.placement.dist_port == 29501


def test_plan_reports_where_replicas_are_for_the_next_pass():
    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)])
    p = plan(catalog(f, M), inv)
    assert p.placed_on == {"m-0": ("a",), "m-1": ("b",)}


def test_copy_of_removed_model_on_unreachable_node_waits_until_it_answers():
    b_obs = observed("b", state="unreachable", reason="timed out")
    f, inv = two_nodes(a=[rank("old-0", "old", "x", gpus=(0,), spec_hash="q")], b_obs=b_obs)
    last = inventory(observed("b", gpu=gpus(8), replicas=[rank("old-1", "old", "x", gpus=(0,), spec_hash="q")]))
    p = plan(catalog(f, model("m", P, replicas=0)), inv, last_seen=last)
    assert kinds(p) == [("stop", "old-0")]
    assert [(w.replica, w.reason) for w in p.waiting] == [
        ("old-1", "model removed from the catalog; stopped on b when it answers again")]


def test_plan_json_names_each_waits_kind_so_no_client_parses_the_reason():
    import orjson

    from reconciler.commands.plan import plan_document

    def waiting_json(p):  # as `plan --format json` writes it
        return orjson.loads(orjson.dumps(plan_document(p)))["waiting"]

    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")],
                       b=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash="stale")], c=True)
    [turn] = waiting_json(plan(catalog(f, M), inv))
    assert (turn["replica"], turn["kind"]) == ("m-1", "one_at_a_time") and "replaced first" in turn["reason"]

    f, inv = two_nodes(a=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H, alive=False)])
    hist = {"m-0": Backoff(restarts=3, streak=3, last_restart=1000)}
    [crashed] = waiting_json(plan(catalog(f, model("m", P, replicas=1)), inv, now=1001, backoff=hist))
    assert crashed == {"replica": "m-0", "model": "m", "kind": "backoff", "reason": crashed["reason"]}

    f, inv = two_nodes(b_obs=observed("b", state="unreachable", reason="timed out"))
    last = inventory(observed("b", gpu=gpus(8), replicas=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)]))
    p = plan(catalog(f, model("m", P, replicas=2)), inv, now=100, unreachable_since={"b": 0}, grace_s=300, last_seen=last)
    assert [(w["replica"], w["kind"]) for w in waiting_json(p)] == [("m-1", "node_unreachable")]


FAB = {"ib": ["mlx5_0"]}
MP = profile("mp", gpus_per_node=8, nodes=2)


def two_node_model(replicas=1):
    return model("mm", MP, replicas=replicas)


def test_a_multi_node_copy_whose_ranks_carry_different_specs_is_replaced():
    # rank 0 runs the current spec, rank 1 an older one (a half-finished change): the copy as a whole
    # does not match the catalog.
    mm = two_node_model()
    h = spec_hash(mm, MP)
    f = fleet(node_spec("a", fabrics=FAB), node_spec("b", fabrics=FAB), node_spec("c", fabrics=FAB))
    inv = inventory(observed("a", gpu=gpus(8), fabrics=FAB, replicas=[rank("mm-0", "mm", "mp", gpus=range(8), spec_hash=h, nnodes=2)]),
                    observed("b", gpu=gpus(8), fabrics=FAB, replicas=[rank("mm-0", "mm", "mp", 1, gpus=range(8), spec_hash="old", nnodes=2)]),
                    observed("c", gpu=gpus(8), fabrics=FAB))
    p = plan(catalog(f, mm), inv, now=5)
    assert kinds(p) == [("replace", "mm-0")] and p.actions[0].reason.startswith("spec changed")


def test_a_copy_not_desired_with_a_rank_on_a_node_away_is_stopped_where_it_answers_without_a_drain():
    # The copy cannot serve with a rank away: there are no requests to let end.
    mm = two_node_model(replicas=0)
    h = spec_hash(mm, MP)
    f = fleet(node_spec("a", fabrics=FAB), node_spec("b", fabrics=FAB))
    inv = inventory(observed("a", gpu=gpus(8), fabrics=FAB, replicas=[rank("mm-0", "mm", "mp", gpus=range(8), spec_hash=h, nnodes=2)]),
                    observed("b", state="unreachable", reason="timed out"))
    last = inventory(observed("b", gpu=gpus(8), fabrics=FAB, replicas=[rank("mm-0", "mm", "mp", 1, gpus=range(8), spec_hash=h, nnodes=2)]))
    p = plan(catalog(f, mm), inv, now=5, unreachable_since={"b": 0}, grace_s=300, last_seen=last)
    [stop] = p.actions
    assert (stop.action, stop.replica, stop.drain) == ("stop", "mm-0", False)
    assert [w.kind for w in p.waiting] == ["stop_when_back"]


def test_a_node_first_seen_unreachable_now_starts_its_grace_period_now():
    b_obs = observed("b", state="unreachable", reason="timed out")
    f, inv = two_nodes(b_obs=b_obs)
    last = inventory(observed("b", gpu=gpus(8), replicas=[rank("m-1", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)]))
    p = plan(catalog(f, model("m", P, replicas=2)), inv, now=10_000, unreachable_since={}, grace_s=300, last_seen=last)
    assert kinds(p) == [("start", "m-0")]  # m-1 is not replaced: its node has been away for no time yet
    assert [(w.replica, w.kind, w.until) for w in p.waiting] == [("m-1", "node_unreachable", 10_300)]


def test_a_drained_stop_holds_its_gpus_this_pass_even_when_the_model_drains_for_no_time():
    """drain_s 0 skips the wait for requests, never the hand-off to the gateway (SPEC 13): the copy runs
    on past this pass, so nothing placed now may count on its GPUs."""
    from dataclasses import replace

    def planned(drain_s):
        m = replace(model("m", P, replicas=1), drain_s=drain_s)
        other = model("n", profile("q", gpus_per_node=4), replicas=1)
        hm = spec_hash(m, P)
        f = fleet(node_spec("a"))
        inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=hm),
                                                            rank("m-1", "m", "p", gpus=(4, 5, 6, 7), port=8001, spec_hash=hm)]))
        return plan(catalog(f, m, other), inv)

    draining = planned(30.0)
    assert ("stop", "m-1") in kinds(draining) and [o.replica for o in draining.unplaced] == ["n-0"]
    at_once = planned(0.0)
    assert ("stop", "m-1") in kinds(at_once) and [o.replica for o in at_once.unplaced] == ["n-0"]


def test_a_stale_copy_with_a_rank_on_a_node_away_is_stopped_where_it_answers_without_a_drain():
    # mm-0 runs on a and b (where the last pass placed it); an older copy is left on c and on d, which
    # does not answer: that copy cannot serve, so its rank on c stops at once rather than draining.
    mm = two_node_model()
    h = spec_hash(mm, MP)

    def on(number):
        return rank("mm-0", "mm", "mp", number, gpus=range(8), spec_hash=h, nnodes=2)

    f = fleet(*(node_spec(n, fabrics=FAB) for n in "abcd"))
    inv = inventory(*(observed(n, gpu=gpus(8), fabrics=FAB, replicas=[on(i)]) for n, i in (("a", 0), ("b", 1), ("c", 0))),
                    observed("d", state="unreachable", reason="timed out"))
    last = inventory(observed("d", gpu=gpus(8), fabrics=FAB, replicas=[on(1)]))
    p = plan(catalog(f, mm), inv, now=5, unreachable_since={"d": 0}, grace_s=300, last_seen=last,
             placed_on={"mm-0": ("a", "b")})
    [stop] = p.actions
    assert (stop.action, stop.reason, stop.drain) == ("stop", "stale copy: the replica runs on a, b", False)
    assert [n.node for n in stop.placement.nodes] == ["c"]
