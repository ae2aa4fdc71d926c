"""The daemon's wiring of the apply pass: what it hands run_pass from one pass to the next."""

from __future__ import annotations

from types import SimpleNamespace

from reconciler.commands.run import ApplyPass, ProbeFleet, ReusedInventory
from reconciler.control.reconcile import ProbeOnly
from reconciler.model import Catalog, Fleet, Inventory, NodeSpec, ObservedNode
from reconciler.observe.transport import LocalTransport


class Pool:
    def __init__(self):
        self.forgotten = []

    def transport_for(self, node):
        return LocalTransport(node.id)

    def forget(self, node_id):
        self.forgotten.append(node_id)

    def close(self):
        pass


def catalog(*node_ids: str) -> Catalog:
    nodes = tuple(NodeSpec(id=i, address=f"10.213.9.{n}", data_address=f"10.213.9.{n}") for n, i in enumerate(node_ids, 1))
    return Catalog(root="/nonexistent", fleet=Fleet(nodes=nodes), models=(), revision="r")


class MemoryStore:
    def __init__(self, saved=None):
        self.saved = {} if saved is None else saved

    def load(self, root):
        return self.saved.get(root)

    def save(self, root, memory):
        self.saved[root] = memory


def apply_pass(run, pool=None, saved=None, **kw) -> ApplyPass:
    store = MemoryStore(saved)
    return ApplyPass(run_pass=run, pool=pool or Pool(), memory=(store.load, store.save), **kw)


class RecordingRunPass:
    def __init__(self):
        self.calls = []
        self.n = 0

    def __call__(self, catalog, *, transports, history, log, ready_wait_s, probe=None):
        self.n += 1
        inventory = Inventory(nodes=tuple(ObservedNode(id=f"seen-{self.n}") for _ in range(1)))
        self.calls.append(SimpleNamespace(transports=sorted(transports), history=history, ready_wait_s=ready_wait_s,
                                          probe=probe))
        return SimpleNamespace(inventory=inventory, memory=f"memory-{self.n}")


def test_history_is_handed_to_the_next_pass_and_readiness_is_never_awaited_inside_one():
    run = RecordingRunPass()
    p = apply_pass(run)
    p(catalog("a"), print, trigger="start")
    p(catalog("a"), print, trigger="interval")
    assert [c.history for c in run.calls] == [None, "memory-1"]
    assert {c.ready_wait_s for c in run.calls} == {0}


def test_a_commit_pass_reuses_the_inventory_the_last_pass_left_only_while_fresh_and_fleet_unchanged():
    now = [100.0]
    run = RecordingRunPass()
    p = apply_pass(run, reuse_inventory_s=30, clock=lambda: now[0])
    logged = []
    p(catalog("a"), lambda *a, **k: logged.append(a), trigger="start")
    assert isinstance(run.calls[-1].probe, ProbeFleet)

    p(catalog("a"), lambda *a, **k: logged.append(a), trigger="commit")
    reused = run.calls[-1].probe
    assert isinstance(reused, ReusedInventory) and reused(None, None).nodes[0].id == "seen-1"
    assert ("probe.reused",) in logged

    p(catalog("a"), print, trigger="interval")  # a resync always probes
    assert isinstance(run.calls[-1].probe, ProbeFleet)

    p(catalog("a", "b"), print, trigger="commit")  # fleet.yaml changed: probe
    assert isinstance(run.calls[-1].probe, ProbeFleet)

    now[0] += 31
    p(catalog("a", "b"), print, trigger="commit")  # too old: probe
    assert isinstance(run.calls[-1].probe, ProbeFleet)


class WakingRunPass(RecordingRunPass):
    """Each pass asks for the next one about node `a` (a start to judge there)."""

    def __call__(self, catalog, **kw):
        out = super().__call__(catalog, **kw)
        out.inventory = Inventory(tuple(ObservedNode(id=n.id, reason=f"pass {self.n}") for n in catalog.fleet.nodes))
        out.next_pass_nodes = frozenset({"a"})
        return out


