"""apply on the namespaced test fleet: real sshd per node, real SSH, fake engines that really rendezvous.

Each node is a network namespace with its own address (tests/fleet.py); the
engines are tests/fakes (they bind their port, answer /health, and a rank
above 0 connects to its head at the address and port it was given). Probe,
plan, render and the SSH pool are the real ones: this is `reconciler apply`
minus the command line.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

from reconciler.decide.outcomes import PassResult
from reconciler.control.reconcile import apply_pass, run_pass
from reconciler.catalog import load_catalog
from reconciler.observe.ssh import TransportPool
from tests.apply_support.cleanup import stop_every_rank
from tests.apply_support.local import is_running
from tests.fleet import TestFleet

pytestmark = [pytest.mark.fleet]

TINY_ENGINE = str(Path(__file__).resolve().parent / "apply_support" / "tiny_engine.py")


@pytest.fixture(scope="module")
def fleet():
    f = TestFleet()
    try:
        f.add_node("solo", gpus=["H100", "H100"], engines=["vllm"], labels={"role": "solo"})
        f.add_node("head", gpus=["H100"], engines=["vllm", "llama.cpp"], labels={"role": "pair"}, fabrics={"ib-t": ["mlx5_0"]})
        f.add_node("work", gpus=["H100"], engines=["vllm", "llama.cpp"], labels={"role": "pair"}, fabrics={"ib-t": ["mlx5_0"]})
        yield f
    finally:
        f.close()


@pytest.fixture
def catalog_dir(tmp_path, fleet, pool):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root)
    yield root
    stop_every_rank(root)  # leave the nodes as we found them, whatever the test did


def write_model(root: Path, doc: dict) -> None:
    (root / "models" / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def vllm_model(name: str, records: Path, *, role: str, nodes: int = 1, replicas: int = 1, args=(), **extra) -> dict:
    profile = {
        "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "gpus_per_node": 1, "nodes": nodes,
        "node_selector": {"role": role}, "port": 8100, "start_timeout_s": 30,
        "env": {"FAKE_ENGINE_RECORD_DIR": str(records)}, **extra,
    }
    if args:
        profile["args"] = list(args)
    # Not a path: the nodes hold no weights, and a path source without fetch must be on the node (SPEC section 7).
    return {"name": name, "source": f"{name}-weights", "replicas": replicas, "profiles": [profile]}


def apply_once(root: Path, pool, history=None) -> PassResult:
    cat = load_catalog(root, with_revision=False)
    return apply_pass(cat, transports=pool, history=history, ready_wait_s=30)


def engine_records(records: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]


def launched_argv(pool, root: Path, replica: str) -> dict[str, list[str]]:
    """node -> the argv the node agent recorded for each rank of `replica` (what really ran there)."""
    cat = load_catalog(root, with_revision=False)
    out = {}
    for node in cat.fleet.nodes:
        t = pool.transport_for(node)
        r = t.run(["sh", "-c", 'cat "$HOME"/.local/state/llm-reconciler/replicas/*.json 2>/dev/null || true'])
        for chunk in re.findall(r"\{.*?\n\}", r.stdout.decode(), flags=re.S):
            rec = json.loads(chunk)
            if rec["id"] == replica:
                out[node.id] = rec["argv"]
    return out


def test_a_single_node_replica_starts_becomes_ready_is_stopped_and_is_gone(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("solo-llm", records, role="solo"))
    first = apply_once(catalog_dir, pool)

    state = first.replicas["solo-llm-0"]
    assert state.phase == "Ready", state.message
    assert [a.node for a in state.nodes] == ["solo"]
    solo = fleet.node("solo").address
    assert first.endpoints() == {"solo-llm": [f"http://{solo}:8100"]}
    [engine] = engine_records(records)
    assert engine["port"] == 8100 and engine["ready"]
    assert is_running(engine["pid"])

    (catalog_dir / "models" / "solo-llm.yaml").unlink()
    second = apply_once(catalog_dir, pool, history=first.memory)
    assert [(d.node, d.action) for d in second.decisions] == [("solo", "stop")]
    assert not is_running(engine["pid"])
    assert second.inventory.node("solo").replicas == ()
    assert not (catalog_dir / "status" / "models" / "solo-llm.yaml").exists()


def test_a_two_node_replica_spans_two_hosts_and_its_worker_reaches_the_head_before_ready(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("pair-llm", records, role="pair", nodes=2))
    result = apply_once(catalog_dir, pool)

    state = result.replicas["pair-llm-0"]
    assert state.phase == "Ready", state.message
    head_node, worker_node = [a.node for a in state.nodes]
    assert {head_node, worker_node} == {"head", "work"}
    head_ip, worker_ip = fleet.node(head_node).address, fleet.node(worker_node).address

    engines = {r["role"]: r for r in engine_records(records)}
    head, worker = engines["head"], engines["worker"]
    # The worker connected to the head at the address and port it was given, from its own host.
    assert worker["rendezvous"].split(":")[0] == head_ip
    assert worker["connected_from"] == worker_ip != head_ip
    assert [(p["rank"], p["address"]) for p in head["peers"]] == [(1, worker_ip)]
    assert head["ready"]

    # The seed's two assertions, on what really ran on the nodes.
    argvs = launched_argv(pool, catalog_dir, "pair-llm-0")
    given = argvs[worker_node]
    assert worker["rendezvous"] == f"{given[given.index('--master-addr') + 1]}:{given[given.index('--master-port') + 1]}"
    assert set(argvs) == {head_node, worker_node}  # at least one rank on a host that is not the head
    for node, argv in argvs.items():
        line = " ".join(argv)
        assert not re.search(r"\$\{?[A-Za-z_]", line), line  # no placeholder survived
        assert argv[argv.index("--master-addr") + 1] == head_ip  # the head address, resolved
        assert not ipaddress.ip_address(argv[argv.index("--master-addr") + 1]).is_loopback
        assert argv[argv.index("--node-rank") + 1] == ("0" if node == head_node else "1")


def test_a_spec_change_with_no_room_beside_the_old_copy_stops_it_first_and_replaces_it(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("swap-llm", records, role="solo"))
    first = apply_once(catalog_dir, pool)
    assert first.replicas["swap-llm-0"].phase == "Ready"
    [old] = engine_records(records)

    write_model(catalog_dir, vllm_model("swap-llm", records, role="solo", args=["--max-model-len", "4096"]))
    second = apply_once(catalog_dir, pool, history=first.memory)
    assert second.replicas["swap-llm-0"].phase == "Ready", second.replicas["swap-llm-0"].message
    assert {d.action for d in second.decisions} >= {"start", "stop"}
    assert not is_running(old["pid"])
    [new] = [r for r in engine_records(records) if r["pid"] != old["pid"]]
    assert "--max-model-len" in new["args"] and is_running(new["pid"])


def test_a_restarted_reconciler_adopts_what_runs_and_launches_nothing(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("keep-llm", records, role="solo"))
    first = apply_once(catalog_dir, pool)
    assert first.replicas["keep-llm-0"].phase == "Ready"

    with TransportPool() as fresh:  # a new process: no memory, new connections
        again = apply_once(catalog_dir, fresh)
    assert [d for d in again.decisions if d.action == "start"] == []
    assert again.replicas["keep-llm-0"].phase == "Ready"
    assert len(engine_records(records)) == 1


def test_a_killed_engine_is_seen_and_restarted(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("crash-llm", records, role="solo"))
    first = apply_once(catalog_dir, pool)
    [engine] = engine_records(records)
    os.kill(engine["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running(engine["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)

    second = apply_once(catalog_dir, pool, history=first.memory)
    assert any(d.action == "stop" and "restart" in d.reason for d in second.decisions), [str(d) for d in second.decisions]
    assert second.replicas["crash-llm-0"].phase == "Ready"
    status = yaml.safe_load((catalog_dir / "status" / "models" / "crash-llm.yaml").read_text())
    assert status["replicas"][0]["restarts"] == 1


HOSTILE = ["$(touch {m})", "`touch {m}`", "; touch {m}", "x\ntouch {m}", "'\"; touch {m} #"]


def test_hostile_strings_in_the_catalog_reach_the_engine_literally_over_ssh(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    marker = tmp_path / "pwned"
    hostile = [h.format(m=marker) for h in HOSTILE]
    # --chat-template takes any string (--served-model-name is the reconciler's own: SPEC section 10).
    args = [x for h in hostile for x in ("--chat-template", h)]
    write_model(catalog_dir, vllm_model("evil-llm", records, role="solo", args=args,
                                        **{"env": {"FAKE_ENGINE_RECORD_DIR": str(records), "EVIL": hostile[0]}}))
    result = apply_once(catalog_dir, pool)
    assert result.replicas["evil-llm-0"].phase == "Ready", result.replicas["evil-llm-0"].message
    [engine] = engine_records(records)
    assert engine["args"][-len(args):] == args
    assert engine["env"]["EVIL"] == hostile[0]
    assert not marker.exists()


def test_a_spec_change_with_room_elsewhere_starts_the_new_copy_before_stopping_the_old(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("roll-llm", records, role="pair"))
    first = apply_once(catalog_dir, pool)
    [old_node] = [a.node for a in first.replicas["roll-llm-0"].nodes]

    write_model(catalog_dir, vllm_model("roll-llm", records, role="pair", args=["--max-model-len", "2048"]))
    second = apply_once(catalog_dir, pool, history=first.memory)
    state = second.replicas["roll-llm-0"]
    assert state.phase == "Ready", state.message
    [new_node] = [a.node for a in state.nodes]
    assert new_node != old_node
    steps = [(d.node, d.action) for d in second.decisions if d.action in ("start", "health", "stop")]
    assert steps == [(new_node, "start"), (new_node, "health"), (old_node, "stop")]
    assert second.endpoints() == {"roll-llm": [f"http://{fleet.node(new_node).address}:8100"]}


def test_a_killed_worker_takes_its_multi_node_replica_down_and_it_is_restarted_whole(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm_model("ring-llm", records, role="pair", nodes=2))
    first = apply_once(catalog_dir, pool)
    assert first.replicas["ring-llm-0"].phase == "Ready"
    engines = {r["role"]: r for r in engine_records(records)}
    os.kill(engines["worker"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running(engines["worker"]["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)

    second = apply_once(catalog_dir, pool, history=first.memory)
    stopped = sorted(d.node for d in second.decisions if d.action == "stop")
    assert stopped == ["head", "work"]  # the surviving head goes too: ranks only rendezvous at start
    assert second.replicas["ring-llm-0"].phase == "Ready", second.replicas["ring-llm-0"].message
    assert not is_running(engines["head"]["pid"])
    fresh = [r for r in engine_records(records) if r["pid"] not in (engines["head"]["pid"], engines["worker"]["pid"])]
    assert sorted(r["role"] for r in fresh) == ["head", "worker"]


def test_a_two_node_llama_cpp_replica_starts_its_rpc_worker_before_the_head_that_dials_it(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, {"name": "gguf", "source": "gguf-weights", "profiles": [{
        "name": "cpu-pair", "engine": "llama.cpp", "nodes": 2, "node_selector": {"role": "pair"}, "port": 8200,
        "start_timeout_s": 30, "env": {"FAKE_ENGINE_RECORD_DIR": str(records)},
    }]})
    log = []
    cat = load_catalog(catalog_dir, with_revision=False)
    result = run_pass(cat, transports=pool, ready_wait_s=30, log=log.append)
    state = result.replicas["gguf-0"]
    assert state.phase == "Ready", state.message
    head_node, worker_node = [a.node for a in state.nodes]
    assert [(d.node, d.action) for d in log if d.action == "start"] == [(worker_node, "start"), (head_node, "start")]
    engines = {r["name"]: r for r in engine_records(records)}
    server, rpc = engines["llama-server"], engines["ggml-rpc-server"]  # the RPC server under its current name
    assert [p["address"] for p in server["peers"]] == [fleet.node(worker_node).address]
    assert [p["address"] for p in rpc["peers"]] == [fleet.node(head_node).address]
