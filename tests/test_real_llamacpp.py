"""Real llama.cpp end to end: `reconciler apply` on the namespaced test fleet, real OpenSSH,
real llama-server and ggml-rpc-server (built from the llama-cpp-python 0.3.36 sdist by
scripts/build-llama-cpp.sh), the real Gemma 3 270M model, real completions.

Every rank does real work: the 2-node replica's worker holds the model's layers (its RSS
against the model's size; an idle RPC server is a few MiB).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fleet import TestFleet
from tests.openai_clients import chat
from tests.real_llama import gemma_model, llama_bin

pytestmark = [pytest.mark.fleet, pytest.mark.real_engine]

REPO = Path(__file__).resolve().parent.parent
PORT = 8080


@pytest.fixture(scope="module")
def real():
    """(bin dir, model file in the cache): in CI scripts/test.sh built them; elsewhere the cache or a build now."""
    return llama_bin(), gemma_model()


def place_weights(f: TestFleet, cached: Path) -> None:
    """The model in the head's model dir only: a path source without fetch must be where it is read,
    and only the head (rank 0) reads it; the workers get their layers over RPC."""
    (f.node("c1").dir / "models" / cached.name).symlink_to(cached)


@pytest.fixture(scope="module")
def fleet(real):
    bindir, _ = real
    server, rpc = bindir / "llama-server", bindir / "ggml-rpc-server"
    f = TestFleet()
    try:
        lan = {"lan": ["mlx5_0"]}
        # c1: the head (llama-server and the RPC server); c2: a worker (RPC server only);
        # c3: an older build's worker, whose RPC server is named rpc-server.
        f.add_node("c1", binaries={"llama-server": server, "ggml-rpc-server": rpc}, fabrics=lan, labels={"role": "head"})
        f.add_node("c2", binaries={"ggml-rpc-server": rpc}, fabrics=lan, labels={"role": "worker"})
        f.add_node("c3", binaries={"rpc-server": rpc}, fabrics=lan, labels={"role": "old-worker"})
        place_weights(f, real[1])
        yield f
    finally:
        f.close()


@pytest.fixture
def catalog(tmp_path, fleet):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root)
    yield root
    # Leave the nodes as we found them: the whole fleet again, no models, and apply stops what runs.
    fleet.fleet_yaml(root)
    for p in (root / "models").glob("*.yaml"):
        p.unlink()
    apply(root, tmp_path)


def only_nodes(fleet: TestFleet, root: Path, *nodes: str) -> None:
    """fleet.yaml with just these nodes, so placement has one choice."""
    (root / "fleet.yaml").write_text(yaml.safe_dump(fleet.fleet_document(list(nodes)), sort_keys=False))


def served(fleet: TestFleet, cached: Path) -> str:
    """The model's path as the nodes see it (under their model dir)."""
    return f"{fleet.models_dir}/{cached.name}"


def model_doc(name: str, source: str, *, nodes: int = 1, selector: dict | None = None, args=()) -> dict:
    profile = {"name": "cpu", "engine": "llama.cpp", "nodes": nodes, "port": PORT, "start_timeout_s": 180,
               # a small context keeps every rank's memory small; one slot, as a 2-core test fleet serves
               "args": ["-c", "512", "-np", "1", *args]}
    if selector:
        profile["node_selector"] = selector
    return {"name": name, "source": source, "profiles": [profile]}


