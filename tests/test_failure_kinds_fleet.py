"""A failed start's kind, end to end on the namespaced fleet (issue 13: Temporary, Permanent).

The typed outcome decides, never the message: a missing engine binary (the node agent's
ENOENT) is permanent, so the replica is stalled until the catalog (or the node) changes;
a start that runs past ssh.command_timeout_s (the agent blocked opening a secret file
that is a FIFO nobody writes) is temporary, so it is retried after a backoff with jitter.
status/models says which (`failure`), `reconciler status` and `plan` say so too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import yaml

from tests.apply_support.cleanup import stop_every_rank
from tests.fleet import fleet  # noqa: F401
import pytest

pytestmark = [pytest.mark.fleet]


def command_model(name: str, port: int, command: list[str], env: dict | None = None) -> dict:
    profile = {"name": "cpu", "engine": "command", "port": port, "command": command, "start_timeout_s": 20}
    if env:
        profile["env"] = env
    return {"name": name, "source": f"org/{name}", "profiles": [profile]}


def replica(root: Path, model: str) -> dict:
    return yaml.safe_load((root / "status" / "models" / f"{model}.yaml").read_text())["replicas"][0]


def starts(out: str, rid: str) -> list[str]:
    """apply's decision lines that launch (or try to launch) a rank of `rid`."""
    return [line for line in out.splitlines() if line.startswith(rid + "  ") and line.split()[2] in ("start", "fail")]


def release_blocked_readers(fifo: Path) -> None:
    """Node agents this test left blocked opening the FIFO: each is handed bytes that are not UTF-8,
    so it refuses the launch and exits (nothing is started)."""
    for _ in range(20):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody has it open for reading any more
            return
        try:
            os.write(fd, b"\xff\xfe")
        finally:
            os.close(fd)
        time.sleep(0.2)


def test_a_missing_engine_is_permanent_and_stalls_and_a_timed_out_start_is_temporary_and_backs_off(fleet, tmp_path, cli):  # noqa: F811
    fleet.add_node("g1")
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    doc = fleet.fleet_document(["g1"])
    doc["ssh"]["command_timeout_s"] = 2
    (root / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    fifo = tmp_path / "secret-fifo"
    os.mkfifo(fifo)
    missing = tmp_path / "no-such-engine"
    (root / "models" / "noengine.yaml").write_text(yaml.safe_dump(
        command_model("noengine", 24100, [str(missing), "--port", "${PORT}"]), sort_keys=False))
    (root / "models" / "hangs.yaml").write_text(yaml.safe_dump(
        command_model("hangs", 24200, ["sleep", "600"], {"TOKEN": {"from_file": str(fifo)}}), sort_keys=False))
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg-state")}
    try:
        first = cli("apply", str(root), env=env, timeout=180)
        assert first.returncode == 1, first.stdout + first.stderr  # both launches fail, by design
        assert starts(first.stdout, "noengine-0") and starts(first.stdout, "hangs-0"), first.stdout
        noengine, hangs = replica(root, "noengine"), replica(root, "hangs")
        assert noengine["phase"] == "Failed" and noengine["failure"] == "permanent", noengine
        assert "no such file on this node's PATH" in noengine["message"]
        assert hangs["phase"] == "Failed" and hangs["failure"] == "temporary", hangs

        # Right after: neither is launched again. The permanent one is stalled, the temporary one waits.
        second = cli("apply", str(root), env=env, timeout=180)
        assert not starts(second.stdout, "noengine-0") and not starts(second.stdout, "hangs-0"), second.stdout
        noengine, hangs = replica(root, "noengine"), replica(root, "hangs")
        assert noengine["failure"] == "permanent" and "stalled until the catalog or node g1 changes" in noengine["message"]
        assert hangs["failure"] == "temporary" and "retried after" in hangs["message"] and "1 failed start" in hangs["message"]
        shown = cli("status", str(root), env=env)
        assert "(permanent)" in next(line for line in shown.stdout.splitlines() if "noengine-0" in line), shown.stdout
        assert "(temporary)" in next(line for line in shown.stdout.splitlines() if "hangs-0" in line), shown.stdout
        planned = cli("plan", str(root), env=env)
        assert "stalled until the catalog or node g1 changes" in planned.stdout, planned.stdout

        # The backoff runs out (the memory apply keeps says the failure was 20 s ago): tried again, and
        # it fails the same way, one attempt more. The permanent one is still not tried.
        memory_file = next((tmp_path / "xdg-state" / "llm-reconciler" / "apply-memory").glob("*.json"))
        state = json.loads(memory_file.read_text())
        assert {rid: b["failure"] for rid, b in state["backoff"].items()} == {"noengine-0": "permanent",
                                                                             "hangs-0": "temporary"}
        state["backoff"]["hangs-0"]["retry_at"] -= 20
        memory_file.write_text(json.dumps(state))
        third = cli("apply", str(root), env=env, timeout=180)
        assert starts(third.stdout, "hangs-0") and not starts(third.stdout, "noengine-0"), third.stdout
        assert json.loads(memory_file.read_text())["backoff"]["hangs-0"]["failed_starts"] == 2

        # The catalog changes the stalled replica's spec: tried at once.
        (root / "models" / "noengine.yaml").write_text(yaml.safe_dump(
            command_model("noengine", 24100, [str(missing) + "-2", "--port", "${PORT}"]), sort_keys=False))
        fourth = cli("apply", str(root), env=env, timeout=180)
        assert starts(fourth.stdout, "noengine-0"), fourth.stdout
        assert replica(root, "noengine")["failure"] == "permanent"
    finally:
        release_blocked_readers(fifo)
        stop_every_rank(root)
