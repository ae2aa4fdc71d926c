"""Placement and plan with GPU health (SPEC section 9): only healthy, uncordoned, unquarantined GPUs
whose memory is not held by nobody are free; the rejection says which GPU and why; a replica on a
GPU that turns bad moves. Plus the fleet.yaml side: cordon_gpus and gpu_quarantine_s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.catalog import load_catalog
from reconciler.observe.inventory import inventory_from_document, inventory_to_document
from reconciler.model import Quarantine, RejectKind, spec_hash
from reconciler.decide.placement import place
from reconciler.decide.plan import plan
from reconciler.observe.probe import observed_from_report
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank
from tests.catalog_files import FLEET, MODEL, problems_of, write_catalog

XID79 = "Xid 79 at 2026-11-30T10:02:11Z: GPU has fallen off the bus"


def broken(gs, index, health="unhealthy", reason=XID79, **kw):
    gs = list(gs)
    gs[index] = replace(gs[index], health=health, health_reason=reason, **kw)
    return tuple(gs)


def rejections(res, rid):
    return res.outcomes[rid].rejections


def test_an_unhealthy_gpu_is_not_free_and_the_rejection_names_it():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=broken(gpus(8), 3)))
    res = place([model("m", profile(gpus_per_node=8))], f, inv)
    assert res.outcomes["m-0"].placement is None
    (rej,) = rejections(res, "m-0")
    assert rej.kind == RejectKind.GPU_UNHEALTHY
    assert rej.reason == f"has 7 free healthy H100-80GB GPUs (gpu3: {XID79}), needs 8"


def test_a_node_short_of_gpus_anyway_is_rejected_for_gpus_not_for_the_bad_one():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=broken(gpus(4), 0)))
    (rej,) = rejections(place([model("m", profile(gpus_per_node=8))], f, inv), "m-0")
    assert rej.kind == RejectKind.GPUS
    assert "gpu0: Xid 79" in rej.reason


def test_a_healthy_node_still_says_what_it_always_said():
    f = fleet(node_spec("a"))
    (rej,) = rejections(place([model("m", profile(gpus_per_node=8))], f, inventory(observed("a", gpu=gpus(4)))), "m-0")
    assert rej.reason == "has 4 free H100-80GB GPUs, needs 8"


@pytest.mark.parametrize(
    "change, said",
    [
        (dict(health="lost", health_reason="GPU 0000:3b:00 is in /proc/driver/nvidia/gpus but the driver does not list it"),
         "gpu1: GPU 0000:3b:00 is in /proc/driver/nvidia/gpus"),
        (dict(health="unhealthy", health_reason="2 uncorrected ECC errors"), "gpu1: 2 uncorrected ECC errors"),
        (dict(quarantined=Quarantine("3 failed starts in a row of m-0", 2e9)), "gpu1: quarantined: 3 failed starts"),
        (dict(memory_used_mb=71200), "gpu1: 71200 MiB used by no process"),
    ],
)
def test_every_kind_of_bad_gpu_is_left_out_and_named(change, said):
    gs = list(gpus(2))
    gs[1] = replace(gs[1], **change)
    f = fleet(node_spec("a"))
    res = place([model("m", profile(gpus_per_node=2))], f, inventory(observed("a", gpu=tuple(gs))))
    (rej,) = rejections(res, "m-0")
    assert rej.kind == RejectKind.GPU_UNHEALTHY and said in rej.reason


def test_one_gpu_of_a_node_goes_to_the_healthy_ones():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=broken(gpus(4), 0)))
    res = place([model("m", profile(gpus_per_node=2))], f, inv)
    assert res.outcomes["m-0"].placement.nodes[0].gpus == (1, 2)


def test_memory_under_the_threshold_with_no_process_is_still_free():
    gs = (replace(gpus(1)[0], memory_used_mb=900),)  # the driver's own context: under 1 GiB and under 5%
    res = place([model("m", profile(gpus_per_node=1))], fleet(node_spec("a")), inventory(observed("a", gpu=gs)))
    assert res.outcomes["m-0"].placement is not None


def test_memory_held_by_this_catalogs_own_running_rank_is_not_a_leak():
    P = profile(gpus_per_node=1)
    m = model("m", P, replicas=1)
    gs = (replace(gpus(1)[0], memory_used_mb=70000),)
    inv = inventory(observed("a", gpu=gs, replicas=[rank("m-0", "m", "p", gpus=(0,), spec_hash=spec_hash(m, P))]))
    p = plan(catalog(fleet(node_spec("a")), m), inv)
    assert p.actions == ()  # kept where it runs, not moved off its own memory


def test_cordoned_gpus_of_fleet_yaml_are_never_handed_out():
    f = fleet(replace(node_spec("a"), cordon_gpus=(0, 1)))
    res = place([model("m", profile(gpus_per_node=2))], f, inventory(observed("a", gpu=gpus(4))))
    assert res.outcomes["m-0"].placement.nodes[0].gpus == (2, 3)
    res = place([model("m", profile(gpus_per_node=3))], f, inventory(observed("a", gpu=gpus(4))))
    (rej,) = rejections(res, "m-0")
    assert "gpu0: cordoned in fleet.yaml; gpu1: cordoned in fleet.yaml" in rej.reason


def test_a_bad_gpu_released_by_its_replica_does_not_become_free():
    # The replica on bad GPU 0 is replaced; its GPUs are released, and GPU 0 must not come back free.
    P = profile(gpus_per_node=2)
    m = model("m", P, replicas=1)
    gs = broken(gpus(2), 0)
    inv = inventory(observed("a", gpu=gs, replicas=[rank("m-0", "m", "p", gpus=(0, 1), spec_hash=spec_hash(m, P))]),
                    observed("b", gpu=gpus(1)))
    p = plan(catalog(fleet(node_spec("a"), node_spec("b")), m), inv)
    assert all(0 not in a.gpus or a.node != "a" for act in p.actions if act.placement for a in act.placement.nodes
               if act.action != "stop")


def test_a_ready_replica_on_a_gpu_that_turns_unhealthy_is_replaced_elsewhere():
    P = profile(gpus_per_node=4)
    m = model("m", P, replicas=1)
    H = spec_hash(m, P)
    inv = inventory(observed("a", gpu=broken(gpus(4), 2), replicas=[rank("m-0", "m", "p", gpus=(0, 1, 2, 3), spec_hash=H)]),
                    observed("b", gpu=gpus(4)))
    p = plan(catalog(fleet(node_spec("a"), node_spec("b")), m), inv)
    (a,) = p.actions
    assert a.action == "replace"
    assert a.reason == f"gpu 2 of a is unhealthy: {XID79}"
    assert a.placement.nodes[0].node == "b"


def test_a_replica_on_a_lost_gpu_is_replaced_too():
    P = profile(gpus_per_node=1)
    m = model("m", P, replicas=1)
    gs = broken(gpus(2), 0, health="lost", reason="GPU 0000:3b:00 is in /proc/driver/nvidia/gpus but the driver does not list it")
    inv = inventory(observed("a", gpu=gs, replicas=[rank("m-0", "m", "p", gpus=(0,), spec_hash=spec_hash(m, P))]))
    p = plan(catalog(fleet(node_spec("a")), m), inv)
    (a,) = p.actions
    assert a.action == "replace" and "gpu 0 of a is lost" in a.reason
    assert a.placement.nodes[0].gpus == (1,)


def test_a_replica_on_a_cordoned_gpu_stays_as_on_a_cordoned_node():
    P = profile(gpus_per_node=1)
    m = model("m", P, replicas=1)
    inv = inventory(observed("a", gpu=gpus(2), replicas=[rank("m-0", "m", "p", gpus=(0,), spec_hash=spec_hash(m, P))]))
    assert plan(catalog(fleet(replace(node_spec("a"), cordon_gpus=(0,))), m), inv).actions == ()


# --------------------------------------------------------------------------
# The snapshot: health fields round-trip, and the probe's report becomes them
# --------------------------------------------------------------------------


def test_health_fields_round_trip_through_the_snapshot_document():
    gs = broken(gpus(2), 1)
    gs = (replace(gs[0], quarantined=Quarantine("3 failed starts in a row of m-0", 1_800_000_000.0, "GPU-0")), gs[1])
    node = replace(observed("a", gpu=gs), health_checks={"ecc": "ok", "remap": "ok", "xid": "unreadable"})
    doc = inventory_to_document(inventory(node))
    g0, g1 = doc["nodes"][0]["gpus"]
    assert g0["quarantined"] == {"reason": "3 failed starts in a row of m-0", "until": "2027-01-15T08:00:00Z", "uuid": "GPU-0"}
    assert g1["health"] == "unhealthy" and g1["health_reason"] == XID79
    assert doc["nodes"][0]["health_checks"] == {"ecc": "ok", "remap": "ok", "xid": "unreadable"}
    back = inventory_from_document(doc).node("a")
    assert back.gpus == node.gpus and back.health_checks == node.health_checks


def test_a_snapshot_without_health_fields_reads_as_healthy():
    inv = inventory_from_document({"nodes": [{"id": "a", "gpus": [{"index": 0, "uuid": "GPU-0"}]}]})
    assert inv.node("a").gpus[0].healthy and inv.node("a").health_checks is None


REPORT_GPU = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}


@pytest.mark.parametrize(
    "said, health, reason",
    [
        ({"health": "ok"}, "ok", ""),
        ({"health": "unhealthy", "health_reason": "2 uncorrected ECC errors"}, "unhealthy", "2 uncorrected ECC errors"),
        ({"health": "lost"}, "lost", "the probe reported it lost"),
        ({"health": "fine, trust me"}, "unhealthy", "the probe reported health 'fine, trust me'"),
        ({"health": ["ok"]}, "unhealthy", "the probe reported health \"['ok']\""),
        ({"health": "unhealthy", "health_reason": "bad\x1b[31m\nline"}, "unhealthy", "bad?[31m?line"),
    ],
)
def test_the_probes_verdict_is_read_and_garble_is_never_healthy(said, health, reason):
    node, _ = observed_from_report(node_spec("a"), {"gpus": [REPORT_GPU | said]})
    assert (node.gpus[0].health, node.gpus[0].health_reason) == (health, reason)


def test_garbled_health_checks_are_unreadable_not_ok():
    node, _ = observed_from_report(node_spec("a"), {"gpus": [REPORT_GPU], "health_checks": {"ecc": "ok", "xid": "perfect"}})
    assert dict(node.health_checks) == {"ecc": "ok", "remap": "unreadable", "xid": "unreadable"}


def test_a_cordoned_gpu_is_reported_so():
    node, _ = observed_from_report(replace(node_spec("a"), cordon_gpus=(0,)), {"gpus": [REPORT_GPU]})
    assert node.gpus[0].health_reason == "cordoned in fleet.yaml" and node.gpus[0].health == "ok"


def test_a_lost_gpu_takes_the_name_of_its_siblings():
    lost = {"index": 1, "uuid": "", "name": "", "memory_total_mb": 0, "health": "lost", "health_reason": "gone"}
    node, _ = observed_from_report(node_spec("a"), {"gpus": [REPORT_GPU, lost]})
    assert node.gpus[1].gpu_class == "H100-80GB" and node.gpus[1].health == "lost"


# --------------------------------------------------------------------------
# fleet.yaml: cordon_gpus and gpu_quarantine_s
# --------------------------------------------------------------------------


def test_cordon_gpus_and_the_quarantine_time_load_from_fleet_yaml(tmp_path):
    text = FLEET.replace("    model_dirs: [/models]\n    fabrics", "    model_dirs: [/models]\n    cordon_gpus: [3, 1]\n    fabrics", 1)
    cat = load_catalog(write_catalog(tmp_path, {"fleet.yaml": "gpu_quarantine_s: 600\n" + text, "models/llama.yaml": MODEL}))
    assert cat.fleet.node("gpu-1").cordon_gpus == (1, 3)
    assert cat.fleet.node("gpu-2").cordon_gpus == ()
    assert cat.fleet.gpu_quarantine_s == 600


def test_the_quarantine_time_defaults_to_an_hour(tmp_path):
    cat = load_catalog(write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": MODEL}))
    assert cat.fleet.gpu_quarantine_s == 3600


@pytest.mark.parametrize("value, col, said", [("[three]", 19, "expected an integer"), ("[1, -1]", 22, "must be at least 0"),
                                               ("3", 18, "expected a list")])
def test_a_cordon_gpus_entry_that_is_not_a_gpu_index_is_an_error_at_its_line(tmp_path, value, col, said):
    text = FLEET.replace("    model_dirs: [/models]\n    fabrics", f"    model_dirs: [/models]\n    cordon_gpus: {value}\n    fabrics", 1)
    problems = problems_of(write_catalog(tmp_path, {"fleet.yaml": text, "models/llama.yaml": MODEL}))
    assert any(p.startswith(f"fleet.yaml:8:{col}") and said in p for p in problems), problems


# --------------------------------------------------------------------------
# plan --inventory of a snapshot with bad GPUs: no SSH, the reason in the rejection
# --------------------------------------------------------------------------


@pytest.mark.process
def test_plan_of_a_snapshot_with_bad_gpus_rejects_with_the_reason(cli, tmp_path):
    import json as _json
    import shutil

    import yaml

    from tests.conftest import REPO, copy_tracked

    root = tmp_path / "catalog"
    copy_tracked(REPO / "catalog", root)
    shutil.copytree(REPO / "schema", tmp_path / "schema")
    doc = yaml.safe_load((REPO / "catalog" / "status" / "nodes.yaml").read_text())
    for n in doc["nodes"]:
        if n["id"] in ("h100-a1", "h100-a3"):
            n["gpus"][3] |= {"health": "unhealthy", "health_reason": XID79}
            n["health_checks"] = {"ecc": "ok", "remap": "ok", "xid": "ok"}
    snapshot = tmp_path / "nodes.yaml"
    snapshot.write_text(yaml.safe_dump(doc))
    r = cli("plan", str(root), "--inventory", str(snapshot), "--format", "json")
    assert r.returncode == 0, r.stderr
    plan_doc = _json.loads(r.stdout)
    # The 8-GPU replica that would have gone to h100-a1 goes to the A100 fallback instead.
    start = next(a for a in plan_doc["actions"] if a["replica"] == "llama-3-70b-1")
    assert {n["node"] for n in start["nodes"]}.isdisjoint({"h100-a1", "h100-a3"})
    (unplaced,) = plan_doc["unplaced"]
    assert {"profile": "h100-2x8", "pool": "ib-pod1/H100-80GB", "node": "h100-a1",
            "reason": f"has 7 free healthy H100-80GB GPUs (gpu3: {XID79}), needs 8"} in unplaced["rejections"]
    text = cli("explain", "deepseek-v3", str(root), "--inventory", str(snapshot))
    assert text.returncode == 0, text.stderr
    assert f"1 has too few free healthy H100-80GB GPUs (h100-a1: 7 free, needs 8 (gpu3: {XID79}))" in text.stdout


# --------------------------------------------------------------------------
# The crash-loop breaker (memory.py): pure
# --------------------------------------------------------------------------

from reconciler.record.memory import (  # noqa: E402
    CRASH_LOOP_STARTS,
    GpuStrikes,
    PassMemory,
    crash_loops_after,
    with_quarantines,
)
from reconciler.record.memory_document import memory_from_document, memory_to_document  # noqa: E402
from reconciler.model import Assignment  # noqa: E402
from reconciler.decide.outcomes import ReplicaState  # noqa: E402


def failed_on(gpus_, node="a", message="exit 1: CUDA error: uncorrectable ECC error encountered", failure="temporary"):
    return ReplicaState("m-0", "m", "p", "Failed", message, nodes=(Assignment(node, 0, tuple(gpus_)),), failure=failure)


def strike(strikes, quarantines, state, now=1000.0, inv=None):
    inv = inv or inventory(observed("a", gpu=gpus(4)))
    return crash_loops_after(strikes, quarantines, inv, {"m-0": state}, now, 3600)


def test_three_failed_starts_on_the_same_gpus_quarantine_them():
    strikes, quarantines = {}, {}
    for n in range(1, CRASH_LOOP_STARTS):
        strikes, quarantines = strike(strikes, quarantines, failed_on((0, 1)))
        assert strikes["m-0"].count == n and quarantines == {}
    strikes, quarantines = strike(strikes, quarantines, failed_on((0, 1)))
    assert strikes == {}
    assert sorted(quarantines) == [("a", 0), ("a", 1)]
    q = quarantines[("a", 0)]
    assert q.until == 1000.0 + 3600 and q.uuid == "GPU-0"
    assert q.reason == "3 failed starts in a row of m-0: exit 1: CUDA error: uncorrectable ECC error encountered"


def test_a_failure_elsewhere_starts_the_count_again():
    strikes, q = strike({"m-0": GpuStrikes((("a", (0, 1)),), 2)}, {}, failed_on((2, 3)))
    assert strikes["m-0"].count == 1 and q == {}


def test_ready_forgets_the_strikes():
    ready = ReplicaState("m-0", "m", "p", "Ready", nodes=(Assignment("a", 0, (0, 1)),))
    strikes, _ = strike({"m-0": GpuStrikes((("a", (0, 1)),), 2)}, {}, ready)
    assert strikes == {}


def test_a_permanent_failure_is_not_the_gpus_doing():
    strikes, _ = strike({}, {}, failed_on((0,), message="vllm is not installed", failure="permanent"))
    assert strikes == {}


def test_a_quarantine_expires_and_clears_when_the_gpu_shows_a_new_uuid():
    q = {("a", 0): Quarantine("3 failed starts", 5000.0, "GPU-0"), ("a", 1): Quarantine("3 failed starts", 5000.0, "GPU-old")}
    inv = inventory(observed("a", gpu=gpus(4)))
    _, kept = crash_loops_after({}, q, inv, {}, 1000.0, 3600)
    assert list(kept) == [("a", 0)]  # GPU 1 now shows uuid GPU-1: a reset or a new card
    _, kept = crash_loops_after({}, q, inv, {}, 5000.0, 3600)
    assert kept == {}


def test_a_node_that_did_not_answer_keeps_its_quarantines():
    q = {("a", 0): Quarantine("3 failed starts", 5000.0, "GPU-0")}
    _, kept = crash_loops_after({}, q, inventory(observed("a", state="unreachable")), {}, 1000.0, 3600)
    assert kept == q


def test_quarantined_gpus_are_marked_and_placement_leaves_them_out():
    q = {("a", 0): Quarantine("3 failed starts in a row of m-0", 5000.0, "GPU-0")}
    inv = with_quarantines(inventory(observed("a", gpu=gpus(2))), q, 1000.0)
    assert inv.node("a").gpus[0].quarantined == q[("a", 0)] and inv.node("a").gpus[1].quarantined is None
    res = place([model("m", profile(gpus_per_node=1))], fleet(node_spec("a")), inv)
    assert res.outcomes["m-0"].placement.nodes[0].gpus == (1,)
    assert with_quarantines(inventory(observed("a", gpu=gpus(2))), q, 6000.0).node("a").gpus[0].quarantined is None


def test_a_crashed_replica_on_quarantined_gpus_is_placed_elsewhere_not_restarted_there():
    P = profile(gpus_per_node=1)
    m = model("m", P, replicas=1)
    q = {("a", 0): Quarantine("3 failed starts in a row of m-0", 5000.0, "GPU-0")}
    inv = inventory(observed("a", gpu=gpus(2), replicas=[rank("m-0", "m", "p", gpus=(0,), spec_hash=spec_hash(m, P), alive=False)]))
    p = plan(catalog(fleet(node_spec("a")), m), with_quarantines(inv, q, 1000.0), now=1000.0)
    (a,) = p.actions
    assert a.action == "replace" and "quarantined" in a.reason
    assert a.placement.nodes[0].gpus == (1,)


def test_strikes_and_quarantines_survive_the_memory_file():
    memory = PassMemory(gpu_strikes={"m-0": GpuStrikes((("a", (0, 1)),), 2, "exit 1")},
                        quarantines={("a", 3): Quarantine("3 failed starts", 5000.0, "GPU-3")})
    back = memory_from_document(memory_to_document(memory))
    assert back.gpu_strikes == memory.gpu_strikes and back.quarantines == memory.quarantines


# --------------------------------------------------------------------------
# reconciler nodes: one character per GPU, and each bad GPU's reason
# --------------------------------------------------------------------------

from reconciler.commands.nodes import bad_gpu_lines, gpu_chars, gpu_summary  # noqa: E402
from reconciler.model import GpuProcess  # noqa: E402


def test_one_character_per_gpu_says_how_each_is():
    gs = list(gpus(8))
    gs[1] = replace(gs[1], processes=(GpuProcess(4242, "python", 1000),))
    gs[2] = replace(gs[2], health="unhealthy", health_reason=XID79)
    gs[3] = replace(gs[3], health="lost", health_reason="gone from the driver")
    gs[4] = replace(gs[4], quarantined=Quarantine("3 failed starts in a row of m-0", 2e9))
    gs[6] = replace(gs[6], memory_used_mb=71200)
    node = observed("a", gpu=gs, replicas=[rank("m-1", "m", "p", gpus=(7,))])
    assert gpu_chars(node, frozenset({5})) == ".fxxqcf#"
    assert gpu_summary(node, frozenset({5})) == "8x H100-80GB (1 free) .fxxqcf#"
    assert bad_gpu_lines(node, frozenset({5})) == [
        f"a gpu2 x {XID79}",
        "a gpu3 x gone from the driver",
        "a gpu4 q quarantined: 3 failed starts in a row of m-0",
        "a gpu5 c cordoned in fleet.yaml",
        "a gpu6 f 71200 MiB used by no process",
    ]


def test_allocated_mb_is_what_our_ranks_reserved_beside_what_the_driver_reports():
    gs = (replace(gpus(2)[0], memory_used_mb=70000), replace(gpus(2)[1], memory_used_mb=71200))
    node = observed("a", gpu=gs, replicas=[rank("m-0", "m", "p", gpus=(0,))])
    g0, g1 = inventory_to_document(inventory(node))["nodes"][0]["gpus"]
    assert (g0["allocated_mb"], g0["memory_used_mb"]) == (81559, 70000)
    assert (g1["allocated_mb"], g1["memory_used_mb"]) == (0, 71200)  # used by nobody


def test_a_snapshots_own_quarantine_mark_holds_until_it_expires():
    gs = (replace(gpus(1)[0], quarantined=Quarantine("3 failed starts", 5000.0, "GPU-0")),)
    inv = inventory(observed("a", gpu=gs))
    assert with_quarantines(inv, {}, 1000.0).node("a").gpus[0].quarantined is not None
    assert with_quarantines(inv, {}, 6000.0).node("a").gpus[0].quarantined is None
