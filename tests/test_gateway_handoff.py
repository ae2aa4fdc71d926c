"""`reconciler gateway` (SPEC 13) with the real LiteLLM proxy (the pinned release, `litellm` on PATH)
and real engines: tests/apply_support/chat_engine.py, a stdlib server speaking the chat API (streamed
or not) with its load on /metrics, run by `apply` on this machine (`transport: local`).

A client sends requests through the gateway the whole time, half of them streamed, each client on
one keep-alive connection; across a scale 2 -> 3 and 3 -> 1 (each a new litellm.yaml that the gateway
takes over live) no request is refused, fails or is cut. A copy is stopped only once the gateway
says it serves without it (status/gateway/served.json). A file LiteLLM cannot start on is refused:
the old one keeps serving, and the copies it would let go are kept, the reason in their status.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.apply_support.local import stop_group
from tests.conftest import REPO, run_cli
from tests.gateway_traffic import Traffic
from tests.gitcatalog import wait_for
from tests.test_daemon_e2e import E2E, fleet_yaml

pytestmark = [pytest.mark.process, pytest.mark.external]

CHAT_ENGINE = Path(__file__).resolve().parent / "apply_support" / "chat_engine.py"
KEY = "sk-test-gateway-handoff"
SERVED = "chat"


def chat_model(replicas: int, port: int, marker: str, *, drain_s: float = 60, rev: str = "1") -> str:
    """The chat model; another `rev` is another spec (its environment): every replica is replaced."""
    doc = {
        "name": "chat", "source": "chat-weights", "served_name": SERVED, "replicas": replicas,
        "spread": "preferred", "drain_s": drain_s,
        "profiles": [{
            "name": "cpu", "engine": "command", "port": port,
            "command": [sys.executable, str(CHAT_ENGINE), "--host", "127.0.0.1", "--port", "${PORT}",
                        "--chunks", "6", "--chunk-s", "0.05"],
            "metrics": {"waiting": "chat:requests_waiting", "running": "chat:requests_running"},
            "env": {"E2E_MARKER": marker, "CHAT_REV": rev}, "health_path": "/health", "start_timeout_s": 30,
        }],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def litellm_program() -> str:
    path = os.environ.get("LLMFLEET_LITELLM") or shutil.which("litellm")
    if not path:
        pytest.skip("litellm is not installed (pip install 'litellm[proxy]==1.106.12', the test extra)")
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProcess:
    """`reconciler gateway` as a person runs it; stopped by pid, and the LiteLLM processes it named
    in its log stopped by pid too should it not have stopped them itself."""

    def __init__(self, root: Path, workdir: Path, extra: list[str] = (), litellm: str | None = None):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = workdir / "gateway.log"
        env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_MASTER_KEY": KEY, "LLMFLEET_LITELLM": litellm or litellm_program(),
               # no network here: LiteLLM's price list from its package, not three tries at GitHub
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        argv = [sys.executable, "-m", "reconciler", "gateway", str(root), "--address", self.address]
        if extra:
            argv += ["--", *extra]
        self.proc = subprocess.Popen(argv, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.root = root

    def served(self) -> dict:
        try:
            return json.loads((self.root / "status" / "gateway" / "served.json").read_text())
        except (OSError, ValueError):
            return {}

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def litellm_pids(self) -> set[int]:
        import re

        return {int(m) for m in re.findall(r"starting LiteLLM \(pid (\d+)", self.text())}

    def stop(self) -> None:
        pids = self.litellm_pids()
        stop_group(self.proc, timeout=30)
        for pid in pids:  # what it should have stopped itself: never left behind
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


def bases(e2e: E2E) -> list[str]:
    doc = yaml.safe_load((e2e.repo.path / "status" / "gateway" / "litellm.yaml").read_text())
    return sorted(e["litellm_params"]["api_base"] for e in doc["model_list"])


def apply_until(e2e: E2E, replicas: int, env: dict, tries: int = 10) -> list[str]:
    """apply until `replicas` copies run (a copy still serving a request stays Draining for a later pass)."""
    outputs = []
    for _ in range(tries):
        out = run_cli("apply", str(e2e.repo.path), env=env, timeout=300)
        outputs.append(out.stdout + out.stderr)
        assert out.returncode == 0, out.stdout + out.stderr
        if len([k for k in e2e.records() if k.startswith("chat-")]) == replicas:
            return outputs
        time.sleep(1)
    raise AssertionError("\n".join(outputs))


@pytest.fixture
def e2e(tmp_path):
    env = E2E(tmp_path)
    env.repo.write("fleet.yaml", "gateway: {settle_s: 1}\n" + fleet_yaml(env.state))
    yield env
    env.cleanup()


def test_reconciler_gateway_takes_each_new_file_live_and_no_request_is_refused_failed_or_cut(e2e):
    env = {"XDG_STATE_HOME": str(e2e.tmp / "xdg")}
    e2e.repo.write("models/chat.yaml", chat_model(2, e2e.port, e2e.marker))
    e2e.repo.commit("chat: 2")
    apply_until(e2e, 2, env)
    two = bases(e2e)
    gateway = GatewayProcess(e2e.repo.path, e2e.tmp)
    traffic = None
    try:
        wait_for(lambda: sorted(gateway.served().get("api_bases", ())) == two, 240,
                 "the gateway serving the first file:\n" + gateway.text()[-3000:], interval=0.5)
        traffic = Traffic(gateway.address, KEY, SERVED, clients=2).start()
        wait_for(lambda: traffic.ok >= 10, 120, "requests through the gateway", interval=0.2)

        e2e.repo.write("models/chat.yaml", chat_model(3, e2e.port, e2e.marker))
        e2e.repo.commit("chat: 3")
        apply_until(e2e, 3, env)
        three = bases(e2e)
        wait_for(lambda: sorted(gateway.served().get("api_bases", ())) == three, 240,
                 "the gateway serving 3:\n" + gateway.text()[-3000:], interval=0.5)
        served_before = traffic.ok
        wait_for(lambda: traffic.ok >= served_before + 10, 120, "requests on the new file", interval=0.2)

        e2e.repo.write("models/chat.yaml", chat_model(1, e2e.port, e2e.marker))
        e2e.repo.commit("chat: 1")
        outputs = apply_until(e2e, 1, env)
        one = bases(e2e)
        # The copies went only once the gateway said it served without them.
        assert sorted(gateway.served().get("api_bases", ())) == one
        said = "\n".join(outputs)
        assert "waiting for the gateway to serve without it" in said or "  wait  " in said, said
        served_before = traffic.ok
        wait_for(lambda: traffic.ok >= served_before + 10, 120, "requests after the scale down", interval=0.2)
    finally:
        if traffic is not None:
            traffic.stop()
        gateway.stop()
    assert traffic.failed == [] and traffic.cut == [], (traffic.failed[:5], traffic.cut[:5], gateway.text()[-3000:])
    assert traffic.sent >= 30 and traffic.streamed * 2 >= traffic.sent - 2
    assert not (e2e.repo.path / "status" / "gateway" / "served.json").exists()  # withdrawn on the way out
    assert all(not Path(f"/proc/{pid}").exists() for pid in gateway.litellm_pids())


def test_a_file_litellm_cannot_start_on_is_refused_and_the_copies_it_would_let_go_are_kept(e2e):
    env = {"XDG_STATE_HOME": str(e2e.tmp / "xdg")}
    e2e.repo.write("models/chat.yaml", chat_model(2, e2e.port, e2e.marker))
    e2e.repo.commit("chat: 2")
    apply_until(e2e, 2, env)
    two = bases(e2e)
    # The first LiteLLM is the real one; every later one fails at start (as a broken upgrade would).
    once, flag = e2e.tmp / "litellm-once", e2e.tmp / "litellm-started-once"
    once.write_text(f"#!/bin/sh\nif [ -e '{flag}' ]; then echo 'litellm: cannot start: broken install' >&2; exit 3; fi\n"
                    f"touch '{flag}'\nexec '{litellm_program()}' \"$@\"\n")
    once.chmod(0o755)
    gateway = GatewayProcess(e2e.repo.path, e2e.tmp, litellm=str(once))
    try:
        wait_for(lambda: sorted(gateway.served().get("api_bases", ())) == two, 240,
                 "the gateway serving the first file:\n" + gateway.text()[-3000:], interval=0.5)
        e2e.repo.write("models/chat.yaml", chat_model(1, e2e.port, e2e.marker))
        e2e.repo.commit("chat: 1")
        out = run_cli("apply", str(e2e.repo.path), env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        refused = wait_for(lambda: gateway.served().get("refused"), 120, "the new file refused:\n" + gateway.text())
        assert "exited with 3" in refused and "broken install" in refused, refused
        assert sorted(gateway.served()["api_bases"]) == two  # the old LiteLLM serves on
        out = run_cli("apply", str(e2e.repo.path), env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "chat-1.rank0" in e2e.records()  # kept: the gateway still routes to it
        status = yaml.safe_load((e2e.repo.path / "status" / "models" / "chat.yaml").read_text())
        [kept] = [r for r in status["replicas"] if r["id"] == "chat-1"]
        assert kept["phase"] == "Draining" and "did not take the new file" in kept["message"], kept
        assert "broken install" in kept["message"]
        assert "Traceback" not in gateway.text() and "Traceback" not in out.stderr
    finally:
        gateway.stop()


def test_reconciler_gateway_says_what_is_missing_without_a_traceback(tmp_path):
    (tmp_path / "fleet.yaml").write_text("nodes: []\n")
    env = {"LLMFLEET_LITELLM": "/bin/true"}
    no_key = run_cli("gateway", str(tmp_path), env={**env, "LITELLM_MASTER_KEY": ""})
    assert no_key.returncode == 2 and "LITELLM_MASTER_KEY is not set" in no_key.stderr, no_key.stderr
    ours = run_cli("gateway", str(tmp_path), "--", "--port", "5", env={**env, "LITELLM_MASTER_KEY": KEY})
    assert ours.returncode == 2 and "--port after --" in ours.stderr, ours.stderr
    nowhere = run_cli("gateway", str(tmp_path / "nope"), env={**env, "LITELLM_MASTER_KEY": KEY})
    assert nowhere.returncode == 1 and "no such catalog directory" in nowhere.stderr
    bad = run_cli("gateway", str(tmp_path), "--address", "localhost", env={**env, "LITELLM_MASTER_KEY": KEY})
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr
    assert not any("Traceback" in r.stderr for r in (no_key, ours, nowhere, bad))