def write_model(root: Path, doc: dict) -> None:
    (root / "models" / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def apply(root: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """`reconciler apply` as a user runs it (its memory kept per test, under tmp_path)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "reconciler", "apply", str(root), *extra], env=env,
                          capture_output=True, text=True, timeout=600)


def replica_status(root: Path, model: str, replica: str) -> dict:
    doc = yaml.safe_load((root / "status" / "models" / f"{model}.yaml").read_text())
    return next(r for r in doc["replicas"] if r["id"] == replica)


def endpoints(root: Path) -> dict:
    """status/endpoints.yaml: model -> URLs of its Ready replicas."""
    return (yaml.safe_load((root / "status" / "endpoints.yaml").read_text()) or {}).get("models") or {}


def endpoint_of(state: dict) -> str:
    """The replica's URL: the head's (rank 0) endpoint in its status entry."""
    return next(n["endpoint"] for n in state["nodes"] if n["rank"] == 0)


def state_dir(fleet: TestFleet, node: str) -> Path:
    return fleet.node(node).dir / "home" / ".local" / "state" / "llm-reconciler"


def record(fleet: TestFleet, node: str, replica: str, rank: int) -> dict:
    """The node agent's record of a rank (its file name may start with the catalog's owner tag)."""
    [path] = [p for p in (state_dir(fleet, node) / "replicas").glob(f"*{replica}.rank{rank}.json")
              if p.name in (f"{replica}.rank{rank}.json",) or p.name.endswith(f".{replica}.rank{rank}.json")]
    return json.loads(path.read_text())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def assert_completes(endpoint: str) -> dict:
    answer = chat(endpoint, max_tokens=8)
    assert 0 < answer["usage"]["completion_tokens"] <= 8, answer["usage"]
    return answer


# --------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------


def test_a_single_node_replica_is_ready_and_answers_completions(fleet, real, catalog, tmp_path):
    _, model = real
    write_model(catalog, model_doc("gemma-solo", served(fleet, model), selector={"role": "head"}))
    done = apply(catalog, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    state = replica_status(catalog, "gemma-solo", "gemma-solo-0")
    assert state["phase"] == "Ready", state
    assert [n["node"] for n in state["nodes"]] == ["c1"]
    assert endpoints(catalog)["gemma-solo"] == [endpoint_of(state)]
    assert_completes(endpoint_of(state))


def test_a_two_node_replica_offloads_to_its_worker_which_holds_part_of_the_model(fleet, real, catalog, tmp_path):
    _, model = real
    only_nodes(fleet, catalog, "c1", "c2")  # the worker with the RPC server's current name
    write_model(catalog, model_doc("gemma-pair", served(fleet, model), nodes=2))
    done = apply(catalog, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    state = replica_status(catalog, "gemma-pair", "gemma-pair-0")
    assert state["phase"] == "Ready", state
    assert [(n["node"], n["rank"]) for n in state["nodes"]] == [("c1", 0), ("c2", 1)]

    assert not (fleet.node("c2").dir / "models" / model.name).exists()  # the worker never holds the file
    head, worker = record(fleet, "c1", "gemma-pair-0", 0), record(fleet, "c2", "gemma-pair-0", 1)
    worker_at = f"{fleet.node('c2').address}:{worker['port']}"
    assert worker["argv"][:5] == ["ggml-rpc-server", "-H", fleet.node("c2").address, "-p", str(worker["port"])]
    assert "-t" in worker["argv"]  # every core of its node, not the RPC server's default of half
    assert head["argv"][head["argv"].index("--rpc") + 1] == worker_at
    assert head["argv"][head["argv"].index("-ngl") + 1] == "99"  # a CPU-only head still offloads

    assert_completes(endpoint_of(state))
    # The worker holds the layers: an idle RPC server is a few MiB; this one has most of the
    # model's weights in its memory (the head's log does not say it at the default verbosity).
    model_mib = model.stat().st_size / 2**20
    assert rss_mib(worker["pid"]) > 0.5 * model_mib, (rss_mib(worker["pid"]), model_mib)

    # The worker dies: the replica is not Ready until it is whole again, then it serves again.
    os.kill(worker["pid"], signal.SIGKILL)
    looked = apply(catalog, tmp_path, "--dry-run")
    assert looked.returncode == 0, looked.stdout + looked.stderr
    assert re.search(r"gemma-pair-0.*restart.*rank 1 on c2", looked.stdout), looked.stdout
    back = apply(catalog, tmp_path)
    assert back.returncode == 0, back.stdout + back.stderr
    state = replica_status(catalog, "gemma-pair", "gemma-pair-0")
    assert state["phase"] == "Ready" and state["restarts"] >= 1, state
    assert record(fleet, "c2", "gemma-pair-0", 1)["pid"] != worker["pid"]
    assert_completes(endpoint_of(state))


def test_a_worker_whose_rpc_server_has_the_older_name_runs_it_under_that_name(fleet, real, catalog, tmp_path):
    _, model = real
    only_nodes(fleet, catalog, "c1", "c3")
    write_model(catalog, model_doc("gemma-old", served(fleet, model), nodes=2))
    done = apply(catalog, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    state = replica_status(catalog, "gemma-old", "gemma-old-0")
    assert state["phase"] == "Ready", state
    assert record(fleet, "c3", "gemma-old-0", 1)["argv"][0] == "rpc-server"
    assert_completes(endpoint_of(state))


# --------------------------------------------------------------------------
# Bad input: one clear line naming node, replica and reason; nothing Ready that is not whole
# --------------------------------------------------------------------------


def test_an_rpc_server_that_exits_at_once_is_a_failed_start_naming_worker_and_log(fleet, real, catalog, tmp_path):
    bindir, model = real
    # The real binary, handed a flag it does not know: it prints its usage and exits 0.
    # c2's RPC server is replaced by a wrapper around the real one, for this test only.
    wrapper = fleet.node("c2").dir / "engines" / "ggml-rpc-server"
    original = wrapper.resolve()
    wrapper.unlink()
    wrapper.write_text(f"#!/bin/sh\nexec {original} --no-such-flag \"$@\"\n")
    wrapper.chmod(0o755)
    try:
        only_nodes(fleet, catalog, "c1", "c2")
        write_model(catalog, model_doc("gemma-bad", served(fleet, model), nodes=2))
        done = apply(catalog, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        state = replica_status(catalog, "gemma-bad", "gemma-bad-0")
        assert state["phase"] == "Failed"
        assert state["message"].startswith("rank 1 on c2 did not start: exited at once (exit code 0) without "
                                           f"listening on port {PORT}"), state["message"]
        assert "error: unknown argument: --no-such-flag" in state["message"]
        assert endpoints(catalog).get("gemma-bad", []) == []  # nothing served
        assert not list((state_dir(fleet, "c1") / "replicas").glob("*gemma-bad-0.*"))  # the head never started
    finally:
        wrapper.unlink()
        wrapper.symlink_to(original)


def test_a_taken_worker_port_is_a_failed_start_naming_node_port_and_replica(fleet, real, catalog, tmp_path):
    _, model = real
    # Bound but not listening: invisible to the probe's listening-port scan, so placement hands
    # the port out, and the node agent finds it taken at start.
    holder = fleet.spawn("c2", [sys.executable, "-c",
                                "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', %d)); "
                                "print('bound', flush=True); time.sleep(300)" % PORT], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "bound"
        only_nodes(fleet, catalog, "c1", "c2")
        write_model(catalog, model_doc("gemma-port", served(fleet, model), nodes=2))
        done = apply(catalog, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        state = replica_status(catalog, "gemma-port", "gemma-port-0")
        assert state["phase"] == "Failed"
        assert state["message"] == f"rank 1 on c2 did not start: port {PORT} is in use", state["message"]
        assert re.search(rf"gemma-port-0 .*c2.*port {PORT} is in use", done.stdout), done.stdout
    finally:
        holder.kill()
        holder.wait()


def test_a_llama_server_that_crashes_at_once_fails_the_replica_with_its_log(fleet, real, catalog, tmp_path):
    _, model = real
    write_model(catalog, model_doc("gemma-crash", served(fleet, model), selector={"role": "head"}, args=("--no-such-flag",)))
    done = apply(catalog, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    state = replica_status(catalog, "gemma-crash", "gemma-crash-0")
    assert state["phase"] == "Failed"
    assert state["message"].startswith("rank 0 on c1 exited; last log lines:"), state["message"]
    assert "invalid argument: --no-such-flag" in state["message"]


def test_an_ipv6_data_address_is_refused_before_anything_runs(fleet, real, catalog, tmp_path):
    _, model = real
    doc = fleet.fleet_document(["c1", "c2"])
    doc["nodes"][1]["data_address"] = "fd00:213::2"
    (catalog / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    write_model(catalog, model_doc("gemma-v6", served(fleet, model), nodes=2))
    done = apply(catalog, tmp_path)
    assert done.returncode != 0
    line = next(line for line in done.stderr.splitlines() if "IPv6" in line)
    assert re.match(r"fleet\.yaml:\d+:\d+: node c2: data_address fd00:213::2 is IPv6, and model gemma-v6 profile cpu "
                    r"\(llama.cpp on 2 nodes\) may place a rank here; llama.cpp's RPC speaks IPv4 only", line), line
    assert "Traceback" not in done.stderr
    assert not list((state_dir(fleet, "c2") / "replicas").glob("*gemma-v6-0.*"))
