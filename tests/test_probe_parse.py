"""The probe's pure parts, on recorded outputs: nvidia-smi of several GPU generations, NVML
answers, sysfs trees, /proc files. Plus the node-side helpers that read real /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.model import NodeSpec, frozen_map
from reconciler.observe.probe import observed_from_report
from reconciler.observe.probe import script
from reconciler.observe.probe import facts
from reconciler.observe.probe import gpus as probe_gpus
from reconciler.observe.probe.parse import (
    ParseError,
    fabric_name_for_prefix,
    gpu_class,
    parse_compute_apps_csv,
    parse_gpu_csv,
    parse_ib_port,
    parse_inet_diag,
    parse_meminfo,
    parse_proc_net_tcp,
    parse_proc_stat,
    parse_topo_matrix,
)

pytestmark = [pytest.mark.process]

DATA = Path(__file__).parent / "data" / "probe"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------
# GPU class: the names real drivers report
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, memory_mb, expected",
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
        ("NVIDIA H200", 143771, "H200-140GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
        ("NVIDIA L40S", 46068, "L40S-45GB"),
        ("NVIDIA A10G", 23028, "A10G-22GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("NVIDIA RTX A6000", 49140, "RTXA6000-48GB"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
        ("Tesla V100-PCIE-16GB", 16384, "V100-16GB"),
        ("Tesla T4", 15360, "T4-15GB"),
    ],
)
def test_gpu_class_is_model_token_and_size_as_drivers_name_them(name, memory_mb, expected):
    assert gpu_class(name, memory_mb) == expected


def test_gpu_class_ignores_a_size_in_the_name_that_is_not_the_gpus_memory():
    # GH200's name counts the Grace CPU's 480 GB of LPDDR; its GPU has 96 GiB of HBM.
    assert gpu_class("NVIDIA GH200 480GB", 97871) == "GH200-96GB"


def test_gpu_class_matches_the_catalog_schema_pattern():
    import re

    pattern = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*-[0-9]+GB$")
    for name, mem in [("NVIDIA GeForce RTX 4090", 24564), ("NVIDIA A100-SXM4-40GB", 40960), ("Tesla T4", 15360)]:
        assert pattern.match(gpu_class(name, mem))


# --------------------------------------------------------------------------
# nvidia-smi
# --------------------------------------------------------------------------


def test_query_gpu_csv_of_an_h100_node_gives_index_uuid_name_and_sizes():
    gpus = parse_gpu_csv(recorded("query-gpu.h100-dgx.csv"))
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[0] == {
        "index": 0,
        "uuid": "GPU-9d3b8a4f-61c2-7d3e-1b0e-5a8c2e4f7a01",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mb": 81559,
        "memory_used_mb": 0,
    }
    assert gpus[7]["memory_used_mb"] == 76235


def test_query_gpu_csv_of_mixed_generations_reads_not_available_as_zero():
    gpus = parse_gpu_csv(recorded("query-gpu.mixed-generations.csv"))
    classes = [gpu_class(g["name"], g["memory_total_mb"]) for g in gpus]
    assert classes == ["A100-40GB", "A100-80GB", "L40S-45GB", "RTX4090-24GB", "V100-32GB", "T4-15GB", "H200-140GB", "GH200-96GB"]
    assert gpus[7]["memory_used_mb"] == 0  # [N/A]


@pytest.mark.parametrize(
    "output",
    [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
        # someone's wrapper printed the header (no noheader support)
        "index, uuid, name, memory.total [MiB], memory.used [MiB]\n0, GPU-x, NVIDIA L40S, 46068, 0\n",
        "0, GPU-x, NVIDIA L40S, [N/A], 0\n",
    ],
)
def test_query_gpu_csv_in_an_unexpected_format_is_an_error_not_a_guess(output):
    with pytest.raises(ParseError):
        parse_gpu_csv(output)


def test_compute_apps_csv_gives_pid_name_and_memory_per_gpu_uuid():
    apps = parse_compute_apps_csv(recorded("query-compute-apps.csv"))
    assert apps == [
        {"gpu_uuid": "GPU-5e6f7a8b-9c0d-1e2f-3a4b-5c6d7e8f9a05", "pid": 23811, "name": "/usr/bin/python3", "used_mb": 30522},
        {"gpu_uuid": "GPU-8b9c0d1e-2f3a-4b5c-6d7e-8f9a0b1c2d08", "pid": 1408, "name": "VLLM::EngineCore", "used_mb": 76222},
        {"gpu_uuid": "GPU-8b9c0d1e-2f3a-4b5c-6d7e-8f9a0b1c2d08", "pid": 1409, "name": "/opt/conda/bin/python", "used_mb": 0},
    ]
    assert parse_compute_apps_csv("") == []
    with pytest.raises(ParseError):
        parse_compute_apps_csv("GPU-x, not-a-pid, python, 10\n")


def test_topo_matrix_of_an_nvswitch_h100_node_is_one_nvlink_domain():
    peers = parse_topo_matrix(recorded("topo.h100-dgx.txt"))
    assert peers == {i: [j for j in range(8) if j != i] for i in range(8)}


def test_topo_matrix_of_a_dgx1_v100_hybrid_cube_mesh():
    peers = parse_topo_matrix(recorded("topo.v100-dgx1.txt"))
    assert peers == {
        0: [1, 2, 3, 4], 1: [0, 2, 3, 5], 2: [0, 1, 3, 6], 3: [0, 1, 2, 7],
        4: [0, 5, 6, 7], 5: [1, 4, 6, 7], 6: [2, 4, 5, 7], 7: [3, 4, 5, 6],
    }


def test_topo_matrix_of_bridged_pcie_pairs_gives_two_domains():
    assert parse_topo_matrix(recorded("topo.a100-pcie-bridged.txt")) == {0: [1], 1: [0], 2: [3], 3: [2]}


def test_topo_matrix_without_nvlink_has_no_peers():
    assert parse_topo_matrix(recorded("topo.t4-pcie.txt")) == {0: [], 1: []}


def test_topo_matrix_printed_on_a_terminal_with_underline_codes():
    assert parse_topo_matrix(recorded("topo.rtx4090-tty.txt")) == {0: []}


def test_topo_matrix_that_is_not_a_matrix_is_an_error():
    with pytest.raises(ParseError):
        parse_topo_matrix("Failed to initialize NVML: Driver/library version mismatch\n")


# --------------------------------------------------------------------------
# NVML answers (a recorded-answers stand-in for pynvml, passed in as the module)
# --------------------------------------------------------------------------


class FakeNvml:
    """Answers pynvml calls from a table, the way a node's NVML would."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    class NVMLError(Exception):
        pass

    def __init__(self, gpus, links, p2p=None):
        # gpus: [(name, total_mb, used_mb, bus)]; links: {gpu: {link: remote_bus}}; p2p: set of (i, j)
        self.gpus, self.links, self.p2p = gpus, links, p2p or set()
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetIndex(self, h):
        return h

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08d}".encode()  # older pynvml returns bytes

    def nvmlDeviceGetName(self, h):
        return self.gpus[h][0]

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("M", (), {"total": self.gpus[h][1] << 20, "used": self.gpus[h][2] << 20})()

    def nvmlDeviceGetPciInfo(self, h):
        return type("P", (), {"busId": self.gpus[h][3]})()

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("Proc", (), {"pid": os.getpid(), "usedGpuMemory": 512 << 20})()] if h == 0 else []

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link not in self.links.get(h, {}):
            raise self.NVMLError("Not Supported")
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return type("P", (), {"busId": self.links[h][link]})()

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return self.NVML_P2P_STATUS_OK if (a, b) in self.p2p or (b, a) in self.p2p else 4


