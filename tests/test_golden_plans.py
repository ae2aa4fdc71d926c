"""Golden plans: the whole output of `plan` (actions, rejections, summaries, text) on generated fleets.

Written once from the code as it was before rejections became typed values and
placement was made faster; placement's rules and messages must not change under
either, so any difference here is a regression (or, if intended, a change that
regenerates the files on purpose: REGENERATE_GOLDEN=1 python3 -m pytest tests/test_golden_plans.py).

The inputs come from bench/placement.py's generators with fixed seeds: a mixed
fleet of single-node, multi-node and CPU models, and the fallback case (every
model with two or three profiles in falling priority, most needing disk).
"""

from __future__ import annotations

import json
import os
import sys

import orjson
import pytest

from reconciler.catalog import build_fleet, build_model
from reconciler.commands.plan import plan_document, render_text
from reconciler.observe.inventory import inventory_from_document
from reconciler.model import Catalog
from reconciler.decide.placement import summarize
from reconciler.decide.plan import plan
from reconciler.record.status.documents import model_status_document
from reconciler.record.status.predict import predicted_pass
from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from bench.placement import generate, generate_fallback  # noqa: E402

GOLDEN = REPO / "tests" / "data" / "golden"

CASES = {
    # name: (generator, explain: models whose placed replicas keep the rejections of skipped profiles)
    "mixed-150": (lambda: generate(150, 400), ("m000", "m150", "zz-huge")),
    "fallback-150": (lambda: generate_fallback(150, 600, 12), ("f000", "f001", "f004")),
}


def _catalog(fleet_doc, models) -> Catalog:
    built = sorted((build_model(doc, f"models/{name}") for name, doc in models.items()), key=lambda m: m.name)
    return Catalog(root="<generated>", fleet=build_fleet(fleet_doc), models=tuple(built))


def _outputs(case: str) -> dict:
    gen, explain = CASES[case]
    fleet_doc, models, snapshot = gen()
    catalog = _catalog(fleet_doc, models)
    inventory = inventory_from_document(snapshot)
    pl = plan(catalog, inventory, now=0.0, explain=explain)
    explained = {rid: {"placed": o.placement is not None,
                       "rejections": [[r.profile, r.pool, r.node, r.reason] for r in o.rejections],
                       "summary": summarize(o.rejections, len(catalog.fleet.nodes), True)}
                 for rid, o in list((rid, o) for rid, o in pl.outcomes.items() if o.model in explain and o.rejections)[:6]}
    return {
        "plan": json.loads(orjson.dumps(plan_document(pl))),  # as `plan --format json` writes it
        "plan_all": [u.get("summary") for u in plan_document(pl, show_all=True)["unplaced"]],
        "text": render_text(pl).splitlines(),
        "explained": explained,
        "status": [model_status_document(m, predicted_pass(catalog, pl), catalog.fleet) for m in catalog.models
                   if m.name in explain],
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_output_is_unchanged(case):
    path = GOLDEN / f"{case}.json"
    got = _outputs(case)
    if os.environ.get("REGENERATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    for key in sorted(want):
        assert got[key] == want[key], f"{case}: {key} differs from {path.name}"
    assert sorted(got) == sorted(want)
