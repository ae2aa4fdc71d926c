"""The gateway files read as they are by the real programs (SPEC section 10), on the namespaced fleet:

- a real LiteLLM proxy (`litellm --config <catalog>/status/gateway/litellm.yaml`) routes real chat
  completions to two real llama.cpp replicas, each serving some of them;
- a real Prometheus (Debian's package) whose file_sd_configs reads status/gateway/prometheus.json
  scrapes every Ready replica's llama-server /metrics, every target up;
- a long streaming completion on a replica that is scaled down completes in full, and the replica
  is stopped after it (Draining in between, out of every gateway file).

LiteLLM is found as LLMFLEET_LITELLM, else `litellm` on PATH (the test extra pins it); Prometheus as
LLMFLEET_PROMETHEUS, else /usr/bin/prometheus (scripts/test.sh installs it). Both run as children
of the test, on loopback ports, and are stopped by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.apply_support.local import is_running, stop_group
from tests.fleet import TestFleet
from tests.openai_clients import Stream
from tests.real_llama import gemma_model, llama_bin

pytestmark = [pytest.mark.fleet, pytest.mark.real_engine, pytest.mark.external]

REPO = Path(__file__).resolve().parent.parent
PORT = 8080
SERVED = "gemma-3-270m"
# LiteLLM's own key, from its environment as an operator gives it (releases from 1.10x refuse to start
# without one); never in the file the reconciler writes.
MASTER_KEY = "sk-test-gateway-key"
STREAM_TOKENS = 160  # long enough to outlast the passes that drain it on a loaded 2-core machine


def program(env: str, name: str, fallback: str | None = None) -> str:
    path = os.environ.get(env) or shutil.which(name) or fallback
    if not path or not Path(path).exists():
        pytest.skip(f"{name} is not installed (set {env}, or install it: see scripts/test.sh)")
    return path


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet():
    bindir, cached = llama_bin(), gemma_model()
    f = TestFleet()
    try:
        for node in ("g1", "g2"):
            f.add_node(node, binaries={"llama-server": bindir / "llama-server"})
            (f.node(node).dir / "models" / cached.name).symlink_to(cached)
        yield f, cached
    finally:
        f.close()


def apply(root: Path, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    return subprocess.run([sys.executable, "-m", "reconciler", "apply", str(root)], env=env,
                          capture_output=True, text=True, timeout=600)


def write_model(root: Path, source: str, replicas: int) -> None:
    doc = {"name": "gemma", "source": source, "served_name": SERVED, "replicas": replicas,
           "drain_s": 600,  # long: the drain must end because the stream ended, not at drain_s
           "profiles": [{"name": "cpu", "engine": "llama.cpp", "port": PORT, "start_timeout_s": 240,
                         "args": ["-c", "512", "-np", "1"]}]}
    (root / "models" / "gemma.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def replicas_in_status(root: Path) -> dict[str, dict]:
    doc = yaml.safe_load((root / "status" / "models" / "gemma.yaml").read_text())
    return {r["id"]: r for r in doc["replicas"]}


def litellm_ids(root: Path) -> list[str]:
    doc = yaml.safe_load((root / "status" / "gateway" / "litellm.yaml").read_text())
    return [e["model_info"]["id"] for e in doc["model_list"]]


def prometheus_replicas(root: Path) -> list[str]:
    return [g["labels"]["replica"] for g in json.loads((root / "status" / "gateway" / "prometheus.json").read_text())]


def get_json(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def wait_until(what: str, check, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what} not within {timeout:g} s (last: {last!r})")


class Child:
    """A program the test starts, stopped by its pid (and its process group) at the end."""

    def __init__(self, argv: list[str], log: Path, **kw):
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True, **kw)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        stop_group(self.proc, timeout=20)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def chat_via(base: str, max_tokens: int = 2) -> tuple[dict, str]:
    """One chat completion through LiteLLM; the answer and the deployment (model_info.id) that served it."""
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r), r.headers.get("x-litellm-model-id", "")


def pid_of(fleet: TestFleet, node: str, replica: str) -> int:
    [path] = (fleet.node(node).dir / "home" / ".local" / "state" / "llm-reconciler" / "replicas").glob(
        f"*{replica}.rank0.json")
    return json.loads(path.read_text())["pid"]


def test_litellm_and_prometheus_read_the_files_as_written_and_a_scale_down_never_cuts_a_stream(fleet, tmp_path):
    f, cached = fleet
    litellm, prometheus = program("LLMFLEET_LITELLM", "litellm"), program(
        "LLMFLEET_PROMETHEUS", "prometheus", "/usr/bin/prometheus")
    root, state = tmp_path / "catalog", tmp_path / "state"
    (root / "models").mkdir(parents=True)
    f.fleet_yaml(root)
    source = f"{f.models_dir}/{cached.name}"
    write_model(root, source, replicas=2)
    children: list[Child] = []
    try:
        done = apply(root, state)
        assert done.returncode == 0, done.stdout + done.stderr
        status = replicas_in_status(root)
        assert [status[r]["phase"] for r in ("gemma-0", "gemma-1")] == ["Ready", "Ready"], status
        assert litellm_ids(root) == ["gemma-0", "gemma-1"] and prometheus_replicas(root) == ["gemma-0", "gemma-1"]

        # Prometheus, reading the targets file as written.
        prom_port = free_loopback_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "llm-engines", "file_sd_configs": [
                {"files": [str(root / "status" / "gateway" / "prometheus.json")], "refresh_interval": "1s"}]}],
        }))
        children.append(Child([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log"))
        # LiteLLM, serving the config as written.
        lite_port = free_loopback_port()
        children.append(Child([litellm, "--config", str(root / "status" / "gateway" / "litellm.yaml"),
                               "--host", "127.0.0.1", "--port", str(lite_port)], tmp_path / "litellm.log",
                              cwd=tmp_path, env={**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": MASTER_KEY}))
        prom, lite = children
        targets_url = f"http://127.0.0.1:{prom_port}/api/v1/targets?state=active"

        def up_targets():
            active = get_json(targets_url)["data"]["activeTargets"]
            return sorted(t["labels"]["replica"] for t in active if t["health"] == "up") or None

        assert wait_until("both replicas up in Prometheus", lambda: up_targets() == ["gemma-0", "gemma-1"],
                          timeout=120), prom.tail()
        active = get_json(targets_url)["data"]["activeTargets"]
        assert {(t["labels"]["model"], t["labels"]["engine"], t["scrapeUrl"]) for t in active} == {
            ("gemma", "llama.cpp", f"http://{f.node(n).address}:{PORT}/metrics") for n in ("g1", "g2")}

        base = f"http://127.0.0.1:{lite_port}"
        def serving():
            assert lite.alive(), f"LiteLLM exited:\n{lite.tail()}"
            return get_json(base + "/health/liveliness") is not None

        wait_until("LiteLLM to serve", serving, timeout=300, every=2)
        served_by: dict[str, int] = {}
        for _ in range(16):  # LiteLLM picks a deployment at random: both within 16 is all but certain
            answer, deployment = chat_via(base)
            assert answer["choices"][0]["message"]["content"] is not None and answer["usage"]["completion_tokens"] > 0
            served_by[deployment] = served_by.get(deployment, 0) + 1
            if len(served_by) == 2:
                break
        assert sorted(served_by) == ["gemma-0", "gemma-1"], (served_by, lite.tail())

        # A long stream on gemma-1, then a scale down to one replica: gemma-1 drains.
        endpoint = next(n["endpoint"] for n in status["gemma-1"]["nodes"] if n["rank"] == 0)
        node = status["gemma-1"]["nodes"][0]["node"]
        pid = pid_of(f, node, "gemma-1")
        stream = Stream(endpoint, SERVED, STREAM_TOKENS, timeout=600)
        stream.start()
        assert stream.started.wait(300) and stream.error is None, stream.error
        write_model(root, source, replicas=1)
        first = apply(root, state)
        assert first.returncode == 0, first.stdout + first.stderr
        status = replicas_in_status(root)
        assert status["gemma-1"]["phase"] == "Draining", status["gemma-1"]
        assert litellm_ids(root) == ["gemma-0"] and prometheus_replicas(root) == ["gemma-0"]
        endpoints = yaml.safe_load((root / "status" / "endpoints.yaml").read_text())["models"]["gemma"]
        assert endpoint not in endpoints and len(endpoints) == 1
        assert is_running(pid) and stream.is_alive(), "the draining replica was stopped while its stream ran"

        passes = 0
        while "gemma-1" in replicas_in_status(root) and passes < 40:  # each pass stops it only once it is idle
            passes += 1
            if stream.is_alive():
                assert is_running(pid), "stopped mid-stream"
            later = apply(root, state)
            assert later.returncode == 0, later.stdout + later.stderr
            if stream.is_alive():
                time.sleep(2)
        stream.join(timeout=600)
        assert stream.error is None, f"the stream was cut: {stream.error!r}"
        assert stream.done and stream.finish_reason == "length" and stream.chunks >= STREAM_TOKENS - 2, vars(stream)
        assert "gemma-1" not in replicas_in_status(root) and not is_running(pid)
        assert wait_until("Prometheus to drop gemma-1", lambda: up_targets() == ["gemma-0"], timeout=60)
    finally:
        for child in children:
            child.stop()
        for p in (root / "models").glob("*.yaml"):
            p.unlink()
        apply(root, state)
