"""A node whose probe session answers what it answered last pass is not read again (an idle fleet's
pass at 10,000 nodes is mostly that); anything that could change the reading reads it again."""

from __future__ import annotations

import dataclasses
import json

import pytest

from reconciler.model import NodeSpec
from reconciler.observe.probe import collect
from reconciler.observe.probe.collect import session_request, warm_result
from reconciler.vocabulary import NodeState

REPORT = {"gpus": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559,
                    "memory_used_mb": 0}], "engines": {"vllm": "0.32.0"}, "memory_total_mb": 1 << 20}


@pytest.fixture
def reads(monkeypatch):
    """How many times a report was read (observed_from_report called)."""
    calls = []
    real = collect.observed_from_report
    monkeypatch.setattr(collect, "observed_from_report", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    monkeypatch.setattr(collect, "_LAST_ANSWER", {})
    return calls


def probe(spec: NodeSpec, report: dict, owner: str | None = None, now: float = 1.0):
    data = json.dumps(report).encode()
    return warm_result(spec, lambda: data, 10.0, 0.0, lambda: now, owner)


def test_the_same_answer_is_read_once_and_gives_the_same_node(reads):
    spec = NodeSpec("n1", "10.0.0.1", "10.0.0.1")
    first = probe(spec, REPORT)
    again = probe(spec, REPORT, now=2.5)
    assert len(reads) == 1
    assert again.node is first.node and again.node.gpus[0].gpu_class == "H100-80GB"
    assert again.seconds == 2.5  # this pass's own wait, not the last one's


def test_a_changed_answer_a_changed_entry_or_another_owner_is_read_again(reads):
    spec = NodeSpec("n1", "10.0.0.1", "10.0.0.1")
    probe(spec, REPORT)
    used = dict(REPORT, gpus=[dict(REPORT["gpus"][0], memory_used_mb=4096)])
    assert probe(spec, used).node.gpus[0].memory_used_mb == 4096
    cordoned = dataclasses.replace(spec, cordon_gpus=(0,))
    assert "cordoned in fleet.yaml" in probe(cordoned, used).node.gpus[0].health_reason
    probe(cordoned, used, owner="other")
    assert len(reads) == 4
    other_node = NodeSpec("n2", "10.0.0.2", "10.0.0.2")
    assert probe(other_node, used).node.id == "n2" and len(reads) == 5


def test_an_unreadable_answer_is_read_again_each_time_to_say_why(reads):
    spec = NodeSpec("n1", "10.0.0.1", "10.0.0.1")
    bad = {"gpus": "not a list of GPUs", "disks": [{"no path": 1}]}
    first = probe(spec, bad)
    assert first.node.state == NodeState.UNREACHABLE
    probe(spec, bad)
    assert len(reads) == 2


def test_the_session_request_is_the_probe_arguments_whatever_the_order_of_the_sources():
    spec = NodeSpec("n1", "10.0.0.1", "10.0.0.1", model_dirs=("/models",))
    a = json.loads(session_request(spec, ["/models/b", "/models/a", "/models/b"], "owner-1"))
    b = json.loads(session_request(spec, ["/models/a", "/models/b"], "owner-1"))
    assert a == b and a["sources"] == ["/models/a", "/models/b"] and a["owner"] == "owner-1"
    assert a["model_dirs"] == ["/models"] and json.loads(session_request(spec, None))["sources"] is None


def test_a_node_that_left_the_fleet_has_its_remembered_answer_dropped_at_the_next_pass(reads):
    from reconciler.model import Fleet
    from reconciler.observe.probe import FleetProber

    staying, leaving = NodeSpec("n1", "10.0.0.1", "10.0.0.1"), NodeSpec("n2", "10.0.0.2", "10.0.0.2")
    from reconciler.errors import TransportError

    class Unreachable:
        def transport_for(self, spec):
            raise TransportError(spec.id, "no route to host")

    probe(staying, REPORT)
    probe(leaving, REPORT)
    assert set(collect._LAST_ANSWER) == {"n1", "n2"}
    result = FleetProber()(Fleet(nodes=(staying,)), Unreachable())  # n2 left the fleet; n1 did not answer
    assert [r.node.reason for r in result.results] == ["no route to host"]
    assert set(collect._LAST_ANSWER) == {"n1"}  # kept: its answer is good again once it answers the same
