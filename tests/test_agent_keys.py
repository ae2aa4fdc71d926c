"""The node agent's keys (reconciler/agent_keys.py): named once, the format they name unchanged.

Records written by an older agent stay on nodes across an upgrade, so the names must keep
spelling exactly what it wrote, and the agent, the probe and the launcher must all read such a
record the same way.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.agent_keys import MANAGER, RECORD_KEYS, Answer, Record
from reconciler.act.launcher import SshLauncher
from reconciler.act.launcher.ssh_launcher import AGENT_MODULES, agent_source
from reconciler.model import NodeSpec
from reconciler.observe.probe import script
from reconciler.observe.probe.report import observed_from_report
from reconciler.act.readiness import http_health
from reconciler.observe.transport import LocalTransport
from tests.apply_support.local import free_port, kill_recorded, tiny_launch, wait_for
from tests.conftest import REPO

# What the agent wrote before the keys were named, spelled as it spelled them.
OLD_RECORD_KEYS = {"id", "model", "profile", "rank", "nnodes", "spec_hash", "pid", "pgid", "start_time",
                   "started_at", "port", "gpus", "argv", "env_keys", "log", "managed_by", "revision", "owner"}
OLD_ANSWER_KEYS = {"ok", "reason", "failure", "port_in_use", "already_running", "pid", "pgid", "log", "start_time",
                   "revision", "ranks", "rank", "detail", "exists", "lines", "offset", "fenced"}


def _names(cls) -> dict[str, str]:
    return {k: v for k, v in vars(cls).items() if k.isupper()}


def test_the_named_record_keys_are_those_the_old_agent_wrote():
    assert set(RECORD_KEYS) == OLD_RECORD_KEYS and len(RECORD_KEYS) == len(OLD_RECORD_KEYS)
    # What readers add to a record they pass on: status' liveness and log tail, the probe's file name.
    assert set(_names(Record).values()) == OLD_RECORD_KEYS | {"alive", "log_tail", "file"}
    assert MANAGER == "llm-reconciler"


def test_the_named_answer_keys_are_those_the_old_agent_answered_with():
    assert set(_names(Answer).values()) == OLD_ANSWER_KEYS
    assert len(_names(Answer)) == len(OLD_ANSWER_KEYS)  # no two names for one key


def test_the_keys_module_is_constants_only_and_opens_both_programs():
    path = REPO / "reconciler" / "agent_keys.py"
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Call))]
    text = path.read_bytes()
    assert AGENT_MODULES[0] == "agent_keys.py" and agent_source().startswith(text)
    # In the probe's payload right after parse.py, whose `from __future__` line must open it.
    assert script.PAYLOAD_MODULES[:2] == ("observe/probe/parse.py", "agent_keys.py")
    joined = script.payload(minify=False).decode()
    assert joined.index(text.decode()) < joined.index("# ---- observe/probe/health.py ----")
    for program in (agent_source(), script.payload(), script.payload(minify=False)):
        ast.parse(program, feature_version=(3, 8))


# --------------------------------------------------------------------------
# Real processes: the agent's own text, the probe's own payload
# --------------------------------------------------------------------------

OWNER = "ownerA"


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    yield d
    kill_recorded(d)


def _launcher(state_dir: Path, owner: str | None = OWNER) -> SshLauncher:
    return SshLauncher({"n1": LocalTransport("n1")}, {"n1": str(state_dir)}, stop_grace_s=2.0, owner=owner)


class Answers:
    """A transport that keeps every answer of the agent it runs."""

    def __init__(self, inner):
        self.inner, self.node_id, self.answers = inner, inner.node_id, []
        self.command_timeout_s = inner.command_timeout_s

    def run(self, argv, *, stdin=None, timeout=60.0):
        result = self.inner.run(argv, stdin=stdin, timeout=timeout)
        self.answers.append(json.loads(result.stdout))
        return result

    def close(self):
        pass


@pytest.mark.process
@pytest.mark.parametrize("owner", [OWNER, None])
def test_the_agent_writes_exactly_the_named_keys_and_answers_only_with_named_ones(state_dir, tmp_path, owner):
    transport = Answers(LocalTransport("n1"))
    launcher = SshLauncher({"n1": transport}, {"n1": str(state_dir)}, stop_grace_s=2.0, owner=owner)
    port = free_port()
    launch = tiny_launch("m-0", "n1", port, tmp_path / "r.json")
    assert launcher.start(launch).ok
    [path] = (state_dir / "replicas").glob("*.json")
    written = set(json.loads(path.read_text()))
    assert written == (set(RECORD_KEYS) if owner else set(RECORD_KEYS) - {Record.OWNER})

    assert launcher.start(launch).already_running
    assert not launcher.start(replace(launch, spec_hash="spec2")).ok  # runs already, with another spec
    wait_for(lambda: http_health("127.0.0.1", port, "/health")[0], what="health 200")  # its port is held now
    assert launcher.start(replace(launch, replica="m-1", port=port)).port_in_use == port
    launcher.ranks("n1", log_lines=2)
    launcher.logs("n1", "m-0", 0)
    assert launcher.stop("n1", "m-0").ok
    named = set(_names(Answer).values())
    assert len(transport.answers) == 7
    for answer in transport.answers:
        assert set(answer) <= named, answer
    [status] = [a for a in transport.answers if a.get("ranks") and "spec_hash" in a["ranks"][0]]
    assert set(status["ranks"][0]) == written | {Record.ALIVE, Record.LOG_TAIL}


def _old_record(state_dir: Path, pid: int, start_time: int) -> None:
    """A record as the agent wrote it before its keys were named: every key a literal."""
    old = {"id": "m-0", "model": "m", "profile": "p", "rank": 1, "nnodes": 2, "spec_hash": "abc123",
           "pid": pid, "pgid": pid, "start_time": start_time, "started_at": 1700000000.5, "port": 8123,
           "gpus": [0, 1], "argv": ["engine", "--port", "8123"], "env_keys": ["HF_TOKEN"], "log": "/dev/null",
           "managed_by": "llm-reconciler", "revision": "0123abcd", "owner": OWNER}
    assert set(old) == OLD_RECORD_KEYS
    (state_dir / "replicas").mkdir(parents=True)
    (state_dir / "replicas" / f"{OWNER}.m-0.rank1.json").write_text(json.dumps(old, sort_keys=True, indent=1))


@pytest.mark.process
def test_a_record_the_old_agent_wrote_is_read_the_same_by_the_probe_and_the_launcher(state_dir):
    engine = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        stat = Path(f"/proc/{engine.pid}/stat").read_text()
        _old_record(state_dir, engine.pid, int(stat[stat.rindex(")") + 2:].split()[19]))

        # The probe: its own payload, run as on a node, then its report read on the management side.
        probed = subprocess.run([sys.executable, "-I", "-S", "-", json.dumps({"state_dir": str(state_dir)})],
                                input=script.payload(), capture_output=True, cwd="/", timeout=60)
        assert probed.returncode == 0, probed.stderr
        node, warnings = observed_from_report(NodeSpec(id="n1", address="10.0.0.1", data_address="10.0.0.1"), json.loads(probed.stdout),
                                              owner=OWNER)
        [seen] = node.replicas
        assert not [w for w in warnings if "record" in w]

        # The launcher: the agent's own text answering `status`.
        [reported] = _launcher(state_dir).ranks("n1")

        expected = dict(id="m-0", model="m", profile="p", rank=1, nnodes=2, spec_hash="abc123", pid=engine.pid,
                        port=8123, gpus=(0, 1), alive=True)
        assert {k: getattr(seen, k) for k in expected} == expected
        assert {k: getattr(reported, k) for k in expected} == expected
        assert seen.revision == "0123abcd" and reported.started_at == 1700000000.5
        # What only one side reads aside, both read the same rank.
        assert replace(reported, node="", started_at=None, log_tail=(), revision=seen.revision) == seen
        assert _launcher(state_dir, "ownerB").ranks("n1") == []  # its owner read too

        # And the agent stops it through the record's pid, process group and start time.
        stopped = _launcher(state_dir).stop("n1", "m-0")
        assert stopped.ok and "SIGTERM" in stopped.detail
        wait_for(lambda: engine.poll() is not None, what="the old record's engine to stop")
    finally:
        if engine.poll() is None:
            engine.kill()
        engine.wait()
