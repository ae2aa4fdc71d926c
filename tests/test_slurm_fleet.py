"""The Slurm launcher on a real Slurm cluster (SPEC section 8).

The fleet (tests/fleet.py) has a login node, where sbatch/squeue/scancel run over
SSH (`slurm.submit_via`), and three `launcher: slurm` nodes, each with a real slurmd
(tests/slurm_cluster.py) that sees the node's own fake nvidia-smi and fake engines.
The fake vLLM ranks really rendezvous: rank 1 connects to the head's address.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from reconciler.control.reconcile import apply_pass, run_pass
from reconciler.catalog import load_catalog
from reconciler.act.launcher.slurm_fold import fold_slurm
from reconciler.owner import catalog_owner
from reconciler.observe.probe import probe_fleet
from reconciler.observe.slurm import job_name
from reconciler.observe.ssh import TransportPool
from tests import slurm_cluster
from tests.conftest import REPO
from tests.fleet import TestFleet
from tests.gitcatalog import wait_for
from tests.apply_support.local import is_running
from tests.slurm_cluster import SlurmCluster

SLURM_NODES = ["s1", "s2", "s3"]

pytestmark = [pytest.mark.fleet, pytest.mark.slurm,
              pytest.mark.skipif(slurm_cluster.available() is not None, reason=str(slurm_cluster.available()))]


@pytest.fixture(scope="module")
def cluster():
    f = TestFleet()
    c = None
    try:
        c = SlurmCluster(f, SLURM_NODES)
        f.add_node("login1", login_env=c.env)
        for nid in SLURM_NODES:
            f.add_node(nid, gpus=["H100", "H100"], engines=["vllm"], fabrics={"ib-s": ["mlx5_0"]}, login_env=c.env)
        c.start()
        yield c
    finally:
        if c is not None:
            c.close()
        f.close()


@pytest.fixture
def catalog_dir(tmp_path, cluster, pool):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    write_fleet(root, cluster)
    yield root
    # Leave the cluster as we found it: cancel every job, ours and foreign.
    for job in cluster.jobs():
        if job["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            cluster.run(["scancel", job["id"]], check=False)
    deadline = time.monotonic() + 20
    while any(j["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for j in cluster.jobs()):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.1)


def write_fleet(root: Path, cluster: SlurmCluster, **slurm) -> None:
    doc = cluster.fleet.fleet_document()
    doc["owner"] = "tests"
    doc["slurm"] = {"submit_via": "login1", "partition": cluster.partition, "command_timeout_s": 20, **slurm}
    for node in doc["nodes"]:
        if node["id"] in SLURM_NODES:
            node["launcher"] = "slurm"
    (root / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def write_model(root: Path, name: str, records: Path, *, nodes: int = 1, gpus: int = 1, **extra) -> None:
    profile = {"name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes,
               "port": 8100, "start_timeout_s": 30, "env": {"FAKE_ENGINE_RECORD_DIR": str(records)}, **extra}
    # Not a path: the nodes hold no weights, and a path source without fetch must be on the node (SPEC section 7).
    doc = {"name": name, "source": f"{name}-weights", "profiles": [profile]}
    (root / "models" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def slurm_pass(root: Path, pool, history=None, *, ready_wait_s: float = 30):
    """`reconciler apply`'s pass: a catalog with `launcher: slurm` nodes gets the Slurm launcher and inventory;
    a copy it stops hands off to the gateway first, within the run, as apply does (SPEC 13)."""
    return apply_pass(load_catalog(root, with_revision=False), transports=pool, history=history, ready_wait_s=ready_wait_s)


def engine_records(records: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]


def our_jobs(cluster: SlurmCluster) -> dict[str, dict]:
    return {j["name"]: j for j in cluster.jobs() if j["name"].startswith("llmrc.tests.")}


def test_replicas_become_jobs_on_their_nodes_meet_at_the_head_survive_a_restart_and_are_cancelled(
        cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, "pair", records, nodes=2)
    write_model(catalog_dir, "solo", records, nodes=1)
    first = slurm_pass(catalog_dir, pool)

    pair, solo = first.replicas["pair-0"], first.replicas["solo-0"]
    assert pair.phase == "Ready", pair.message
    assert solo.phase == "Ready", solo.message
    jobs = our_jobs(cluster)
    assert set(jobs) == {"llmrc.tests.pair-0", "llmrc.tests.solo-0"}
    assert all(j["state"] == "RUNNING" for j in jobs.values())
    # The job runs exactly on the nodes placement chose, and its comment carries the spec hash and ranks.
    pair_nodes = [a.node for a in pair.nodes]
    assert cluster.run(["scontrol", "show", "hostnames", jobs["llmrc.tests.pair-0"]["nodes"]]).stdout.split() == sorted(pair_nodes)
    comment = jobs["llmrc.tests.pair-0"]["comment"].split()
    assert comment[0] == "llmrc/1" and comment[4] == ",".join(f"{a.node}:{a.port}:0" for a in pair.nodes)

    # Rank 1 met the head at the head's own address (the fake engines' rendezvous), not loopback.
    head_addr = cluster.fleet.node(pair_nodes[0]).address
    pair_recs = [r for r in engine_records(records) if r.get("nnodes") == 2]
    head = next(r for r in pair_recs if r["role"] == "head")
    worker = next(r for r in pair_recs if r["role"] == "worker")
    assert head["ready"]
    assert worker["rendezvous"].startswith(f"{head_addr}:")
    assert head["peers"] and head["peers"][0]["address"] == cluster.fleet.node(pair_nodes[1]).address
    # Each rank ran with the CUDA_VISIBLE_DEVICES Slurm gave, and status records those indices.
    for rec in pair_recs:
        assert rec["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert rec["env"]["SLURM_JOB_NAME"] == "llmrc.tests.pair-0"

    # A reconciler that starts again (no memory, new connections) finds the jobs and submits nothing.
    pool.close()
    again = slurm_pass(catalog_dir, TransportPool())
    assert again.replicas["pair-0"].phase == "Ready", again.replicas["pair-0"].message
    assert {n: j["id"] for n, j in our_jobs(cluster).items()} == {n: j["id"] for n, j in jobs.items()}
    assert not [d for d in again.decisions if d.action in ("start", "stop")], again.decisions
    # What it found is Slurm's account: the job id and the GPU indices Slurm gave each rank.
    node_doc = yaml.safe_load((catalog_dir / "status" / "nodes.yaml").read_text())
    held = {(n["id"], r["id"]): r for n in node_doc["nodes"] for r in n["replicas"]}
    assert held[(pair_nodes[0], "pair-0")]["gpus"] == [0]
    assert held[(pair_nodes[0], "pair-0")]["slurm_job"] == jobs["llmrc.tests.pair-0"]["id"]
    model_doc = yaml.safe_load((catalog_dir / "status" / "models" / "pair.yaml").read_text())
    assert [n["gpus"] for n in model_doc["replicas"][0]["nodes"]] == [[0], [0]]

    # Removed from the catalog: scancel, and the job is gone from the running states.
    (catalog_dir / "models" / "pair.yaml").unlink()
    removed = slurm_pass(catalog_dir, TransportPool())
    assert [d for d in removed.decisions if d.action == "stop" and d.replica == "pair-0" and d.ok]
    left = our_jobs(cluster)
    assert left["llmrc.tests.pair-0"]["state"] not in ("RUNNING", "PENDING", "COMPLETING")
    assert left["llmrc.tests.solo-0"]["state"] == "RUNNING"
    assert not [r for r in engine_records(records) if r.get("nnodes") == 2 and r["state"] not in ("stopped", "failed")
                and is_running(r["pid"])]


def test_a_foreign_job_holding_gpus_is_placed_around_and_never_touched(cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    foreign = {"s1": cluster.submit_foreign("s1", gpus=2), "s2": cluster.submit_foreign("s2", gpus=1)}
    deadline = time.monotonic() + 20
    while not all(j["state"] == "RUNNING" for j in cluster.jobs() if j["id"] in foreign.values()):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.1)
    write_model(catalog_dir, "wide", records, nodes=1, gpus=2)
    doc = yaml.safe_load((catalog_dir / "models" / "wide.yaml").read_text())
    doc["replicas"] = 2
    (catalog_dir / "models" / "wide.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = slurm_pass(catalog_dir, pool)

    wide = result.replicas["wide-0"]
    assert wide.phase == "Ready", wide.message
    assert [a.node for a in wide.nodes] == ["s3"]  # s1: both GPUs held by someone else's job, s2: one
    assert result.replicas["wide-1"].phase == "Pending"
    rejections = {r.node: r.reason for o in result.plan.unplaced for r in o.rejections}
    assert "has 0 free H100-80GB GPUs, needs 2" in rejections["s1"], rejections
    assert f"2 held by other Slurm jobs: Slurm job {foreign['s1']} of root" in rejections["s1"], rejections
    assert f"1 held by other Slurm jobs: Slurm job {foreign['s2']} of root" in rejections["s2"], rejections
    # The foreign jobs still run, untouched.
    states = {j["id"]: j["state"] for j in cluster.jobs()}
    assert all(states[j] == "RUNNING" for j in foreign.values())


def test_sbatch_refusing_the_job_is_a_failed_start_in_slurms_words_naming_the_replica(cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_fleet(catalog_dir, cluster, partition="nonexistent")
    write_model(catalog_dir, "refused", records, nodes=1)
    result = slurm_pass(catalog_dir, pool)
    state = result.replicas["refused-0"]
    assert state.phase == "Failed"
    assert "sbatch refused job llmrc.tests.refused-0" in state.message
    assert "invalid partition specified: nonexistent" in state.message
    assert "llmrc.tests.refused-0" not in our_jobs(cluster)


def test_a_pending_job_is_phase_pending_with_slurms_reason_and_is_never_submitted_twice(cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_fleet(catalog_dir, cluster, extra_args=["--begin=now+600"])
    write_model(catalog_dir, "queued", records, nodes=1)
    first = slurm_pass(catalog_dir, pool, ready_wait_s=2)
    assert first.replicas["queued-0"].phase == "Pending", first.replicas["queued-0"]
    assert "BeginTime" in first.replicas["queued-0"].message
    job = our_jobs(cluster)["llmrc.tests.queued-0"]
    assert job["state"] == "PENDING"
    second = slurm_pass(catalog_dir, pool, history=first.memory, ready_wait_s=2)
    assert second.replicas["queued-0"].phase == "Pending", second.replicas["queued-0"]
    assert "BeginTime" in second.replicas["queued-0"].message
    assert [j["id"] for j in cluster.jobs() if j["name"] == "llmrc.tests.queued-0"] == [job["id"]]


def test_a_job_that_ends_is_a_crash_and_is_restarted(cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, "crashy", records, nodes=1)
    first = slurm_pass(catalog_dir, pool)
    assert first.replicas["crashy-0"].phase == "Ready", first.replicas["crashy-0"].message
    job = our_jobs(cluster)["llmrc.tests.crashy-0"]
    cluster.run(["scancel", job["id"]])  # as a time limit, a node failure or a preemption would
    deadline = time.monotonic() + 20
    while our_jobs(cluster)["llmrc.tests.crashy-0"]["state"] in ("RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    second = slurm_pass(catalog_dir, pool, history=first.memory)
    assert [d for d in second.decisions if d.action == "restart" or "restart" in d.reason], second.decisions
    assert second.replicas["crashy-0"].phase == "Ready", second.replicas["crashy-0"].message
    new = our_jobs(cluster)["llmrc.tests.crashy-0"]
    assert new["id"] != job["id"] and new["state"] == "RUNNING"


def test_drained_slurm_node_is_cordoned_and_a_killed_slurmd_makes_it_unreachable(cluster, pool, catalog_dir):
    cat = load_catalog(catalog_dir, with_revision=False)
    cluster.drain("s1", "disk replacement")
    try:
        inv = fold_slurm(cat, pool, probe_fleet(cat.fleet, pool))
        s1 = inv.node("s1")
        assert s1.state == "cordoned" and "disk replacement" in s1.reason
        assert inv.node("s2").state == "ready"
    finally:
        cluster.resume("s1")
    cluster.kill_slurmd("s2")
    try:
        deadline = time.monotonic() + 40
        while True:
            inv = fold_slurm(cat, pool, probe_fleet(cat.fleet, pool))
            if inv.node("s2").state == "unreachable":
                break
            assert time.monotonic() < deadline, inv.node("s2")
            time.sleep(0.5)
        assert "NOT_RESPONDING" in inv.node("s2").reason or "DOWN" in inv.node("s2").reason
        assert inv.node("s1").state == "ready"
    finally:
        cluster.start_slurmd("s2")
        cluster.wait_nodes(["s2"], "IDLE", "MIXED")


def test_owner_names_the_jobs(catalog_dir):
    cat = load_catalog(catalog_dir, with_revision=False)
    assert job_name(catalog_owner(cat), "solo-0") == "llmrc.tests.solo-0"


def test_slurm_not_answering_is_temporary_and_leaves_running_jobs_alone(cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, "steady", records, nodes=1)
    first = slurm_pass(catalog_dir, pool)
    assert first.replicas["steady-0"].phase == "Ready", first.replicas["steady-0"].message
    job = our_jobs(cluster)["llmrc.tests.steady-0"]
    cluster.fleet.cut("login1")  # submit_via: squeue and scontrol cannot be asked
    try:
        second = slurm_pass(catalog_dir, TransportPool(), history=first.memory, ready_wait_s=2)
    finally:
        cluster.fleet.restore("login1")
    placed = [a.node for a in first.replicas["steady-0"].nodes]
    assert "Slurm did not answer" in second.inventory.node(placed[0]).reason
    assert second.replicas["steady-0"].phase == "Unknown", second.replicas["steady-0"]
    assert not [d for d in second.decisions if d.action in ("start", "stop", "restart", "replace")], second.decisions
    now = our_jobs(cluster)
    assert [j["id"] for j in cluster.jobs() if j["name"] == "llmrc.tests.steady-0"] == [job["id"]]
    assert now["llmrc.tests.steady-0"]["state"] == "RUNNING"


def test_a_killed_slurmd_puts_its_replica_under_the_node_loss_rules(cluster, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, "mobile", records, nodes=1)
    first = slurm_pass(catalog_dir, pool)
    assert first.replicas["mobile-0"].phase == "Ready", first.replicas["mobile-0"].message
    lost = first.replicas["mobile-0"].nodes[0].node
    old_job = our_jobs(cluster)["llmrc.tests.mobile-0"]["id"]
    cluster.kill_slurmd(lost)
    try:
        cat = load_catalog(catalog_dir, with_revision=False)
        deadline = time.monotonic() + 40
        while fold_slurm(cat, pool, probe_fleet(cat.fleet, pool)).node(lost).state != "unreachable":
            assert time.monotonic() < deadline
            time.sleep(0.5)
        # Within the grace: left alone, reported as not known.
        held = slurm_pass(catalog_dir, pool, history=first.memory, ready_wait_s=2)
        assert held.replicas["mobile-0"].phase == "Unknown", held.replicas["mobile-0"]
        assert not [d for d in held.decisions if d.action in ("start", "stop", "replace")], held.decisions
        # Past the grace: placed elsewhere, as one new job.
        moved = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, history=held.memory,
                         ready_wait_s=30, now=time.time() + 301)
        state = moved.replicas["mobile-0"]
        assert state.phase == "Ready", state.message
        assert state.nodes[0].node != lost
        new_job = our_jobs(cluster)["llmrc.tests.mobile-0"]
        assert new_job["id"] != old_job and new_job["state"] == "RUNNING"
    finally:
        cluster.start_slurmd(lost)
        cluster.wait_nodes([lost], "IDLE", "MIXED")


def slurm_pass_of(catalog_dir: Path, pool, records: Path, name: str, nodes: int = 1, ready_wait_s: float = 2):
    """A pass over one model of one replica."""
    records.mkdir(exist_ok=True)
    write_model(catalog_dir, name, records, nodes=nodes)
    return slurm_pass(catalog_dir, pool, ready_wait_s=ready_wait_s)


def ready_job(cluster: SlurmCluster, catalog_dir: Path, pool, records: Path, name: str, nodes: int):
    """One model of one replica, applied and Ready: (the pass, its Slurm job)."""
    result = slurm_pass_of(catalog_dir, pool, records, name, nodes, ready_wait_s=30)
    assert result.replicas[f"{name}-0"].phase == "Ready", result.replicas[f"{name}-0"].message
    return result, our_jobs(cluster)[f"llmrc.tests.{name}-0"]


def test_logs_reads_a_slurm_replica_s_job_output_rank_by_rank_and_follows_it(cluster, pool, catalog_dir, tmp_path, cli):
    first, job = ready_job(cluster, catalog_dir, pool, tmp_path / "engines", "pair", nodes=2)
    head_node = first.replicas["pair-0"].nodes[0].node

    def rank_log(rank: int) -> list[str]:
        r = cli("logs", "pair-0", str(catalog_dir), "--rank", str(rank))
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()

    # Each rank's own lines, without srun's task labels: the head listens, the worker joins it.
    head, worker = rank_log(0), rank_log(1)
    assert any("rendezvous listening" in line for line in head) and not any("joined head" in line for line in head)
    assert any(f"joined head at {cluster.fleet.node(head_node).address}:" in line for line in worker)
    assert not any("rendezvous listening" in line for line in worker)
    assert not any(line.startswith(("0: ", "1: ")) for line in head + worker)
    last = cli("logs", "pair-0", str(catalog_dir), "--rank", "1", "--tail", "1")
    assert last.stdout.splitlines() == worker[-1:]

    # --follow brings what the worker writes next (here: what it says when Slurm signals the job).
    env = dict(os.environ, PYTHONPATH=str(REPO))
    follow = subprocess.Popen([sys.executable, "-m", "reconciler", "logs", "pair-0", str(catalog_dir), "--rank", "1",
                               "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout], daemon=True).start()
    seen: list[str] = []

    def arrives(text: str) -> bool:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            if text in seen[-1]:
                return True
        return False

    try:
        assert arrives("joined head at"), seen  # the tail first
        cluster.run(["scancel", "--signal=TERM", job["id"]])
        assert arrives("received signal 15"), seen

        # The job ended; its output stays readable, one rank at a time: each said it once.
        wait_for(lambda: our_jobs(cluster)["llmrc.tests.pair-0"]["state"] not in ("RUNNING", "COMPLETING"), 20,
                 "the signalled job to end")
        for rank in (0, 1):
            assert sum("received signal 15" in line for line in rank_log(rank)) == 1

        # A crash is restarted as a new job, writing a new file: --follow goes on with it.
        restarted = slurm_pass(catalog_dir, pool, history=first.memory)
        assert restarted.replicas["pair-0"].phase == "Ready", restarted.replicas["pair-0"].message
        new_job = our_jobs(cluster)["llmrc.tests.pair-0"]["id"]
        assert new_job != job["id"]
        assert arrives("joined head at"), seen  # the new job's worker, joining the new head
    finally:
        follow.send_signal(signal.SIGINT)
        follow.wait(timeout=30)
    err = follow.stderr.read()
    assert follow.returncode == 130 and "Traceback" not in err
    assert f"reconciler: now pair-0 rank 1 (Slurm job {new_job}, output on " in err


def test_logs_of_a_pending_slurm_job_or_with_slurm_silent_say_so_in_one_line(cluster, pool, catalog_dir, tmp_path, cli):
    write_fleet(catalog_dir, cluster, extra_args=["--begin=now+600"])  # every job waits ten minutes to start
    state = slurm_pass_of(catalog_dir, pool, tmp_path / "engines", "later").replicas["later-0"]
    assert state.phase == "Pending", state
    job = our_jobs(cluster)["llmrc.tests.later-0"]

    pending = cli("logs", "later-0", str(catalog_dir))
    assert pending.returncode == 1
    assert pending.stderr.strip() == f"reconciler: later-0 rank 0: no log yet (its Slurm job {job['id']} is pending (BeginTime))"

    cluster.fleet.cut("login1")  # submit_via: nobody to ask which job, or where its output is
    try:
        silent = cli("logs", "later-0", str(catalog_dir), timeout=90)
    finally:
        cluster.fleet.restore("login1")
    assert silent.returncode == 3, silent.stderr
    assert silent.stderr.startswith("reconciler: later-0 rank 0: Slurm did not answer (on login1)")
    assert len(silent.stderr.strip().splitlines()) == 1 and "Traceback" not in silent.stderr
