"""Canary rollouts with REAL llama.cpp (SPEC section 13): `reconciler apply` on the namespaced test fleet
(real OpenSSH, real llama-server, the real Gemma 3 270M), one model under three revisions:

  A  the stable spec, two replicas serving;
  B  a bad one: `--api-key` makes every chat request answer HTTP 401 while /health stays 200, so it
     starts and turns Ready as a broken quantization or chat template would: the request check catches
     it, the rollout aborts, the canary copy drains and stops, the stable copies serve on untouched
     (the canary surged beside gemma-0's old copy, which serves on: two Ready stable copies after the
     abort, as before it), and applying again does not try the aborted spec;
  B2 another bad one whose canary fails to start: aborted as well, the stable copies untouched;
  C  a good one: canary first (weighted in litellm.yaml, marked in status and endpoints.yaml), then
     promoted and Complete, every copy on the new spec and weighing the same.

Each `apply` is a fresh process: the rollout is carried in the memory file between runs, as the
daemon carries it across restarts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fleet import TestFleet
from tests.openai_clients import chat
from tests.real_llama import gemma_model, llama_bin

pytestmark = [pytest.mark.fleet, pytest.mark.real_engine]

REPO = Path(__file__).resolve().parent.parent
PORT = 8080
STABLE_ARGS = ["-c", "512", "-np", "1"]
ROLLOUT = {
    "canary": {"replicas": 1, "weight": 25, "analysis_s": 1},
    "checks": {"interval_s": 1, "failure_limit": 0, "request": {
        "body": {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0},
        "expect": {"status": 200, "matches": r"\w"}, "timeout_s": 120}},
}


@pytest.fixture(scope="module")
def fleet():
    bindir, cached = llama_bin(), gemma_model()
    f = TestFleet()
    try:
        for node in ("g1", "g2", "g3"):  # two replicas and room for a surge
            f.add_node(node, binaries={"llama-server": bindir / "llama-server"})
            (f.node(node).dir / "models" / cached.name).symlink_to(cached)
        yield f, cached
    finally:
        f.close()


def cli(root: Path, state: Path, command: str, *args: str) -> subprocess.CompletedProcess:
    """The reconciler's CLI on this catalog, with this test's memory (XDG_STATE_HOME) and this checkout's code."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    return subprocess.run([sys.executable, "-m", "reconciler", command, *args, str(root)], env=env,
                          capture_output=True, text=True, timeout=900)


def apply(root: Path, state: Path) -> subprocess.CompletedProcess:
    return cli(root, state, "apply")


