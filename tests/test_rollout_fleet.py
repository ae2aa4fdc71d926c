"""Changes on the namespaced fleet (real sshd, fake engines that really serve): weights fetched for a
replica placed where they are missing, a start that never becomes Ready ends, a full fleet updated in place."""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.control.reconcile import run_pass
from tests.fleet import TestFleet
from tests.apply_support.local import is_running
from tests.test_apply_fleet import catalog_dir, write_model  # noqa: F401  (a fixture: catalog_dir)
from tests.test_fetch_fleet import files_under

pytestmark = [pytest.mark.fleet]

WEIGHTS = {"config.json": 123, "model.safetensors": 6 * 1024 * 1024 + 11}


@pytest.fixture(scope="module")
def fleet():
    f = TestFleet()
    try:
        f.add_node("w1", gpus=["H100"], engines=["vllm"], models=["llama"])
        f.add_node("w2", gpus=["H100"], engines=["vllm"])
        for rel, size in WEIGHTS.items():
            (f.node("w1").dir / "models" / "llama" / rel).write_bytes(os.urandom(size))
        yield f
    finally:
        f.close()


def vllm(name, records, *, source, replicas=1, fetch=None, env=None, start_timeout_s=30, args=()):
    doc = {"name": name, "source": source, "replicas": replicas, "profiles": [{
        "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "port": 8300, "start_timeout_s": start_timeout_s,
        "env": {"FAKE_ENGINE_RECORD_DIR": str(records), **(env or {})}, "args": list(args)}]}
    if fetch is not None:
        doc["fetch"] = fetch
    return doc


def test_a_replica_placed_where_its_weights_are_missing_gets_them_and_serves(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    source = f"{fleet.models_dir}/llama"
    write_model(catalog_dir, vllm("llama", records, source=source, replicas=2, fetch={"from_node": True}))
    log = []
    result = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=30, log=log.append)
    states = result.replicas
    assert [states["llama-0"].phase, states["llama-1"].phase] == ["Ready", "Ready"], [s.message for s in states.values()]
    assert {states["llama-0"].nodes[0].node, states["llama-1"].nodes[0].node} == {"w1", "w2"}
    fetched = [d for d in log if d.action == "fetch" and d.reason.startswith("fetched")]
    assert [(d.node, d.ok) for d in fetched] == [("w2", True)]
    assert "from w1" in fetched[0].reason
    assert files_under(fleet.node("w2").dir / "models" / "llama") == WEIGHTS
    # The engine on w2 started after its weights were there, and the next probe sees them.
    assert result.plan.actions and all(d.ok for d in log)
    again = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=30,
                     history=result.memory)
    assert again.plan.actions == ()
    assert again.inventory.node("w2").weights == (source,)


def test_a_failed_fetch_is_a_failed_start_with_the_fetchs_error(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm("ghost", records, source=f"{fleet.models_dir}/ghost", fetch={
        "command": ["sh", "-c", "echo 'no route to the hub' >&2; exit 7"]}))
    result = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=10)
    state = result.replicas["ghost-0"]
    assert state.phase == "Failed"
    assert "fetch of" in state.message and "sh exited 7: no route to the hub" in state.message
    assert not records.exists() or not list(records.iterdir())  # no engine was launched
    doc = yaml.safe_load((catalog_dir / "status" / "models" / "ghost.yaml").read_text())
    assert doc["replicas"][0]["phase"] == "Failed" and "no route to the hub" in doc["replicas"][0]["message"]


def test_a_start_that_never_becomes_ready_is_stopped_reported_with_its_log_and_restarted_with_backoff(
        fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, vllm("stuck", records, source="stuck-weights", start_timeout_s=2,
                                  env={"FAKE_ENGINE_START_DELAY_S": "3600"}))
    log = []
    first = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=10, log=log.append)
    state = first.replicas["stuck-0"]
    assert state.phase == "Failed"
    assert "not Ready after 2s" in state.message and "last log lines:" in state.message and "[fake]" in state.message
    (engine,) = [json.loads(p.read_text()) for p in records.glob("*.json")]
    deadline = time.monotonic() + 10
    while is_running(engine["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_running(engine["pid"])  # stopped, not left running
    assert any(d.action == "stop" and "start timeout" in d.reason for d in log)
    # The next pass restarts it (restart 1); the one after waits out the backoff.
    restarted_at = time.time()
    second = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=10,
                      history=first.memory, now=restarted_at)
    assert [(a.action, a.replica) for a in second.plan.actions] == [("restart", "stuck-0")]
    assert second.plan.backoff["stuck-0"].restarts == 1
    assert second.replicas["stuck-0"].phase == "Failed"
    # One second later by the plan's clock, well inside the 10 s backoff of a second crash, however slow the pass.
    third = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=10,
                     history=second.memory, now=restarted_at + 1)
    assert third.plan.actions == ()
    assert any(w.replica == "stuck-0" and "waiting for backoff" in w.reason for w in third.plan.waiting)
    assert all(not is_running(json.loads(p.read_text())["pid"]) for p in records.glob("*.json"))


def test_a_one_argument_change_on_a_full_fleet_converges_in_place_and_nothing_is_ever_unplaced(
        fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    # No gateway to wait for: each old copy hands off once the files without it are written (SPEC 13).
    (catalog_dir / "fleet.yaml").write_text("gateway: {settle_s: 0}\n" + (catalog_dir / "fleet.yaml").read_text())
    write_model(catalog_dir, vllm("full", records, source="full-weights", replicas=2))
    result = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=30)
    assert [s.phase for s in result.replicas.values()] == ["Ready", "Ready"]
    where = {rid: s.nodes[0].node for rid, s in result.replicas.items()}
    write_model(catalog_dir, vllm("full", records, source="full-weights", replicas=2, args=["--max-model-len", "4096"]))
    memory = result.memory
    for _ in range(8):
        result = run_pass(load_catalog(catalog_dir, with_revision=False), transports=pool, ready_wait_s=30,
                          history=memory)
        memory = result.memory
        assert result.plan.unplaced == ()
        replaced = [a for a in result.plan.actions if a.action == "replace"]
        assert len(replaced) <= 1 and all(a.stop_first for a in replaced)  # in place, one at a time
        waiting = [w for w in result.plan.waiting if "runs the old spec" in w.reason]
        for w in waiting:
            assert "runs the old spec" in result.replicas[w.replica].message
        if not result.plan.actions and not memory.draining:
            break
    assert result.plan.actions == () and memory.draining == {}
    assert [s.phase for s in result.replicas.values()] == ["Ready", "Ready"]
    assert {rid: s.nodes[0].node for rid, s in result.replicas.items()} == where  # on the same nodes
    running = [json.loads(p.read_text()) for p in records.glob("*.json")]
    live = [r for r in running if is_running(r["pid"])]
    assert len(live) == 2 and all("--max-model-len" in r["args"] for r in live)