def test_nvml_nvlink_peers_from_remote_pci_bus_ids_of_bridged_pairs():
    nvml = FakeNvml(
        gpus=[("NVIDIA A100 80GB PCIe", 81920, 0, "00000000:17:00.0"), ("NVIDIA A100 80GB PCIe", 81920, 0, "00000000:65:00.0"),
              ("NVIDIA A100 80GB PCIe", 81920, 0, "00000000:CA:00.0")],
        links={0: {0: "0000:65:00.0", 1: "0000:65:00.0"}, 1: {0: "00000000:17:00.0"}},
    )
    gpus = probe_gpus.gpus_from_nvml(nvml)
    assert [g["nvlink_peers"] for g in gpus] == [[1], [0], []]
    assert gpus[0]["uuid"] == "GPU-00000000" and gpus[0]["memory_total_mb"] == 81920
    assert gpus[0]["processes"][0]["pid"] == os.getpid() and gpus[0]["processes"][0]["used_mb"] == 512
    assert nvml.shutdown


def test_nvml_links_ending_at_nvswitches_fall_back_to_p2p_status():
    buses = [f"00000000:{b:02X}:00.0" for b in (0x18, 0x2A, 0x3A, 0x5D)]
    switch = "00000000:C0:00.0"
    nvml = FakeNvml(
        gpus=[("NVIDIA H100 80GB HBM3", 81559, 0, b) for b in buses],
        links={h: {0: switch, 1: switch} for h in range(4)},
        p2p={(0, 1), (0, 2), (1, 2)},  # GPU 3's NVLink is down
    )
    assert [g["nvlink_peers"] for g in probe_gpus.gpus_from_nvml(nvml)] == [[1, 2], [0, 2], [0, 1], []]


