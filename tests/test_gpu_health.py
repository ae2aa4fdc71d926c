"""GPU health's pure parts (SPEC section 9), on recorded outputs: nvidia-smi's health fields and
remapped rows, per-GPU driver errors, kernel-log Xid lines, NVML's answers, and the judgement."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.observe.probe.health import (
    FATAL_XIDS,
    NvmlFailed,
    assess,
    health_from_nvml,
    judge_gpu,
    lost_gpus,
    parse_boot_time,
    parse_remapped_rows_csv,
    parse_xid_lines,
)
from reconciler.observe.probe.parse import ParseError, device_error_line, parse_gpu_csv, pci_bus_key
from reconciler.vocabulary import CheckResult, GpuHealth

DATA = Path(__file__).parent / "data" / "probe" / "health"
BOOT = 1_764_000_000  # 2025-11-24T16:00:00Z


def recorded(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------
# Bus ids: every tool spells them its own way
# --------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["00000000:3B:00.0", "0000:3b:00.0", "PCI:0000:3b:00", "0000:3B:00", "3b:00.0"])
def test_every_spelling_of_a_bus_id_is_one_key(spelling):
    assert pci_bus_key(spelling) == "0000:3b:00"


def test_a_bus_id_of_another_domain_is_another_key():
    assert pci_bus_key("00000001:3B:00.0") != pci_bus_key("00000000:3B:00.0")


@pytest.mark.parametrize("text", ["", "GPU-abc", "zz:yy:xx", "1:2:3:4"])
def test_what_is_not_a_bus_id_is_a_parse_error(text):
    with pytest.raises(ParseError):
        pci_bus_key(text)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error", ("0000:3b:00", "Unknown Error")),
        ("Unable to determine the device handle for GPU0000:65:00.0: Unknown Error", ("0000:65:00", "Unknown Error")),
        ("Unable to determine the device handle for GPU 0000:AB:00.0: GPU is lost.  Reboot the system to recover this GPU",
         ("0000:ab:00", "GPU is lost")),
        ("0, GPU-1, NVIDIA H100 80GB HBM3, 81559, 0, 00000000:18:00.0, 0, [N/A]", None),
        ("No devices were found", None),
    ],
)
def test_a_line_naming_a_gpu_the_driver_cannot_answer_for(line, expected):
    assert device_error_line(line) == expected


# --------------------------------------------------------------------------
# nvidia-smi --query-gpu with the health fields
# --------------------------------------------------------------------------


def test_healthy_h100s_read_their_bus_ids_and_zero_ecc_errors():
    gpus = parse_gpu_csv(recorded("query-gpu.h100-healthy.csv"))
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["bus_id"] for g in gpus] == ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00"]
    assert all(g["ecc_uncorrected"] == 0 and g["retired_pending"] is None and "error" not in g for g in gpus)


def test_broken_gpus_each_keep_their_place_and_say_why():
    gpus = {g["index"]: g for g in parse_gpu_csv(recorded("query-gpu.h100-broken.csv"))}
    assert sorted(gpus) == [0, 1, 2, 3, 4, 5]
    assert gpus[1]["ecc_uncorrected"] == 2
    assert gpus[2]["error"] == "Unknown Error" and gpus[2]["bus_id"] == "0000:3a:00"
    assert gpus[3]["error"] == "memory.total reads [GPU requires reset]"
    assert gpus[4]["error"] == "ecc.errors.uncorrected.volatile.total reads ERR!"
    assert gpus[4]["memory_used_mb"] == 71200
    assert gpus[5]["error"] == "GPU is lost" and gpus[5]["bus_id"] == "0000:ab:00"


def test_the_older_five_field_query_still_reads_without_health_fields():
    gpus = parse_gpu_csv("0, GPU-1, NVIDIA H100 80GB HBM3, 81559, 0\n")
    assert gpus[0]["memory_total_mb"] == 81559 and "bus_id" not in gpus[0]


def test_a_line_of_six_fields_is_neither_query_and_is_refused():
    with pytest.raises(ParseError, match="expected 8"):
        parse_gpu_csv("0, GPU-1, NVIDIA H100 80GB HBM3, 81559, 0, 00000000:18:00.0\n")


def test_retired_pages_pending_reads_yes_and_no():
    gpus = parse_gpu_csv(recorded("query-gpu.v100-retired-pending.csv"))
    assert [g["retired_pending"] for g in gpus] == [False, True]


def test_a_consumer_gpu_without_ecc_reads_none_not_zero():
    (gpu,) = parse_gpu_csv(recorded("query-gpu.rtx4090-no-ecc.csv"))
    assert gpu["ecc_uncorrected"] is None


# --------------------------------------------------------------------------
# --query-remapped-rows
# --------------------------------------------------------------------------


def test_remapped_rows_pending_and_failed_by_bus_id():
    rows = parse_remapped_rows_csv(recorded("remapped-rows.a100.csv"))
    assert rows["0000:18:00"] == {"pending": False, "failure": False}
    assert rows["0000:2a:00"]["pending"] is True
    assert rows["0000:3a:00"]["failure"] is True


def test_remapped_rows_on_a_gpu_before_ampere_are_unknown_not_clean():
    rows = parse_remapped_rows_csv(recorded("remapped-rows.v100.csv"))
    assert all(r == {"pending": None, "failure": None} for r in rows.values())


def test_remapped_rows_of_a_gpu_the_driver_cannot_answer_for_carry_the_error():
    rows = parse_remapped_rows_csv(recorded("remapped-rows.one-lost.csv"))
    assert rows["0000:2a:00"]["error"] == "Unknown Error"
    assert rows["0000:3a:00"]["error"] == "remapped_rows.pending reads [GPU requires reset]"


@pytest.mark.parametrize("text", ["00000000:18:00.0, 0\n", "garbage, 1, 2\n", "00000000:18:00.0, maybe, 0\n"])
def test_garbled_remapped_rows_are_a_parse_error(text):
    with pytest.raises(ParseError):
        parse_remapped_rows_csv(text)


def test_no_devices_is_no_rows():
    assert parse_remapped_rows_csv("No devices were found\n") == {}


# --------------------------------------------------------------------------
# Kernel log: Xid lines
# --------------------------------------------------------------------------


def test_xid_lines_since_boot_are_matched_by_bus_and_given_a_utc_time():
    events = parse_xid_lines(recorded("dmesg.since-boot.txt"), BOOT)
    assert [(e["bus"], e["xid"]) for e in events] == [("0000:2a:00", 13), ("0000:3a:00", 79), ("0000:af:00", 48)]
    fell = events[1]
    assert fell["message"] == "GPU has fallen off the bus"
    assert fell["time"] == "2026-02-11T03:49:01Z"


def test_an_nvswitch_sxid_is_not_a_gpu_xid():
    events = parse_xid_lines(recorded("dmesg.since-boot.txt"), BOOT)
    assert all(e["xid"] != 20034 for e in events)


def test_without_a_boot_time_a_since_boot_stamp_has_no_time():
    events = parse_xid_lines(recorded("dmesg.since-boot.txt"))
    assert events[1]["time"] is None


@pytest.mark.parametrize(
    "name, expected",
    [
        ("dmesg.ctime.txt", [("0000:cb:00", 13, "Fri Aug 30 11:43:09 2024"), ("0000:cb:00", 94, "Fri Aug 30 11:43:10 2024")]),
        ("dmesg.no-timestamps.txt", [("0000:18:00", 79, None)]),
        ("dmesg.iso.txt", [("0000:18:00", 79, "2026-11-30T10:02:11Z"), ("0000:2a:00", 31, "2026-11-30T10:05:00+01:00")]),
    ],
)
def test_xid_lines_in_every_timestamp_format(name, expected):
    assert [(e["bus"], e["xid"], e["time"]) for e in parse_xid_lines(recorded(name), BOOT)] == expected


def test_a_log_without_xids_is_none_and_costs_no_line_scan():
    assert parse_xid_lines("[    0.000000] Linux version 6.1\n" * 1000) == []


def test_megabytes_of_kernel_log_are_parsed_to_the_xids_they_hold():
    text = "[  1.0] usb 1-1: new high-speed USB device\n" * 100_000 + recorded("dmesg.no-timestamps.txt")
    assert [(e["xid"]) for e in parse_xid_lines(text)] == [79]


def test_boot_time_from_proc_stat():
    assert parse_boot_time("cpu  1 2 3\nbtime 1764000000\nprocesses 5\n") == BOOT
    assert parse_boot_time("cpu 1 2 3\n") is None


# --------------------------------------------------------------------------
# The judgement
# --------------------------------------------------------------------------

ALL_RAN = {"ecc": "ok", "remap": "ok", "xid": "ok"}


def _xid(n, bus="0000:18:00", time="2026-11-30T10:02:11Z", message="GPU has fallen off the bus"):
    return {"bus": bus, "xid": n, "message": message, "time": time}


@pytest.mark.parametrize(
    "gpu, remap, xids, health, reason",
    [
        ({"ecc_uncorrected": 0}, {"pending": False, "failure": False}, [], "ok", ""),
        ({"ecc_uncorrected": 2}, None, [], "unhealthy", "2 uncorrected ECC errors"),
        ({"ecc_uncorrected": 1}, None, [], "unhealthy", "1 uncorrected ECC error"),
        ({}, {"pending": True, "failure": False}, [], "unhealthy", "row remap pending"),
        ({}, {"pending": True, "failure": True}, [], "unhealthy", "row remap failed"),
        ({"retired_pending": True}, None, [], "unhealthy", "page retirement pending"),
        ({}, None, [_xid(79)], "unhealthy", "Xid 79 at 2026-11-30T10:02:11Z: GPU has fallen off the bus"),
        ({}, None, [_xid(13, message="Graphics SM Warp Exception")], "ok", ""),
        ({"error": "Unknown Error"}, None, [], "unhealthy", "the driver cannot answer for it: Unknown Error"),
        ({"lost": True}, None, [], "lost", "listed in /proc/driver/nvidia/gpus but not by the driver"),
    ],
)
def test_each_fact_makes_its_verdict(gpu, remap, xids, health, reason):
    assert judge_gpu(gpu, remap, xids, ALL_RAN) == (health, reason)


@pytest.mark.parametrize("xid", sorted(FATAL_XIDS))
def test_every_fatal_xid_makes_the_gpu_unhealthy(xid):
    assert judge_gpu({}, None, [_xid(xid, time=None, message="m")], ALL_RAN) == ("unhealthy", f"Xid {xid}: m")


def test_the_newest_fatal_xid_is_the_one_named():
    health, reason = judge_gpu({}, None, [_xid(48, message="DBE"), _xid(13), _xid(79)], ALL_RAN)
    assert reason.startswith("Xid 79")


def test_several_causes_are_said_in_one_line_worst_first():
    _, reason = judge_gpu({"ecc_uncorrected": 3}, {"pending": True, "failure": False}, [_xid(79)], ALL_RAN)
    assert reason == "Xid 79 at 2026-11-30T10:02:11Z: GPU has fallen off the bus; 3 uncorrected ECC errors; row remap pending"
    assert "\n" not in reason


def test_the_verdicts_are_the_vocabularys_words():
    assert {GpuHealth(judge_gpu(g, None, [], ALL_RAN)[0]) for g in ({}, {"ecc_uncorrected": 1}, {"lost": True})} == set(GpuHealth)


def test_assess_reports_each_cause_of_the_recorded_broken_node():
    gpus = parse_gpu_csv(recorded("query-gpu.h100-broken.csv"))
    rows = parse_remapped_rows_csv(recorded("remapped-rows.a100.csv"))
    xids = parse_xid_lines(recorded("dmesg.since-boot.txt"), BOOT)
    out, checks, warnings = assess(gpus, rows, "ok", xids, "unreadable", proc_bus_ids=["0000:18:00.0", "0000:c1:00.0"])
    by_index = {g["index"]: g for g in out}
    assert checks == {"ecc": "ok", "remap": "ok", "xid": "ok"}
    assert by_index[0]["health"] == GpuHealth.OK and "health_reason" not in by_index[0]
    assert by_index[1]["health_reason"] == "2 uncorrected ECC errors; row remap pending"
    assert by_index[2]["health_reason"].startswith("the driver cannot answer for it: Unknown Error; Xid 79 at")
    assert "row remap failed" in by_index[2]["health_reason"]
    assert by_index[3]["health"] == GpuHealth.UNHEALTHY
    assert by_index[4]["health_reason"] == "the driver cannot answer for it: ecc.errors.uncorrected.volatile.total reads ERR!"
    assert by_index[5]["health"] == GpuHealth.UNHEALTHY
    lost = by_index[6]
    assert lost["health"] == GpuHealth.LOST and "0000:c1:00" in lost["health_reason"]
    # Xid 13 on GPU 1 is information, not a verdict; Xid 48 on a bus no GPU has is a warning.
    assert by_index[1]["xid_info"] == ["Xid 13 at 2025-11-24T18:16:51Z: Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"]
    assert any("0000:af:00" in w and "no GPU of this node has" in w for w in warnings)


def test_an_unreadable_kernel_log_is_reported_and_never_taken_as_clean():
    gpus = parse_gpu_csv(recorded("query-gpu.h100-healthy.csv"))
    out, checks, _ = assess(gpus, {}, "unsupported", None, CheckResult.UNREADABLE)
    assert checks["xid"] == CheckResult.UNREADABLE
    # Judged on the checks that ran: no Xid verdict is made up either way.
    assert all(g["health"] == "ok" for g in out)


def test_facts_of_a_check_that_did_not_run_are_not_read():
    checks = {"ecc": "unreadable", "remap": "ok", "xid": "ok"}
    assert judge_gpu({"ecc_uncorrected": 5}, None, [], checks) == ("ok", "")


def test_consumer_gpus_without_ecc_make_the_ecc_check_unsupported():
    _, checks, _ = assess(parse_gpu_csv(recorded("query-gpu.rtx4090-no-ecc.csv")), None, "unsupported", [], "ok")
    assert checks == {"ecc": "unsupported", "remap": "unsupported", "xid": "ok"}


def test_a_gpu_in_proc_that_the_driver_lists_is_not_lost():
    listed = parse_gpu_csv(recorded("query-gpu.h100-healthy.csv"))
    assert lost_gpus(listed, ["0000:18:00.0", "0000:2A:00.0"]) == []
    (lost,) = lost_gpus(listed, ["0000:18:00.0", "0000:77:00.0", "not-a-bus-id"])
    assert lost["index"] == 4 and lost["bus_id"] == "0000:77:00" and lost["lost"]


# --------------------------------------------------------------------------
# NVML: pynvml's answers
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers, facts, remap, checks",
    [
        ({"ecc": 0, "retired_pending": 0, "remapped_rows": (0, 0, 0, 0)},
         {"ecc_uncorrected": 0, "retired_pending": False}, {"pending": False, "failure": False}, {"ecc": "ok", "remap": "ok"}),
        ({"ecc": 4, "retired_pending": NvmlFailed(3), "remapped_rows": (12, 1, 1, 0)},
         {"ecc_uncorrected": 4, "retired_pending": None}, {"pending": True, "failure": False}, {"ecc": "ok", "remap": "ok"}),
        ({"ecc": NvmlFailed(3), "retired_pending": NvmlFailed(3), "remapped_rows": NvmlFailed(3)},
         {"ecc_uncorrected": None, "retired_pending": None}, None, {"ecc": "unsupported", "remap": "unsupported"}),
        ({"ecc": NvmlFailed(4), "retired_pending": NvmlFailed(4), "remapped_rows": NvmlFailed(4)},
         {"ecc_uncorrected": None, "retired_pending": None}, None, {"ecc": "unreadable", "remap": "unreadable"}),
        ({"ecc": NvmlFailed(15), "retired_pending": NvmlFailed(15), "remapped_rows": NvmlFailed(15)},
         {"ecc_uncorrected": None, "retired_pending": None, "error": "GPU is lost"}, None,
         {"ecc": "unsupported", "remap": "unsupported"}),
    ],
)
def test_nvml_answers_become_the_same_facts(answers, facts, remap, checks):
    assert health_from_nvml(answers) == (facts, remap, checks)


def test_a_gpu_nvml_calls_lost_is_unhealthy():
    facts, remap, checks = health_from_nvml({"ecc": NvmlFailed(15), "retired_pending": NvmlFailed(15),
                                             "remapped_rows": NvmlFailed(999)})
    assert judge_gpu(facts, remap, [], checks | {"xid": "ok"})[0] == GpuHealth.UNHEALTHY


# --------------------------------------------------------------------------
# The node side's bounded read of dmesg (one child process each, no fleet)
# --------------------------------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

from reconciler.observe.probe import script  # noqa: E402
from reconciler.observe.probe import gpus as probe_gpus  # noqa: E402


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


@pytest.mark.process
def test_a_kernel_log_of_megabytes_is_read_to_its_newest_bytes_only():
    proc = _child("import sys; sys.stdout.write('[ 1.0] noise line\\n' * 1_000_000); "
                  "sys.stdout.write('[ 2.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\\n')")
    text, why = script.read_bounded(proc, 30, 1 << 20)
    assert why is None
    assert len(text) <= 1 << 20 and text.startswith("[ 1.0]")  # the cut first line is dropped
    assert [e["xid"] for e in parse_xid_lines(text)] == [79]


@pytest.mark.process
def test_a_dmesg_that_hangs_is_killed_at_its_deadline_and_said_so():
    proc = _child("import time; time.sleep(60)")
    text, why = script.read_bounded(proc, 0.3, 1 << 20)
    assert text is None and why == "dmesg ran past 0.3s"
    assert proc.poll() is not None  # killed, not left behind


@pytest.mark.process
def test_a_dmesg_refused_says_its_error():
    proc = _child("import sys; sys.stderr.write('dmesg: read kernel buffer failed: Operation not permitted\\n'); sys.exit(1)")
    text, why = script.read_bounded(proc, 5, 1 << 20)
    assert text is None and why == "dmesg exited 1: dmesg: read kernel buffer failed: Operation not permitted"


# --------------------------------------------------------------------------
# NVML on the node: the same verdicts as nvidia-smi's (pynvml stood in by recorded answers)
# --------------------------------------------------------------------------

from tests.test_probe_parse import FakeNvml  # noqa: E402


class NvmlError(FakeNvml.NVMLError):
    def __init__(self, value):
        super().__init__({15: "GPU is lost", 3: "Not Supported", 999: "Unknown Error"}.get(value, str(value)))
        self.value = value


class HealthNvml(FakeNvml):
    """FakeNvml plus the health calls: GPU 1 has 2 uncorrected ECC errors, GPU 2 a row pending remap,
    GPU 3 cannot be opened (NVML_ERROR_GPU_IS_LOST), and pages pending retirement are not supported
    (Ampere and later remap rows instead)."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def nvmlDeviceGetHandleByIndex(self, i):
        if i == 3:
            raise NvmlError(15)
        return i

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert (kind, counter) == (1, 0)  # uncorrected, volatile: since the driver loaded
        return 2 if h == 1 else 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        raise NvmlError(3)

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 1, 1, 0) if h == 2 else (0, 0, 0, 0)


