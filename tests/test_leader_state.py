"""State that survives a takeover (SPEC section 14): under `leader:`, the daemon's pass (ApplyPass) keeps
the pass memory (backoffs, drains, ...) and the autoscaled counts in a real etcd, where the next leader
reads them; a new leader first records its epoch on every node; a deposed one runs no pass and its
writes are refused. The pass itself is a recording stand-in (ApplyPass's run_pass seam) and the node
agent answers in this process (tests/test_fencing.py), so what is asserted is what crosses the takeover."""

from __future__ import annotations

import time

import pytest
import yaml

from reconciler.decide.autoscale import AutoscaleState
from reconciler.decide.backoff import Backoff
from reconciler.catalog import load_catalog
from reconciler.commands.run import ApplyPass
from reconciler.control.election import Election
from reconciler.control.etcd import EtcdClient
from reconciler.decide.outcomes import PassMemory, PassResult
from reconciler.decide.plan_values import Drain
from tests.etcd_cluster import EtcdCluster, have_etcd
from tests.test_fencing import AgentInProcess

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(not have_etcd(), reason="etcd-server is not installed (scripts/test.sh installs it)")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = EtcdCluster(tmp_path_factory.mktemp("etcd"), size=3)
    c.start()
    yield c
    c.close()


def catalog(tmp_path, endpoints):
    (tmp_path / "models").mkdir(parents=True)
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "owner": "takeover" + str(int(time.time() * 1000) % 100000),
        "leader": {"etcd": {"endpoints": endpoints}, "lease_s": 5},
        "nodes": [{"id": "n1", "address": "10.9.0.1"}, {"id": "n2", "address": "10.9.0.2"}]}))
    (tmp_path / "models" / "busy.yaml").write_text(yaml.safe_dump({
        "name": "busy", "source": "busy-weights", "replicas": {"min": 1, "max": 3},
        "autoscale": {"metric": "requests", "target": 1},
        "profiles": [{"name": "cpu", "engine": "command", "port": 9000, "command": ["/bin/true"],
                      "metrics": {"waiting": "w", "running": "r"}}]}))
    return load_catalog(tmp_path, with_revision=False)


class Pool:
    """One in-process node agent per node, with its own state directory."""

    def __init__(self, tmp_path):
        self.agents = {}
        self.tmp = tmp_path

    def transport_for(self, spec):
        return self.agents.setdefault(spec.id, AgentInProcess())

    def forget(self, node):
        pass

    def close(self):
        pass


class RecordingPass:
    def __init__(self, memory=None, counts=None):
        self.calls = []
        self.memory, self.counts = memory, counts

    def __call__(self, catalog, **kw):
        self.calls.append(kw)
        return PassResult(catalog.revision, None, None, memory=self.memory or kw["history"], autoscale=self.counts)


def elect(cluster, owner, host):
    e = Election(EtcdClient(cluster.endpoints), owner, 5, log=lambda *a, **k: None, host=host)
    e.start(wait_s=3)
    deadline = time.monotonic() + 10
    while e.epoch() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return e


def test_a_new_leader_goes_on_from_the_memory_and_counts_the_last_one_left(cluster, tmp_path):
    cat = catalog(tmp_path / "catalog", cluster.endpoints)
    owner = cat.fleet.owner
    memory = PassMemory(backoff={"busy-0": Backoff(restarts=3, streak=2, last_restart=1000.0)},
                        draining={"busy-1": Drain(replica="busy-1", model="busy", nodes=("n2",), port=9000,
                                                  engine="command", started=1500.0, until=2000.0)})
    counts = {"busy": AutoscaleState(current=3, wanted=3, metric_sum=7.0, reason="requests 7 over 2 replicas > target 1",
                                     since=1700000000.0)}
    a_election = elect(cluster, owner, "mgmt-a")
    a_run = RecordingPass(memory, counts)
    a = ApplyPass(run_pass=a_run, pool=Pool(tmp_path), read_loads=lambda *x, **k: {})
    a.leadership = a_election
    log = []
    a(cat, lambda *x, **k: log.append((x, k)))
    first = a_run.calls[-1]
    assert first["epoch"] == a_election.epoch() and first["may_act"]() is None

    b_election = Election(EtcdClient(cluster.endpoints), owner, 5, log=lambda *x, **k: None, host="mgmt-b")
    b_election.start(wait_s=3)
    a_election.stop()  # the leader goes; b takes over
    deadline = time.monotonic() + 15
    while b_election.epoch() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    b_pool = Pool(tmp_path)
    b_run = RecordingPass()
    b = ApplyPass(run_pass=b_run, pool=b_pool, read_loads=lambda *x, **k: {})
    b.leadership = b_election
    b(cat, lambda *x, **k: None)
    try:
        taken = b_run.calls[-1]
        assert taken["epoch"] == b_election.epoch() > first["epoch"]
        assert taken["history"].backoff["busy-0"].restarts == 3
        assert taken["history"].draining["busy-1"].until == 2000.0  # a drain in progress goes on
        assert taken["counts_kept"]["busy"].current == 3
        # Before anything else, every node was told the new epoch.
        assert {n: [r["op"] for r in agent.requests][:1] for n, agent in b_pool.agents.items()} == \
            {"n1": ["fence"], "n2": ["fence"]}
        assert all(agent.requests[0]["epoch"] == taken["epoch"] for agent in b_pool.agents.values())
        # The deposed leader runs no pass, and may not act through a launcher it still holds.
        assert a(cat, lambda *x, **k: None) is None and len(a_run.calls) == 1
        assert first["may_act"]() is not None
    finally:
        b_election.stop()
