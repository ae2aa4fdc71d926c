"""Helpers for apply tests on this machine: free ports, a tiny engine launch, cleanup by recorded pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from reconciler.model import RankLaunch

TINY_ENGINE = str(Path(__file__).with_name("tiny_engine.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