# --------------------------------------------------------------------------
# sysfs and /proc
# --------------------------------------------------------------------------


def make_port(root: Path, hca: str, port: int, state: str, link_layer: str | None, gid: str | None) -> None:
    base = root / hca / "ports" / str(port)
    (base / "gids").mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    if link_layer is not None:
        (base / "link_layer").write_text(link_layer + "\n")
    if gid is not None:
        (base / "gids" / "0").write_text(gid + "\n")


def test_infiniband_tree_gives_state_link_layer_and_subnet_prefix_per_port(tmp_path):
    make_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "InfiniBand", "fec0:0000:0000:0001:0002:c903:0049:b0a1")
    make_port(tmp_path, "mlx5_1", 1, "1: DOWN", "InfiniBand", "fe80:0000:0000:0000:0002:c903:0049:b0a2")
    make_port(tmp_path, "mlx5_2", 1, "4: ACTIVE", "Ethernet", "fe80:0000:0000:0000:ba3f:d2ff:fe01:0203")
    (tmp_path / "mlx5_3" / "ports" / "1").mkdir(parents=True)  # a port without a state file
    warnings: list[str] = []
    ports = facts.infiniband(warnings, root=str(tmp_path))
    assert ports == [
        {"hca": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fec0:0000:0000:0001"},
        {"hca": "mlx5_1", "port": 1, "state": "DOWN", "link_layer": "InfiniBand", "subnet_prefix": "fe80:0000:0000:0000"},
        {"hca": "mlx5_2", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "subnet_prefix": "fe80:0000:0000:0000"},
    ]
    assert len(warnings) == 1 and "mlx5_3" in warnings[0] and "no state file" in warnings[0]


def test_a_node_without_infiniband_reports_none_not_an_empty_list(tmp_path):
    assert facts.infiniband([], root=str(tmp_path / "absent")) is None


def test_ib_port_with_an_unreadable_gid_is_an_error():
    with pytest.raises(ParseError):
        parse_ib_port({"state": "4: ACTIVE", "gids/0": "garbage"})


def test_fabric_named_after_its_prefix():
    assert fabric_name_for_prefix("fec0:0000:0000:0001") == "ib-fec0-0-0-1"


def test_meminfo_total_in_mib():
    text = "MemTotal:       2113147460 kB\nMemFree:        1933212340 kB\nMemAvailable:   2061234567 kB\n"
    assert parse_meminfo(text) == 2113147460 // 1024
    with pytest.raises(ParseError):
        parse_meminfo("MemFree: 12 kB\n")


def test_proc_net_tcp_listening_ports_only():
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n"
        "   1: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n"
        "   2: 0B07D50A:0016 0107D50A:C350 01 00000000:00000000 02:000A7E4A 00000000     0        0 3 4 0 20 4 29 10 -1\n"
    )
    assert parse_proc_net_tcp(text) == [22, 8000]
    tcp6 = (
        "  sl  local_address                         remote_address                        st tx_queue rx_queue\n"
        "   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000\n"
    )
    assert parse_proc_net_tcp(tcp6) == [30000]


def test_proc_stat_with_spaces_and_parentheses_in_the_command_name():
    text = "4242 (vllm (serve) x) S 1 4240 4240 0 -1 4194560 500 0 0 0 10 5 0 0 20 0 12 0 987654 1000000 100 18446744073709551615\n"
    assert parse_proc_stat(text) == {"pid": 4242, "state": "S", "pgrp": 4240, "session": 4240, "start_time": 987654}


