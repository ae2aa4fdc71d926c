"""The node agent through LocalTransport: real processes, real ports, real records."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from reconciler.act.launcher import SshLauncher
from reconciler.observe.transport import LocalTransport
from tests.apply_support.local import (
    free_port,
    is_running,
    kill_recorded,
    tiny_launch,
    wait_for,
)
from reconciler.act.readiness import http_health

pytestmark = [pytest.mark.process]

RECORD_KEYS = {"id", "model", "profile", "rank", "nnodes", "spec_hash", "pid", "pgid", "start_time", "port",
               "gpus", "argv", "env_keys", "log", "managed_by"}


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    yield d
    kill_recorded(d)


@pytest.fixture
def launcher(state_dir):
    return SshLauncher({"n1": LocalTransport("n1")}, {"n1": str(state_dir)}, stop_grace_s=2.0)


def read_record(state_dir: Path, name: str) -> dict:
    return json.loads((state_dir / "replicas" / f"{name}.json").read_text())


def test_started_rank_runs_in_its_own_session_with_a_record_and_a_log(launcher, state_dir, tmp_path):
    port = free_port()
    outcome = launcher.start(tiny_launch("m-0", "n1", port, tmp_path / "rec.json"))
    assert outcome.ok, outcome.reason
    rec = read_record(state_dir, "m-0.rank0")
    assert RECORD_KEYS <= set(rec)
    assert rec["managed_by"] == "llm-reconciler" and rec["pid"] == outcome.pid == rec["pgid"]
    stat = Path(f"/proc/{rec['pid']}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    assert int(fields[2]) == rec["pid"] and int(fields[3]) == rec["pid"]  # own process group and session
    assert int(fields[19]) == rec["start_time"]
    wait_for(lambda: http_health("127.0.0.1", port, "/health")[0], what="health 200")
    assert "loading weights" in Path(rec["log"]).read_text()


def test_stop_takes_down_the_whole_process_group_and_removes_the_record(launcher, state_dir, tmp_path):
    port = free_port()
    record = tmp_path / "rec.json"
    assert launcher.start(tiny_launch("m-0", "n1", port, record, "--child")).ok
    seen = wait_for(lambda: record.exists() and json.loads(record.read_text()), what="engine record")
    engine, child = seen["pid"], seen["child"]
    assert is_running(engine) and is_running(child)
    outcome = launcher.stop("n1", "m-0")
    assert outcome.ok and "SIGTERM" in outcome.detail
    assert not is_running(engine) and not is_running(child)
    assert not (state_dir / "replicas" / "m-0.rank0.json").exists()
    assert launcher.ranks("n1") == []


def test_stop_escalates_to_sigkill_when_the_engine_ignores_sigterm(state_dir, tmp_path):
    launcher = SshLauncher({"n1": LocalTransport("n1")}, {"n1": str(state_dir)}, stop_grace_s=0.5)
    record = tmp_path / "rec.json"
    assert launcher.start(tiny_launch("m-0", "n1", free_port(), record, "--ignore-term")).ok
    pid = wait_for(lambda: record.exists() and json.loads(record.read_text()), what="engine record")["pid"]
    outcome = launcher.stop("n1", "m-0")
    assert outcome.ok and "SIGKILL" in outcome.detail
    assert not is_running(pid)


def test_stopping_a_rank_that_is_already_gone_succeeds(launcher, tmp_path):
    assert launcher.stop("n1", "never-started-0").ok
    assert launcher.start(tiny_launch("m-0", "n1", free_port(), tmp_path / "r.json", "--exit-after", "0")).ok
    wait_for(lambda: not launcher.ranks("n1")[0].alive, what="engine to exit")
    assert launcher.stop("n1", "m-0").ok
    assert launcher.ranks("n1") == []


def test_starting_a_running_rank_again_adopts_it_instead_of_launching_twice(launcher, state_dir, tmp_path):
    launch = tiny_launch("m-0", "n1", free_port(), tmp_path / "r.json")
    first = launcher.start(launch)
    second = launcher.start(launch)
    assert first.ok and second.ok and second.already_running
    assert second.pid == first.pid
    assert [r.pid for r in launcher.ranks("n1")] == [first.pid]


def test_a_running_rank_with_another_spec_is_not_silently_replaced(launcher, tmp_path):
    port = free_port()
    assert launcher.start(tiny_launch("m-0", "n1", port, tmp_path / "r.json")).ok
    other = launcher.start(tiny_launch("m-0", "n1", port, tmp_path / "r2.json", spec_hash="spec2"))
    assert not other.ok and "already runs here" in other.reason


def test_a_port_held_by_a_foreign_listener_fails_the_launch_naming_port_and_holder(launcher, state_dir, tmp_path):
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        outcome = launcher.start(tiny_launch("m-0", "n1", port, tmp_path / "r.json"))
    assert not outcome.ok
    assert f"port {port} is in use by pid {os.getpid()}" in outcome.reason
    assert outcome.port_in_use == port
    assert not (tmp_path / "r.json").exists()  # nothing was launched
    assert launcher.ranks("n1") == []


def test_a_killed_engine_is_seen_as_dead(launcher, tmp_path):
    port = free_port()
    outcome = launcher.start(tiny_launch("m-0", "n1", port, tmp_path / "r.json"))
    wait_for(lambda: http_health("127.0.0.1", port, "/health")[0], what="health 200")
    assert launcher.ranks("n1")[0].alive
    os.kill(outcome.pid, signal.SIGKILL)
    wait_for(lambda: not is_running(outcome.pid), what="engine to die")
    [rank] = launcher.ranks("n1", log_lines=5)
    assert not rank.alive
    assert any("loading weights" in line for line in rank.log_tail)


def test_a_reused_pid_is_neither_taken_for_the_engine_nor_signalled(launcher, state_dir, tmp_path):
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (state_dir / "replicas").mkdir(parents=True)
        fake = {"id": "m-0", "model": "m", "profile": "p", "rank": 0, "nnodes": 1, "spec_hash": "s",
                "pid": stranger.pid, "pgid": stranger.pid, "start_time": 1, "port": 1, "gpus": [], "argv": [],
                "env_keys": [], "log": "", "managed_by": "llm-reconciler"}
        (state_dir / "replicas" / "m-0.rank0.json").write_text(json.dumps(fake))
        assert [r.alive for r in launcher.ranks("n1")] == [False]
        outcome = launcher.stop("n1", "m-0")
        assert outcome.ok and "reused" in outcome.detail
        assert stranger.poll() is None  # the stranger was left alone
    finally:
        stranger.kill()
        stranger.wait()


HOSTILE = ["$(touch {m})", "`touch {m}`", "; touch {m}", "a\ntouch {m}", "'\"; touch {m} #", "&& touch {m} &"]


def test_hostile_strings_reach_the_engine_literally_and_run_nothing(launcher, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [h.format(m=marker) for h in HOSTILE]
    record = tmp_path / "r.json"
    launch = tiny_launch("m-0", "n1", free_port(), record, *hostile, env={"EVIL": hostile[0], "EVIL2": hostile[3]})
    assert launcher.start(launch).ok, "launch failed"
    seen = wait_for(lambda: record.exists() and json.loads(record.read_text()), what="engine record")
    assert seen["extra"] == hostile
    assert seen["env"]["EVIL"] == hostile[0] and seen["env"]["EVIL2"] == hostile[3]
    assert not marker.exists()


def test_a_missing_engine_binary_fails_with_the_reason_and_leaves_no_record(launcher, state_dir):
    from dataclasses import replace

    launch = replace(tiny_launch("m-0", "n1", free_port(), Path("/nonexistent")), argv=("no-such-engine-xyz", "serve"))
    outcome = launcher.start(launch)
    assert not outcome.ok and "no-such-engine-xyz" in outcome.reason
    assert launcher.ranks("n1") == []


def test_an_agent_without_python_on_the_node_is_a_transport_error_naming_the_node(state_dir):
    from reconciler.errors import TransportError

    launcher = SshLauncher({"n1": LocalTransport("n1")}, {"n1": str(state_dir)}, python="python3-missing-xyz")
    with pytest.raises(TransportError) as err:
        launcher.ranks("n1")
    assert err.value.node == "n1"


def test_two_reconcilers_starting_the_same_rank_at_once_launch_it_once(launcher, state_dir, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    launch = tiny_launch("m-0", "n1", free_port(), tmp_path / "r.json")
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda _: launcher.start(launch), range(4)))
    assert all(o.ok for o in outcomes)
    assert len({o.pid for o in outcomes}) == 1
    assert sum(not o.already_running for o in outcomes) == 1
    assert [r.pid for r in launcher.ranks("n1")] == [outcomes[0].pid]


class Recording:
    """A transport that records every argv it is asked to run, then runs it."""

    def __init__(self, inner):
        self.inner, self.node_id, self.argvs = inner, inner.node_id, []
        self.command_timeout_s = inner.command_timeout_s

    def run(self, argv, *, stdin=None, timeout=60.0):
        self.argvs.append(list(argv))
        return self.inner.run(argv, stdin=stdin, timeout=timeout)

    def close(self):
        pass


def test_no_catalog_value_reaches_a_node_command_line_where_ps_could_read_it(state_dir, tmp_path):
    spy = Recording(LocalTransport("n1"))
    launcher = SshLauncher({"n1": spy}, {"n1": str(state_dir)}, stop_grace_s=2)
    secret = "hf_SECRET_token_value"
    launch = tiny_launch("m-0", "n1", free_port(), tmp_path / "r.json", "--api-key", secret, env={"HF_TOKEN": secret})
    assert launcher.start(launch).ok
    launcher.ranks("n1", log_lines=3)
    assert launcher.stop("n1", "m-0").ok
    assert spy.argvs == [["python3", "-I", "-S", "-"]] * 3
    assert oct((state_dir / "replicas").stat().st_mode & 0o777) == "0o700"


def test_log_tail_of_a_restarted_rank_shows_only_its_latest_run(launcher, tmp_path):
    # The log is appended across starts; a Failed message quoting the previous run's lines
    # (a healthy server's access log) would hide why this start died.
    from dataclasses import replace
    import sys

    base = tiny_launch("m-0", "n1", free_port(), tmp_path / "r.json")
    for words in ("first run was fine", "second run crashed"):
        outcome = launcher.start(replace(base, argv=(sys.executable, "-c", f"print({words!r}, flush=True)")))
        assert outcome.ok, outcome.reason
        wait_for(lambda: not is_running(outcome.pid), what="the run to end")
    [rank] = launcher.ranks("n1", log_lines=5)
    assert not rank.alive
    assert "second run crashed" in rank.log_tail
    assert not any("first run" in line for line in rank.log_tail)


# --------------------------------------------------------------------------
# Ranks the head dials (llama.cpp's RPC servers): started only once they listen
# --------------------------------------------------------------------------

FAKE_RPC = Path(__file__).resolve().parent / "fakes" / "bin" / "ggml-rpc-server"


def rpc_launch(port: int, *extra: str, listen_timeout_s: float = 10.0):
    from reconciler.model import RankLaunch

    return RankLaunch(replica="g-0", model="g", profile="p", node="n1", rank=1, nnodes=2,
                      argv=(str(FAKE_RPC), "-H", "127.0.0.1", "-p", str(port), *extra), env={}, port=port, gpus=(),
                      spec_hash="s", health_path=None, listen_timeout_s=listen_timeout_s)


def test_a_listening_rank_is_started_only_once_its_port_accepts_connections(launcher):
    port = free_port()
    outcome = launcher.start(rpc_launch(port))
    assert outcome.ok, outcome.reason
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # listening by the time start answered: no wait, no retry


def test_an_rpc_server_that_exits_0_on_an_unknown_flag_is_a_failed_start_with_its_log(launcher, state_dir):
    outcome = launcher.start(rpc_launch(free_port(), "-m", "512"))
    assert not outcome.ok
    assert outcome.reason.startswith("exited at once (exit code 0) without listening on port")
    assert "error: unknown argument: -m" in outcome.reason
    assert launcher.ranks("n1") == []  # no record of a rank that never ran


def test_an_rpc_server_on_a_taken_port_is_a_failed_start_naming_the_port(launcher):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        # The agent's own port check sees a foreign listener first and names it.
        outcome = launcher.start(rpc_launch(port))
        assert not outcome.ok and f"port {port} is in use" in outcome.reason
    finally:
        holder.close()


def test_a_rank_that_never_listens_is_stopped_and_reported_after_the_bounded_wait(launcher, state_dir, tmp_path):
    from dataclasses import replace

    script = tmp_path / "silent.sh"
    pidfile = tmp_path / "pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\necho warming up\nexec sleep 60\n")
    script.chmod(0o755)
    launch = replace(rpc_launch(free_port(), listen_timeout_s=0.5), argv=(str(script),))
    outcome = launcher.start(launch)
    assert not outcome.ok
    assert outcome.reason.startswith(f"did not listen on port {launch.port} within 0.5s; last log lines: warming up")
    assert launcher.ranks("n1") == []
    assert not is_running(int(pidfile.read_text()))  # stopped, not left behind


def test_a_slurm_job_output_gives_each_rank_its_own_lines_and_the_job_s_own_to_all(launcher, tmp_path):
    # As `srun --label` writes it: Slurm numbers the tasks by its node order (task 0 runs rank 1 here),
    # the step runner's first line of each task says which rank it is.
    out = tmp_path / "llmrc.o.m-0.17.out"
    out.write_text(
        "0: --- llm-reconciler: starting rank 1 of m-0 on s1\n"
        "1: --- llm-reconciler: starting rank 0 of m-0 on s2\n"
        "1: INFO rendezvous listening on port 29500\n"
        "0: INFO joined head at 10.0.0.2:29500\n"
        "1: INFO worker rank 1 joined: 1: not a label\n"
    )
    head = launcher.job_output("n1", str(out), 0)
    assert head.exists and head.lines == ("INFO rendezvous listening on port 29500", "INFO worker rank 1 joined: 1: not a label")
    assert launcher.job_output("n1", str(out), 1).lines == ("INFO joined head at 10.0.0.2:29500",)
    assert launcher.job_output("n1", str(out), 0, lines=1).lines == ("INFO worker rank 1 joined: 1: not a label",)
    assert launcher.job_output("n1", str(out), 1, lines=0).lines == ()

    # Following: what was appended since, for that rank, whole lines only; srun's own lines belong to every rank.
    offset = launcher.job_output("n1", str(out), 1).offset
    with out.open("a") as f:
        f.write("1: INFO received signal 15\n0: INFO received signal 15, shutting down\n"
                "srun: error: s1: task 0: Exited with exit code 1\n0: half a li")
    follow = launcher.job_output("n1", str(out), 1, offset=offset)
    assert follow.lines == ("INFO received signal 15, shutting down", "srun: error: s1: task 0: Exited with exit code 1")
    assert launcher.job_output("n1", str(out), 1, offset=follow.offset).lines == ()
    assert not launcher.job_output("n1", str(tmp_path / "llmrc.o.m-0.18.out"), 0).exists
