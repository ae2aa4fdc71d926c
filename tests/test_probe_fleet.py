"""Probing a real namespaced fleet over SSH: every node reports what it really has, and every
way a node can fail is reported for that node while the others are still probed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reconciler.observe.inventory import inventory_from_document, inventory_to_document
from reconciler.observe.probe import probe_fleet_report
from reconciler.observe.ssh import TransportPool
from tests.fleet import fleet  # noqa: F401  (pytest fixture)

pytestmark = [pytest.mark.fleet]

VLLM_WRAPPER = """#!/bin/sh
# A wrapper people put in front of an engine: anything it does not know, it passes to the server.
touch "$HOME/vllm-wrapper-ran"
exec python3 -m http.server 8000
"""


@pytest.fixture(scope="module")
def probed(fleet):  # noqa: F811
    """A mixed fleet, probed once; each test reads the part it specifies."""
    fleet.add_node(
        "h100", gpus=["H100"] * 8, nvlink=[[0, 1, 2, 3], [4, 5, 6, 7]], engines=["vllm", "sglang"],
        fabrics={"ib-pod1": ["mlx5_0", "mlx5_1"]}, models=["llama-3-8b", "meta-llama/Llama-3.1-70B"],
        labels={"zone": "a"}, processes=[{"gpu": 5, "pid": 999999, "name": "foreign-job", "used_mb": 2048}],
    )
    fleet.add_node("a100", gpus=["A100-40"] * 2, nvlink="none", engines=["llama.cpp"],
                   hcas=[{"name": "mlx5_0", "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fec0:0000:0000:00aa"}])
    fleet.add_node("t4", gpus=["T4"], state="cordoned", executables={"vllm": VLLM_WRAPPER})
    fleet.add_node("cpu", engines=["llama.cpp"], python_modules={"sglang": "raise ImportError('no torch here')\n"})
    fleet.add_node("smi-fails", gpus=["L40S"], nvidia_smi="fail")
    fleet.add_node("smi-garbage", gpus=["L40S"], nvidia_smi="garbage")
    fleet.add_node("nopython", python=False)
    fleet.add_node("garbage", executables={"python3": "#!/bin/sh\necho 'Welcome to garbage OS'\n"})
    fleet.add_node("cut")
    fleet.cut("cut")
    fleet.add_node("sshd-dead")
    fleet.kill_sshd("sshd-dead")
    fleet.add_node("rekeyed")
    fleet.rekey("rekeyed")
    # A bare listener (http.server would stall on a reverse lookup: nodes have no DNS).
    listen = f"import socket,time; s=socket.socket(); s.bind(({fleet.node('cpu').address!r}, 18123)); s.listen(); time.sleep(120)"
    listener = fleet.spawn("cpu", [sys.executable, "-c", listen])
    import time

    deadline = time.monotonic() + 10
    while fleet.exec("cpu", ["sh", "-c", f"grep -c ':{18123:04X} ' /proc/net/tcp || true"]).stdout.strip() == "0":
        assert listener.poll() is None and time.monotonic() < deadline, "listener did not start"
        time.sleep(0.05)
    spec = fleet.fleet_spec()
    sources = [f"{fleet.models_dir}/llama-3-8b", "meta-llama/Llama-3.1-70B", f"{fleet.models_dir}/absent"]
    with TransportPool() as pool:
        result = probe_fleet_report(spec, pool, sources=sources, timeout=30)
    return fleet, result, {r.node.id: r for r in result.results}


def test_gpus_classes_and_nvlink_domains_come_from_the_nodes_own_nvidia_smi(probed):
    _, _, by_id = probed
    h100 = by_id["h100"].node
    assert [g.gpu_class for g in h100.gpus] == ["H100-80GB"] * 8
    assert h100.gpus[0].nvlink_peers == (1, 2, 3) and h100.gpus[6].nvlink_peers == (4, 5, 7)
    a100 = by_id["a100"].node
    assert [g.gpu_class for g in a100.gpus] == ["A100-40GB"] * 2 and a100.gpus[0].nvlink_peers == ()
    assert [g.gpu_class for g in by_id["t4"].node.gpus] == ["T4-15GB"]
    assert by_id["cpu"].node.gpus == ()


def test_foreign_gpu_processes_are_reported_on_their_gpu(probed):
    _, _, by_id = probed
    gpus = by_id["h100"].node.gpus
    assert [(p.pid, p.name, p.used_mb) for p in gpus[5].processes] == [(999999, "foreign-job", 2048)]
    assert gpus[5].memory_used_mb == 2048 and all(not g.processes for i, g in enumerate(gpus) if i != 5)


def test_engines_are_what_each_node_has(probed):
    _, _, by_id = probed
    assert dict(by_id["h100"].node.engines) == {"sglang": "", "vllm": ""}
    assert dict(by_id["a100"].node.engines) == {"llama.cpp": ""}
    assert dict(by_id["t4"].node.engines) == {"vllm": ""}


def test_a_wrapper_script_named_vllm_is_found_and_never_executed(probed):
    fleet, _, by_id = probed
    assert "vllm" in by_id["t4"].node.engines
    assert not (fleet.node("t4").dir / "home" / "vllm-wrapper-ran").exists()
    # The marker is real: running the wrapper on purpose does create it.
    subprocess.run(fleet.ssh_argv("t4") + ["timeout 1 vllm --version"], capture_output=True, timeout=30)
    assert (fleet.node("t4").dir / "home" / "vllm-wrapper-ran").exists()


def test_a_broken_sglang_import_is_not_reported_installed(probed):
    _, _, by_id = probed
    cpu = by_id["cpu"]
    assert "sglang" not in cpu.node.engines
    assert any("sglang" in w and "no torch here" in w for w in cpu.warnings)


def test_fabrics_by_declaration_and_by_non_default_subnet_prefix(probed):
    _, _, by_id = probed
    assert [(f.name, f.hcas) for f in by_id["h100"].node.fabrics] == [("ib-pod1", ("mlx5_0", "mlx5_1"))]
    assert [(f.name, f.hcas) for f in by_id["a100"].node.fabrics] == [("ib-fec0-0-0-aa", ("mlx5_0",))]
    assert by_id["t4"].node.fabrics == ()


def test_weights_disks_memory_labels_and_state(probed):
    fleet, _, by_id = probed
    h100 = by_id["h100"].node
    assert h100.weights == tuple(sorted([f"{fleet.models_dir}/llama-3-8b", "meta-llama/Llama-3.1-70B"]))
    assert by_id["a100"].node.weights == ()
    assert [d.path for d in h100.disks] == [fleet.models_dir] and h100.disks[0].total_bytes > 0
    assert h100.memory_total_mb and h100.memory_total_mb > 0
    assert dict(h100.labels) == {"zone": "a"} and h100.state == "ready"
    assert by_id["t4"].node.state == "cordoned"


def test_listening_ports_are_those_of_the_nodes_own_network_namespace(probed):
    _, _, by_id = probed
    assert 18123 in by_id["cpu"].node.ports_in_use and 22 in by_id["cpu"].node.ports_in_use
    assert 18123 not in by_id["h100"].node.ports_in_use


def test_failing_nvidia_smi_is_a_warning_and_the_node_is_still_probed(probed):
    _, _, by_id = probed
    r = by_id["smi-fails"]
    assert r.node.state == "ready" and r.node.gpus == () and r.node.memory_total_mb
    assert any("exited 9" in w for w in r.warnings), r.warnings


def test_garbled_nvidia_smi_makes_the_node_unusable_with_the_reason_not_ready_without_gpus(probed):
    # Issue 13: "ready with no GPUs" let CPU replicas land on a GPU node whose GPUs were
    # simply unknown; the rest of the report (memory, records) is still read.
    _, _, by_id = probed
    r = by_id["smi-garbage"]
    assert r.node.state == "unusable" and "GPUs unknown" in r.node.reason and "unexpected format" in r.node.reason
    assert r.node.gpus == () and r.node.memory_total_mb


def test_each_unreachable_node_has_its_own_reason_while_the_others_are_probed(probed):
    _, result, by_id = probed
    reasons = {i: by_id[i].node.reason for i in ("nopython", "garbage", "cut", "sshd-dead", "rekeyed")}
    assert all(by_id[i].node.state == "unreachable" for i in reasons)
    assert "python3 is not on the node's login PATH" in reasons["nopython"]
    assert "not a JSON report" in reasons["garbage"] and "Welcome to garbage OS" in reasons["garbage"]
    assert "timed out connecting" in reasons["cut"] or "no route" in reasons["cut"]
    assert "connection refused" in reasons["sshd-dead"]
    assert "HOST KEY CHANGED" in reasons["rekeyed"] and "SHA256:" in reasons["rekeyed"]
    assert len(set(reasons.values())) == 5
    assert {n.id for n in result.inventory.nodes if n.state != "unreachable"} == {"h100", "a100", "t4", "cpu", "smi-fails", "smi-garbage"}
    assert by_id["cut"].node.engines is None and by_id["cut"].node.weights is None


def test_the_snapshot_document_round_trips_through_the_inventory_reader(probed):
    _, result, _ = probed
    doc = inventory_to_document(result.inventory)
    again = inventory_from_document(json.loads(json.dumps(doc)))
    assert inventory_to_document(again) == doc
    assert again.node("h100").gpus[5].processes[0].pid == 999999


def test_a_managed_replicas_processes_are_not_foreign_and_its_record_is_reported_alive(fleet):  # noqa: F811
    node = fleet.add_node("managed", gpus=["L40S"] * 2)
    rank = fleet.spawn("managed", ["sh", "-c", "sleep 60 & wait"])
    stat = None
    for _ in range(200):
        kids = open(f"/proc/{rank.pid}/task/{rank.pid}/children").read().split()
        if kids:
            break
        __import__("time").sleep(0.01)
    child = int(kids[0])
    stat = open(f"/proc/{rank.pid}/stat").read()
    start_time = int(stat[stat.rfind(")") + 2:].split()[19])
    records = node.dir / "home" / ".local" / "state" / "llm-reconciler" / "replicas"
    records.mkdir(parents=True)
    rec = {"id": "small-0", "model": "small", "profile": "l40s", "rank": 0, "nnodes": 1, "spec_hash": "f00", "pid": rank.pid,
           "pgid": rank.pid, "start_time": start_time, "port": 8000, "gpus": [1], "argv": ["x"], "env_keys": [],
           "log": "/dev/null", "managed_by": "llm-reconciler"}
    (records / "small-0.rank0.json").write_text(json.dumps(rec))
    (records / "gone-0.rank0.json").write_text(json.dumps({**rec, "id": "gone-0", "model": "gone", "start_time": start_time + 1}))
    fleet.set_hardware("managed", processes=[{"gpu": 1, "pid": child, "name": "vllm", "used_mb": 30000},
                                             {"gpu": 0, "pid": 424242, "name": "other-team", "used_mb": 100}])
    with TransportPool() as pool:
        (r,) = probe_fleet_report(fleet.fleet_spec(["managed"]), pool).results
    assert [(x.id, x.alive, x.gpus) for x in r.node.replicas] == [("gone-0", False, (1,)), ("small-0", True, (1,))]
    assert r.node.gpus[1].processes == ()
    assert [p.pid for p in r.node.gpus[0].processes] == [424242]


def test_changed_hardware_is_seen_on_the_next_pass_over_the_same_connection(fleet):  # noqa: F811
    fleet.add_node("changing", gpus=["RTX4090"])
    spec = fleet.fleet_spec(["changing"])
    with TransportPool() as pool:
        first = probe_fleet_report(spec, pool).results[0].node
        fleet.set_hardware("changing", gpus=["H200", "H200"])
        second = probe_fleet_report(spec, pool).results[0].node
    assert [g.gpu_class for g in first.gpus] == ["RTX4090-24GB"]
    assert [g.gpu_class for g in second.gpus] == ["H200-140GB", "H200-140GB"] and second.gpus[0].nvlink_peers == (1,)


def test_warm_passes_reuse_one_probe_session_which_ends_with_the_connection(fleet):  # noqa: F811
    import time

    fleet.add_node("session")
    spec = fleet.fleet_spec(["session"])

    def sessions() -> list[str]:
        # Only this node's network namespace: the pid namespace is the machine's, where other
        # fleets (another test run, another engineer) keep probe sessions of their own.
        mine = ["sh", "-c", 'exec pgrep --ns "$$" --nslist net -f llm-reconciler-probe']
        return fleet.exec("session", mine, check=False).stdout.split()

    with TransportPool() as pool:
        probe_fleet_report(spec, pool)
        first = sessions()
        probe_fleet_report(spec, pool)
        probe_fleet_report(spec, pool)
        assert len(first) == 1 and sessions() == first
    deadline = time.monotonic() + 20
    while sessions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions() == []


def test_a_node_whose_sshd_restarted_between_passes_is_probed_again_not_unreachable(fleet):  # noqa: F811
    fleet.add_node("restarts", gpus=["T4"])
    spec = fleet.fleet_spec(["restarts"])
    with TransportPool() as pool:
        assert probe_fleet_report(spec, pool).results[0].node.state == "ready"
        fleet.kill_sshd("restarts")
        fleet.start_sshd("restarts")
        again = probe_fleet_report(spec, pool).results[0]
    assert again.node.state == "ready" and [g.gpu_class for g in again.node.gpus] == ["T4-15GB"]


def test_a_pass_over_open_probe_sessions_starts_no_thread_per_node(fleet, monkeypatch):  # noqa: F811
    import threading
    import time

    from reconciler.observe.probe import FleetProber
    from reconciler.observe.probe import prober as fleet_prober

    names = [f"warm{i}" for i in range(3)]
    for name in names:
        fleet.add_node(name)
    spec = fleet.fleet_spec(names)
    monkeypatch.setattr(fleet_prober, "WORKER_IDLE_S", 0.05)  # the first pass's workers end before the second
    prober = FleetProber()
    starts = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (starts.append(self.name), real_start(self))[1])
    with TransportPool() as pool:
        first = prober(spec, pool)
        assert [r.node.state for r in first.results] == ["ready"] * 3
        assert starts  # connecting and starting the sessions blocked, on worker threads
        while any(t.name == "probe-worker" for t in threading.enumerate()):
            time.sleep(0.05)
        del starts[:]
        second = prober(spec, pool)
        started = list(starts)
    assert [r.node.state for r in second.results] == ["ready"] * 3
    assert [r.node.gpus for r in second.results] == [r.node.gpus for r in first.results]
    assert started == []  # every node answered over its open session through the event loop


def test_a_warm_pass_leaves_no_reference_cycle_behind(fleet):  # noqa: F811
    import gc
    import time

    from reconciler.observe.probe import FleetProber
    from reconciler.observe.probe import prober as fleet_prober

    # A cycle per node and pass (a Future whose callback held it) left some 40 objects per node for the
    # cyclic collector: at 10,000 nodes it walked the daemon's whole heap about once a pass to free them.
    fleet.add_node("acyclic")
    spec = fleet.fleet_spec(["acyclic"])
    prober = FleetProber()

    def jobs() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, fleet_prober._InFlight))

    with TransportPool() as pool:
        assert prober(spec, pool).results[0].node.state == "ready"
        gc.collect()
        enabled = gc.isenabled()
        gc.disable()
        try:
            assert prober(spec, pool).results[0].node.state == "ready"  # over the open session
            deadline = time.monotonic() + 5
            while jobs() and time.monotonic() < deadline:  # the loop thread lets go of it as its callback returns
                time.sleep(0.02)
            assert jobs() == 0
        finally:
            if enabled:
                gc.enable()