# --------------------------------------------------------------------------
# Node-side helpers on real processes and files
# --------------------------------------------------------------------------


@pytest.fixture
def process_group():
    """A real process group: a shell leader with a child, in its own session."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def _children(pid: int) -> list[int]:
    import time

    for _ in range(200):
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return [int(k) for k in kids]
        time.sleep(0.01)
    raise AssertionError("child never appeared")


def write_record(state_dir: Path, rid: str, rank: int, **fields) -> None:
    d = state_dir / "replicas"
    d.mkdir(parents=True, exist_ok=True)
    rec = {"id": rid, "model": rid.rsplit("-", 1)[0], "profile": "p", "rank": rank, "nnodes": 1, "spec_hash": "abc123",
           "port": 8000, "gpus": [0], "argv": ["x"], "env_keys": [], "log": "/dev/null", "managed_by": "llm-reconciler"}
    rec.update(fields)
    (d / f"{rid}.rank{rank}.json").write_text(json.dumps(rec))


def test_records_are_alive_only_when_pid_and_start_time_both_match(tmp_path, process_group):
    st = facts.proc_stat(process_group.pid)
    write_record(tmp_path, "m-0", 0, pid=process_group.pid, pgid=process_group.pid, start_time=st["start_time"])
    write_record(tmp_path, "m-1", 0, pid=process_group.pid, pgid=process_group.pid, start_time=st["start_time"] - 1)  # pid reused
    write_record(tmp_path, "m-2", 0, pid=2**22 + 17, pgid=2**22 + 17, start_time=1)  # gone
    (tmp_path / "replicas" / "junk.json").write_text("{not json")
    (tmp_path / "replicas" / "other.json").write_text(json.dumps({"id": "x", "managed_by": "someone-else"}))
    warnings: list[str] = []
    records = facts.replica_records(str(tmp_path), warnings)
    assert {r["id"]: r["alive"] for r in records} == {"m-0": True, "m-1": False, "m-2": False}
    assert len(warnings) == 1 and "junk.json" in warnings[0]


def test_gpu_processes_of_a_managed_replicas_group_are_not_foreign(process_group):
    child = _children(process_group.pid)[0]
    records = [{"id": "m-0", "pid": process_group.pid, "pgid": process_group.pid, "alive": True}]
    gpus = [{"index": 0, "processes": [{"pid": child, "name": "sleep", "used_mb": 10},
                                       {"pid": os.getpid(), "name": "pytest", "used_mb": 20}]}]
    facts.exclude_managed(gpus, records)
    assert [p["pid"] for p in gpus[0]["processes"]] == [os.getpid()]


def test_sources_present_by_path_under_a_model_dir_or_by_hub_layout(tmp_path):
    models = tmp_path / "models"
    (models / "llama-3-8b").mkdir(parents=True)
    (models / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    (models / "models--Qwen--Qwen2.5-7B").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    dirs = [str(models)]
    assert facts.source_present(str(models / "llama-3-8b"), dirs)
    assert facts.source_present("meta-llama/Llama-3.1-8B", dirs)
    assert facts.source_present("Qwen/Qwen2.5-7B", dirs)
    assert not facts.source_present(str(tmp_path / "elsewhere"), dirs)  # exists, but not under a model dir
    assert not facts.source_present(str(models / "missing"), dirs)
    assert not facts.source_present("org/absent", dirs)
    assert not facts.source_present("relative/../../etc", dirs)


def test_the_script_runs_standalone_from_its_payload_and_prints_one_json_document(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-", json.dumps({"model_dirs": [str(tmp_path)], "sources": [str(tmp_path)], "state_dir": str(tmp_path)})],
        input=script.payload(), capture_output=True, cwd="/", env={"PATH": os.environ["PATH"]}, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["disks"][0]["path"] == str(tmp_path) and report["weights"] == [str(tmp_path)]
    assert report["memory_total_mb"] > 0


# --------------------------------------------------------------------------
# Report -> ObservedNode
# --------------------------------------------------------------------------


def spec(**kw) -> NodeSpec:
    base = dict(id="n1", address="10.0.0.1", data_address="10.0.0.1")
    base.update(kw)
    return NodeSpec(**base)


def report(**kw) -> dict:
    base = {"gpus": [], "engines": {}, "hcas": [], "disks": [], "weights": [], "replicas": [], "ports_in_use": [], "warnings": []}
    base.update(kw)
    return base


def test_fleet_intent_wins_for_state_labels_and_gpu_class():
    node, _ = observed_from_report(
        spec(state="cordoned", labels=frozen_map({"zone": "a"}), gpu_class="L40S-48GB"),
        report(gpus=[{"index": 0, "uuid": "u", "name": "NVIDIA L40S", "memory_total_mb": 46068, "memory_used_mb": 0}]),
    )
    assert node.state == "cordoned" and dict(node.labels) == {"zone": "a"}
    assert node.gpus[0].gpu_class == "L40S-48GB"


def test_declared_fabric_keeps_only_hcas_the_node_has():
    ports = [{"hca": "mlx5_0", "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fe80:0000:0000:0000"}]
    node, warnings = observed_from_report(spec(fabrics=frozen_map({"ib-pod1": ("mlx5_0", "mlx5_9")})), report(hcas=ports))
    assert [(f.name, f.hcas) for f in node.fabrics] == [("ib-pod1", ("mlx5_0",))]
    assert any("mlx5_9" in w for w in warnings)


def test_undeclared_active_ib_ports_on_a_configured_subnet_form_a_fabric_default_prefix_does_not():
    ports = [
        {"hca": "mlx5_0", "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fec0:0000:0000:0001"},
        {"hca": "mlx5_1", "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fec0:0000:0000:0001"},
        {"hca": "mlx5_2", "state": "DOWN", "link_layer": "InfiniBand", "subnet_prefix": "fec0:0000:0000:0002"},
        {"hca": "mlx5_3", "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fe80:0000:0000:0000"},
        {"hca": "mlx5_4", "state": "ACTIVE", "link_layer": "Ethernet", "subnet_prefix": "fec0:0000:0000:0003"},
    ]
    node, _ = observed_from_report(spec(), report(hcas=ports))
    assert [(f.name, f.hcas) for f in node.fabrics] == [("ib-fec0-0-0-1", ("mlx5_0", "mlx5_1"))]


def test_declared_fabrics_stand_when_the_node_has_no_infiniband_class_to_contradict_them():
    node, warnings = observed_from_report(spec(fabrics=frozen_map({"roce-a": ("eth2",)})), report(hcas=None))
    assert [(f.name, f.hcas) for f in node.fabrics] == [("roce-a", ("eth2",))]
    assert warnings


def test_records_become_running_ranks_with_liveness():
    rec = {"id": "m-0", "model": "m", "profile": "p", "rank": 1, "nnodes": 2, "gpus": [2, 3], "port": 8001,
           "spec_hash": "abc", "pid": 77, "alive": False, "file": "m-0.rank1.json"}
    node, warnings = observed_from_report(spec(), report(replicas=[rec, {"file": "bad.json"}]))
    (r,) = node.replicas
    assert (r.id, r.rank, r.nnodes, r.gpus, r.port, r.pid, r.alive) == ("m-0", 1, 2, (2, 3), 8001, 77, False)
    assert any("bad.json" in w for w in warnings)


def test_sock_diag_answer_gives_the_local_ports_and_ends_at_done():
    import struct

    def msg(kind, body):
        return struct.pack("=LHHLL", 16 + len(body), kind, 2, 1, 0) + body

    sockid = struct.pack("!HH", 8000, 0) + b"\0" * 44
    listen = msg(20, struct.pack("=BBBB", 2, 10, 0, 0) + sockid + b"\0" * 20)
    data = listen + msg(3, struct.pack("=i", 0))
    assert parse_inet_diag(data) == ([8000], True)
    assert parse_inet_diag(listen) == ([8000], False)
    with pytest.raises(ParseError):
        parse_inet_diag(msg(2, struct.pack("=i", -1)))


def test_listening_ports_through_sock_diag_see_a_real_listener():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port in facts.listening_ports_netlink()
        assert port in facts.listening_ports([])
    with socket.socket() as s:  # bound but not listening: not a port in use for serving
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] not in facts.listening_ports_netlink()


def test_a_session_answers_a_report_per_request_and_imports_sglang_once_per_recheck_window(tmp_path):
    from reconciler.observe.probe.collect import session_command

    pkg = tmp_path / "py" / "sglang"
    pkg.mkdir(parents=True)
    counter = tmp_path / "imports"
    (pkg / "__init__.py").write_text(f"open({str(counter)!r}, 'a').write('x')\n")
    argv, preamble = session_command()
    bindir = tmp_path / "bin"  # `sglang serve` is what runs: its command must be on the PATH too
    bindir.mkdir()
    (bindir / "sglang").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "sglang").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "py")}
    proc = subprocess.Popen([sys.executable] + argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd="/")
    try:
        proc.stdin.write(preamble)
        reports = []
        for _ in range(3):
            proc.stdin.write(json.dumps({"model_dirs": [str(tmp_path)]}).encode() + b"\n")
            proc.stdin.flush()
            reports.append(json.loads(proc.stdout.readline()))
        assert all(r["engines"] == {"sglang": ""} for r in reports)
        assert counter.read_text() == "x"  # one child import, not one per pass
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0  # end of input ends the session
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_payload_never_imports_the_reconciler_package_on_a_node(tmp_path):
    # A node with some other version of the package installed must still run what was sent.
    fake = tmp_path / "reconciler" / "probe"
    fake.mkdir(parents=True)
    (tmp_path / "reconciler" / "__init__.py").write_text("raise SystemExit('the installed package was imported')\n")
    proc = subprocess.run([sys.executable, "-", "{}"], input=script.payload(), capture_output=True, cwd=str(tmp_path),
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["probe_version"] == script.PROBE_VERSION


def test_a_local_node_is_probed_without_ssh_through_the_one_shot_path(tmp_path):
    from reconciler.observe.probe import probe_node
    from reconciler.observe.transport import LocalTransport

    (tmp_path / "weights").mkdir()
    node = spec(transport="local", model_dirs=(str(tmp_path),), state_dir=str(tmp_path / "state"))
    result = probe_node(node, LocalTransport(node.id), sources=[str(tmp_path / "weights"), str(tmp_path / "absent")])
    assert result.reached and result.node.state == "ready", result.node.reason
    assert result.node.weights == (str(tmp_path / "weights"),)
    assert result.node.disks[0].path == str(tmp_path) and result.node.memory_total_mb > 0


class ScriptedTransport:
    """A transport seam that answers every command with one canned result."""

    def __init__(self, node_id, rc, stdout=b"", stderr=b""):
        from reconciler.observe.transport import CommandResult

        self.node_id = node_id
        self.command_timeout_s = 30.0
        self.result = CommandResult(rc, stdout, stderr)
        self.argvs = []

    def run(self, argv, *, stdin=None, timeout=60.0):
        self.argvs.append(list(argv))
        return self.result

    def close(self):
        pass


@pytest.mark.parametrize(
    "rc, stdout, stderr, reason",
    [
        (127, b"", b"bash: line 1: python3: command not found\n", "python3 is not on the node's login PATH"),
        (0, b"Last login: yesterday\n", b"", "not a JSON report: 'Last login: yesterday'"),
        (1, b"", b"Traceback ...\nMemoryError\n", "probe exited 1: 'Traceback ...\\nMemoryError'"),
        (0, b"[1, 2]", b"", "not a JSON report"),
    ],
)
def test_what_a_broken_node_prints_becomes_its_reason(rc, stdout, stderr, reason):
    from reconciler.observe.probe import probe_node

    t = ScriptedTransport("n1", rc, stdout, stderr)
    result = probe_node(spec(), t)
    assert result.node.state == "unreachable" and reason in result.node.reason
    assert t.argvs[0][:2] == ["python3", "-"]  # the command line is fixed; arguments travel as one JSON word


def test_a_report_with_an_infinite_number_makes_the_node_unreachable_never_a_traceback():
    from reconciler.observe.probe.collect import _decode_report, _from_report
    from reconciler.vocabulary import FailureKind, NodeState

    # JSON as Python reads it takes Infinity: int() of it overflowed out of the probe, a traceback per pass.
    gpu = '{"index": 0, "uuid": "u", "name": "NVIDIA L40S", "memory_total_mb": 46068, "nvlink_peers": [Infinity]}'
    raw = ('{"gpus": [%s], "engines": {}, "hcas": [], "disks": [], "weights": [], "replicas": []}' % gpu).encode()
    probe = _from_report(spec(), _decode_report(raw), 0.0, lambda: 0.0)
    assert probe.node.state == NodeState.UNREACHABLE and probe.node.failure == FailureKind.PERMANENT
    assert probe.node.reason.startswith("probe report unreadable (OverflowError"), probe.node.reason
