"""The CI, pre-commit and systemd examples call the reconciler with flags it really has."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
import yaml

from reconciler.cli import build_parser
from tests.conftest import copy_tracked

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def reconciler_commands(text: str) -> list[list[str]]:
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("run:").removeprefix("entry:").strip()
        if line.startswith(("reconciler ", "/usr/local/bin/reconciler ")) or "bin/reconciler run" in line:
            argv = shlex.split(line.split("reconciler", 1)[1])
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


@pytest.mark.parametrize("name", ["ci/pre-commit-config.yaml", "ci/.pre-commit-hooks.yaml"])
def test_pre_commit_hooks_run_validate_and_the_offline_plan(name):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
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


def test_the_pull_request_job_passes_when_everything_fits_and_fails_with_the_reasons_when_not(tmp_path, cli):
    import re

    catalog = tmp_path / "catalog"
    copy_tracked(EXAMPLES.parent / "catalog", catalog)
    (catalog / "models/deepseek-v3.yaml").unlink()  # the one model the bundled inventory cannot hold
    commands = reconciler_commands((EXAMPLES / "ci/github-actions.yml").read_text())
    assert [c[0] for c in commands] == ["validate", "plan"]

    validate, plan = (cli(*argv, cwd=catalog) for argv in commands)
    assert validate.returncode == 0, validate.stderr
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert (catalog / "status/models/qwen2.5-7b.yaml").exists()  # the predicted status, for the diff step

    model = catalog / "models/qwen2.5-7b.yaml"
    model.write_text(re.sub(r"(?m)^replicas: .*$", "replicas: 40", model.read_text()))
    plan = cli(*commands[1], cwd=catalog)
    assert plan.returncode == 1
    assert "could not be placed" in plan.stderr
    assert "qwen2.5-7b-" in plan.stdout and "too few free" in plan.stdout  # the reasons, in the job log
    assert "Traceback" not in plan.stderr + validate.stderr
