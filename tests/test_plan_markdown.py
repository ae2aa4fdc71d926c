"""`plan --format markdown`, the pull-request comment, against golden files.

The goldens are the comment a reviewer reads; a change to them is a change to what
every pull request shows, so it is reviewed as one (regenerate with
`UPDATE_GOLDEN=1 python3 -m pytest tests/test_plan_markdown.py`).
"""

from __future__ import annotations

import os
import re

import pytest
import yaml

from reconciler.commands.plan_markdown import MARKER, cell, code
from tests.conftest import REPO, copy_tracked

pytestmark = [pytest.mark.process]

GOLDEN = REPO / "tests" / "data" / "plan_markdown"
SNAPSHOT = REPO / "catalog" / "status" / "nodes.yaml"


def with_removed_model_and_stale_spec(snapshot: dict) -> dict:
    """A snapshot where a model deleted from the catalog still runs (stop) and one replica runs an old spec (replace)."""
    nodes = {n["id"]: n for n in snapshot["nodes"]}
    nodes["cpu-d1"]["replicas"] = [{"id": "old-model-0", "model": "old-model", "profile": "cpu", "rank": 0,
                                    "nnodes": 1, "gpus": [], "port": 8090, "spec_hash": "0ld", "pid": 4242}]
    nodes["h100-a2"]["replicas"][0]["spec_hash"] = "0ld"
    return snapshot


CASES = {
    "example-catalog": (lambda catalog: None, None),
    "qwen-40-replicas": (lambda catalog: (catalog / "models/qwen2.5-7b.yaml").write_text(
        re.sub(r"(?m)^replicas: .*$", "replicas: 40", (catalog / "models/qwen2.5-7b.yaml").read_text())), None),
    "stop-and-replace": (lambda catalog: None, with_removed_model_and_stale_spec),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_markdown_matches_its_golden_file(cli, tmp_path, name):
    edit_catalog, edit_snapshot = CASES[name]
    catalog = copy_tracked(REPO / "catalog", tmp_path / "catalog")  # not a git repository: no revision
    edit_catalog(catalog)
    snapshot = SNAPSHOT
    if edit_snapshot is not None:
        snapshot = tmp_path / "nodes.yaml"
        snapshot.write_text(yaml.safe_dump(edit_snapshot(yaml.safe_load(SNAPSHOT.read_text()))))
    r = cli("plan", str(catalog), "--inventory", str(snapshot), "--format", "markdown")
    assert r.returncode == 0, r.stderr
    golden = GOLDEN / f"{name}.md"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(r.stdout)
    assert r.stdout == golden.read_text()
    assert r.stdout.startswith(MARKER + "\n")
    assert "\x1b" not in r.stdout  # no terminal escapes, whatever the terminal


def test_a_value_cannot_break_the_table_or_inject_html_or_escapes():
    assert cell("a|b <script>x</script> \x1b[31mred") == "a\\|b &lt;script&gt;x&lt;/script&gt;  [31mred"
    assert code("qwen-0") == "`qwen-0`"
    assert code("a`b|c") == "a`b\\|c"


def test_markdown_with_fail_on_unplaced_still_prints_the_comment_and_exits_1(cli, tmp_path):
    catalog = copy_tracked(REPO / "catalog", tmp_path / "catalog")
    r = cli("plan", str(catalog), "--inventory", str(SNAPSHOT), "--format", "markdown", "--fail-on-unplaced")
    assert r.returncode == 1
    assert "<details><summary><code>deepseek-v3-0</code> cannot be placed" in r.stdout
    assert "1 replica could not be placed" in r.stderr and "Traceback" not in r.stderr
