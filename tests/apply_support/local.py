"""Helpers for apply tests on this machine: free ports, a tiny engine launch, cleanup by recorded pid."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from reconciler.model import RankLaunch

TINY_ENGINE = str(Path(__file__).with_name("tiny_engine.py"))


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()


def _bindable(port: int) -> bool:
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            s.bind((host, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def free_port() -> int:
    """A port free now, for an engine to listen on, drawn outside the kernel's ephemeral range.

    bind(0) hands out an ephemeral port, the kind the kernel also gives every outgoing
    connection: with other suites on the machine, a client socket could sit on it by the time
    the engine binds, and the node agent rightly says "port N is in use" with no listener.
    """
    low, high = _ephemeral_range()
    pool = range(10000, low) if low > 11000 else range(high + 1, 65536)
    rng = random.Random()
    for _ in range(500):
        port = rng.choice(pool)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port found in {pool.start}-{pool.stop - 1}")


def tiny_launch(replica: str, node: str, port: int, record: Path, *extra: str, rank: int = 0, nnodes: int = 1,
                spec_hash: str = "spec1", model: str = "m", env: dict | None = None,
                start_timeout_s: float = 30) -> RankLaunch:
    argv = (sys.executable, TINY_ENGINE, "--port", str(port), "--record", str(record), *extra)
    return RankLaunch(
        replica=replica, model=model, profile="p", node=node, rank=rank, nnodes=nnodes, argv=argv,
        env=env or {}, port=port, gpus=(), spec_hash=spec_hash,
        health_path="/health" if rank == 0 else None, start_timeout_s=start_timeout_s,
    )


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def proc_state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return text[text.rindex(")") + 2:].split()[0]


def is_running(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def kill_recorded(state_dir: Path) -> None:
    """Teardown: stop every process group recorded under state_dir (only ones the test started)."""
    for rec_path in (state_dir / "replicas").glob("*.json"):
        try:
            rec = json.loads(rec_path.read_text())
        except (OSError, ValueError):
            continue
        pgid = rec.get("pgid")
        if isinstance(pgid, int) and pgid > 1 and is_running(rec["pid"]):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_group(proc, timeout: float) -> None:
    """Teardown of a program the test started in a session of its own (start_new_session): SIGTERM to
    its process group, SIGKILL if it is still there after `timeout` seconds."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def terminate_all(procs, timeout: float) -> None:
    """Teardown of programs a test or a bench started: SIGTERM to each at once (their exits overlap),
    then SIGKILL to any still there `timeout` seconds after its turn to be waited for came."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def example_catalog(tmp_path: Path) -> Path:
    """A copy of examples/single-machine that a test applies for real: its own state dir (so
    kill_recorded(tmp_path / "state") stops what it started) and its own serving port."""
    import yaml

    from tests.conftest import REPO, copy_tracked

    root = copy_tracked(REPO / "examples" / "single-machine", tmp_path / "catalog")
    fleet = yaml.safe_load((root / "fleet.yaml").read_text())
    fleet["state_dir"] = str(tmp_path / "state")
    (root / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
    model_file = root / "models" / "tiny-echo.yaml"
    model = yaml.safe_load(model_file.read_text())
    model["profiles"][0]["port"] = free_port()
    model_file.write_text(yaml.safe_dump(model, sort_keys=False))
    return root
