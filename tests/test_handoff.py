"""SPEC 13's hand-off, as the pass decides it: a copy the reconciler stops leaves every gateway file
first, and stops only once the gateway serves without it (what `reconciler gateway` says it serves,
or gateway.settle_s for a gateway the user runs) and its engine runs no request; it drains by the
metrics it was started with; a removed model's status file stays while its copies drain."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.record.gateway import SERVED_STALE_S, Served, handoff, litellm_api_bases
from reconciler.record.memory import (
    DRAIN_RECHECK_S, PassMemory, next_drain_check, plan_remembering, remember, started_with_after, with_out_at,
)
from reconciler.record.memory_document import memory_from_document, memory_to_document
from reconciler.model import Fleet, NodeSpec, ProfileMetrics, spec_hash
from reconciler.decide.outcomes import PassResult, ReplicaState, StartedWith, copy_key
from reconciler.decide.plan_values import Drain
from reconciler.control.reconcile import stoppable_drains, wait_for_handoffs, with_drain_loads, with_handoffs
from reconciler.record.status.gateway_files import read_served, write_served
from reconciler.record.status.write import write_pass
from reconciler.vocabulary import NodeState, Phase, WaitKind
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank
from tests.test_catalog import FLEET, MODEL, problems_of, write_catalog
from tests.test_drain import metrics_server

API = "http://127.0.0.1:8002/v1"


def served(*bases: str, alive_at: float = 1000.0, refused: str = "") -> Served:
    return Served("ab" * 32, tuple(bases), since=990.0, alive_at=alive_at, pid=4242, refused=refused)


# --------------------------------------------------------------------------
# gateway.handoff: the gateway's word, or settle_s
# --------------------------------------------------------------------------


@pytest.mark.parametrize("out_at, report, now, done, said", [
    (None, None, 5000.0, False, "not written yet"),  # the pass that began it has not written the files
    (1000.0, None, 1004.9, False, "gateway.settle_s (5 s)"),
    (1000.0, None, 1005.0, True, ""),
    (1000.0, served(API), 1001.0, False, "still serves it"),  # reconciler gateway: settle_s does not count
    (1000.0, served(API, alive_at=5000.0), 5000.0 + SERVED_STALE_S, False, "still serves it"),  # however long
    (1000.0, served(API, refused="litellm exited with 1"), 1001.0, False, "did not take the new file: litellm exited"),
    (1000.0, served("http://127.0.0.1:8000/v1"), 1000.5, True, ""),  # it serves without it: at once
    (1000.0, served(API, alive_at=1000.0), 1000.0 + SERVED_STALE_S + 1, True, ""),  # a gateway gone: settle_s
])
def test_a_copy_is_handed_off_once_the_gateway_serves_without_it_or_settle_s_has_passed(out_at, report, now, done, said):
    answer, why = handoff(out_at, API, now, 5.0, report)
    assert answer is done and said in why


def test_the_api_bases_of_a_litellm_config_are_what_the_gateway_may_send_to():
    doc = {"model_list": [{"litellm_params": {"api_base": "http://b/v1"}}, {"litellm_params": {"api_base": "http://a/v1"}},
                          {"litellm_params": {}}, "junk"]}
    assert litellm_api_bases(doc) == ("http://a/v1", "http://b/v1")
    assert litellm_api_bases(None) == () and litellm_api_bases({"model_list": 3}) == ()


def test_the_gateways_report_reads_back_and_a_foreign_file_reads_as_none(tmp_path):
    report = served(API)
    write_served(tmp_path, report)
    again = read_served(tmp_path)
    assert dataclasses.replace(again, alive_at=report.alive_at) == report
    assert again.alive_at > report.alive_at  # the file's mtime: the gateway touches it while it runs
    (tmp_path / "status" / "gateway" / "served.json").write_text('{"sha256": 3}')
    assert read_served(tmp_path) is None


# --------------------------------------------------------------------------
# The plan: an idle copy is never stopped in the pass that takes it out of the files
# --------------------------------------------------------------------------

P = profile("p", gpus_per_node=2)


def scaled_down(drain_s=10.0):
    m = dataclasses.replace(model("m", P, replicas=2), drain_s=drain_s)
    h = spec_hash(m, P)
    ranks = [rank(f"m-{i}", "m", "p", gpus=(2 * i, 2 * i + 1), port=8000 + i, spec_hash=h) for i in range(3)]
    spec = NodeSpec(id="a", address="127.0.0.1", data_address="127.0.0.1")
    return catalog(Fleet(nodes=(spec,), gateway_settle_s=5.0), m), inventory(observed("a", gpu=gpus(8), replicas=ranks))


def test_an_idle_copy_begun_draining_is_stopped_only_after_the_files_without_it_have_settled(tmp_path):
    cat, inv = scaled_down()
    cat = dataclasses.replace(cat, root=str(tmp_path))
    first = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert first.actions == () and [(w.replica, w.kind) for w in first.waiting] == [("m-2", WaitKind.DRAINING)]
    memory = remember(PassMemory(), first, inv, {}, 1000.0)
    # The engine is idle from the start: today's pass asked it and stopped it in the same pass.
    idle = dataclasses.replace(memory, draining={k: dataclasses.replace(d, running=0.0) for k, d in memory.draining.items()})
    judged = with_handoffs(cat, idle, 1000.0)  # before the files are written: out_at None
    assert [d.handed_off for d in judged.draining.values()] == [False]
    assert plan_remembering(cat, inv, now=1000.0, memory=judged).actions == ()
    written = with_out_at(idle, 1001.0)  # the pass wrote status/ at 1001
    assert [d.out_at for d in written.draining.values()] == [1001.0]
    assert with_out_at(written, 2000.0) == written  # stamped once
    early = with_handoffs(cat, written, 1003.0)
    assert plan_remembering(cat, inv, now=1003.0, memory=early).actions == ()
    [w] = plan_remembering(cat, inv, now=1003.0, memory=early).waiting
    assert "waiting for the gateway to serve without it" in w.reason and "settle_s (5 s)" in w.reason
    late = with_handoffs(cat, written, 1006.0)
    [stop] = plan_remembering(cat, inv, now=1006.0, memory=late).actions
    assert (stop.action, stop.replica) == ("stop", "m-2")


def test_reconciler_gateways_word_hands_off_before_settle_s_and_holds_a_copy_it_still_serves(tmp_path):
    cat, inv = scaled_down()
    cat = dataclasses.replace(cat, root=str(tmp_path))
    memory = with_out_at(remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0),
                         1000.0)
    memory = dataclasses.replace(memory, draining={k: dataclasses.replace(d, running=0.0) for k, d in memory.draining.items()})
    write_served(tmp_path, served(API, alive_at=1000.5, refused="litellm did not answer /health within 60 s"))
    kept = plan_remembering(cat, inv, now=1001.0, memory=with_handoffs(cat, memory, 1001.0))
    assert kept.actions == () and "did not take the new file: litellm did not answer /health" in kept.waiting[0].reason
    kept = plan_remembering(cat, inv, now=1020.0, memory=with_handoffs(cat, memory, 1020.0))
    assert kept.actions == ()  # past settle_s: the gateway's word is the one that counts
    write_served(tmp_path, served("http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1", alive_at=1001.0))
    [stop] = plan_remembering(cat, inv, now=1001.0, memory=with_handoffs(cat, memory, 1001.0)).actions
    assert stop.replica == "m-2"


def test_apply_waits_only_for_copies_that_may_stop_now_and_stops_waiting_at_settle_s(tmp_path):
    cat, inv = scaled_down()
    cat = dataclasses.replace(cat, root=str(tmp_path))
    memory = with_out_at(remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0),
                         1000.0)
    busy = dataclasses.replace(memory, draining={k: dataclasses.replace(d, running=2.0) for k, d in memory.draining.items()})
    assert stoppable_drains(busy) == []  # still running requests: left Draining for a later pass
    idle = dataclasses.replace(memory, draining={k: dataclasses.replace(d, running=0.0) for k, d in memory.draining.items()})
    assert stoppable_drains(idle) == ["m-2@a"]
    clock = [1000.0]
    slept: list[float] = []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    assert wait_for_handoffs(cat, idle, ["m-2@a"], clock=lambda: clock[0], sleep=sleep, poll_s=1.0, gateway_wait_s=0)
    assert clock[0] == 1005.0  # settle_s after the files were written, not a poll more
    write_served(tmp_path, served(API, alive_at=1e12))  # a gateway that never takes the change
    clock[0] = 1000.0
    assert not wait_for_handoffs(cat, idle, ["m-2@a"], clock=lambda: clock[0], sleep=sleep, poll_s=1.0,
                                 gateway_wait_s=30)
    assert clock[0] == 1030.0
    # One that says it refused the file on disk: no point waiting in this apply.
    text = b"model_list: []\n"
    (tmp_path / "status" / "gateway" / "litellm.yaml").write_bytes(text)
    import hashlib

    write_served(tmp_path, dataclasses.replace(served(API), refused_sha256=hashlib.sha256(text).hexdigest(),
                                               refused="LiteLLM exited with 3"))
    clock[0] = 1000.0
    assert not wait_for_handoffs(cat, idle, ["m-2@a"], clock=lambda: clock[0], sleep=sleep, poll_s=1.0,
                                 gateway_wait_s=30)
    assert clock[0] == 1000.0


def test_a_pending_hand_off_asks_for_a_pass_when_settle_s_ends():
    d = Drain("m-2", "m", ("a",), 8002, "vllm", 1000.0, 1600.0, out_at=1001.0)
    assert next_drain_check({d.key: d}, 1002.0, settle_s=3.0) == 1004.0
    assert next_drain_check({d.key: d}, 1002.0, settle_s=30.0) == 1002.0 + DRAIN_RECHECK_S
    done = dataclasses.replace(d, handed_off=True)
    assert next_drain_check({d.key: done}, 1002.0, settle_s=3.0) == 1002.0 + DRAIN_RECHECK_S


# --------------------------------------------------------------------------
# A copy drains by the metrics it was started with
# --------------------------------------------------------------------------

TINY = ProfileMetrics(waiting="tiny_requests_waiting", running="tiny_requests_running")


def test_what_a_copy_was_started_with_is_recorded_kept_and_forgotten_with_it():
    cmd = dataclasses.replace(profile("c", engine="command", gpu_class=None), metrics=TINY)
    cat = catalog(fleet(node_spec("a"), node_spec("b")), model("tiny", cmd))
    inv = inventory(observed("a", replicas=[rank("tiny-0", "tiny", "c", port=9000), rank("tiny-0", "tiny", "c", r=1, port=9001)]),
                    observed("b", replicas=[rank("gone-0", "gone", "x", port=9100)]))
    first = started_with_after(cat, inv, {})
    assert first == {copy_key("tiny-0", "a", 9000): StartedWith("command", TINY, 10.0)}  # heads only; an unknown model: nothing
    removed = catalog(fleet(node_spec("a"), node_spec("b")))
    assert started_with_after(removed, inv, first) == first  # the model removed: what it was started with stays
    assert started_with_after(removed, inventory(observed("a"), observed("b")), first) == {}  # stopped: forgotten
    away = inventory(observed("a", state=NodeState.UNREACHABLE), observed("b"))
    assert started_with_after(removed, away, first) == first  # a node that does not answer: kept
    memory = PassMemory(started_with=first, draining={"x": Drain("tiny-0", "tiny", ("a",), 9000, "command", 1.0, 2.0,
                                                                   out_at=1.5)})
    again = memory_from_document(memory_to_document(memory))
    assert again.started_with == first and again.draining == memory.draining
    # Its model removed, the copy drains for the drain_s it was started with, not a default.
    long = {k: dataclasses.replace(v, drain_s=120.0) for k, v in first.items()}
    p = plan_remembering(removed, inv, now=1000.0, memory=PassMemory(started_with=long))
    assert sorted((d.replica, d.until, d.engine) for d in p.draining.values()) == [
        ("gone-0", 1010.0, ""), ("tiny-0", 1120.0, "command")]  # gone-0: nothing recorded, the default


def test_a_removed_models_copy_drains_by_the_series_it_was_started_with():
    body = b"# TYPE tiny_requests_running gauge\ntiny_requests_running 0\ntiny_requests_waiting 0\n"
    _, port, close = metrics_server(body)
    try:
        cat = catalog(Fleet(nodes=(NodeSpec(id="a", address="127.0.0.1", data_address="127.0.0.1"),)))  # no model
        d = Drain("tiny-0", "tiny", ("a",), port, "command", 1000.0, 1010.0, profile="c")
        guessed = with_drain_loads(cat, PassMemory(draining={d.key: d}), timeout_s=2).draining[d.key]
        assert guessed.running is None  # every engine's own series tried: none is this one's
        recorded = PassMemory(draining={d.key: d}, started_with={copy_key("tiny-0", "a", port): StartedWith("command", TINY)})
        assert with_drain_loads(cat, recorded, timeout_s=2).draining[d.key].running == 0.0
    finally:
        close()


# --------------------------------------------------------------------------
# A removed model's status file stays while its copies drain
# --------------------------------------------------------------------------


def test_a_removed_models_status_file_stays_until_its_last_copy_has_stopped(tmp_path):
    cat = catalog(fleet(node_spec("a")), model("kept", P), root=str(tmp_path))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("gone-0", "gone", "p", gpus=(0, 1), port=8000)]))
    p = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert [(w.replica, w.kind) for w in p.waiting] == [("gone-0", WaitKind.DRAINING)]
    draining = ReplicaState("gone-0", "gone", "p", Phase.DRAINING, "draining (model removed from the catalog)")
    write_pass(cat, PassResult(None, inv, p, replicas={"gone-0": draining}))
    path = tmp_path / "status" / "models" / "gone.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["name"] == "gone" and doc["desired"] == 0
    assert [(r["id"], r["phase"]) for r in doc["replicas"]] == [("gone-0", "Draining")]
    write_pass(cat, PassResult(None, inventory(observed("a", gpu=gpus(8))), p, replicas={}))  # its last copy stopped
    assert not path.exists() and (tmp_path / "status" / "models" / "kept.yaml").exists()


# --------------------------------------------------------------------------
# fleet.yaml gateway.settle_s
# --------------------------------------------------------------------------


def test_gateway_settle_s_loads_and_defaults_to_5(tmp_path):
    assert load_catalog(write_catalog(tmp_path / "a", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
                        ).fleet.gateway_settle_s == 5.0
    cat = load_catalog(write_catalog(tmp_path / "b", {"fleet.yaml": "gateway: {settle_s: 2.5}\n" + FLEET,
                                                      "models/llama.yaml": MODEL}))
    assert cat.fleet.gateway_settle_s == 2.5


@pytest.mark.parametrize("text, where, said", [
    ("gateway: {settle_s: -1}\n", "fleet.yaml:1:21", "must be at least 0"),
    ("gateway:\n  settle_s: soon\n", "fleet.yaml:2:13", "expected a number"),
    ("gateway:\n  settle: 5\n", "fleet.yaml:2:3", "settle"),
    ("gateway: 5\n", "fleet.yaml:1:10", "expected a mapping"),
])
def test_a_bad_gateway_settle_s_is_an_error_at_its_line_and_column(tmp_path, text, where, said):
    problems = problems_of(write_catalog(tmp_path, {"fleet.yaml": text + FLEET, "models/llama.yaml": MODEL}))
    assert any(p.startswith(where) and said in p for p in problems), problems
