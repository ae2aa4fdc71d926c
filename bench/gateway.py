#!/usr/bin/env python3
"""The gateway hand-off (SPEC section 10), measured with the real parts on a namespaced test fleet:

    python3 bench/gateway.py [--requests 20] [--stream-tokens 96]

Needs root (tests/fleet.py), real llama.cpp (scripts/build-llama-cpp.sh), the real Gemma 3 270M
model and LiteLLM (LLMFLEET_LITELLM or `litellm` on PATH; the test extra pins it). Prints:

1. Ready -> gateway files: whether a replica's entry is in status/gateway/litellm.yaml and
   prometheus.json after the very pass that found it Ready (target: the same pass), and the seconds
   from that pass logging it Ready to both files' modification time.
2. Request latency through LiteLLM (started on litellm.yaml as written) against the same request
   straight to the engines: the median of N each, interleaved, one-token chat completions of one
   cached prompt, so the difference is what the hand-off costs.
3. A drained replica: a stream runs on it while it is scaled down; `apply` runs back to back (one
   pass interval = the time one apply takes, printed); the seconds from the stream's last byte to
   the replica's process being gone (target: at most one pass interval).

Asserts nothing (benchmarks are not tests).

Figures (2026-12-01, the team's shared 2-core machine under load, LiteLLM 1.80.17, llama.cpp 0.3.36's
llama-server, Gemma 3 270M Q4_K_M; two runs):
    ready -> gateway files: same pass: yes; +0.022 s / +0.047 s from Ready logged to the later write
    latency, median of 20, interleaved: direct 960 ms, through LiteLLM 1424 ms (+464 ms); the first
        run, not interleaved, read 618 / 104 ms: on this machine the load of the moment dominates
    drain: the stream completed in full (96 tokens) both runs; stopped 2.3 s / 1.8 s after its last
        byte, against a pass interval (one apply) of 2.1 s / 3.1 s
    LiteLLM takes 14-57 s here to answer its first /health/liveliness
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.apply_support.local import is_running  # noqa: E402
from tests.fleet import TestFleet  # noqa: E402
from tests.real_llama import gemma_model, llama_bin  # noqa: E402
from tests.openai_clients import Stream  # noqa: E402
from tests.test_gateway_real import (  # noqa: E402
    MASTER_KEY,
    SERVED,
    Child,
    free_loopback_port,
    get_json,
    litellm_ids,
    pid_of,
    prometheus_replicas,
    replicas_in_status,
    wait_until,
    write_model,
)


def apply_logged(root: Path, state: Path) -> tuple[float, float, list[dict]]:
    """`reconciler apply --log-format json`: (started, ended, [decision + the wall time it was printed])."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "reconciler", "apply", str(root), "--log-format", "json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        try:
            lines.append({**json.loads(line), "at": time.time()})
        except ValueError:
            pass
    proc.wait(timeout=900)
    return started, time.time(), lines


def chat_once(base: str, headers: dict) -> float:
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", **headers})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        json.load(r)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--stream-tokens", type=int, default=96)
    args = ap.parse_args()
    litellm = os.environ.get("LLMFLEET_LITELLM") or "litellm"
    bindir, cached = llama_bin(), gemma_model()
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    root, state = tmp / "catalog", tmp / "state"
    (root / "models").mkdir(parents=True)
    children: list[Child] = []
    with TestFleet() as f:
        for node in ("g1", "g2"):
            f.add_node(node, binaries={"llama-server": bindir / "llama-server"})
            (f.node(node).dir / "models" / cached.name).symlink_to(cached)
        f.fleet_yaml(root)
        source = f"{f.models_dir}/{cached.name}"
        try:
            # 1. Ready -> both gateway files.
            write_model(root, source, replicas=1)
            _, _, lines = apply_logged(root, state)
            ready_at = next(d["at"] for d in lines if d["action"] == "health" and d["reason"].startswith("Ready"))
            gw = root / "status" / "gateway"
            same_pass = litellm_ids(root) == ["gemma-0"] and prometheus_replicas(root) == ["gemma-0"]
            mtimes = [os.stat(gw / n).st_mtime_ns / 1e9 for n in ("litellm.yaml", "prometheus.json")]
            print(f"ready -> gateway files: same pass: {'yes' if same_pass else 'NO'}; "
                  f"{max(mtimes) - ready_at:+.3f} s from the pass logging Ready to the later file's write")

            # 2. Latency through LiteLLM against direct, median of N each.
            write_model(root, source, replicas=2)
            apply_logged(root, state)
            port = free_loopback_port()
            children.append(Child([litellm, "--config", str(gw / "litellm.yaml"), "--host", "127.0.0.1",
                                   "--port", str(port)], tmp / "litellm.log", cwd=tmp,
                                  env={**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY}))
            base = f"http://127.0.0.1:{port}"
            t0 = time.perf_counter()
            wait_until("LiteLLM", lambda: get_json(base + "/health/liveliness") is not None, timeout=600, every=1)
            print(f"litellm start: {time.perf_counter() - t0:.1f} s to answer /health/liveliness")
            status = replicas_in_status(root)
            heads = [next(n["endpoint"] for n in status[r]["nodes"] if n["rank"] == 0) for r in ("gemma-0", "gemma-1")]
            key = {"Authorization": f"Bearer {MASTER_KEY}"}
            for head in heads:  # warm: the prompt cached on both replicas
                chat_once(head, {})
            chat_once(base, key)
            # Interleaved, direct over both replicas as LiteLLM spreads over them: both see the same load.
            d, g = [], []
            for i in range(args.requests):
                d.append(chat_once(heads[i % 2], {}))
                g.append(chat_once(base, key))
            md, mg = statistics.median(d), statistics.median(g)
            print(f"latency, median of {args.requests}: direct {md * 1000:.0f} ms, through LiteLLM {mg * 1000:.0f} ms "
                  f"(+{(mg - md) * 1000:.0f} ms)")
            children.pop().stop()

            # 3. A drained replica's stop after its last request.
            node = status["gemma-1"]["nodes"][0]["node"]
            endpoint = next(n["endpoint"] for n in status["gemma-1"]["nodes"] if n["rank"] == 0)
            pid = pid_of(f, node, "gemma-1")
            stream = Stream(endpoint, SERVED, args.stream_tokens, timeout=600)
            stream.start()
            stream.started.wait(600)
            write_model(root, source, replicas=1)
            passes, durations, gone_at = 0, [], None
            while is_running(pid) and passes < 100:
                started, ended, _ = apply_logged(root, state)
                passes += 1
                durations.append(ended - started)
                if not is_running(pid):
                    gone_at = ended
            stream.join(timeout=600)
            end = stream.ended_at
            print(f"drain: stream {'completed' if stream.done and stream.error is None else 'CUT'} "
                  f"({stream.chunks} chunks); {passes} passes; pass interval (one apply) median "
                  f"{statistics.median(durations):.1f} s")
            if end is not None and gone_at is not None:
                print(f"drain: stopped {gone_at - end:.1f} s after the stream's last byte")
        finally:
            for c in children:
                c.stop()
            for p in (root / "models").glob("*.yaml"):
                p.unlink()
            apply_logged(root, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
