"""Invariants that hold on every plan, over generated fleets and catalogs (hypothesis)."""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.model import RunningRank, spec_hash
from reconciler.decide.placement import place
from reconciler.decide.plan import plan
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile

CLASSES = ["H100-80GB", "A100-80GB"]
FABRICS = ["ib-a", "ib-b"]
ENGINES = ["vllm", "sglang", "llama.cpp"]


@st.composite
def fleets(draw):
    n = draw(st.integers(1, 12))
    specs, nodes = [], []
    for i in range(n):
        nid = f"n{i:02d}"
        cls = draw(st.sampled_from(CLASSES + CLASSES + [None]))
        count = 0 if cls is None else draw(st.sampled_from([1, 2, 4, 8]))
        busy = draw(st.sets(st.integers(0, max(count - 1, 0)), max_size=2)) if count else set()
        fab = draw(st.sampled_from(["ib-a", "ib-a", "ib-b", None]))
        declared = draw(st.booleans())
        fabrics = {fab: [f"mlx5_{i % 3}"]} if fab else {}
        engines = draw(st.one_of(st.none(), st.just(set(ENGINES)), st.sets(st.sampled_from(ENGINES))))
        specs.append(node_spec(
            nid, labels={"zone": draw(st.sampled_from(["a", "b"]))},
            state=draw(st.sampled_from(["ready"] * 8 + ["cordoned", "drained"])),
            fabrics=fabrics if declared else None,
        ))
        nodes.append(observed(
            nid, gpu=gpus(count, cls, busy=busy) if cls else (),
            state=draw(st.sampled_from(["ready"] * 12 + ["unreachable"])),
            engines=None if engines is None else tuple(sorted(engines)),
            memory_gib=draw(st.sampled_from([64, 256, 1024, 1024, None])),
            fabrics=None if declared else fabrics,
            weights=draw(st.one_of(st.none(), st.just(["/models/m0"]), st.just([]))),
            ports_in_use=draw(st.sets(st.sampled_from([8000, 8001, 8080, 29500]), max_size=2)),
        ))
    # occasionally leave a fleet node out of the snapshot: it counts as unreachable
    if n > 1 and draw(st.booleans()):
        nodes.pop(draw(st.integers(0, n - 1)))
    return fleet(*specs), inventory(*nodes)


@st.composite
def profiles(draw, i):
    cpu = draw(st.integers(0, 4)) == 0
    engine = draw(st.sampled_from(["llama.cpp", "command"])) if cpu else draw(st.sampled_from(["vllm", "sglang"]))
    kw = {}
    if draw(st.integers(0, 3)) == 0:
        kw["node_selector"] = {"zone": draw(st.sampled_from(["a", "b"]))}
    if draw(st.integers(0, 3)) == 0:
        kw["min_memory_gb"] = draw(st.sampled_from([128, 512]))
    if engine == "command":
        kw["command"] = ("serve",)
        kw["port"] = 9000
    return profile(
        f"p{i}", engine=engine, gpu_class=None if cpu else draw(st.sampled_from(CLASSES)),
        gpus_per_node=None if cpu else draw(st.sampled_from([1, 2, 4, 8])),
        nodes=draw(st.sampled_from([1, 1, 1, 2, 3])), priority=draw(st.integers(0, 100)), **kw,
    )


@st.composite
def models(draw):
    out = []
    for mi in range(draw(st.integers(1, 4))):
        profs = [draw(profiles(i)) for i in range(draw(st.integers(1, 3)))]
        out.append(model(f"m{mi}", *profs, replicas=draw(st.integers(0, 5)),
                         spread=draw(st.sampled_from(["required", "required", "preferred"]))))
    return out


