"""The CI, pre-commit and systemd examples call the reconciler with flags it really has."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
import yaml

from reconciler.cli import build_parser
from tests.conftest import copy_tracked

pytestmark = [pytest.mark.process]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def reconciler_commands(text: str) -> list[list[str]]:
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("run:").removeprefix("entry:").strip()
        if line.startswith(("reconciler ", "/usr/local/bin/reconciler ")) or "bin/reconciler run" in line:
            argv = shlex.split(line.split("reconciler", 1)[1])
            # The reconciler's own arguments: a shell redirection or pipe after them is the step's.
            argv = argv[:next((i for i, a in enumerate(argv) if a in (">", ">>", "|", "&&", "2>")), len(argv))]
            out.append(argv)
    return out


def parses(argv: list[str]) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on unknown flags
        pytest.fail(f"reconciler {' '.join(argv)} does not parse ({exc.code})")


def test_github_workflow_validates_and_plans_offline_failing_on_unplaced():
    text = (EXAMPLES / "ci/github-actions.yml").read_text()
    workflow = yaml.safe_load(text)
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the `on:` key as True
    commands = reconciler_commands(text)
    assert ["validate", "."] in commands
    plan = next(c for c in commands if c[0] == "plan")
    assert {"--inventory", "status/nodes.yaml", "--write-status", "--fail-on-unplaced"} <= set(plan)
    for argv in commands:
        parses(argv)


# pre-commit reads a remote repository's hooks from .pre-commit-hooks.yaml at its root, nowhere else.
@pytest.mark.parametrize("name", ["examples/ci/pre-commit-config.yaml", ".pre-commit-hooks.yaml"])
def test_pre_commit_hooks_run_validate_and_the_offline_plan(name):
    doc = yaml.safe_load((EXAMPLES.parent / name).read_text())
    hooks = doc[0:] if isinstance(doc, list) else doc["repos"][0]["hooks"]
    entries = [shlex.split(h["entry"]) for h in hooks]
    assert [e[1] for e in entries] == ["validate", "plan"]
    assert all(h["pass_filenames"] is False for h in hooks)
    for argv in entries:
        parses(argv[1:])


def test_systemd_unit_runs_the_daemon_and_keeps_engines_on_stop():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((EXAMPLES / "systemd/llm-reconciler.service").read_text().replace("\\\n", " "))
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])[1:]
    assert argv[0] == "run"
    parses(argv)
    assert service["KillMode"] == "process"
    assert "-HUP" in service["ExecReload"]
    # one connection per node stays open: the unit must not leave systemd's 1024 in force
    assert int(service["LimitNOFILE"]) >= 16384


class FakeGitHub:
    """GitHub's issue-comments REST API, the part the workflow calls, on loopback.

    The real one cannot be reached from a test; this answers the same paths with the
    same JSON shapes (list, create, edit), and keeps every request for the test to read.
    """

    def __init__(self):
        import http.server
        import json
        import threading

        self.comments: list[dict] = [{"id": 1, "body": "LGTM, but check the GPUs", "user": {"login": "a-person"}}]
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code: int, doc) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def do_GET(self):
                fake.requests.append(("GET", self.path))
                self._answer(200, fake.comments if self.path.startswith("/repos/o/r/issues/7/comments") else [])

            def do_POST(self):
                fake.requests.append(("POST", self.path))
                assert self.path == "/repos/o/r/issues/7/comments", self.path
                comment = {"id": len(fake.comments) + 100, "body": self._body()["body"], "user": {"login": "github-actions[bot]"}}
                fake.comments.append(comment)
                self._answer(201, comment)

            def do_PATCH(self):
                fake.requests.append(("PATCH", self.path))
                comment = next(c for c in fake.comments if self.path == f"/repos/o/r/issues/comments/{c['id']}")
                comment["body"] = self._body()["body"]
                self._answer(200, comment)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _step_runs(condition: str | None, failed: bool) -> bool:
    """The few `if:` expressions the workflow uses, evaluated as Actions does for a pull_request event."""
    if condition is None:
        return not failed  # success()
    known = {"always()": True, "always() && github.event_name == 'pull_request'": True}
    assert condition in known, f"the test does not know how to evaluate if: {condition}"
    return known[condition]


def run_workflow(catalog_repo: Path, work: Path, github: FakeGitHub) -> tuple[bool, dict[str, str]]:
    """Check out the pull request's head and run the job's `run:` steps as a runner does. (passed, log per step)"""
    import json
    import os
    import subprocess
    import sys

    work.mkdir()
    checkout = work / "checkout"
    subprocess.run(["git", "clone", "-q", str(catalog_repo), str(checkout)], check=True, timeout=60)  # actions/checkout
    tools = work / "bin"
    tools.mkdir()
    (tools / "reconciler").write_text(f"#!/bin/sh\nexec {sys.executable} -m reconciler \"$@\"\n")
    (tools / "reconciler").chmod(0o755)
    (work / "event.json").write_text(json.dumps({"pull_request": {"number": 7}}))
    (work / "runner-temp").mkdir()
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}", PYTHONPATH=str(EXAMPLES.parent),
               RUNNER_TEMP=str(work / "runner-temp"), GITHUB_API_URL=github.url, GITHUB_REPOSITORY="o/r",
               GITHUB_EVENT_PATH=str(work / "event.json"), GITHUB_EVENT_NAME="pull_request", GITHUB_TOKEN="t0ken")
    workflow = yaml.safe_load((EXAMPLES / "ci/github-actions.yml").read_text())
    failed, log = False, {}
    for step in workflow["jobs"]["plan"]["steps"]:
        if "run" not in step or step["name"] == "Install the reconciler":  # `uses:` steps; the tree is on PYTHONPATH
            continue
        if not _step_runs(step.get("if"), failed):
            continue
        # Actions runs a `run:` block as `bash --noprofile --norc -eo pipefail {0}`.
        script = work / "step.sh"
        script.write_text(step["run"])
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=checkout,
                              env=env, capture_output=True, text=True, timeout=300)
        log[step["name"]] = done.stdout + done.stderr
        failed = failed or done.returncode != 0
    return not failed, log


def test_the_pull_request_job_run_locally_passes_when_everything_fits_and_fails_with_the_reasons_when_not(tmp_path, cli):
    import re
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=repo,
                       check=True, capture_output=True, timeout=60)

    repo = copy_tracked(EXAMPLES.parent / "catalog", tmp_path / "catalog")
    (repo / "models/deepseek-v3.yaml").unlink()  # the one model the bundled inventory cannot hold
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "catalog")
    github = FakeGitHub()
    try:
        passed, log = run_workflow(repo, tmp_path / "push-1", github)
        assert passed, log
        # The predicted status files are new (untracked) in the checkout, and the diff shows them.
        assert "status/models/qwen2.5-7b.yaml" in log["Predicted status (what this pull request will change)"]
        assert "+  phase: Pending" in log["Predicted status (what this pull request will change)"]
        [comment] = [c for c in github.comments if c["user"]["login"] == "github-actions[bot]"]
        expected = cli("plan", str(repo), "--inventory", str(repo / "status/nodes.yaml"), "--format", "markdown").stdout
        assert comment["body"] == expected and expected.startswith("<!-- llm-reconciler plan -->")

        model = repo / "models/qwen2.5-7b.yaml"
        model.write_text(re.sub(r"(?m)^replicas: .*$", "replicas: 40", model.read_text()))
        git("commit", "-qam", "forty qwen replicas")
        passed, log = run_workflow(repo, tmp_path / "push-2", github)
        assert not passed
        plan_log = log["Plan against the last probed inventory"]
        assert "could not be placed" in plan_log
        assert "qwen2.5-7b-" in plan_log and "too few free" in plan_log  # the reasons, in the job log
        assert "Traceback" not in "".join(log.values())
        # Still one comment of ours, edited in place, now with the unplaced replicas; the person's comment untouched.
        ours = [c for c in github.comments if c["user"]["login"] == "github-actions[bot]"]
        assert len(ours) == 1 and "<summary><code>qwen2.5-7b-" in ours[0]["body"]
        assert github.comments[0]["body"] == "LGTM, but check the GPUs"
        assert [m for m, _ in github.requests].count("POST") == 1 and ("PATCH", f"/repos/o/r/issues/comments/{ours[0]['id']}") in github.requests
    finally:
        github.close()
