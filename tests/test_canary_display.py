"""A canary rollout as people read it (SPEC section 13): `plan` in text, JSON and the pull-request
comment, `status`, and the dashboard's models and overview pages each show its state, weight and
check figures. Fast tier: pure renderers and the dashboard through Starlette's TestClient."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.decide.canary import CanaryCopy, Measurement, advance
from reconciler.commands.plan import plan_document, render_text
from reconciler.commands.plan_markdown import render_markdown
from reconciler.commands.status import rollout_lines
from reconciler.commands._status_files import read_catalog_status
from reconciler.decide.plan import plan
from reconciler.record.status.files import dump_yaml
from tests.test_canary_plan import F, M, NEW, catalog, running

MEASURED = [Measurement("request", False, "request: 1 of 2 failed: HTTP 500")]


def progressing():
    return advance(M, None, old_copies=2, canaries=[CanaryCopy("m-0", "Ready")], measurements=MEASURED, now=100,
                   revision="b", from_revision="a")


def test_plan_says_a_new_spec_starts_its_canary_first_with_its_weight():
    text = render_text(plan(catalog(F, M), running("old", "old", "old")))
    assert "canary rollouts:" in text
    assert "m: Progressing, canary weight 10%" in text
    assert "next: a new spec: start the canary m-0 with 10% of the requests" in text


def test_plan_json_and_the_pr_comment_carry_state_weight_and_check_figures():
    pl = plan(catalog(F, M), running(NEW, "old", "old"), rollouts={"m": progressing()})
    [doc] = plan_document(pl)["rollouts"]
    assert (doc["state"], doc["weight"]) == ("Progressing", 10)
    assert doc["checks"] == [{"name": "request", "passed": 0, "failed": 1, "last": "request: 1 of 2 failed: HTTP 500"}]
    assert doc["next_step"].startswith("check the canary m-0 every 10 s")
    md = render_markdown(pl)
    assert "| Canary rollout | State | Weight | Checks | Next step |" in md
    assert "| `m` | Progressing" in md and "| 10% |" in md and "request 0 passed, 1 failed (request: 1 of 2 failed: HTTP 500)" in md


def test_a_plan_without_rollouts_keeps_its_json_shape():
    plain = replace(M, rollout=None)
    assert "rollouts" not in plan_document(plan(catalog(F, plain), running("old", "old", "old")))


def test_an_aborted_rollout_says_what_the_next_pass_does():
    r = replace(progressing(), state="Aborted", reason="request: 1 of 2 failed: HTTP 500 (2 failed measurements)")
    text = render_text(plan(catalog(F, M), running(NEW, "old", "old"), rollouts={"m": r}))
    assert "m: Aborted, canary weight 10%: request: 1 of 2 failed: HTTP 500" in text
    assert "next: stop the canary copies (drained); the old spec serves on" in text


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "catalog"
    (root / "status" / "models").mkdir(parents=True)
    (root / "status" / "catalog.yaml").write_text(dump_yaml({
        "last_attempted_revision": None, "last_applied_revision": None, "message": "applied", "errors": [],
        "warnings": [], "out_of_sync": ["m: rollout of revision b aborted: request: 2 of 2 failed: HTTP 401"]}))
    (root / "status" / "models" / "m.yaml").write_text(dump_yaml({
        "name": "m", "desired": 2, "ready": 2,
        "rollout": {"state": "Progressing", "revision": "b", "from_revision": "a", "since": "2026-12-05T07:00:00Z",
                    "weight": 25, "reason": "canary serving 25% of requests; checks must hold 30 s more",
                    "checks": [{"name": "request", "passed": 3, "failed": 0, "last": "request: 2 of 2 answered as expected"}]},
        "replicas": [{"id": "m-0", "phase": "Ready", "canary": True, "nodes": [], "message": "", "restarts": 0},
                     {"id": "m-1", "phase": "Ready", "nodes": [], "message": "", "restarts": 0}]}))
    return root


def test_status_lists_the_rollout_and_its_checks(tree):
    lines = rollout_lines(read_catalog_status(str(tree)))
    assert lines == ["m: rollout Progressing (canary weight 25%): canary serving 25% of requests; checks must hold 30 s more",
                     "  request: 3 passed, 0 failed; last: request: 2 of 2 answered as expected"]


def test_the_dashboard_shows_the_rollout_the_canary_copy_and_the_model_out_of_sync(tree):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from reconciler.dashboard.app import create_app

    client = TestClient(create_app(tree))
    models = client.get("/models").text
    assert 'data-state="Progressing"' in models and "canary weight 25%" in models
    assert "request: 3 passed, 0 failed; last: request: 2 of 2 answered as expected" in models
    assert '<span class="canary">canary</span>' in models
    overview = client.get("/").text
    assert "OutOfSync" in overview and "m: rollout of revision b aborted" in overview
