"""Autoscaling a real llama.cpp on the namespaced test fleet (SPEC section 11): the real daemon over
real OpenSSH, llama-server started with `--parallel 1 --metrics`, the real Gemma 3 270M model.

Bounded concurrent completions on the first replica (4 in flight on one slot: llama-server
reports requests_processing 1 and requests_deferred 3) make the daemon add replicas up to
`max` and not beyond; a manual `apply` in between changes nothing; when the load stops the
daemon removes them one at a time, highest ordinal first, down to `min`; the catalog is never
modified. Every request answers; where draining (SPEC section 10) is merged, a long request on
the replica being removed is drained, not cut.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from reconciler.engines.llamacpp import LlamaCppAdapter
from reconciler.model import Model
from tests.conftest import run_cli
from tests.fleet import TestFleet
from tests.gitcatalog import CatalogRepo, DaemonProcess, git, wait_for
from tests.openai_clients import Load, chat
from tests.real_llama import gemma_model, llama_bin

pytestmark = [pytest.mark.fleet, pytest.mark.real_engine]

NODES = ("s1", "s2", "s3")
METRICS_FLAG = [] if "--metrics" in LlamaCppAdapter.owned_flags else ["--metrics"]
# Draining (SPEC section 10) is the traffic branch's: where it is merged, the scale-down is seen drained.
DRAINS = hasattr(Model, "drain_s")
MAX = 2  # three nodes could hold three replicas: max, not room, is what stops the count


@pytest.fixture(scope="module")
def real():
    return llama_bin(), gemma_model()


@pytest.fixture(scope="module")
def fleet(real):
    bindir, model = real
    f = TestFleet()
    try:
        for n in NODES:
            f.add_node(n, binaries={"llama-server": bindir / "llama-server"})
            (f.node(n).dir / "models" / model.name).symlink_to(model)
        yield f
    finally:
        f.close()


def model_doc(source: str, marker: str) -> dict:
    return {**({"drain_s": 300} if DRAINS else {}),
        "name": "gemma",
        "source": source,
        "replicas": {"min": 1, "max": MAX},
        "autoscale": {"metric": "requests", "target": 1, "up_delay_s": 1, "down_delay_s": 3},
        "profiles": [{
            "name": "cpu", "engine": "llama.cpp", "port": 8080, "start_timeout_s": 180,
            # --metrics: /metrics on (once the reconciler sets it itself, as the traffic branch does, not here)
            "args": ["-c", "2048", "--parallel", "1", "-t", "1"] + METRICS_FLAG,
            "env": {"E2E_MARKER": marker},
        }],
    }


LONG_TOKENS = 1200


def long_completion(endpoint: str) -> dict:
    """A completion that generates exactly LONG_TOKENS tokens (EOS ignored): tens of seconds here."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": LONG_TOKENS, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(endpoint + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=400) as r:
        return json.load(r)


def busy(endpoint: str) -> bool:
    """llama-server's own word: a request is being processed."""
    try:
        text = urllib.request.urlopen(endpoint + "/metrics", timeout=5).read().decode()
    except OSError:
        return False
    return any(line.startswith("llamacpp:requests_processing") and float(line.split()[-1]) >= 1
               for line in text.splitlines())


def test_real_llama_cpp_scales_to_max_under_load_and_back_to_min(fleet, real, tmp_path):
    _, model = real
    marker = f"autoscale-{os.getpid()}"
    repo = CatalogRepo(tmp_path / "catalog", init=False)
    repo.path.mkdir()
    git(repo.path, "init", "-q", "-b", "main")
    git(repo.path, "config", "user.email", "person@example.com")
    git(repo.path, "config", "user.name", "A Person")
    fleet.fleet_yaml(repo.path)
    repo.write("models/gemma.yaml", yaml.safe_dump(model_doc(f"{fleet.models_dir}/{model.name}", marker),
                                                   sort_keys=False))
    repo.commit("gemma: 1-2 replicas, autoscaled on requests in flight")
    catalog_bytes = (repo.path / "models" / "gemma.yaml").read_bytes()
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

    def at(count: int, timeout: float = 240) -> dict:
        return wait_for(lambda: (s := status()) and s.get("desired") == count == s.get("ready") and s, timeout,
                        f"{count} Ready replicas of gemma:\n{daemon.logfile.read_text()[-4000:]}", interval=0.2)

    try:
        first = at(1)
        head = next(n for n in first["replicas"][0]["nodes"] if n["rank"] == 0)
        endpoint = head["endpoint"]
        load = Load(lambda: chat(endpoint, max_tokens=48, timeout=180), limit=200, join_s=240)
        up = at(MAX)
        assert up["autoscale"]["current"] == MAX and up["autoscale"]["wanted"] == MAX, up["autoscale"]
        assert [r["id"] for r in up["replicas"]] == ["gemma-0", "gemma-1"]
        assert len({r["nodes"][0]["node"] for r in up["replicas"]}) == MAX
        # A manual apply in between changes nothing: the daemon holds the catalog's lock
        applied = run_cli("apply", str(repo.path), env=env, timeout=600)
        assert applied.returncode == 1 and f"(pid {daemon.pid}) is already acting on" in applied.stderr, \
            applied.stdout + applied.stderr
        assert applied.stdout == ""
        assert status()["desired"] == MAX
        if DRAINS:
            # One long request on the replica about to go, before the load stops: the scale-down
            # drains it (out of the gateway files, waiting for it to end), never cuts it.
            last = next(n for n in up["replicas"][1]["nodes"] if n["rank"] == 0)["endpoint"]
            answer: list = []
            long = threading.Thread(target=lambda: answer.append(long_completion(last)))
            long.start()
            wait_for(lambda: busy(last), 60, "the long request running on gemma-1", interval=0.2)
        load.stop()
        assert load.errors == [] and load.answered == load.sent > 0, (load.errors, load.sent, load.answered)
        if DRAINS:
            wait_for(lambda: any(r["id"] == "gemma-1" and r["phase"] == "Draining"
                                 for r in status().get("replicas") or ()), 240,
                     f"gemma-1 Draining:\n{daemon.logfile.read_text()[-4000:]}", interval=0.2)
            long.join(timeout=400)
            assert answer and answer[0]["usage"]["completion_tokens"] == LONG_TOKENS, \
                f"the drained replica's request was cut: {answer}"
        wait_for(lambda: [r["id"] for r in status().get("replicas") or ()] == ["gemma-0"], 240,
                 f"gemma-1 stopped:\n{daemon.logfile.read_text()[-4000:]}", interval=0.2)
        down = at(1)
        assert [r["id"] for r in down["replicas"]] == ["gemma-0"]
        # the catalog is never modified: the count lives in status/ only
        assert (repo.path / "models" / "gemma.yaml").read_bytes() == catalog_bytes
        assert git(repo.path, "status", "--porcelain", "--", "models").strip() == ""
    finally:
        if load is not None:
            load.stop()
        daemon.stop()
        # Leave the nodes as found: no models, and apply stops what runs.
        for p in (repo.path / "models").glob("*.yaml"):
            p.unlink()
        run_cli("apply", str(repo.path), env=env, timeout=600)
    assert max(seen) == MAX and seen[seen.index(MAX):] == [MAX, 1], seen
    stops = [e["replica"] for e in daemon.events("decision") if e.get("action") == "stop"]
    assert stops == ["gemma-1"], stops
    metrics_answers = [e for e in daemon.events("decision") if e.get("action") == "metrics"]
    assert metrics_answers == [], f"a real llama-server's /metrics was not read: {metrics_answers}"
