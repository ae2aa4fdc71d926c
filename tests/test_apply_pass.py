"""One apply pass on this machine: real engine processes on loopback, real records, real status files.

Probe, plan and render are the simple stand-ins of tests/apply_support/seams.py,
so these tests pin down what apply itself does with a plan.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
import yaml

from reconciler.act.readiness import http_health
from reconciler.control.reconcile import run_pass
from reconciler.observe.snapshot import gpu_problems, start_order
from reconciler.act.launcher import SshLauncher
from reconciler.model import Gpu, GpuProcess, Inventory, ObservedNode, RunningRank
from reconciler.observe.transport import LocalTransport
from tests.apply_support.local import free_port, is_running, kill_recorded, tiny_launch, wait_for
from tests.apply_support.seams import SimplePlanner, as_plan, catalog, local_fleet, local_probe, tiny_model, tiny_render

pytestmark = [pytest.mark.process]


@pytest.fixture
def env(tmp_path):
    fleet = local_fleet(tmp_path)
    transports = {n.id: LocalTransport(n.id) for n in fleet.nodes}
    launcher = SshLauncher.for_fleet(fleet, transports, stop_grace_s=2.0)
    records = tmp_path / "engine-records"
    records.mkdir()
    yield fleet, transports, launcher, records
    for n in fleet.nodes:
        kill_recorded(Path(n.state_dir))


def one_pass(cat, transports, launcher, planner, records, log=None, **kw):
    """One run_pass with the stand-in probe and renderer; the planner's bare actions become a real Plan."""

    def plan(catalog, inventory, **k):
        return as_plan(catalog, inventory, planner(catalog, inventory, **k))

    return run_pass(
        cat, transports=transports, launcher=launcher, probe=kw.pop("probe", None) or local_probe(launcher),
        planner=plan, render=tiny_render(records), log=log or (lambda d: None), **kw,
    )


def read_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def test_a_pass_starts_a_missing_replica_waits_until_ready_and_writes_status(tmp_path, env):
    fleet, transports, launcher, records = env
    port = free_port()
    cat = catalog(tmp_path, fleet, tiny_model("m", args=["--ready-after", "0.5"]))
    result = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", port, ())]}), records)

    assert [(d.replica, d.node, d.action) for d in result.decisions if d.action == "start"] == [("m-0", "n1", "start")]
    assert result.replicas["m-0"].phase == "Ready"
    assert result.endpoints() == {"m": [f"http://127.0.0.1:{port}"]}
    status = Path(cat.root) / "status"
    model_doc = read_yaml(status / "models" / "m.yaml")
    assert model_doc["desired"] == 1 and model_doc["ready"] == 1
    [replica] = model_doc["replicas"]
    assert replica["id"] == "m-0" and replica["phase"] == "Ready"
    assert replica["nodes"] == [{"node": "n1", "rank": 0, "gpus": [], "port": port, "endpoint": f"http://127.0.0.1:{port}"}]
    assert read_yaml(status / "endpoints.yaml")["models"] == {"m": [f"http://127.0.0.1:{port}"]}
    nodes_doc = read_yaml(status / "nodes.yaml")
    n1 = next(n for n in nodes_doc["nodes"] if n["id"] == "n1")
    assert [(r["id"], r["port"]) for r in n1["replicas"]] == [("m-0", port)]


def test_a_restarted_reconciler_adopts_what_runs_and_launches_nothing(tmp_path, env):
    fleet, transports, launcher, records = env
    port = free_port()
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    planner = SimplePlanner({"m-0": [("n1", port, ())]})
    first = one_pass(cat, transports, launcher, planner, records)
    pid = json.loads((records / "m-0.rank0.json").read_text())["pid"]

    # A new launcher and planner: nothing is remembered in memory, only on the node.
    relaunched = SshLauncher.for_fleet(fleet, transports)
    second = one_pass(cat, transports, relaunched, SimplePlanner({"m-0": [("n1", port, ())]}), records)
    assert first.replicas["m-0"].phase == second.replicas["m-0"].phase == "Ready"
    assert [d for d in second.decisions if d.action == "start"] == []
    assert [r.pid for r in relaunched.ranks("n1")] == [pid]
    # Even a plan that (wrongly) asks to start it again gets the running copy back, not a second one.
    again = one_pass(cat, transports, relaunched, lambda c, i, **k: list(planner(c, i.__class__(()))), records)
    assert [d.action for d in again.decisions if d.replica == "m-0"][0] == "adopt"
    assert [r.pid for r in relaunched.ranks("n1")] == [pid]


