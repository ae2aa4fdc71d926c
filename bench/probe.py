"""Probe benchmark: a fleet of namespaced nodes (tests/fleet.py), probed cold and warm, side by
side with plain SSH fan-out baselines run in the same process on the same fleet.

    sudo python3 bench/probe.py [--nodes 50] [--rounds 3]

Prints, per measurement, the median wall time of --rounds runs:
  openssh xargs -P N ssh true        cold OpenSSH client per node, trivial command
  ansible -m raw -f N                (when ansible is installed)
  paramiko N threads, cold           SSHClient.connect + exec `true`, one thread per node
  paramiko N threads, warm           exec `true` on the already open connections
  reconciler nodes (cold, CLI)       the whole command: interpreter, imports, connect, probe, status file
  probe_fleet cold (in-process)      a fresh TransportPool: connect + probe
  TransportPool connect + true, cold the SSH layer alone, for comparison with paramiko cold
  one node alone, cold probe         one node's connect + probe latency
  probe_fleet warm (in-process)      the same pool again: probe over open connections
  probe cold/warm, with/without GPU health   issue 19: the health queries (ECC and retired pages
                                     in the GPU query, --query-remapped-rows, dmesg) against the probe
                                     without them, rounds interleaved; `--health-only` runs just these
Targets (issue 4): cold probe within 1.3x paramiko cold; warm pass under 250 ms for 50 nodes.
Target (issue 19): the health queries add at most 10% to a cold probe and to a warm pass.

Issue 19's figures (sudo python3 bench/probe.py --nodes 50 --rounds 6 --health-only, 2 shared cores,
the team's tests running beside it): cold 4763 ms with / 4711 ms without (+1.1%); warm 323 / 301 ms
(+7.6%); an earlier run at --rounds 3: cold +6.2%, warm +12.1% (runs spread 190-530 ms). Before a
session kept the kernel log and the remapped rows for HEALTH_RECHECK_S (10 s), every warm pass
forked dmesg and --query-remapped-rows again: warm 555 / 355 ms (+56%), which is what one pass in
ten seconds still pays.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import paramiko  # noqa: E402

from reconciler.observe.probe import collect as probe_collect  # noqa: E402
from reconciler.observe.probe import probe_fleet_report  # noqa: E402
from reconciler.observe.ssh import TransportPool  # noqa: E402
from tests.fleet import TestFleet  # noqa: E402


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def median_of(rounds: int, fn) -> tuple[float, list[float]]:
    times = [timed(fn) for _ in range(rounds)]
    return statistics.median(times), times


def openssh_fanout(fleet: TestFleet, n: int) -> None:
    lines = "\n".join(fleet.node(i).address for i in fleet.nodes) + "\n"
    argv = fleet.ssh_argv(next(iter(fleet.nodes)))[:-1]  # options, without the address
    proc = subprocess.run(
        ["xargs", "-P", str(n), "-I", "{}"] + argv + ["{}", "true"], input=lines, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssh fan-out failed: {proc.stderr[-500:]}")


class ParamikoFanout:
    """The plain-paramiko baseline: one SSHClient per node, one thread per node."""

    def __init__(self, fleet: TestFleet):
        self.fleet = fleet
        self.key = paramiko.Ed25519Key.from_private_key_file(str(fleet.key))
        self.clients: list[paramiko.SSHClient] = []

    def _connect(self, address: str, out: list) -> None:
        c = paramiko.SSHClient()
        c.load_host_keys(str(self.fleet.known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(address, username="root", pkey=self.key, allow_agent=False, look_for_keys=False, timeout=10)
        self._exec(c)
        out.append(c)

    @staticmethod
    def _exec(c: paramiko.SSHClient) -> None:
        _, stdout, _ = c.exec_command("true")
        if stdout.channel.recv_exit_status() != 0:
            raise RuntimeError("true failed")

    def _fan(self, fn, items) -> None:
        threads = [threading.Thread(target=fn, args=a) for a in items]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def cold(self) -> None:
        self.close()
        out: list = []
        self._fan(self._connect, [(self.fleet.node(i).address, out) for i in self.fleet.nodes])
        if len(out) != len(self.fleet.nodes):
            raise RuntimeError("a paramiko connection failed")
        self.clients = out

    def warm(self) -> None:
        self._fan(self._exec, [(c,) for c in self.clients])

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.clients = []


def health_comparison(spec, sources, rounds: int, check) -> list[tuple[str, float, list[float]]]:
    """The probe with and without its GPU health queries, cold (a fresh pool) and warm (open
    sessions), rounds interleaved so that drift on a shared machine hits both alike."""
    times: dict[str, list[float]] = {k: [] for k in ("cold, with", "cold, without", "warm, with", "warm, without")}

    def probe(pool, with_health: bool):
        probe_collect.GPU_HEALTH_QUERIES = with_health
        try:
            check(probe_fleet_report(spec, pool, sources=sources))
        finally:
            probe_collect.GPU_HEALTH_QUERIES = True

    for _ in range(rounds):
        for with_health, label in ((True, "with"), (False, "without")):
            with TransportPool() as pool:
                times[f"cold, {label}"].append(timed(lambda: probe(pool, with_health)))
    with TransportPool() as pool:
        probe(pool, True)
        for _ in range(rounds * 2):
            for with_health, label in ((True, "with"), (False, "without")):
                times[f"warm, {label}"].append(timed(lambda: probe(pool, with_health)))
    return [(f"probe {k} GPU health", statistics.median(v), v) for k, v in times.items()]


def print_results(results) -> None:
    width = max(len(r[0]) for r in results)
    print(f"{'measurement':<{width}}  median    runs")
    for name, med, times in results:
        print(f"{name:<{width}}  {med * 1000:7.0f} ms  " + " ".join(f"{t * 1000:.0f}" for t in times))


def print_health_targets(by) -> None:
    for kind in ("cold", "warm"):
        with_h, without = by[f"probe {kind}, with GPU health"], by[f"probe {kind}, without GPU health"]
        print(f"{kind} probe: {with_h * 1000:.0f} ms with the GPU health queries, {without * 1000:.0f} ms without: "
              f"{(with_h / without - 1) * 100:+.1f}% (target +10% at most)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--health-only", action="store_true", help="only the with/without GPU health comparison")
    args = ap.parse_args()
    n = args.nodes
    results: list[tuple[str, float, list[float]]] = []
    with TestFleet(connect_timeout_s=10) as fleet:
        t = time.perf_counter()
        for i in range(n):
            fleet.add_node(f"n{i:03d}", gpus=["H100"] * 8, engines=["vllm", "llama.cpp"], fabrics={"ib-pod1": ["mlx5_0", "mlx5_1"]},
                           models=["llama-3-8b"])
        print(f"fleet of {n} namespaced nodes up in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        catalog = Path(tempfile.mkdtemp(prefix="probe-bench-"))
        fleet.fleet_yaml(catalog)
        (catalog / "models").mkdir()
        (catalog / "models" / "llama.yaml").write_text(
            f"name: llama\nsource: {fleet.models_dir}/llama-3-8b\nprofiles:\n  - {{name: h100, engine: vllm, gpu_class: H100-80GB}}\n"
        )
        spec = fleet.fleet_spec()
        sources = [f"{fleet.models_dir}/llama-3-8b"]

        def check(fp) -> None:
            bad = [r.node.id for r in fp.results if r.node.state == "unreachable" or len(r.node.gpus) != 8]
            if bad:
                raise RuntimeError(f"probe failed on {bad[:5]}: {fp.results[0].node.reason}")

        results += health_comparison(spec, sources, max(args.rounds, 5), check)
        if args.health_only:
            print_results(results)
            print_health_targets({r[0]: r[1] for r in results})
            return 0

        results.append((f"openssh xargs -P {n} ssh true (cold)", *median_of(args.rounds, lambda: openssh_fanout(fleet, n))))
        if shutil.which("ansible"):
            inv = catalog / "hosts"
            inv.write_text("\n".join(fleet.node(i).address for i in fleet.nodes) + "\n")
            env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_SSH_ARGS=f"-o UserKnownHostsFile={fleet.known_hosts} -o StrictHostKeyChecking=yes")
            cmd = ["ansible", "all", "-i", str(inv), "-u", "root", "--private-key", str(fleet.key), "-m", "raw", "-a", "true", "-f", str(n)]
            results.append((f"ansible -m raw -f {n}", *median_of(args.rounds, lambda: subprocess.run(cmd, env=env, capture_output=True, check=True))))
        else:
            print("ansible is not installed: its baseline is skipped", file=sys.stderr)

        pm = ParamikoFanout(fleet)
        results.append((f"paramiko {n} threads, cold", *median_of(args.rounds, pm.cold)))
        results.append((f"paramiko {n} threads, warm", *median_of(args.rounds, pm.warm)))
        pm.close()

        env = dict(os.environ, PYTHONPATH=str(REPO))

        def cli_nodes() -> None:
            r = subprocess.run([sys.executable, "-m", "reconciler", "nodes", str(catalog), "--format", "json"], env=env, capture_output=True)
            if r.returncode != 0:
                raise RuntimeError(r.stderr.decode()[-1000:])

        results.append(("reconciler nodes (cold, CLI)", *median_of(args.rounds, cli_nodes)))

        def cold_probe() -> None:
            with TransportPool() as pool:
                check(probe_fleet_report(spec, pool, sources=sources))

        results.append(("probe_fleet cold (in-process)", *median_of(args.rounds, cold_probe)))

        def connect_only() -> None:
            from concurrent.futures import ThreadPoolExecutor

            with TransportPool() as pool, ThreadPoolExecutor(n) as ex:
                list(ex.map(lambda node: pool.transport_for(node).run(["true"]), spec.nodes))

        results.append(("TransportPool connect + true, cold", *median_of(args.rounds, connect_only)))
        one = fleet.fleet_spec([next(iter(fleet.nodes))])

        def one_node_cold() -> None:
            with TransportPool() as pool:
                check(probe_fleet_report(one, pool, sources=sources))

        results.append(("one node alone, cold probe (latency)", *median_of(max(args.rounds, 5), one_node_cold)))
        with TransportPool() as pool:
            check(probe_fleet_report(spec, pool, sources=sources))
            results.append(("probe_fleet warm (in-process)", *median_of(max(args.rounds, 5), lambda: check(probe_fleet_report(spec, pool, sources=sources)))))
        shutil.rmtree(catalog, ignore_errors=True)

    print_results(results)
    by = {r[0]: r[1] for r in results}
    print_health_targets(by)
    base = by[f"paramiko {n} threads, cold"]
    print(f"cold probe / paramiko cold: in-process {by['probe_fleet cold (in-process)'] / base:.2f}x, "
          f"CLI {by['reconciler nodes (cold, CLI)'] / base:.2f}x (target 1.3x)")
    print(f"warm probe pass: {by['probe_fleet warm (in-process)'] * 1000:.0f} ms (target 250 ms for 50 nodes)")
    print(f"SSH layer alone, cold: TransportPool {by['TransportPool connect + true, cold'] / base:.2f}x paramiko; "
          f"the rest of a cold probe is the node side (python3 start, compile, first collect) on {os.cpu_count()} shared cores")
    print(f"one node's cold probe takes {by['one node alone, cold probe (latency)'] * 1000:.0f} ms: on nodes with CPUs of their own "
          f"a cold fleet probe would be about paramiko cold + that")
    return 0


if __name__ == "__main__":
    sys.exit(main())
