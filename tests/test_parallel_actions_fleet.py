"""The actions of a pass run at once, each under its node's own deadline (issue 13), on the namespaced fleet.

A node that stops answering between the probe and the act (its link cut) holds up the
action on it, and only that one: the start on a healthy node, which comes after it in
the plan (stops come first), is launched while the stop still waits on the cut node.
Ordering, not timing: the link comes back only once the start has been logged, so with
actions one after another the start could never come first. The pass's result still
lists the decisions in the plan's order.
"""

from __future__ import annotations

import threading

import yaml

from reconciler.catalog import load_catalog
from reconciler.record.memory import plan_remembering
from reconciler.control.reconcile import run_pass
from reconciler.observe.ssh import TransportPool
from tests.apply_support.cleanup import stop_every_rank
from tests.fleet import fleet  # noqa: F401
import pytest

pytestmark = [pytest.mark.fleet]

# Long enough that the stop on the cut node (connecting, then its command) cannot end on its own
# before the test restores the link.
COMMAND_TIMEOUT_S = 90


def vllm_model(name: str, role: str, records) -> dict:
    return {"name": name, "source": f"org/{name}", "profiles": [{
        "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "port": 8100, "start_timeout_s": 30,
        "node_selector": {"role": role}, "env": {"FAKE_ENGINE_RECORD_DIR": str(records)}}]}


def test_an_action_on_a_node_that_stopped_answering_does_not_hold_up_the_others(fleet, tmp_path):  # noqa: F811
    fleet.add_node("ok", gpus=["H100"], engines=["vllm"], labels={"role": "ok"})
    fleet.add_node("mute", gpus=["H100"], engines=["vllm"], labels={"role": "mute"})
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    doc = fleet.fleet_document(["ok", "mute"])
    doc["ssh"]["command_timeout_s"] = doc["ssh"]["connect_timeout_s"] = COMMAND_TIMEOUT_S
    doc["gateway"] = {"settle_s": 0}  # old-0's hand-off is done once the files without it are written
    (root / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    records = tmp_path / "engines"
    records.mkdir()
    (root / "models" / "old.yaml").write_text(yaml.safe_dump(vllm_model("old", "mute", records), sort_keys=False))

    seen: list[tuple[str, str, str, bool]] = []  # decisions as they were logged, in the order they came
    start_logged = threading.Event()

    def log(d) -> None:
        seen.append((d.replica, d.node, d.action, d.ok))
        if (d.replica, d.node, d.action) == ("new-0", "ok", "start"):
            start_logged.set()

    released = []

    cut: list[bool] = []

    def cut_once_planned(catalog, inventory, **kw):
        # Cut once the plan stops old-0 (its engine idle when the pass asked, so no drain to wait out):
        # the stop then meets a node that stopped answering, the start beside it must not wait on it.
        planned = plan_remembering(catalog, inventory, **kw)
        if any(a.replica == "old-0" and a.action == "stop" for a in planned.actions) and not cut:
            cut.append(True)
            fleet.cut("mute")

            def restore_once_started():
                released.append(start_logged.wait(COMMAND_TIMEOUT_S / 2))
                fleet.restore("mute")

            threading.Thread(target=restore_once_started, daemon=True).start()
        return planned

    with TransportPool() as pool:
        try:
            first = run_pass(load_catalog(root, with_revision=False), transports=pool, ready_wait_s=30)
            assert first.replicas["old-0"].phase == "Ready", first.decisions

            # `old` removed: old-0 leaves the gateway files and drains (SPEC 13: never stopped in that pass).
            (root / "models" / "old.yaml").unlink()
            draining = run_pass(load_catalog(root, with_revision=False), transports=pool, ready_wait_s=30,
                                history=first.memory)
            assert [d.replica for d in draining.memory.draining.values()] == ["old-0"], draining.decisions
            # The catalog now wants `new` on ok: stop old-0 on mute (handed off, idle), then start on ok.
            (root / "models" / "new.yaml").write_text(yaml.safe_dump(vllm_model("new", "ok", records), sort_keys=False))
            second = run_pass(load_catalog(root, with_revision=False), transports=pool, log=log, ready_wait_s=30,
                              planner=cut_once_planned, history=draining.memory)

            assert released == [True], seen  # the start was logged while mute's link was still down
            start = seen.index(("new-0", "ok", "start", True))
            stop = next((i for i, d in enumerate(seen) if d[:3] == ("old-0", "mute", "stop")), None)
            assert stop is not None, (seen, second.plan.actions, second.plan.waiting)
            assert start < stop, seen  # launched while the stop waited on the cut node
            # The result reads in the plan's order: the stop first, as the plan has it.
            acted = [(d.replica, d.node, d.action) for d in second.decisions if d.action in ("start", "stop")]
            assert acted == [("old-0", "mute", "stop"), ("new-0", "ok", "start")], second.decisions
            assert all(d.ok for d in second.decisions), second.decisions  # the stop went through once the link was back
            assert second.replicas["new-0"].phase == "Ready"
            assert "old-0" not in {r.id for n in second.inventory.nodes for r in n.replicas}
        finally:
            fleet.restore("mute")
            stop_every_rank(root)
