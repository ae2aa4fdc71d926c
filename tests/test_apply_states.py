"""The phase of every desired replica after a pass, from the snapshot the pass left (no processes needed)."""

from __future__ import annotations

from reconciler.control.reconcile import replica_states
from reconciler.model import spec_hash
from reconciler.decide.plan import plan
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

P = profile("p", gpus_per_node=1)
M = model("m", P, replicas=3)
H = spec_hash(M, P)


class CountingInventory:
    """An inventory that counts how often its nodes are walked."""

    def __init__(self, inner):
        self.inner = inner
        self.walks = 0

    @property
    def nodes(self):
        self.walks += 1
        return self.inner.nodes

    def node(self, node_id):
        return self.inner.node(node_id)


def test_replica_states_walk_the_snapshot_once_for_all_replicas_not_once_per_replica():
    f = fleet(node_spec("a", data_address="10.1.0.1"), node_spec("b", data_address="10.1.0.2"))
    inv = inventory(
        observed("a", gpu=gpus(2), replicas=[rank("m-0", "m", "p", gpus=[0], port=8000, spec_hash=H),
                                             rank("m-1", "m", "p", gpus=[1], port=8001, spec_hash=H)]),
        observed("b", gpu=gpus(2), replicas=[rank("m-2", "m", "p", gpus=[0], port=8000, spec_hash=H)]),
    )
    c = catalog(f, M)
    counted = CountingInventory(inv)
    asked = []

    def health(host, port, path):
        asked.append(f"http://{host}:{port}")
        return True, ""

    states = replica_states(c, counted, {}, plan(c, inv), launcher=None, health=health)
    assert {rid: s.phase for rid, s in states.items()} == {"m-0": "Ready", "m-1": "Ready", "m-2": "Ready"}
    assert states["m-1"].endpoint == "http://10.1.0.1:8001" and states["m-2"].nodes[0].node == "b"
    assert sorted(asked) == ["http://10.1.0.1:8000", "http://10.1.0.1:8001", "http://10.1.0.2:8000"]
    assert counted.walks == 1


def test_the_snapshot_after_a_pass_looks_at_each_started_rank_a_few_times_not_once_per_fleet_node():
    from reconciler.observe.snapshot import inventory_after
    from reconciler.model import RankLaunch

    reads = []

    class CountedLaunch(RankLaunch):
        def __getattribute__(self, name):
            if name == "node":
                reads.append(1)
            return super().__getattribute__(name)

    def launch(rid, node, port):
        return CountedLaunch(rid, "m", "p", node, 0, 1, ("engine",), {}, port, (0,), H, "/health")

    before = inventory(*(observed(f"n{i}", ports_in_use=(22,)) for i in range(20)))
    started = [launch("m-0", "n3", 8000), launch("m-1", "n7", 8001)]
    after = inventory_after(before, started, [], pids={("n3", "m-0", 0): 30, ("n7", "m-1", 0): 70})
    assert [(r.id, r.pid) for r in after.node("n3").replicas] == [("m-0", 30)]
    assert after.node("n7").ports_in_use == (22, 8001) and after.node("n0") == before.node("n0")
    assert len(reads) <= 2 * len(started)
