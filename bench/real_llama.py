#!/usr/bin/env python3
"""Real llama.cpp across two nodes: is the second node doing real work, and what does it cost?

    python3 bench/real_llama.py [--tokens N] [--requests N]

On a namespaced test fleet (tests/fleet.py; needs root) of two nodes, with the real
llama-server and ggml-rpc-server (scripts/build-llama-cpp.sh) and the real Gemma 3 270M
model: times `reconciler apply` (the CLI, as a user runs it) to the first completion of a
2-node replica, then generation speed (completion tokens per second, from the tokens the
server says it generated and the wall time of each request) of that replica against the
same model on one node. Both nodes are namespaces of this one machine, so the "network" is
a bridge and the 2-node figure shows the cost of the RPC round trips, not a gain from more
cores. Prints figures; asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from tests.fleet import TestFleet  # noqa: E402
from tests.openai_clients import chat  # noqa: E402
from tests.real_llama import gemma_model, llama_bin, wait_for_completion  # noqa: E402


def apply(root: Path, state: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    done = subprocess.run([sys.executable, "-m", "reconciler", "apply", str(root)], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"apply failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def endpoint(root: Path, model: str) -> str:
    return yaml.safe_load((root / "status" / "endpoints.yaml").read_text())["models"][model][0]


def tokens_per_second(url: str, tokens: int, requests: int) -> tuple[float, float]:
    """(median completion tokens/s over `requests` requests, server-side predicted tokens/s)."""
    rates, server = [], []
    for i in range(requests):
        t0 = time.perf_counter()
        answer = chat(url, prompt=f"Write a short story about the number {i}.", max_tokens=tokens, timeout=600)
        wall = time.perf_counter() - t0
        rates.append(answer["usage"]["completion_tokens"] / wall)
        if "timings" in answer:
            server.append(answer["timings"].get("predicted_per_second", 0.0))
    return statistics.median(rates), statistics.median(server) if server else float("nan")


def model_doc(name: str, source: str, nodes: int, port: int) -> dict:
    return {"name": name, "source": source, "profiles": [{
        "name": "cpu", "engine": "llama.cpp", "nodes": nodes, "port": port, "start_timeout_s": 600,
        "args": ["-c", "1024", "-np", "1"]}]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request (default 64)")
    ap.add_argument("--requests", type=int, default=3, help="requests per replica (default 3)")
    args = ap.parse_args()

    bindir, model = llama_bin(), gemma_model()
    work = Path(tempfile.mkdtemp(prefix="bench-real-llama-"))
    fleet = TestFleet()
    try:
        lan = {"lan": ["mlx5_0"]}
        binaries = {"llama-server": bindir / "llama-server", "ggml-rpc-server": bindir / "ggml-rpc-server"}
        fleet.add_node("b1", binaries=binaries, fabrics=lan)
        fleet.add_node("b2", binaries=binaries, fabrics=lan)
        # A path source must be where it is read: on the head (b1) only; the worker gets its layers over RPC.
        (fleet.node("b1").dir / "models" / model.name).symlink_to(model)
        source = f"{fleet.models_dir}/{model.name}"
        root = work / "catalog"
        (root / "models").mkdir(parents=True)
        fleet.fleet_yaml(root)
        print(f"llama.cpp {bindir}, model {model.name} ({model.stat().st_size / 2**20:.0f} MiB), 2 namespaced nodes, "
              f"{os.cpu_count()} CPUs on this machine")

        (root / "models" / "pair.yaml").write_text(yaml.safe_dump(model_doc("pair", source, 2, 8090), sort_keys=False))
        t0 = time.perf_counter()
        apply(root, work / "state")
        t_ready = time.perf_counter() - t0
        pair = endpoint(root, "pair")
        wait_for_completion(pair, timeout=600)
        t_first = time.perf_counter() - t0
        print(f"  2-node replica: apply -> Ready                {t_ready:6.1f} s")
        print(f"  2-node replica: apply -> first completion     {t_first:6.1f} s")
        pair_rate, pair_server = tokens_per_second(pair, args.tokens, args.requests)

        (root / "models" / "pair.yaml").unlink()
        (root / "models" / "solo.yaml").write_text(yaml.safe_dump(model_doc("solo", source, 1, 8091), sort_keys=False))
        t0 = time.perf_counter()
        apply(root, work / "state")
        solo = endpoint(root, "solo")
        wait_for_completion(solo, timeout=600)
        t_solo = time.perf_counter() - t0
        print(f"  1-node replica: apply (stop pair, start solo) -> first completion  {t_solo:6.1f} s")
        solo_rate, solo_server = tokens_per_second(solo, args.tokens, args.requests)

        print(f"  generation, {args.tokens} tokens x {args.requests} requests (median):")
        print(f"    2-node (all layers on the worker's RPC device)  {pair_rate:6.1f} tok/s   (server: {pair_server:6.1f})")
        print(f"    1-node                                          {solo_rate:6.1f} tok/s   (server: {solo_server:6.1f})")
        print(f"    2-node / 1-node                                 {pair_rate / solo_rate:6.2f}")
        (root / "models" / "solo.yaml").unlink()
        apply(root, work / "state")  # stops what it started
    finally:
        fleet.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