def check_invariants(f, inv, ms, result, kept=()):
    specs = {s.id: s for s in f.nodes}
    by_model = {m.name: m for m in ms}
    gpu_owner: dict[tuple[str, int], str] = {}
    port_owner: dict[tuple[str, int], str] = {}
    for p in result.placements:
        if p.replica in kept:
            continue
        m = by_model[p.model]
        prof = m.profile(p.profile)
        assert len(p.nodes) == prof.nodes
        assert len({a.node for a in p.nodes}) == prof.nodes, "a replica uses each node once"
        assert [a.rank for a in p.nodes] == list(range(prof.nodes))
        if prof.nodes > 1:
            assert p.fabric is not None and p.pool == f"{p.fabric}/{prof.class_label}"
            assert p.dist_port is not None and p.dist_port != p.nodes[0].port
            assert p.dist_port not in inv.node(p.nodes[0].node).ports_in_use
            assert (p.nodes[0].node, p.dist_port) not in port_owner, "rendezvous port given twice"
            port_owner[(p.nodes[0].node, p.dist_port)] = p.replica
        else:
            assert p.fabric is None and p.pool == f"none/{prof.class_label}"
        for a in p.nodes:
            spec, obs = specs[a.node], inv.node(a.node)
            assert obs is not None and obs.state != "unreachable" and spec.state == "ready"
            for k, v in prof.node_selector.items():
                assert spec.labels.get(k) == v
            if prof.engine != "command" and obs.engines is not None:
                assert prof.engine in obs.engines
            if prof.min_memory_gb and obs.memory_total_mb:
                assert obs.memory_total_mb / 1024 >= prof.min_memory_gb
            if p.fabric is not None:
                fabs = dict(spec.fabrics) if spec.fabrics else {x.name: x.hcas for x in obs.fabrics}
                assert p.fabric in fabs and a.hcas == tuple(fabs[p.fabric])
            assert len(a.gpus) == prof.gpus_per_node
            gpu_by_index = {g.index: g for g in obs.gpus}
            for g in a.gpus:
                assert (spec.gpu_class or gpu_by_index[g].gpu_class) == prof.gpu_class, "one GPU class per replica"
                assert not gpu_by_index[g].processes, "never a GPU a foreign process uses"
                assert (a.node, g) not in gpu_owner, f"GPU {a.node}:{g} given twice"
                gpu_owner[(a.node, g)] = p.replica
            assert a.port not in obs.ports_in_use
            assert (a.node, a.port) not in port_owner, f"port {a.node}:{a.port} given twice"
            port_owner[(a.node, a.port)] = p.replica
    for m in ms:
        if m.spread == "required":
            hosts = [a.node for p in result.placements if p.model == m.name for a in p.nodes]
            assert len(hosts) == len(set(hosts)), "replicas of one model never share a node"
    for o in result.unplaced:
        if o.rejections_same_as:
            first = result.outcomes[o.rejections_same_as]
            assert first.placement is None and first.rejections
        else:
            assert {r.profile for r in o.rejections} == {p.name for p in by_model[o.model].profiles}


# 100 examples a property in the whole suite; the fast tier (LLMFLEET_FAST_TIER=1, set by
# `scripts/test.sh --fast`) draws 20, so it stays under a minute on two cores.
EXAMPLES = 20 if os.environ.get("LLMFLEET_FAST_TIER") else 100
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(fleets(), models())
def test_every_placement_respects_every_rule(fi, ms):
    f, inv = fi
    result = place(ms, f, inv)
    check_invariants(f, inv, ms, result)
    assert set(result.outcomes) == {rid for m in ms for rid in m.replica_ids()}


@SETTINGS
@given(fleets(), models())
def test_placement_is_deterministic(fi, ms):
    f, inv = fi
    assert place(ms, f, inv) == place(ms, f, inv)


def applied(inv, f, ms, p):
    """The snapshot after a perfect apply of plan p: node records for every start, gone for every stop."""
    by_model = {m.name: m for m in ms}
    adds: dict[str, list[RunningRank]] = {}
    ports: dict[str, set[int]] = {}
    for a in p.actions:
        assert a.action == "start"
        m = by_model[a.model]
        prof = m.profile(a.placement.profile)
        for asg in a.placement.nodes:
            adds.setdefault(asg.node, []).append(RunningRank(
                id=a.replica, model=a.model, profile=prof.name, rank=asg.rank, gpus=asg.gpus, port=asg.port,
                spec_hash=spec_hash(m, prof), nnodes=prof.nodes))
            ports.setdefault(asg.node, set()).add(asg.port)
        if a.placement.dist_port:
            ports.setdefault(a.placement.nodes[0].node, set()).add(a.placement.dist_port)
    nodes = []
    for n in inv.nodes:
        nodes.append(replace(n, replicas=n.replicas + tuple(adds.get(n.id, ())),
                             ports_in_use=tuple(sorted(set(n.ports_in_use) | ports.get(n.id, set())))))
    return type(inv)(tuple(nodes))


