"""GPU health on the namespaced fleet (SPEC section 9): each way a GPU breaks is reported with its
reason by the real probe over real SSH, apply never hands a bad GPU out, and a Ready replica whose
GPU goes bad is moved. The GPUs are fakes (tests/fleet.py: nvidia-smi, dmesg and
/proc/driver/nvidia/gpus print what a broken GPU makes them print); everything else is real."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.act.launcher import SshLauncher
from reconciler.observe.probe import probe_fleet_report
from reconciler.control.reconcile import apply_pass, run_pass
from reconciler.observe.ssh import TransportPool
from reconciler.vocabulary import CheckResult, GpuHealth
from tests.apply_support.cleanup import stop_every_rank
from tests.fleet import TestFleet, bus_id

pytestmark = pytest.mark.fleet

FAULTS = {0: "ecc", 1: "retired_pending", 2: "remap_pending", 3: "remap_failed", 4: "xid79", 5: "xid13",
          6: "handle", 7: "reset", 8: "err", 9: "leak", 10: "lost"}
STRAY_XID = "[ 9000.000000] NVRM: Xid (PCI:0000:f1:00): 48, pid=77, An uncorrectable double bit error (DBE) has been detected."


@pytest.fixture(scope="module")
def fleet():
    f = TestFleet()
    try:
        f.add_node("broken", gpus=["H100"] * 12, faults=FAULTS, kernel_log=[STRAY_XID])
        f.add_node("no-dmesg-rights", gpus=["H100"] * 2, faults={1: "ecc"}, dmesg="unreadable")
        f.add_node("dmesg-hangs", gpus=["H100"], dmesg="hang")
        f.add_node("dmesg-huge", gpus=["H100"] * 2, faults={1: "xid79"}, dmesg="huge")
        f.add_node("apply-a", gpus=["H100"] * 4, faults={0: "xid79", 1: "ecc"}, engines=["vllm"], labels={"role": "a"})
        f.add_node("mover", gpus=["H100"] * 2, engines=["vllm"], labels={"role": "m"})
        yield f
    finally:
        f.close()


@pytest.fixture(scope="module")
def probed(fleet):
    spec = fleet.fleet_spec(["broken", "no-dmesg-rights", "dmesg-hangs", "dmesg-huge"])
    with TransportPool() as pool:
        result = probe_fleet_report(spec, pool, timeout=30)
    return {r.node.id: r for r in result.results}


def by_index(probe):
    return {g.index: g for g in probe.node.gpus}


def test_the_probe_reports_each_way_a_gpu_breaks_with_its_reason(probed):
    gpus = by_index(probed["broken"])
    said = {i: (g.health, g.health_reason) for i, g in gpus.items()}
    assert said[0] == (GpuHealth.UNHEALTHY, "2 uncorrected ECC errors")
    assert said[1] == (GpuHealth.UNHEALTHY, "page retirement pending")
    assert said[2] == (GpuHealth.UNHEALTHY, "row remap pending")
    assert said[3] == (GpuHealth.UNHEALTHY, "row remap failed")
    assert said[4][0] == GpuHealth.UNHEALTHY and said[4][1].startswith("Xid 79 at ")
    assert said[4][1].endswith(": GPU has fallen off the bus")
    assert said[5] == (GpuHealth.OK, "") and gpus[5].xid_info[0].startswith("Xid 13 at ")
    assert said[6] == (GpuHealth.UNHEALTHY, "the driver cannot answer for it: Unknown Error")
    assert said[7] == (GpuHealth.UNHEALTHY, "the driver cannot answer for it: memory.total reads [GPU requires reset]")
    assert said[8] == (GpuHealth.UNHEALTHY, "the driver cannot answer for it: ecc.errors.uncorrected.volatile.total reads ERR!")
    assert said[9] == (GpuHealth.OK, "") and gpus[9].memory_used_mb == 71200  # placement's to refuse, not the probe's
    assert said[11] == (GpuHealth.OK, "")
    # GPU 10 is not listed by the driver; /proc/driver/nvidia/gpus still has it: lost, at a slot after the listed ones.
    (lost,) = [g for g in gpus.values() if g.health == GpuHealth.LOST]
    assert bus_id(10)[4:].lower()[:10] in lost.health_reason and lost.gpu_class == "H100-80GB"
    assert dict(probed["broken"].node.health_checks) == {"ecc": "ok", "remap": "ok", "xid": "ok"}


def test_an_xid_for_a_bus_no_gpu_has_is_a_warning_not_a_verdict(probed):
    assert any("0000:f1:00" in w and "no GPU of this node has" in w for w in probed["broken"].warnings)


def test_a_kernel_log_the_login_cannot_read_is_unreadable_and_the_other_checks_still_judge(probed):
    p = probed["no-dmesg-rights"]
    assert p.node.health_checks["xid"] == CheckResult.UNREADABLE
    assert p.node.health_checks["ecc"] == CheckResult.OK
    assert by_index(p)[1].health == GpuHealth.UNHEALTHY
    assert any("dmesg exited 1" in w and "Operation not permitted" in w for w in p.warnings)


def test_a_dmesg_that_hangs_costs_the_xid_check_not_the_probe(probed):
    p = probed["dmesg-hangs"]
    assert p.node.state == "ready" and len(p.node.gpus) == 1
    assert p.node.health_checks["xid"] == CheckResult.UNREADABLE
    assert any("dmesg ran past" in w for w in p.warnings)


def test_megabytes_of_kernel_log_are_read_to_the_xid_at_their_end(probed):
    gpus = by_index(probed["dmesg-huge"])
    assert gpus[1].health == GpuHealth.UNHEALTHY and "Xid 79" in gpus[1].health_reason
    assert gpus[0].health == GpuHealth.OK


# --------------------------------------------------------------------------
# apply
# --------------------------------------------------------------------------


@pytest.fixture
def pool():
    with TransportPool() as p:
        yield p


@pytest.fixture
def catalog_dir(tmp_path, fleet, pool):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root, ["apply-a", "mover"])
    yield root
    stop_every_rank(root)  # leave the nodes as we found them, whatever the test did


def write_model(root: Path, name: str, records: Path, role: str, gpus: int) -> None:
    doc = {"name": name, "source": f"{name}-weights", "replicas": 1, "profiles": [{
        "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "gpus_per_node": gpus, "node_selector": {"role": role},
        "port": 8100, "start_timeout_s": 30, "env": {"FAKE_ENGINE_RECORD_DIR": str(records)}}]}
    (root / "models" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def apply_once(root: Path, pool, history=None):
    return apply_pass(load_catalog(root, with_revision=False), transports=pool, history=history, ready_wait_s=30)


def visible_devices(fleet, node: str, records: Path) -> list[list[int]]:
    """The GPU indices each recorded engine was given (CUDA_VISIBLE_DEVICES names them by uuid)."""
    index = {g["uuid"]: i for i, g in enumerate(fleet.node(node).hardware["gpus"])}
    out = []
    for p in sorted(records.glob("*.json"), key=lambda p: p.stat().st_mtime):
        devices = json.loads(p.read_text())["env"].get("CUDA_VISIBLE_DEVICES", "")
        out.append([index.get(d, d) if not d.isdigit() else int(d) for d in devices.split(",") if d])
    return out


def test_apply_puts_the_replica_on_the_healthy_gpus_only(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, "pair", records, "a", 2)
    result = apply_once(catalog_dir, pool)
    state = result.replicas["pair-0"]
    assert state.phase == "Ready", state.message
    assert visible_devices(fleet, "apply-a", records) == [[2, 3]]
    nodes_yaml = yaml.safe_load((catalog_dir / "status" / "nodes.yaml").read_text())
    gpus = {g["index"]: g for n in nodes_yaml["nodes"] if n["id"] == "apply-a" for g in n["gpus"]}
    assert gpus[0]["health"] == "unhealthy" and gpus[0]["health_reason"].startswith("Xid 79 at ")
    assert gpus[2]["health"] == "ok" and "health_reason" not in gpus[2]


def test_a_ready_replica_whose_gpu_goes_bad_is_moved_to_a_healthy_one(fleet, pool, catalog_dir, tmp_path):
    records = tmp_path / "engines"
    records.mkdir()
    write_model(catalog_dir, "one", records, "m", 1)
    first = apply_once(catalog_dir, pool)
    assert first.replicas["one-0"].phase == "Ready", first.replicas["one-0"].message
    assert visible_devices(fleet, "mover", records) == [[0]]
    fleet.set_hardware("mover", faults={0: "xid79"})
    try:
        # A fresh pool: an open probe session reads the kernel log again only every HEALTH_RECHECK_S.
        with TransportPool() as fresh:
            second = apply_once(catalog_dir, fresh, history=first.memory)
        assert any("gpu 0 of mover is unhealthy: Xid 79" in d.reason for d in second.decisions), \
            [str(d) for d in second.decisions]
        state = second.replicas["one-0"]
        assert state.phase == "Ready", state.message
        assert [a.gpus for a in state.nodes] == [(1,)]
        assert visible_devices(fleet, "mover", records)[-1] == [1]
    finally:
        fleet.set_hardware("mover", faults={})


# --------------------------------------------------------------------------
# The crash-loop breaker
# --------------------------------------------------------------------------

FAKE_VLLM = Path(__file__).resolve().parent / "fakes" / "bin" / "vllm"
# An engine that dies at start on one GPU only, as on a GPU whose memory is bad.
DIES_ON_GPU = """#!/bin/sh
case "$CUDA_VISIBLE_DEVICES" in
  *{uuid}*) echo "CUDA error: uncorrectable ECC error encountered" >&2; exit 1 ;;
