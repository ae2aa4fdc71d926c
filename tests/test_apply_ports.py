"""A port taken by a foreign process between probe and launch: that launch fails naming it, the next pass moves on."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket

import yaml

from reconciler.control.reconcile import default_probe as _default_probe, run_pass
from reconciler.catalog import load_catalog
from reconciler.observe.transport import LocalTransport
from tests.apply_support.local import TINY_ENGINE, free_port, is_running


def test_a_port_taken_after_the_probe_fails_that_launch_and_the_next_pass_picks_another(tmp_path):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(yaml.safe_dump({
        "state_dir": str(tmp_path / "state"),
        "nodes": [{"id": "local", "address": "127.0.0.1", "transport": "local"}],
    }))
    with socket.socket() as foreign:
        # Outside the ephemeral range, with the next ports (the second pass moves on to one):
        # an outgoing connection elsewhere on the machine never sits on them.
        foreign.bind(("127.0.0.1", free_port()))
        port = foreign.getsockname()[1]
        (root / "models" / "m.yaml").write_text(yaml.safe_dump({
            "name": "m", "source": "m", "profiles": [{
                "name": "cpu", "engine": "command", "port": port, "start_timeout_s": 20,
                "command": ["python3", TINY_ENGINE, "--host", "127.0.0.1", "--port", "${PORT}",
                            "--record", str(tmp_path / "engine.json")],
            }],
        }))
        catalog = load_catalog(root, with_revision=False)
        transports = {"local": LocalTransport("local")}

        def probe_before_the_foreigner_listens(cat, t):
            inv = _default_probe(cat, t)
            return dataclasses.replace(inv, nodes=tuple(
                dataclasses.replace(n, ports_in_use=tuple(p for p in n.ports_in_use if p != port)) for n in inv.nodes))

        foreign.listen()
        first = run_pass(catalog, transports=transports, probe=probe_before_the_foreigner_listens, ready_wait_s=20)
        state = first.replicas["m-0"]
        assert state.phase == "Failed"
        assert f"port {port} is in use by pid {os.getpid()}" in state.message
        assert not (tmp_path / "engine.json").exists()
        assert port in first.inventory.node("local").ports_in_use  # status/nodes.yaml says so too

        second = run_pass(catalog, transports=transports, history=first.memory, ready_wait_s=20)
    try:
        state = second.replicas["m-0"]
        assert state.phase == "Ready", state.message
        [rank] = state.nodes
        assert rank.port != port
        assert json.loads((tmp_path / "engine.json").read_text())["argv"][3] == str(rank.port)
    finally:
        for rec in (tmp_path / "state" / "replicas").glob("*.json"):
            pid = json.loads(rec.read_text())["pid"]
            if is_running(pid):
                os.killpg(pid, signal.SIGKILL)
