"""What a canary rollout writes (SPEC section 13): LiteLLM weights that give the canary copies their share,
`/canary` ids, canary URLs in endpoints.yaml, the `rollout:` block and `canary: true` in the model's
status, and status/catalog.yaml naming a model whose rollout was aborted. Pure documents, no processes."""

from __future__ import annotations

import dataclasses

from reconciler.decide.canary import Measurement, advance, CanaryCopy
from reconciler.record.gateway import litellm_document
from reconciler.record.memory_document import memory_from_document, memory_to_document
from reconciler.model import Assignment, Catalog, Fleet, NodeSpec, RolloutPolicy
from reconciler.decide.outcomes import PassMemory, PassResult, ReplicaState
from reconciler.decide.plan_values import Plan
from reconciler.schemas import validator
from reconciler.record.status.documents import CatalogStatus, catalog_document, endpoints_document, model_status_document
from reconciler.vocabulary import Phase, RolloutPhase
from tests.builders import model, profile

FLEET = Fleet(nodes=(NodeSpec(id="n1", address="10.9.0.1", data_address="10.9.0.1"),))
CHAT = dataclasses.replace(model("chat", profile("cpu", "llama.cpp", gpu_class=None), replicas=3),
                           rollout=RolloutPolicy(weight=20))


def states(canary: bool = True):
    return {f"chat-{i}": ReplicaState(f"chat-{i}", "chat", "cpu", Phase.READY, nodes=(Assignment("n1", 0, (), (), 8080 + i),),
                                      endpoint=f"http://10.9.0.1:{8080 + i}", canary=canary and i == 0)
            for i in range(3)}


def result(replicas, rollouts=None) -> PassResult:
    plan = Plan(actions=(), outcomes={}, unplaced=(), waiting=(), observed={}, backoff={})
    return PassResult("b", None, plan, replicas=replicas, rollouts=rollouts or {})


def test_litellm_weights_send_the_canary_its_share_and_mark_its_id():
    entries = litellm_document(Catalog("/c", FLEET, (CHAT,)), states())["model_list"]
    got = [(e["model_info"]["id"], e["litellm_params"]["weight"]) for e in entries]
    assert got == [("chat-0/canary", 1), ("chat-1", 2), ("chat-2", 2)]  # 1 of 5 = 20 %


def test_without_a_canary_serving_all_copies_weigh_the_same():
    entries = litellm_document(Catalog("/c", FLEET, (CHAT,)), states(canary=False))["model_list"]
    assert [e["model_info"]["id"] for e in entries] == ["chat-0", "chat-1", "chat-2"]
    assert all("weight" not in e["litellm_params"] for e in entries)


def test_endpoints_mark_canary_urls_and_status_shows_the_rollout_and_the_canary_copy():
    r = advance(CHAT, None, old_copies=2, canaries=[CanaryCopy("chat-0", Phase.READY)],
                measurements=[Measurement("request", True, "request: 2 of 2 answered as expected")], now=100,
                revision="b", from_revision="a")
    res = result(states(), {"chat": r})
    ends = endpoints_document(Catalog("/c", FLEET, (CHAT,)), res)
    assert ends["canary"] == {"chat": ["http://10.9.0.1:8080"]} and len(ends["models"]["chat"]) == 3
    validator("status-endpoints").validate(ends)
    doc = model_status_document(CHAT, res, FLEET)
    validator("status-model").validate(doc)
    assert doc["rollout"]["state"] == "Progressing" and doc["rollout"]["weight"] == 20
    assert doc["rollout"]["checks"] == [{"name": "request", "passed": 1, "failed": 0,
                                         "last": "request: 2 of 2 answered as expected"}]
    assert [r.get("canary", False) for r in doc["replicas"]] == [True, False, False]


def test_catalog_status_names_a_model_whose_rollout_was_aborted():
    doc = catalog_document(CatalogStatus("b", "b", "applied", out_of_sync=("chat: rollout of revision b aborted: x",)))
    assert doc["out_of_sync"] == ["chat: rollout of revision b aborted: x"]
    validator("status-catalog").validate(doc)
    assert "out_of_sync" not in catalog_document(CatalogStatus("b", "b", "applied"))


def test_the_rollout_survives_the_memory_file_of_a_restart():
    r = advance(CHAT, None, old_copies=2, canaries=[CanaryCopy("chat-0", Phase.FAILED, "HTTP 500")], now=5,
                revision="b")
    back = memory_from_document(memory_to_document(PassMemory(rollouts={"chat": r})))
    assert back.rollouts == {"chat": r} and back.rollouts["chat"].state == RolloutPhase.ABORTED