def write_model(root: Path, source: str, args: list[str], **profile) -> None:
    doc = {"name": "gemma", "source": source, "replicas": 2, "drain_s": 5, "rollout": ROLLOUT,
           "profiles": [{"name": "cpu", "engine": "llama.cpp", "port": PORT, "start_timeout_s": 300, "args": args,
                         **profile}]}
    (root / "models" / "gemma.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def model_status(root: Path) -> dict:
    return yaml.safe_load((root / "status" / "models" / "gemma.yaml").read_text())


def litellm(root: Path) -> list[tuple[str, int | None]]:
    doc = yaml.safe_load((root / "status" / "gateway" / "litellm.yaml").read_text())
    return [(e["model_info"]["id"], e["litellm_params"].get("weight")) for e in doc["model_list"]]


def endpoint(status: dict, rid: str) -> str:
    [entry] = [r for r in status["replicas"] if r["id"] == rid]
    return entry["nodes"][0]["endpoint"]


def test_a_bad_revision_is_aborted_by_its_request_check_and_a_good_one_is_promoted(fleet, tmp_path):
    f, cached = fleet
    root, state = tmp_path / "catalog", tmp_path / "state"
    (root / "models").mkdir(parents=True)
    f.fleet_yaml(root, nodes=["g1", "g2", "g3"])
    source = f"{f.models_dir}/{cached.name}"

    # A: two stable copies.
    write_model(root, source, STABLE_ARGS)
    done = apply(root, state)
    assert done.returncode == 0, done.stdout + done.stderr
    status = model_status(root)
    assert [r["phase"] for r in status["replicas"]] == ["Ready", "Ready"], status
    assert "rollout" not in status  # a first start has nothing to roll out
    stable_url, stable0_url = endpoint(status, "gemma-1"), endpoint(status, "gemma-0")

    # B: every chat request answers 401. One pass starts the canary, measures it and aborts.
    write_model(root, source, STABLE_ARGS + ["--api-key", "sk-nobody-has-this"])
    done = apply(root, state)
    assert "Traceback" not in done.stderr, done.stderr
    rollout = model_status(root)["rollout"]
    assert rollout["state"] == "Aborted", (rollout, done.stdout)
    # The run that aborted it fails, as a failed start does: a pipeline applying a bad revision goes red.
    assert done.returncode == 1 and "Aborted: request: 2 of 2 failed" in done.stdout, (done.returncode, done.stdout,
                                                                                      done.stderr)
    assert rollout["reason"].startswith("request: 2 of 2 failed: HTTP 401"), rollout
    assert rollout["checks"][0]["failed"] == 1
    # Out of the gateway files in the pass that aborted it; only the stable copies are listed, gemma-0's
    # old copy among them (the canary surged beside it and it served on, with the stable share).
    assert sorted(litellm(root)) == [("gemma-0", None), ("gemma-1", None)]

    # Applying again stops the canary (drained) and does not try the aborted spec: the stable copy
    # serves on, on the old spec, and status/catalog.yaml names the model.
    # Its engine answers /metrics with 401 too, so its drain ends at drain_s (5 s): a pass or two.
    for _ in range(6):
        done = apply(root, state)
        assert done.returncode == 0, done.stdout + done.stderr
        status = model_status(root)
        phases = {r["id"]: r["phase"] for r in status["replicas"]}
        if phases.get("gemma-0") != "Draining":
            break
        time.sleep(2)
    # The model's full count serves on the old spec: its stable Ready copies equal its replicas.
    assert phases == {"gemma-0": "Ready", "gemma-1": "Ready"}, status
    assert status["ready"] == status["desired"] == 2, status
    assert (endpoint(status, "gemma-0"), endpoint(status, "gemma-1")) == (stable0_url, stable_url)
    for url in (stable0_url, stable_url):
        assert chat(url, max_tokens=2)["choices"], "a stable copy stopped serving"
    catalog_status = yaml.safe_load((root / "status" / "catalog.yaml").read_text())
    assert catalog_status["out_of_sync"][0].startswith("gemma: rollout of revision"), catalog_status
    assert litellm(root) == [("gemma-0", None), ("gemma-1", None)]
    again = apply(root, state)
    assert "start" not in [line.split()[2] for line in again.stdout.splitlines() if len(line.split()) > 2]

    # B2: a canary that fails to start (a LoRA adapter that is not there: llama-server exits) aborts too.
    write_model(root, source, STABLE_ARGS + ["--lora", "/nonexistent/adapter.gguf"])
    for _ in range(4):
        done = apply(root, state)
        assert "Traceback" not in done.stderr, done.stderr
        if model_status(root)["rollout"]["state"] == "Aborted":
            break
    rollout = model_status(root)["rollout"]
    assert rollout["state"] == "Aborted" and rollout["reason"].startswith("canary gemma-0 failed"), rollout
    assert endpoint(model_status(root), "gemma-1") == stable_url
    # gemma-0's old copy ran on beside the canary that failed: still in the gateway, where it was.
    assert litellm(root) == [("gemma-0", None), ("gemma-1", None)]
    doc = yaml.safe_load((root / "status" / "gateway" / "litellm.yaml").read_text())
    assert doc["model_list"][0]["litellm_params"]["api_base"] == stable0_url + "/v1", doc

    # C: a good revision. Its canary serves 25 % of the gateway's requests while it is checked.
    write_model(root, source, ["-c", "640", "-np", "1"])
    done = apply(root, state)
    assert done.returncode == 0, done.stdout + done.stderr
    status = model_status(root)
    # analysis_s counts from the pass that found the canary Ready: it cannot promote in that pass.
    assert status["rollout"]["state"] == "Progressing", status["rollout"]
    assert [r.get("canary", False) for r in status["replicas"]] == [True, False]
    # gemma-0's old copy serves on beside its canary: two stable entries, 25 % to the canary together.
    assert sorted(litellm(root)) == [("gemma-0", 3), ("gemma-0/canary", 2), ("gemma-1", 3)]
    ends = yaml.safe_load((root / "status" / "endpoints.yaml").read_text())
    assert ends["canary"] == {"gemma": [endpoint(status, "gemma-0")]}
    assert endpoint(status, "gemma-1") == stable_url  # the old copy serves on beside its canary
    assert chat(stable0_url, max_tokens=2)["choices"], "gemma-0's old copy stopped serving during Progressing"
    # status, explain and the pull-request comment say the same.
    shown = cli(root, state, "status").stdout
    assert "gemma: rollout Progressing (canary weight 25%)" in shown and "canary copy" in shown
    explained = cli(root, state, "explain", "gemma").stdout
    assert "rollout gemma: Progressing, canary weight 25%" in explained and "checks: request 1 passed" in explained
    comment = cli(root, state, "plan", "--format", "markdown").stdout
    assert "| `gemma` | Progressing" in comment and "| 25% |" in comment
    assert status["rollout"]["checks"][0]["passed"] >= 1 and status["rollout"]["checks"][0]["failed"] == 0
    for _ in range(5):  # promotion replaces the old copy as section 7 does; a pass or two
        if model_status(root)["rollout"]["state"] == "Complete":
            break
        done = apply(root, state)
        assert done.returncode == 0, done.stdout + done.stderr
    status = model_status(root)
    assert status["rollout"]["state"] == "Complete", status["rollout"]
    assert [r["phase"] for r in status["replicas"]] == ["Ready", "Ready"]
    assert litellm(root) == [("gemma-0", None), ("gemma-1", None)]  # all weigh the same again
    assert "out_of_sync" not in yaml.safe_load((root / "status" / "catalog.yaml").read_text())
    for rid in ("gemma-0", "gemma-1"):
        assert chat(endpoint(status, rid), max_tokens=2)["choices"]


def test_an_in_place_canary_aborted_gives_its_replica_back_on_the_old_spec_from_git(tmp_path):
    """No room to surge (two nodes, two replicas): the canary replaces gemma-0 in place. After the abort
    gemma-0 starts again on the model as the rollout's from_revision held it, read from the catalog's git
    repository: the model serves both its replicas on the old spec again (a chat answers, where the
    aborted spec's `--api-key` answers 401)."""
    from tests.gitcatalog import git

    bindir, cached = llama_bin(), gemma_model()
    f = TestFleet()
    try:
        for node in ("h1", "h2"):
            f.add_node(node, binaries={"llama-server": bindir / "llama-server"})
            (f.node(node).dir / "models" / cached.name).symlink_to(cached)
        root, state = tmp_path / "catalog", tmp_path / "state"
        (root / "models").mkdir(parents=True)
        f.fleet_yaml(root, nodes=["h1", "h2"])
        source = f"{f.models_dir}/{cached.name}"
        git(root, "init", "-q", "-b", "main")
        git(root, "config", "user.email", "person@example.com")
        git(root, "config", "user.name", "A Person")
        (root / ".gitignore").write_text("status/\n")

        write_model(root, source, STABLE_ARGS)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "A: stable")
        done = apply(root, state)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [r["phase"] for r in model_status(root)["replicas"]] == ["Ready", "Ready"]

        write_model(root, source, STABLE_ARGS + ["--api-key", "sk-nobody-has-this"])
        git(root, "commit", "-q", "-am", "B: bad")
        done = apply(root, state)
        assert "Traceback" not in done.stderr, done.stderr
        assert model_status(root)["rollout"]["state"] == "Aborted", (model_status(root), done.stdout)

        # The canary drains and stops (drain_s 5 s), then gemma-0 starts again on A's spec.
        for _ in range(8):
            done = apply(root, state)
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
            status = model_status(root)
            if [r["phase"] for r in status["replicas"]] == ["Ready", "Ready"]:
                break
            time.sleep(2)
        assert status["ready"] == status["desired"] == 2, (status, done.stdout)
        assert status["rollout"]["state"] == "Aborted"  # the aborted spec is not tried again
        for rid in ("gemma-0", "gemma-1"):
            assert chat(endpoint(status, rid), max_tokens=2)["choices"], f"{rid} does not run the old spec"
        assert litellm(root) == [("gemma-0", None), ("gemma-1", None)]
    finally:
        f.close()
