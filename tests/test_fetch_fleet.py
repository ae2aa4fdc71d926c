"""Weights copied between nodes of the namespaced fleet (real sshd, real OpenSSH client on the nodes).

The model directory is the same path on every node with different contents
(tests/fleet.py), so a copy really lands on another machine's disk: what the
test reads under `<node dir>/models` on the host is what that node sees.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.act.fetch import Fetcher, choose_source
from reconciler.model import FetchPolicy
from reconciler.observe.probe import probe_fleet
from tests.builders import model
from tests.conftest import REPO
from tests.fleet import TestFleet

pytestmark = [pytest.mark.fleet]

SIZES = {"config.json": 57, "tokenizer.json": 3 * 1000 * 1000 + 7, "empty.txt": 0,
         "weights/model-00001.safetensors": 9 * 1024 * 1024 + 3, "weights/model-00002.safetensors": 5 * 1024 * 1024}


@pytest.fixture(scope="module")
def fleet():
    f = TestFleet()
    try:
        f.add_node("src", models=["llama"], fabrics={"ib-a": ["mlx5_0"]})
        f.add_node("near", fabrics={"ib-a": ["mlx5_0"]})
        f.add_node("far")
        root = f.node("src").dir / "models" / "llama"
        for rel, size in SIZES.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(size))
        yield f
    finally:
        f.close()


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def weights_model(fleet):
    return replace(model("llama", source=f"{fleet.models_dir}/llama"), fetch=FetchPolicy(from_node=True, max_parallel=1))


class Transports:
    def __init__(self, fleet, pool):
        self.spec = fleet.fleet_spec()
        self.pool = pool

    def get(self, node_id):
        return self.pool.transport_for(self.spec.node(node_id))


def clean(fleet, node):
    for entry in (fleet.node(node).dir / "models").iterdir():  # the directory itself is a node's bind mount
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    shutil.rmtree(fleet.node(node).dir / "home" / ".ssh", ignore_errors=True)


def trust_each_other(fleet, node):
    """Give the node a key the others accept and their host keys: what an operator sets up for node-to-node copies."""
    ssh = fleet.node(node).dir / "home" / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    shutil.copy(fleet.key, ssh / "id_ed25519")
    os.chmod(ssh / "id_ed25519", 0o600)
    shutil.copy(fleet.known_hosts, ssh / "known_hosts")


def test_the_source_is_a_holder_on_the_targets_fabric_first(fleet, pool):
    spec = fleet.fleet_spec()
    m = weights_model(fleet)
    inv = probe_fleet(spec, pool, sources=[m.source])
    assert inv.node("src").weights == (m.source,) and inv.node("near").weights == ()
    assert choose_source(m, "near", spec, inv) == "src"
    assert choose_source(m, "src", spec, inv) is None  # nobody else holds them


@pytest.mark.parametrize("route", ["through the management host", "node to node"])
def test_a_second_replicas_weights_are_copied_from_the_node_that_holds_them(fleet, pool, route):
    clean(fleet, "near")
    if route == "node to node":
        trust_each_other(fleet, "near")
    m = weights_model(fleet)
    seen: list[tuple[int, int]] = []
    out = Fetcher(fleet.fleet_spec(), Transports(fleet, pool), chunk_bytes=2 << 20).fetch(
        m, "near", "src", progress=lambda done, total: seen.append((done, total)))
    assert out.ok, out.reason
    assert out.route == route and out.source_node == "src"
    assert out.bytes_total == sum(SIZES.values())
    assert files_under(fleet.node("near").dir / "models" / "llama") == SIZES
    assert (fleet.node("near").dir / "models" / "llama" / "tokenizer.json").read_bytes() == \
        (fleet.node("src").dir / "models" / "llama" / "tokenizer.json").read_bytes()
    assert [e.name for e in (fleet.node("near").dir / "models").iterdir()] == ["llama"]  # no temporary left
    assert seen[0] == (0, out.bytes_total) and seen[-1] == (out.bytes_total, out.bytes_total)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    inv = probe_fleet(fleet.fleet_spec(), pool, sources=[m.source])
    assert inv.node("near").weights == (m.source,)


def test_a_single_file_source_is_copied_too(fleet, pool):
    clean(fleet, "far")
    gguf = fleet.node("src").dir / "models" / "tiny.gguf"
    gguf.write_bytes(os.urandom(3 * 1024 * 1024 + 1))
    m = replace(model("tiny", source=f"{fleet.models_dir}/tiny.gguf"), fetch=FetchPolicy(from_node=True))
    out = Fetcher(fleet.fleet_spec(), Transports(fleet, pool), chunk_bytes=1 << 20).fetch(m, "far", "src")
    assert out.ok, out.reason
    assert (fleet.node("far").dir / "models" / "tiny.gguf").read_bytes() == gguf.read_bytes()


def test_a_fetch_from_a_node_without_the_files_fails_naming_the_node_and_path(fleet, pool):
    clean(fleet, "far")
    m = replace(model("gone", source=f"{fleet.models_dir}/gone"), fetch=FetchPolicy(from_node=True))
    out = Fetcher(fleet.fleet_spec(), Transports(fleet, pool)).fetch(m, "far", "near")
    assert not out.ok
    assert out.reason == f"node near: {fleet.models_dir}/gone does not exist on this node"
    assert list((fleet.node("far").dir / "models").iterdir()) == []


def test_fetch_command_runs_on_the_node_and_its_output_becomes_the_weights_only_when_it_succeeds(fleet, pool):
    clean(fleet, "far")
    ok = replace(model("cmd", source=f"{fleet.models_dir}/cmd"),
                 fetch=FetchPolicy(command=("sh", "-c", 'mkdir -p "$1" && echo hi > "$1/config.json"', "sh", "${MODEL_SOURCE}")))
    out = Fetcher(fleet.fleet_spec(), Transports(fleet, pool)).fetch(ok, "far", None)
    assert out.ok and out.route == "command", out.reason
    assert (fleet.node("far").dir / "models" / "cmd" / "config.json").read_text() == "hi\n"
    bad = replace(model("bad", source=f"{fleet.models_dir}/bad"),
                  fetch=FetchPolicy(command=("sh", "-c", 'mkdir -p "$1"; echo half > "$1/a"; echo quota exceeded; exit 3',
                                             "sh", "${MODEL_SOURCE}")))
    out = Fetcher(fleet.fleet_spec(), Transports(fleet, pool)).fetch(bad, "far", None)
    assert not out.ok and out.reason == "sh exited 3: quota exceeded"
    assert not (fleet.node("far").dir / "models" / "bad").exists()


def test_a_copy_killed_halfway_leaves_no_complete_looking_directory(fleet, pool, tmp_path):
    clean(fleet, "near")
    m = weights_model(fleet)
    # The copy runs in a process of its own, which is SIGKILLed once half the bytes are across.
    script = tmp_path / "killed_copy.py"
    spec_doc = tmp_path / "fleet.json"
    spec_doc.write_text(json.dumps(fleet.fleet_document()))
    script.write_text(f"""