esac
exec {fake} "$@"
"""


def test_three_failed_starts_on_one_gpu_quarantine_it_and_the_replica_is_ready_elsewhere(fleet, pool, tmp_path):
    if "looper" not in fleet.nodes:
        fleet.add_node("looper", gpus=["H100"] * 2, engines=["vllm"], labels={"role": "loop"})
    uuid0 = fleet.node("looper").hardware["gpus"][0]["uuid"]
    (fleet.node("looper").dir / "engines" / "vllm").unlink()
    (fleet.node("looper").dir / "engines" / "vllm").write_text(DIES_ON_GPU.format(uuid=uuid0, fake=FAKE_VLLM))
    (fleet.node("looper").dir / "engines" / "vllm").chmod(0o755)
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root, ["looper"])
    (root / "fleet.yaml").write_text("gpu_quarantine_s: 1000000\n" + (root / "fleet.yaml").read_text())
    records = tmp_path / "engines"
    records.mkdir()
    write_model(root, "loop", records, "loop", 1)
    try:
        memory, now = None, time.time()
        for attempt in range(1, 4):
            result = run_pass(load_catalog(root, with_revision=False), transports=pool, history=memory, ready_wait_s=20,
                              now=now)
            state = result.replicas["loop-0"]
            assert state.phase == "Failed", (attempt, state.phase, state.message)
            assert [a.gpus for a in state.nodes] == [(0,)], attempt
            memory, now = result.memory, now + 4000  # past any backoff
        assert list(memory.quarantines) == [("looper", 0)]
        nodes_yaml = yaml.safe_load((root / "status" / "nodes.yaml").read_text())
        (looper,) = [n for n in nodes_yaml["nodes"] if n["id"] == "looper"]
        assert looper["gpus"][0]["quarantined"]["reason"].startswith("3 failed starts in a row of loop-0")
        assert "quarantined" not in looper["gpus"][1]
        assert "quarantined" not in (root / "fleet.yaml").read_text()  # observed state, never the catalog's
        result = run_pass(load_catalog(root, with_revision=False), transports=pool, history=memory, ready_wait_s=20, now=now)
        state = result.replicas["loop-0"]
        assert state.phase == "Ready", state.message
        assert [a.gpus for a in state.nodes] == [(1,)]
    finally:
        cat = load_catalog(root, with_revision=False)
        launcher = SshLauncher.for_fleet(cat.fleet, {n.id: pool.transport_for(n) for n in cat.fleet.nodes}, stop_grace_s=2)
        for rank in launcher.ranks("looper"):
            launcher.stop("looper", rank.replica)


def test_reconciler_nodes_shows_a_character_per_gpu_and_each_bad_ones_reason(fleet, tmp_path):
    from tests.conftest import run_cli

    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root, ["apply-a"])
    r = run_cli("nodes", str(root))
    assert r.returncode == 0, r.stderr
    assert "4x H100-80GB (2 free) xx.." in r.stdout
    assert "apply-a gpu0 x Xid 79 at " in r.stdout and "apply-a gpu1 x 2 uncorrected ECC errors" in r.stdout
