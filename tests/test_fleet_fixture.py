"""The test fleet itself (tests/fleet.py): what other tests rely on it for."""

from __future__ import annotations

import subprocess
import sys

from tests.fleet import REPO_ROOT, TestFleet, fleet  # noqa: F401  (pytest fixture)
import pytest

pytestmark = [pytest.mark.fleet]


def ssh(fleet, node_id, command):  # noqa: F811
    return subprocess.run(fleet.ssh_argv(node_id) + [command], capture_output=True, text=True, timeout=30)


def test_nodes_see_their_own_files_at_the_same_paths(fleet):  # noqa: F811
    fleet.add_node("one", models=["only-on-one"], fabrics={"ib-x": ["mlx5_0"]}, engines=["vllm"])
    fleet.add_node("two", models=["only-on-two"])
    one = ssh(fleet, "one", f"ls {fleet.models_dir} /sys/class/infiniband; command -v vllm; echo $HOME")
    two = ssh(fleet, "two", f"ls {fleet.models_dir}; ls /sys/class/infiniband 2>/dev/null; command -v vllm; echo $HOME")
    assert "only-on-one" in one.stdout and "mlx5_0" in one.stdout and "/engines/vllm" in one.stdout
    assert "only-on-two" in two.stdout and "only-on-one" not in two.stdout
    assert "mlx5_0" not in two.stdout and "vllm" not in two.stdout
    assert one.stdout.split()[-1] != two.stdout.split()[-1]  # homes differ


def test_set_hardware_changes_what_the_nodes_nvidia_smi_prints(fleet):  # noqa: F811
    fleet.add_node("hw", gpus=["L40S"])
    query = "nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits"
    assert ssh(fleet, "hw", query).stdout.count("NVIDIA L40S") == 1
    fleet.set_hardware("hw", gpus=["H100", "H100"], processes=[{"gpu": 1, "pid": 7, "name": "x", "used_mb": 5}])
    out = ssh(fleet, "hw", query).stdout.splitlines()
    assert [line.split(", ")[2] for line in out] == ["NVIDIA H100 80GB HBM3"] * 2 and out[1].endswith(", 5")
    bad = ssh(fleet, "hw", "nvidia-smi --query-gpu=bogus --format=csv")
    assert bad.returncode == 2 and "Invalid combination" in bad.stdout


def test_cut_and_restore_take_a_node_off_the_network_and_back(fleet):  # noqa: F811
    fleet.add_node("flaky")
    fleet.cut("flaky")
    import socket

    try:
        socket.create_connection((fleet.node("flaky").address, 22), timeout=1).close()
        reached = True
    except OSError:
        reached = False
    assert not reached
    fleet.restore("flaky")
    assert ssh(fleet, "flaky", "echo $LLMFLEET_NODE").stdout.strip() == "flaky"


def test_a_fleet_left_behind_by_a_dead_run_is_reaped_by_the_next(tmp_path):
    code = (
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); from tests.fleet import TestFleet; "
        "f = TestFleet(); f.add_node('orphan'); print(f.prefix, f.node('orphan').sshd.pid, flush=True); import os; os._exit(1)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    prefix, sshd_pid = out.stdout.split()
    assert prefix in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with TestFleet():
        pass
    assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert not_running(int(sshd_pid))


def not_running(pid: int) -> bool:
    """Gone, or a zombie (killed; its new parent, pid 1 of a container, may never reap it)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"