def test_nvml_answers_give_each_gpu_its_verdict():
    buses = [f"00000000:{b:02X}:00.0" for b in (0x18, 0x2A, 0x3A, 0x5D)]
    nvml = HealthNvml(gpus=[("NVIDIA H100 80GB HBM3", 81559, 0, b) for b in buses], links={})
    gpus = probe_gpus.gpus_from_nvml(nvml)
    out, checks, _ = assess(gpus, xid_events=[], xid_state="ok", nvml_checks=True)
    said = {g["index"]: (g["health"], g.get("health_reason", "")) for g in out}
    assert said == {
        0: ("ok", ""),
        1: ("unhealthy", "2 uncorrected ECC errors"),
        2: ("unhealthy", "row remap pending"),
        3: ("unhealthy", "the driver cannot answer for it: GPU is lost"),
    }
    assert checks == {"ecc": "ok", "remap": "ok", "xid": "ok"}
    assert nvml.shutdown


# --------------------------------------------------------------------------
# The node side's collect() with the test fleet's fake nvidia-smi and dmesg on PATH (no SSH)
# --------------------------------------------------------------------------

from tests import fleet as test_fleet  # noqa: E402


def fake_node_bin(root: Path, faults: dict, dmesg_mode: str = "ok") -> Path:
    """A bin dir with the fleet's fake nvidia-smi and dmesg, for four H100s broken as `faults` say."""
    bin_dir = root / "bin"
    (bin_dir / ".nvidia-smi").mkdir(parents=True, exist_ok=True)
    (bin_dir / ".dmesg").mkdir(exist_ok=True)
    gpus = [test_fleet.gpu_entry("H100", i, "n") for i in range(4)]
    smi = bin_dir / ".nvidia-smi"
    (smi / "gpus.csv").write_text(test_fleet.render_gpus_csv(gpus, [], faults))
    (smi / "remap.csv").write_text(test_fleet.render_remap_csv(gpus, faults))
    (smi / "apps.csv").write_text("")
    (smi / "topo.txt").write_text(test_fleet.render_topo(gpus, [[0, 1, 2, 3]]))
    (smi / "mode").write_text("ok\n")
    (bin_dir / ".dmesg" / "log.txt").write_text(test_fleet.render_kernel_log(gpus, faults))
    (bin_dir / ".dmesg" / "mode").write_text(dmesg_mode + "\n")
    for name, text in (("nvidia-smi", test_fleet.NVIDIA_SMI), ("dmesg", test_fleet.DMESG)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def health_of(report):
    return {g["index"]: g["health"] for g in report["gpus"]}


@pytest.mark.process
def test_a_session_reads_the_kernel_log_again_once_its_answer_is_older_than_the_recheck(tmp_path, monkeypatch):
    bin_dir = fake_node_bin(tmp_path, {})
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    cache: dict = {}
    args = {"state_dir": str(tmp_path / "state")}
    assert set(health_of(script.collect(args, cache)).values()) == {"ok"}
    fake_node_bin(tmp_path, {2: "xid79"})
    # Within the recheck the session's answer stands (the GPU query's own fields are read every pass)...
    assert health_of(script.collect(args, cache))[2] == "ok"
    # ...and once it is older, the kernel log is read again.
    report = script.collect(args | {"health_recheck_s": 0}, cache)
    assert health_of(report)[2] == "unhealthy" and report["health_checks"]["xid"] == "ok"


@pytest.mark.process
def test_without_a_session_each_probe_reads_everything(tmp_path, monkeypatch):
    bin_dir = fake_node_bin(tmp_path, {1: "ecc", 3: "remap_pending"}, dmesg_mode="unreadable")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    report = script.collect({"state_dir": str(tmp_path / "state")})
    assert health_of(report) == {0: "ok", 1: "unhealthy", 2: "ok", 3: "unhealthy"}
    assert report["health_checks"] == {"ecc": "ok", "remap": "ok", "xid": "unreadable"}