import json, sys, time
from reconciler.catalog import build_fleet
from reconciler.act.fetch import Fetcher
from reconciler.model import FetchPolicy, Model
from reconciler.observe.ssh import TransportPool
spec = build_fleet(json.load(open({str(spec_doc)!r})))
pool = TransportPool()
class T:
    def get(self, n):
        return pool.transport_for(spec.node(n))
m = Model(name="llama", source={m.source!r}, fetch=FetchPolicy(from_node=True))
def progress(done, total):
    print(done, total, flush=True)
    if done * 2 >= total:
        time.sleep(60)   # halfway: wait here to be killed
Fetcher(spec, T(), chunk_bytes=1 << 20).fetch(m, "near", "src", progress=progress)
""")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        total = 0
        for line in proc.stdout:
            done, total = map(int, line.split())
            if done * 2 >= total > 0:
                break
        assert total == sum(SIZES.values())  # it got halfway before the kill
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    models = fleet.node("near").dir / "models"
    assert not (models / "llama").exists()
    leftovers = [p.name for p in models.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".llama.fetch-")
    partial = files_under(models / leftovers[0] / "llama")
    assert sum(partial.values()) < sum(SIZES.values())
    inv = probe_fleet(fleet.fleet_spec(), pool, sources=[m.source])
    assert inv.node("near").weights == ()  # the probe does not take the partial copy for the weights
    # The next copy clears what the killed one left and completes.
    out = Fetcher(fleet.fleet_spec(), Transports(fleet, pool), chunk_bytes=3 << 20).fetch(m, "near", "src")
    assert out.ok, out.reason
    assert [p.name for p in models.iterdir()] == ["llama"]
    assert files_under(models / "llama") == SIZES
