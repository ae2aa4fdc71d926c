#!/usr/bin/env python3
"""Canary rollouts (SPEC section 13), measured with the real parts on a namespaced test fleet:

    python3 bench/canary.py [--requests 1000] [--weight 10] [--concurrency 8]

Needs root (tests/fleet.py), real llama.cpp (scripts/build-llama-cpp.sh), the real Gemma 3 270M model
and LiteLLM (LLMFLEET_LITELLM or `litellm` on PATH). One model, two replicas, `reconciler apply` run
as a person would:

1. A bad revision (every chat request answers 401, /health 200): the seconds from the pass logging
   the failing measurement to status/gateway/litellm.yaml written without the canary (goal: at most
   interval_s plus one pass), and the seconds one such pass takes.
2. A good revision held Progressing (analysis_s long): N one-token chat completions through a real
   LiteLLM started on litellm.yaml as written, `concurrency` at a time; the share that the canary
   copy served (LiteLLM's x-litellm-model-id header ends in /canary) against its weight (goal: within
   3 points over 1,000 requests).

Asserts nothing (benchmarks are not tests).

Figures (2026-12-05, the team's shared 2-core machine, load average about 11, LiteLLM as the test extra
pins it, llama.cpp 0.3.36's llama-server, Gemma 3 270M Q4_K_M; `python3 bench/canary.py --requests 1000`):
    abort: 'request: 2 of 2 failed: HTTP 401'; canary out of litellm.yaml: yes, +0.032 s after the failing
        measurement was logged; that pass took 25.2 s (interval_s 1)
    share: 114 of 1000 requests served by the canary = 11.4% against weight 10% (+1.4 points); 0 failed;
        1000 requests in 1504 s, 8 at a time
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.gateway import apply_logged  # noqa: E402
from tests.fleet import TestFleet  # noqa: E402
from tests.real_llama import gemma_model, llama_bin  # noqa: E402
from tests.test_gateway_real import MASTER_KEY, Child, free_loopback_port, get_json, wait_until  # noqa: E402

SERVED = "gemma"
ARGS = ["-c", "512", "-np", "2"]


def write_model(root: Path, source: str, args: list[str], weight: int) -> None:
    doc = {"name": "gemma", "source": source, "replicas": 2, "drain_s": 5,
           "rollout": {"canary": {"replicas": 1, "weight": weight, "analysis_s": 86400},
                       "checks": {"interval_s": 1, "failure_limit": 0, "request": {
                           "body": {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1},
                           "expect": {"status": 200}, "timeout_s": 120}}},
           "profiles": [{"name": "cpu", "engine": "llama.cpp", "port": 8080, "start_timeout_s": 300, "args": args}]}
    (root / "models" / "gemma.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def litellm_ids(root: Path) -> list[str]:
    doc = yaml.safe_load((root / "status" / "gateway" / "litellm.yaml").read_text())
    return [e["model_info"]["id"] for e in doc["model_list"]]


def served_by(base: str) -> str:
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            return r.headers.get("x-litellm-model-id", "?")
    except OSError as exc:
        return f"error: {exc}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--weight", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    litellm = os.environ.get("LLMFLEET_LITELLM") or "litellm"
    bindir, cached = llama_bin(), gemma_model()
    tmp = Path(tempfile.mkdtemp(prefix="bench-canary-"))
    root, state = tmp / "catalog", tmp / "state"
    (root / "models").mkdir(parents=True)
    children: list[Child] = []
    with TestFleet() as f:
        for node in ("g1", "g2", "g3"):
            f.add_node(node, binaries={"llama-server": bindir / "llama-server"})
            (f.node(node).dir / "models" / cached.name).symlink_to(cached)
        f.fleet_yaml(root)
        source = f"{f.models_dir}/{cached.name}"
        try:
            write_model(root, source, ARGS, args.weight)
            apply_logged(root, state)

            # 1. A bad revision: from its failing measurement to the canary out of the gateway files.
            write_model(root, source, ARGS + ["--api-key", "sk-nobody"], args.weight)
            started, ended, lines = apply_logged(root, state)
            failed = next((d for d in lines if d.get("action") == "check" and not d.get("ok")), None)
            written = os.stat(root / "status" / "gateway" / "litellm.yaml").st_mtime_ns / 1e9
            out = not any(i.endswith("/canary") for i in litellm_ids(root))
            if failed is None:
                print("abort: no failing measurement logged (the check did not run)")
            else:
                print(f"abort: '{failed['reason']}'; canary out of litellm.yaml: {'yes' if out else 'NO'}, "
                      f"{written - failed['at']:+.3f} s after the failing measurement was logged; "
                      f"that pass took {ended - started:.1f} s (interval_s 1)")

            # 2. A good revision, Progressing: the canary's share of requests through a real LiteLLM.
            write_model(root, source, ["-c", "640", "-np", "2"], args.weight)
            for _ in range(3):
                apply_logged(root, state)
                if any(i.endswith("/canary") for i in litellm_ids(root)):
                    break
            ids = litellm_ids(root)
            print(f"progressing: litellm.yaml entries {ids}")
            port = free_loopback_port()
            children.append(Child([litellm, "--config", str(root / "status" / "gateway" / "litellm.yaml"),
                                   "--host", "127.0.0.1", "--port", str(port)], tmp / "litellm.log", cwd=tmp,
                                  env={**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY}))
            base = f"http://127.0.0.1:{port}"
            wait_until("LiteLLM", lambda: get_json(base + "/health/liveliness") is not None, timeout=600, every=1)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                served = list(pool.map(lambda _: served_by(base), range(args.requests)))
            took = time.perf_counter() - t0
            errors = [s for s in served if s.startswith("error")]
            good = [s for s in served if not s.startswith("error")]
            canary = sum(1 for s in good if s.endswith("/canary"))
            share = 100 * canary / len(good) if good else 0.0
            print(f"share: {canary} of {len(good)} requests served by the canary = {share:.1f}% against weight "
                  f"{args.weight}% ({share - args.weight:+.1f} points); {len(errors)} failed; "
                  f"{args.requests} requests in {took:.0f} s, {args.concurrency} at a time")
            if errors:
                print(f"  first failure: {errors[0]}")
        finally:
            for c in children:
                c.stop()
            for p in (root / "models").glob("*.yaml"):
                p.unlink()
            apply_logged(root, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
