#!/usr/bin/env python3
"""Benchmark of the Slurm launcher: submit-to-Ready through Slurm beside SSH, and the Slurm inventory per pass.

    python3 bench/slurm.py [--rounds N] [--nodes 4000]

1. On a namespaced fleet with a real Slurm cluster (tests/fleet.py, tests/slurm_cluster.py;
   needs root and the slurm packages): a 2-node fake-vLLM replica is applied with
   `launcher: slurm` and, on the same two nodes' twins, with `launcher: ssh`; the time
   from the pass starting to the replica Ready, each round with the replica removed
   again in between.
2. The Slurm inventory of one pass (squeue + scontrol show node + scontrol show job,
   over SSH to the login node, parsed and folded) at 3 nodes.
3. The same parse and fold on synthetic scontrol/squeue output for --nodes nodes
   (a 4,000-node cluster, half of it busy with foreign jobs and a replica of ours
   on every 8th node): the cost the reconciler adds per pass, without slurmctld's.

Prints figures; asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from reconciler.catalog import load_catalog  # noqa: E402
from reconciler.act.launcher.slurm_fold import SlurmInventory, fold  # noqa: E402
from reconciler.act.launcher.slurm_launcher import SlurmClient  # noqa: E402
from reconciler.model import Fleet, Gpu, Inventory, NodeSpec, ObservedNode, SlurmSettings  # noqa: E402
from reconciler.control.reconcile import run_pass  # noqa: E402
from reconciler.observe.slurm import SEP, parse_show_jobs, parse_show_nodes, parse_squeue  # noqa: E402
from reconciler.observe.ssh import TransportPool  # noqa: E402


def ms(samples: list[float]) -> str:
    samples = sorted(samples)
    return f"median {statistics.median(samples) * 1000:8.1f} ms   min {samples[0] * 1000:8.1f} ms   (n={len(samples)})"


def real_cluster(rounds: int) -> None:
    from tests.fleet import TestFleet
    from tests.slurm_cluster import SlurmCluster

    with TestFleet() as f, tempfile.TemporaryDirectory() as tmp:
        c = SlurmCluster(f, ["s1", "s2"])
        try:
            f.add_node("login1", login_env=c.env)
            for nid in ("s1", "s2", "h1", "h2"):
                f.add_node(nid, gpus=["H100"], engines=["vllm"], fabrics={"ib-" + nid[0]: ["mlx5_0"]}, login_env=c.env)
            t = time.perf_counter()
            c.start()
            print(f"slurm cluster (munged, slurmctld, 2 slurmd) up in {(time.perf_counter() - t) * 1000:.0f} ms")
            root = Path(tmp) / "catalog"
            (root / "models").mkdir(parents=True)
            doc = f.fleet_document()
            doc["owner"] = "bench"
            doc["slurm"] = {"submit_via": "login1", "partition": c.partition}
            for n in doc["nodes"]:
                if n["id"] in ("s1", "s2"):
                    n["launcher"] = "slurm"
            (root / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            model = root / "models" / "pair.yaml"
            timings: dict[str, list[float]] = {"slurm": [], "ssh": []}
            launched: dict[str, list[float]] = {"slurm": [], "ssh": []}
            with TransportPool() as pool:
                for _ in range(rounds):
                    for launcher, fabric in (("slurm", "ib-s"), ("ssh", "ib-h")):
                        profile = {"name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "nodes": 2, "port": 8100,
                                   "start_timeout_s": 60}
                        # Not a path: the nodes hold no weights, and a path source without fetch must be on the node.
                        model.write_text(yaml.safe_dump({"name": "pair", "source": "pair-weights", "profiles": [
                            {**profile, "node_selector": {}}]}, sort_keys=False))
                        # Steer the replica onto the launcher's pair of nodes: the other pair is cordoned.
                        for n in doc["nodes"]:
                            n["state"] = "ready" if n.get("fabrics", {}).get(fabric) or n["id"] == "login1" else "cordoned"
                        (root / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
                        t = time.perf_counter()
                        first_launch: list[float] = []

                        def log(d, t=t, first_launch=first_launch):
                            if d.action in ("start", "adopt") and not first_launch:
                                first_launch.append(time.perf_counter() - t)

                        result = run_pass(load_catalog(root, with_revision=False), transports=pool, ready_wait_s=60, log=log)
                        took = time.perf_counter() - t
                        launched[launcher].append(first_launch[0] if first_launch else took)
                        state = result.replicas["pair-0"]
                        if state.phase != "Ready":
                            raise SystemExit(f"{launcher}: {state.phase}: {state.message}")
                        timings[launcher].append(took)
                        model.unlink()
                        run_pass(load_catalog(root, with_revision=False), transports=pool, ready_wait_s=5)
                print("2-node fake-vLLM replica, pass start -> Ready (probe, plan, launch, rendezvous, /health 200):")
                for launcher in ("slurm", "ssh"):
                    print(f"  launcher: {launcher:5}  {ms(timings[launcher])}")
                    print(f"     of which probe + plan until the first rank is handed to the launcher  {ms(launched[launcher])}")
                cat = load_catalog(root, with_revision=False)
                inv = SlurmInventory(cat.fleet, SlurmClient(cat.fleet, pool), "bench")
                empty = Inventory(tuple(ObservedNode(n.id) for n in cat.fleet.nodes))
                samples = []
                for _ in range(10):
                    t = time.perf_counter()
                    inv.fold(empty)
                    samples.append(time.perf_counter() - t)
                print(f"Slurm inventory per pass, 2 Slurm nodes (3 commands over SSH on login1, parse, fold)  {ms(samples)}")
        finally:
            c.close()


def synthetic(n: int) -> None:
    names = [f"gpu-{i:05d}" for i in range(n)]
    node_lines = []
    job_lines = []
    queue_lines = []
    for i, name in enumerate(names):
        state = "MIXED" if i % 2 else "IDLE"
        if i % 97 == 0:
            state = "IDLE+DRAIN"
        if i % 211 == 0:
            state = "DOWN+NOT_RESPONDING"
        used = "gpu:h100:4(IDX:0-3)" if i % 2 else "gpu:h100:0"
        node_lines.append(
            f"NodeName={name} Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=128 CPUTot=128 CPULoad=1.00 "
            f"AvailableFeatures=h100,ib ActiveFeatures=h100,ib Gres=gpu:h100:8(S:0-1) GresDrain=N/A GresUsed={used} "
            f"NodeAddr={name} NodeHostName={name} Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian "
            f"RealMemory=2063000 AllocMem=0 FreeMem=2000000 Sockets=2 Boards=1 State={state} ThreadsPerCore=2 TmpDisk=0 "
            f"Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2026-11-01T00:00:00 "
            f"SlurmdStartTime=2026-11-01T00:00:00 CfgTRES=cpu=128,mem=2063000M,billing=128,gres/gpu=8 AllocTRES= "
            f"CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")
        if i % 2:
            job_lines.append(
                f"JobId={100000 + i} JobName=train-{i} UserId=alice(1001) GroupId=alice(1001) JobState=RUNNING Reason=None "
                f"NodeList={name} BatchHost={name} NumNodes=1 JOB_GRES=gpu:h100:4   Nodes={name} CPU_IDs=0-31 Mem=0 "
                f"GRES=gpu:h100:4(IDX:0-3) Comment=(null) StdOut=/home/alice/out")
            queue_lines.append(SEP.join([str(100000 + i), f"train-{i}", "RUNNING", "None", "2026-12-01T10:00:00", "(null)"]))
        if i % 8 == 0:
            jid = 200000 + i
            job_lines.append(
                f"JobId={jid} JobName=llmrc.bench.m-{i} UserId=serve(1000) JobState=RUNNING Reason=None NodeList={name} "
                f"JOB_GRES=gpu:h100:2   Nodes={name} CPU_IDs=32-33 Mem=0 GRES=gpu:h100:2(IDX:4-5) Comment=llmrc/1 abc m h100 {name}:8000:4+5")
            queue_lines.append(SEP.join([str(jid), f"llmrc.bench.m-{i}", "RUNNING", "None", "2026-12-01T10:00:00",
                                         f"llmrc/1 abc m h100 {name}:8000:4+5"]))
    nodes_out, jobs_out, queue_out = "\n".join(node_lines), "\n".join(job_lines), "\n".join(queue_lines)
    fleet = Fleet(nodes=tuple(NodeSpec(id=nm, address=nm, data_address=nm, launcher="slurm") for nm in names),
                  slurm=SlurmSettings(submit_via="local"))
    gpus = tuple(Gpu(index=g, uuid=f"GPU-{g}", name="NVIDIA H100 80GB HBM3", gpu_class="H100-80GB", memory_total_mb=81559)
                 for g in range(8))
    probed = Inventory(tuple(ObservedNode(nm, gpus=gpus) for nm in names))
    parse, folds = [], []
    for _ in range(5):
        t = time.perf_counter()
        queue, nodes, details = parse_squeue(queue_out), parse_show_nodes(nodes_out), parse_show_jobs(jobs_out)
        parse.append(time.perf_counter() - t)
        t = time.perf_counter()
        fold(fleet, "bench", probed, queue, nodes, details)
        folds.append(time.perf_counter() - t)
    size = (len(nodes_out) + len(jobs_out) + len(queue_out)) / 1e6
    print(f"synthetic {n} Slurm nodes ({len(queue)} jobs, {size:.1f} MB of squeue + scontrol output):")
    print(f"  parse squeue + scontrol show node/job   {ms(parse)}")
    print(f"  fold into the inventory                 {ms(folds)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--no-cluster", action="store_true", help="only the synthetic figures")
    args = ap.parse_args()
    if not args.no_cluster:
        real_cluster(args.rounds)
    synthetic(args.nodes)


if __name__ == "__main__":
    main()
