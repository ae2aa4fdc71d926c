#!/usr/bin/env python3
"""Benchmark of the node-side lifecycle: what one start, status and stop cost, and a pass with nothing to do.

    python3 bench/apply.py [--ranks N] [--ssh]

Starts N tiny engines (tests/apply_support/tiny_engine.py) through the node
agent, measuring each round trip: over LocalTransport, and with --ssh also
over real SSH to a namespaced node (tests/fleet.py; needs root). Then, with
the probe and plan merged, times `run_pass` with N Ready replicas and nothing
to do. Prints figures; asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.act.readiness import http_health  # noqa: E402
from reconciler.act.launcher import SshLauncher  # noqa: E402
from reconciler.observe.transport import LocalTransport  # noqa: E402
from tests.apply_support.local import free_port, tiny_launch  # noqa: E402


def ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p90 = samples[max(0, int(len(samples) * 0.9) - 1)]
    return f"median {statistics.median(samples) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   (n={len(samples)})"


def lifecycle(launcher: SshLauncher, node: str, ranks: int, record_dir: Path, host: str) -> None:
    starts, readies, statuses, stops = [], [], [], []
    launches = []
    try:
        _measure(launcher, node, ranks, record_dir, host, launches, starts, readies, statuses, stops)
    finally:  # a failed run leaves no engine behind: stop what it started, by its record (pid and group)
        for launch in launches:
            launcher.stop(node, launch.replica)
    print(f"  start (agent round trip, engine launched, record written)   {ms(starts)}")
    print(f"  start -> /health 200 (tiny engine, python start-up)        {ms(readies)}")
    print(f"  status of {ranks} records                                   {ms(statuses)}")
    print(f"  stop (SIGTERM, confirmed gone, record removed)              {ms(stops)}")


def _measure(launcher, node, ranks, record_dir, host, launches, starts, readies, statuses, stops) -> None:
    for i in range(ranks):
        port = free_port()
        launch = tiny_launch(f"bench-{i}", node, port, record_dir / f"{i}.json", "--host", host)
        t = time.perf_counter()
        outcome = launcher.start(launch)
        starts.append(time.perf_counter() - t)
        if not outcome.ok:
            raise SystemExit(f"start failed: {outcome.reason}")
        launches.append(launch)
        while not http_health(host, port, "/health", timeout=1)[0]:
            time.sleep(0.01)
        readies.append(time.perf_counter() - t)
    for _ in range(ranks):
        t = time.perf_counter()
        launcher.ranks(node)
        statuses.append(time.perf_counter() - t)
    while launches:
        launch = launches[0]
        t = time.perf_counter()
        outcome = launcher.stop(node, launch.replica)
        stops.append(time.perf_counter() - t)
        if not outcome.ok:
            raise SystemExit(f"stop failed: {outcome.detail}")
        launches.pop(0)


def noop_pass(tmp: Path, replicas: int) -> None:
    """The real pass (probe, plan, health checks, status) on one local node with N Ready replicas."""
    import yaml

    from reconciler.control.reconcile import run_pass
    from reconciler.catalog import load_catalog
    from reconciler.observe.transport import LocalTransport
    from tests.apply_support.local import TINY_ENGINE

    root = tmp / "catalog"
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(yaml.safe_dump({
        "state_dir": str(tmp / "pass-state"),
        "nodes": [{"id": "local", "address": "127.0.0.1", "transport": "local"}],
    }))
    (root / "models" / "bench.yaml").write_text(yaml.safe_dump({
        "name": "bench", "source": "bench", "replicas": replicas, "spread": "preferred",
        "profiles": [{"name": "cpu", "engine": "command", "port": 21000, "start_timeout_s": 60,
                      "command": ["python3", TINY_ENGINE, "--host", "127.0.0.1", "--port", "${PORT}",
                                  "--record", str(tmp / "pass-${REPLICA_ID}.json")]}],
    }))
    catalog = load_catalog(root, with_revision=False)
    transports = {"local": LocalTransport("local")}
    try:
        t = time.perf_counter()
        first = run_pass(catalog, transports=transports, ready_wait_s=60)
        took = time.perf_counter() - t
        ready = sum(s.phase == "Ready" for s in first.replicas.values())
        print(f"  first pass: {replicas} replicas started and Ready ({ready} Ready)      {took * 1000:7.0f} ms")
        samples, written = [], 0
        memory = first.memory
        for _ in range(5):
            t = time.perf_counter()
            again = run_pass(catalog, transports=transports, history=memory, ready_wait_s=60)
            samples.append(time.perf_counter() - t)
            memory = again.memory
            written += len(again.written)
        print(f"  pass with nothing to do ({replicas} Ready replicas)            {ms(samples)}, status files written: {written}")
    finally:  # also when a pass failed half-way: the engines must not outlive the bench
        empty = catalog.__class__(root=catalog.root, fleet=catalog.fleet, models=(), revision=None)
        run_pass(empty, transports=transports, ready_wait_s=0)  # stops them all


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=20)
    p.add_argument("--ssh", action="store_true", help="also over SSH to a namespaced node (root)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"LocalTransport, {args.ranks} ranks:")
        launcher = SshLauncher({"local": LocalTransport("local")}, {"local": str(tmp / "state")})
        lifecycle(launcher, "local", args.ranks, tmp, "127.0.0.1")

        print("Real pass (probe, plan, health, status) on a local node:")
        noop_pass(tmp, args.ranks)

        if args.ssh:
            from reconciler.observe.transport import FleetTransports
            from reconciler.observe.ssh import TransportPool
            from tests.fleet import TestFleet

            with TestFleet() as fleet, TransportPool() as pool:
                fleet.add_node("bench")
                spec = fleet.fleet_spec()
                transports = FleetTransports(pool, spec)
                launcher = SshLauncher.for_fleet(spec, transports)
                launcher.ranks("bench")  # open the connection: the daemon keeps it open
                print(f"SSH to a namespaced node (connection kept open), {args.ranks} ranks:")
                lifecycle(launcher, "bench", args.ranks, tmp, fleet.node("bench").address)


if __name__ == "__main__":
    main()