def test_a_wake_pass_probes_only_the_nodes_it_is_about_while_every_node_was_probed_lately():
    now = [100.0]
    run = WakingRunPass()
    p = apply_pass(run, reuse_inventory_s=30, clock=lambda: now[0])
    logged = []
    p(catalog("a", "b", "c"), lambda event, **k: logged.append((event, k)), trigger="start")
    assert isinstance(run.calls[-1].probe, ProbeFleet)

    p(catalog("a", "b", "c"), lambda event, **k: logged.append((event, k)), trigger="wake")
    partial = run.calls[-1].probe
    assert isinstance(partial, ProbeOnly) and partial.nodes == {"a"}
    assert [n.reason for n in partial.last.nodes] == ["pass 1"] * 3  # the others, as the last pass left them
    assert [k["nodes"] for e, k in logged if e == "probe.partial"] == [["a"]]

    now[0] += 20
    p(catalog("a", "b", "c"), lambda *a, **k: None, trigger="wake")  # a wake after a wake: the age counts from the full probe
    assert isinstance(run.calls[-1].probe, ProbeOnly)
    now[0] += 11
    p(catalog("a", "b", "c"), lambda *a, **k: None, trigger="wake")  # every node last probed 31 s ago: probe them all
    assert isinstance(run.calls[-1].probe, ProbeFleet)
    p(catalog("a", "b"), lambda *a, **k: None, trigger="wake")  # fleet.yaml changed: probe
    assert isinstance(run.calls[-1].probe, ProbeFleet)


def test_a_partial_probe_merges_the_nodes_it_probed_into_the_last_inventory():
    last = Inventory(tuple(ObservedNode(id=i, reason="last pass") for i in ("a", "b", "c")))
    asked = []

    def probe(cat, transports):
        asked.append([n.id for n in cat.fleet.nodes])
        return Inventory(tuple(ObservedNode(id=n.id, reason="probed now") for n in cat.fleet.nodes))

    merged = ProbeOnly(probe, last, frozenset({"b", "gone"}))(catalog("a", "b", "c"), None)
    assert asked == [["b"]]
    assert [(n.id, n.reason) for n in merged.nodes] == [("a", "last pass"), ("b", "probed now"), ("c", "last pass")]
    assert ProbeOnly(probe, last, frozenset())(catalog("a", "b", "c"), None) is last and asked == [["b"]]


def test_a_node_removed_from_the_fleet_has_its_connection_dropped():
    pool = Pool()
    p = apply_pass(RecordingRunPass(), pool=pool)
    p(catalog("a", "b"), print, trigger="start")
    p(catalog("a"), print, trigger="commit")
    assert pool.forgotten == ["b"]


def test_the_pass_memory_is_saved_after_each_pass_and_read_back_by_a_new_daemon():
    saved = {}
    first = apply_pass(RecordingRunPass(), saved=saved)
    first(catalog("a"), print, trigger="start")
    first(catalog("a"), print, trigger="interval")
    assert saved == {"/nonexistent": "memory-2"}

    run = RecordingRunPass()
    restarted = apply_pass(run, saved=saved)
    restarted(catalog("a"), print, trigger="start")
    assert run.calls[0].history == "memory-2"


class Stuck:
    """A node whose commands never answer until the test lets them go (a cut link)."""

    def __init__(self, node_id, gate):
        self.node_id, self.gate = node_id, gate
        self.command_timeout_s = 30.0

    def run(self, argv, *, stdin=None, timeout=None):
        from reconciler.errors import CommandTimeout

        self.gate.wait()
        raise CommandTimeout(self.node_id, "ran past its deadline")

    def close(self):
        pass


def test_a_node_that_stops_answering_is_not_waited_on_while_a_commit_waits():
    import threading

    from reconciler.observe.probe import FleetProber

    gate = threading.Event()
    fleet = catalog("fast", "stuck").fleet

    class Pool:
        def transport_for(self, node):
            return Stuck(node.id, gate) if node.id == "stuck" else LocalTransport(node.id)

    events = []
    try:
        result = FleetProber()(fleet, Pool(), interrupt=lambda: True, log=lambda e, **f: events.append((e, f.get("node"))))
        by_id = {r.node.id: r.node for r in result.results}
        assert by_id["fast"].state == "ready"
        assert by_id["stuck"].state == "unreachable" and "no answer yet" in by_id["stuck"].reason
        assert not gate.is_set()  # its probe was still running when the pass went on
        # Only a probe that ended has a duration: the stuck one's is not the seconds the pass waited.
        assert set(result.durations()) == {"fast"} and result.durations()["fast"] > 0
    finally:
        gate.set()