@SETTINGS
@given(fleets(), models())
def test_a_plan_applied_then_planned_again_changes_nothing(fi, ms):
    f, inv = fi
    c = catalog(f, *ms)
    first = plan(c, inv)
    check_invariants(f, inv, ms, type("R", (), {"placements": [a.placement for a in first.actions],
                                               "unplaced": list(first.unplaced), "outcomes": first.outcomes})())
    second = plan(c, applied(inv, f, ms, first))
    assert second.actions == (), "running replicas are sticky: an applied plan is a fixed point"
    assert [o.replica for o in second.unplaced] == [o.replica for o in first.unplaced]


@st.composite
def changes(draw, ms, f):
    """Which models get a new spec, which node is drained, which replicas crash."""
    changed = draw(st.sets(st.sampled_from([m.name for m in ms])))
    drained = draw(st.one_of(st.none(), st.sampled_from([s.id for s in f.nodes])))
    crash_seed = draw(st.integers(0, 3))
    return changed, drained, crash_seed


@SETTINGS
@given(fleets(), models(), st.data())
def test_second_pass_over_running_replicas_keeps_every_rule(fi, ms, data):
    f, inv = fi
    first = plan(catalog(f, *ms), inv)
    running = applied(inv, f, ms, first)
    changed, drained, crash_seed = data.draw(changes(ms, f))
    # crash some ranks
    nodes = []
    for k, n in enumerate(running.nodes):
        reps = tuple(replace(r, alive=False) if (k + r.rank + crash_seed) % 4 == 0 else r for r in n.replicas)
        nodes.append(replace(n, replicas=reps))
    running = type(inv)(tuple(nodes))
    ms2 = [replace(m, profiles=tuple(replace(p, args=p.args + ("--new",)) for p in m.profiles)) if m.name in changed else m
           for m in ms]
    f2 = type(f)(nodes=tuple(replace(s, state="drained") if s.id == drained else s for s in f.nodes))
    second = plan(catalog(f2, *ms2), running, now=100)

    assert set(second.outcomes) == {rid for m in ms2 for rid in m.replica_ids()}
    spec_replaces: dict[str, int] = {}
    new = []
    for a in second.actions:
        assert a.action in ("restart", "replace", "start"), a
        if a.action == "replace":
            if a.reason.startswith("spec changed"):
                spec_replaces[a.model] = spec_replaces.get(a.model, 0) + 1
            if a.placement is not None:
                assert drained not in [x.node for x in a.placement.nodes]
                if not a.stop_first:
                    # beside the old copy, never on its nodes
                    assert not {x.node for x in a.placement.nodes} & {x.node for x in a.previous.nodes}
        if a.action in ("start", "replace") and a.placement is not None:
            new.append(a.placement)
    assert all(v == 1 for v in spec_replaces.values()), "one spec change at a time per model"
    check_invariants(f2, running, ms2, type("R", (), {"placements": new, "unplaced": [], "outcomes": second.outcomes})())
    # no GPU is promised to two copies that run at the same time
    held: dict[tuple[str, int], str] = {}
    stopped_first = {a.replica for a in second.actions if a.action == "replace" and a.stop_first}
    for rid, o in second.outcomes.items():
        if o.placement is None:
            continue
        for x in o.placement.nodes:
            for g in x.gpus:
                assert (x.node, g) not in held, f"{x.node}:{g} held by {held[(x.node, g)]} and {rid}"
                held[(x.node, g)] = rid
    for a in second.actions:
        if a.action == "replace" and a.placement is not None and a.replica not in stopped_first:
            for x in a.previous.nodes:
                for g in x.gpus:
                    assert (x.node, g) not in held or held[(x.node, g)] == a.replica