def test_a_second_pass_with_nothing_changed_writes_no_status_file(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    planner = SimplePlanner({"m-0": [("n1", free_port(), ())]})
    first = one_pass(cat, transports, launcher, planner, records)
    # models/m.yaml, endpoints.yaml, nodes.yaml, gateway/litellm.yaml, gateway/prometheus.json
    assert len(first.written) == 5
    second = one_pass(cat, transports, launcher, planner, records)
    assert second.written == []


def test_workers_start_before_the_head():
    launches = [tiny_launch("m-0", f"n{r}", 1, Path("x"), rank=r, nnodes=3) for r in (0, 1, 2)]
    assert [l.rank for l in start_order(launches)] == [1, 2, 0]


def test_a_multi_node_replica_whose_head_cannot_start_leaves_no_worker_behind(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m", nodes=2))
    with socket.socket() as foreign:
        foreign.bind(("0.0.0.0", 0))
        foreign.listen()
        taken = foreign.getsockname()[1]
        planner = SimplePlanner({"m-0": [("n1", taken, ()), ("n2", free_port(), ())]})
        result = one_pass(cat, transports, launcher, planner, records)

    state = result.replicas["m-0"]
    assert state.phase == "Failed"
    assert f"rank 0 on n1 did not start: port {taken} is in use by pid {os.getpid()}" in state.message
    [started] = [d for d in result.decisions if d.action == "start"]  # the worker did start first...
    worker_pid = int(re.search(r"\(pid (\d+)\)", started.reason).group(1))
    assert not is_running(worker_pid)  # ...and was taken back
    assert launcher.ranks("n1") == [] and launcher.ranks("n2") == []
    assert [(d.node, d.action) for d in result.decisions] == [("n2", "start"), ("n2", "stop"), ("n1", "fail")]
    assert not result.ok


def test_a_replica_not_ready_within_its_start_timeout_is_failed_with_its_last_log_lines(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m", args=["--never-ready"], start_timeout_s=1.0))
    result = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", free_port(), ())]}), records)
    state = result.replicas["m-0"]
    assert state.phase == "Failed"
    assert "not Ready after 1s" in state.message and "loading weights" in state.message
    doc = read_yaml(Path(cat.root) / "status" / "models" / "m.yaml")
    assert doc["ready"] == 0 and "loading weights" in doc["replicas"][0]["message"]


def test_apply_stops_waiting_at_its_budget_and_reports_starting(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m", args=["--never-ready"], start_timeout_s=600))
    result = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", free_port(), ())]}), records,
                      ready_wait_s=0.5)
    assert result.replicas["m-0"].phase == "Starting"
    # The next pass (a daemon's) sees it still starting, from the record's launch time.
    later = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", 1, ())]}), records, ready_wait_s=0)
    assert later.replicas["m-0"].phase == "Starting"


def test_a_dead_worker_keeps_a_replica_from_ready_even_when_the_head_answers(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m", nodes=2))
    planner = SimplePlanner({"m-0": [("n1", free_port(), ()), ("n2", free_port(), ())]})
    first = one_pass(cat, transports, launcher, planner, records)
    assert first.replicas["m-0"].phase == "Ready"
    worker = json.loads((records / "m-0.rank1.json").read_text())["pid"]
    os.kill(worker, 9)
    from tests.apply_support.local import wait_for

    wait_for(lambda: not is_running(worker), what="worker to die")
    after = one_pass(cat, transports, launcher, lambda c, i, **k: [], records)
    assert after.replicas["m-0"].phase == "Failed"
    assert "rank 1 on n2 is not running" in after.replicas["m-0"].message
    assert after.endpoints() == {}


def test_a_rank_on_a_gpu_used_by_a_foreign_process_is_refused_naming_the_process(tmp_path, env):
    fleet, transports, launcher, records = env
    dirty = ObservedNode("n1", gpus=(
        Gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", "H100-80GB", 81559, 30000, processes=(GpuProcess(4242, "python", 30000),)),
        Gpu(1, "GPU-b", "NVIDIA H100 80GB HBM3", "H100-80GB", 81559, 0),
    ))
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    result = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", free_port(), (0,))]}), records,
                      probe=local_probe(launcher, {"n1": dirty}))
    state = result.replicas["m-0"]
    assert state.phase == "Failed"
    assert "GPU 0 on n1 is used by foreign process 4242 (python, 30000 MiB)" in state.message
    assert launcher.ranks("n1") == []


def test_gpu_memory_mostly_used_without_a_listed_process_is_not_clean():
    from reconciler.model import RankLaunch

    node = ObservedNode("n1", gpus=(Gpu(0, "u0", "x", "A100-80GB", 81920, 70000), Gpu(1, "u1", "x", "A100-80GB", 81920, 500)))
    launch = RankLaunch("m-0", "m", "p", "n1", 0, 1, ("x",), {}, 1, (0, 1), "s", "/health")
    assert gpu_problems(launch, node) == ["GPU 0 on n1 has 70000 of 81920 MiB in use"]
    # memory held by our own replica (about to be replaced) is not held against the GPU
    ours = ObservedNode("n1", gpus=node.gpus, replicas=(RunningRank("m-0", "m", "p", 0, (0,), 1, "old"),))
    assert gpu_problems(launch, ours) == []


def test_a_spec_change_replaces_the_replica_new_copy_first_when_capacity_allows(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    first = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", free_port(), ())]}), records)
    old_pid = json.loads((records / "m-0.rank0.json").read_text())["pid"]
    assert first.replicas["m-0"].phase == "Ready"

    changed = catalog(tmp_path, fleet, tiny_model("m", args=["--ready-after", "0.3"]))
    new_port = free_port()
    log = []
    second = one_pass(changed, transports, launcher, SimplePlanner({"m-0": [("n2", new_port, ())]}), records, log=log.append)
    assert [(d.node, d.action) for d in log if d.action in ("start", "stop")] == [("n2", "start"), ("n1", "stop")]
    assert second.replicas["m-0"].phase == "Ready"
    assert second.endpoints() == {"m": [f"http://127.0.0.1:{new_port}"]}
    assert not is_running(old_pid)
    assert launcher.ranks("n1") == [] and [r.spec_hash for r in launcher.ranks("n2")] != [first.inventory.nodes[0].replicas[0].spec_hash]


def test_a_spec_change_on_the_same_slot_stops_the_old_copy_before_starting_the_new(tmp_path, env):
    fleet, transports, launcher, records = env
    port = free_port()
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", port, ())]}), records)
    changed = catalog(tmp_path, fleet, tiny_model("m", args=["--ready-after", "0.1"]))
    log = []
    second = one_pass(changed, transports, launcher, SimplePlanner({"m-0": [("n1", port, ())]}), records, log=log.append)
    assert [(d.node, d.action) for d in log if d.action in ("start", "stop")] == [("n1", "stop"), ("n1", "start")]
    assert second.replicas["m-0"].phase == "Ready"
    assert len(launcher.ranks("n1")) == 1


def test_removing_a_model_stops_all_its_ranks_and_deletes_its_status(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m", nodes=2), tiny_model("keep"))
    planner = SimplePlanner({"m-0": [("n1", free_port(), ()), ("n2", free_port(), ())], "keep-0": [("n1", free_port(), ())]})
    one_pass(cat, transports, launcher, planner, records)
    status = Path(cat.root) / "status" / "models"
    assert (status / "m.yaml").exists()

    without = catalog(tmp_path, fleet, tiny_model("keep"))
    result = one_pass(without, transports, launcher, planner, records)
    assert sorted((d.node, d.action) for d in result.decisions if d.replica == "m-0") == [("n1", "stop"), ("n2", "stop")]
    assert [r.replica for r in launcher.ranks("n1")] == ["keep-0"] and launcher.ranks("n2") == []
    assert not (status / "m.yaml").exists() and (status / "keep.yaml").exists()


def test_a_dry_run_reports_decisions_and_changes_nothing(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    result = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", free_port(), ())]}), records, dry_run=True)
    assert [(d.replica, d.node, d.action) for d in result.decisions] == [("m-0", "n1", "start")]
    assert "would start" in result.decisions[0].reason
    assert launcher.ranks("n1") == []
    assert not (Path(cat.root) / "status").exists()


class DropsMidLaunch:
    """A node that goes away mid-launch: it runs the start, the answer never arrives, and nothing after it reaches it."""

    def __init__(self, inner):
        self.inner = inner
        self.node_id = inner.node_id
        self.command_timeout_s = inner.command_timeout_s
        self.gone = False

    def run(self, argv, *, stdin=None, timeout=60.0):
        from reconciler.errors import TransportError

        if self.gone:
            raise TransportError(self.node_id, "connection refused")
        result = self.inner.run(argv, stdin=stdin, timeout=timeout)
        from reconciler.act.launcher.ssh_launcher import request_of

        if request_of(stdin).get("op") == "start":
            self.gone = True
            raise TransportError(self.node_id, "connection lost")
        return result

    def close(self):
        pass


def test_a_node_lost_mid_launch_leaves_nothing_the_next_pass_does_not_know_about(tmp_path, env):
    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    port = free_port()
    planner = SimplePlanner({"m-0": [("n1", port, ())]})
    flaky = {**transports, "n1": DropsMidLaunch(transports["n1"])}
    lost = one_pass(cat, flaky, SshLauncher.for_fleet(fleet, flaky), planner, records)
    assert lost.replicas["m-0"].phase == "Failed" and "connection lost" in lost.replicas["m-0"].message
    [orphan] = launcher.ranks("n1")  # the record was written before the answer was lost
    assert orphan.alive
    # An adopted replica is judged once, not waited for: let the orphan finish starting (on a
    # loaded machine it may not answer yet), so Ready below is about adoption, not timing.
    wait_for(lambda: http_health("127.0.0.1", port, "/health")[0], what="the orphan to answer")

    back = one_pass(cat, transports, launcher, planner, records)
    assert [d for d in back.decisions if d.action == "start"] == []
    assert back.replicas["m-0"].phase == "Ready"
    assert [r.pid for r in launcher.ranks("n1")] == [orphan.pid]


def test_pass_memory_tracks_unreachable_nodes_and_keeps_their_last_records():
    from reconciler.record.memory import PassMemory, remember
    from reconciler.decide.outcomes import ReplicaState
    from reconciler.model import Assignment, Inventory

    seen = Inventory((ObservedNode("a", replicas=(RunningRank("m-0", "m", "p", 0, (), 9000, "h"),)), ObservedNode("b")))
    first = remember(PassMemory(), None, seen, {}, now=100.0, desired=["m-0"])
    assert first.unreachable_since == {} and first.last_seen.node("a").replicas

    lost = Inventory((ObservedNode("a", state="unreachable", reason="timed out"), ObservedNode("b")))
    moved = {"m-0": ReplicaState("m-0", "m", "p", "Starting", "", (Assignment("b", 0),))}
    second = remember(first, None, lost, moved, now=200.0, desired=["m-0"])
    assert second.unreachable_since == {"a": 200.0}
    assert second.last_seen.node("a").replicas == seen.node("a").replicas  # what it ran when last seen
    assert second.placed_on == {"m-0": ("b",)}

    third = remember(second, None, lost, {}, now=300.0, desired=[])
    assert third.unreachable_since == {"a": 200.0}  # since when, not since the last pass
    assert third.placed_on == {}


def test_a_restart_reuses_the_gpus_its_own_crashed_copy_held(tmp_path, env):
    from reconciler.model import Action, Assignment, Placement

    fleet, transports, launcher, records = env
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    port = free_port()
    # As probed: GPU 0 mostly used, by our own (now dead) rank of m-0; no foreign process.
    probed = ObservedNode("n1", gpus=(Gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", "H100-80GB", 81559, 70000),),
                          replicas=(RunningRank("m-0", "m", "p", 0, (0,), port, "old", alive=False),))
    placement = Placement("m-0", "m", "p", None, "none/H100-80GB", (Assignment("n1", 0, (0,), (), port),))
    restart = Action("restart", "m-0", "m", "rank 0 on n1 is dead", placement)

    def planner(c, inventory, **_):
        return [restart]

    result = one_pass(cat, transports, launcher, planner, records, probe=lambda c, t: Inventory((probed, ObservedNode("n2"))))
    assert result.replicas["m-0"].phase == "Ready", result.replicas["m-0"].message
    assert [d.action for d in result.decisions] == ["stop", "start", "health"]


def test_the_snapshot_after_a_pass_drops_stopped_ranks_adds_started_ones_and_taken_ports():
    from reconciler.observe.snapshot import inventory_after

    before = Inventory((
        ObservedNode("a", replicas=(RunningRank("old-0", "old", "p", 0, (0,), 9000, "h", pid=10),), ports_in_use=(22, 9000)),
        ObservedNode("b", ports_in_use=(22,)),
    ))
    started = [tiny_launch("new-0", "b", 9100, Path("x"))]
    after = inventory_after(before, started, [("a", "old-0", None)], pids={("b", "new-0", 0): 42}, taken_ports={"b": [9200]})
    assert after.node("a").replicas == () and after.node("a").ports_in_use == (22,)
    [new] = after.node("b").replicas
    assert (new.id, new.port, new.pid, new.alive) == ("new-0", 9100, 42, True)
    assert after.node("b").ports_in_use == (22, 9100, 9200)


def test_pass_memory_survives_a_round_trip_through_its_document():
    import json as _json

    from reconciler.record.memory import PassMemory
    from reconciler.record.memory_document import memory_from_document, memory_to_document
    from reconciler.decide.backoff import Backoff

    memory = PassMemory(
        backoff={"m-0": Backoff(restarts=2, streak=1, last_restart=123.5)},
        unreachable_since={"a": 100.0},
        last_seen=Inventory((ObservedNode("a", replicas=(RunningRank("m-0", "m", "p", 0, (1,), 9000, "h", pid=7),)),)),
        placed_on={"m-0": ("a",)},
    )
    again = memory_from_document(_json.loads(_json.dumps(memory_to_document(memory))))
    assert again.backoff == memory.backoff and again.unreachable_since == memory.unreachable_since
    assert again.placed_on == memory.placed_on
    assert again.last_seen.node("a").replicas == memory.last_seen.node("a").replicas
    assert memory_from_document({"history": {"x": {"bogus": 1}}}) == PassMemory()  # unreadable: forgotten


def test_a_replacement_that_never_gets_ready_is_taken_back_and_the_old_copy_keeps_serving(tmp_path, env):
    fleet, transports, launcher, records = env
    old_port = free_port()
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    first = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", old_port, ())]}), records)
    assert first.replicas["m-0"].phase == "Ready"

    broken = catalog(tmp_path, fleet, tiny_model("m", args=["--never-ready"], start_timeout_s=1.0))
    second = one_pass(broken, transports, launcher, SimplePlanner({"m-0": [("n2", free_port(), ())]}), records)
    state = second.replicas["m-0"]
    assert state.phase == "Ready" and "replacement failed" in state.message and "not Ready after 1s" in state.message
    assert second.endpoints() == {"m": [f"http://127.0.0.1:{old_port}"]}
    assert [r.port for r in launcher.ranks("n1")] == [old_port] and launcher.ranks("n2") == []
    assert not second.ok


def test_a_multi_node_replica_whose_other_node_is_unreachable_is_unknown_not_failed(tmp_path):
    # Rank 1's node does not answer: its rank is not "missing", it cannot be seen. Failed would
    # page someone for a network blip, while the plan holds the replica for the grace period.
    from types import SimpleNamespace

    from reconciler.control.reconcile import replica_states
    from reconciler.decide.plan_values import Waiting
    from reconciler.vocabulary import WaitKind

    fleet = local_fleet(tmp_path)
    model = tiny_model("m", nodes=2)
    cat = catalog(tmp_path, fleet, model)
    rank0 = RunningRank(id="m-0", model="m", profile="p", rank=0, gpus=(), port=free_port(), spec_hash="s", nnodes=2)
    inventory = Inventory((ObservedNode(id="n1", replicas=(rank0,)), ObservedNode(id="n2", state="unreachable", reason="timed out")))
    held = Waiting("m-0", "m", "node n2 unreachable; replaced elsewhere if it stays unreachable for 300 s",
                   kind=WaitKind.NODE_UNREACHABLE, nodes=("n2",))
    plan = SimpleNamespace(actions=(), unplaced=(), waiting=(held,), observed={}, beside={})
    states = replica_states(cat, inventory, {}, plan, launcher=None, health=lambda host, port, path: (True, "200"))
    assert states["m-0"].phase == "Unknown"
    assert "node n2 unreachable" in states["m-0"].message


def test_a_dead_rank_on_a_reachable_node_stays_failed_while_another_node_is_unreachable(tmp_path):
    from types import SimpleNamespace

    from reconciler.control.reconcile import replica_states
    from reconciler.decide.plan_values import Waiting
    from reconciler.vocabulary import WaitKind

    fleet = local_fleet(tmp_path)
    cat = catalog(tmp_path, fleet, tiny_model("m", nodes=2))
    rank0 = RunningRank(id="m-0", model="m", profile="p", rank=0, gpus=(), port=free_port(), spec_hash="s", nnodes=2,
                        alive=False)
    inventory = Inventory((ObservedNode(id="n1", replicas=(rank0,)), ObservedNode(id="n2", state="unreachable", reason="timed out")))
    held = Waiting("m-0", "m", "node n2 unreachable; replaced elsewhere if it stays unreachable for 300 s",
                   kind=WaitKind.NODE_UNREACHABLE, nodes=("n2",))
    plan = SimpleNamespace(actions=(), unplaced=(), waiting=(held,), observed={}, beside={})
    states = replica_states(cat, inventory, {}, plan, launcher=None, health=lambda host, port, path: (True, "200"))
    assert states["m-0"].phase == "Failed" and "rank 0 on n1 is not running" in states["m-0"].message
