"""A start that failed and left nothing running: retried by its kind (memory.py), pure, with an injected clock
and jitter. The same plan the daemon and `apply` act on, and `plan` predicts (memory.plan_remembering)."""

from __future__ import annotations

import pytest

from reconciler.decide.backoff import PERMANENT_RECHECK_S, Backoff
from reconciler.record.memory import (
    PassMemory,
    remember,
)
from reconciler.record.memory_document import memory_from_document, memory_to_document
from reconciler.model import Assignment
from reconciler.decide.outcomes import ReplicaState
from reconciler.vocabulary import FailureKind, Phase, WaitKind
from reconciler.record.memory import plan_remembering as default_planner
from reconciler.record.status.documents import model_status_document
from reconciler.record.status.predict import predicted_pass
from tests.builders import catalog, fleet, inventory, model, node_spec, observed, profile

NOW = 1_000_000.0


def setup():
    cat = catalog(fleet(node_spec("n1")), model("m", profile("p", engine="command", gpu_class=None, command=("x",))))
    return cat, inventory(observed("n1"))


def failed(kind: str, message: str = "rank 0 on n1 did not start: boom") -> dict[str, ReplicaState]:
    return {"m-0": ReplicaState("m-0", "m", "p", Phase.FAILED, message, (Assignment("n1", 0, (), (), 9000),), failure=kind)}


def after_failure(cat, inv, kind, *, memory=PassMemory(), now=NOW, jitter=0.0):
    planned = default_planner(cat, inv, now=now, memory=memory)
    [start] = [a for a in planned.actions if a.replica == "m-0"]
    from reconciler.record.memory import attempt_key

    return remember(memory, planned, inv, failed(kind), now, ["m-0"],
                    attempt_keys={"m-0": attempt_key(cat, inv, start)}, jitter=lambda: jitter)


def test_a_temporary_failure_backs_off_exponentially_with_jitter_then_is_tried_again():
    cat, inv = setup()
    memory = after_failure(cat, inv, FailureKind.TEMPORARY, jitter=0.0)
    assert memory.backoff["m-0"].retry_at == NOW + 10  # the first backoff, no jitter
    held = default_planner(cat, inv, now=NOW + 9, memory=memory)
    assert [a.replica for a in held.actions] == []
    [w] = held.waiting
    assert w.kind is WaitKind.START_BACKOFF and w.until == NOW + 10 and "boom" in w.reason
    assert [a.replica for a in default_planner(cat, inv, now=NOW + 10, memory=memory).actions] == ["m-0"]

    # The second failure in a row doubles it; the largest jitter shortens it by a quarter.
    second = after_failure(cat, inv, FailureKind.TEMPORARY, memory=memory, now=NOW + 10, jitter=1.0)
    assert second.backoff["m-0"].failed_starts == 2
    assert second.backoff["m-0"].retry_at == pytest.approx(NOW + 10 + 20 * 0.75)


def test_a_permanent_failure_stalls_until_the_catalog_changes_or_its_recheck():
    cat, inv = setup()
    memory = after_failure(cat, inv, FailureKind.PERMANENT)
    far = NOW + PERMANENT_RECHECK_S - 1  # past every temporary backoff
    held = default_planner(cat, inv, now=far, memory=memory)
    assert held.actions == () and held.waiting[0].kind is WaitKind.STALLED
    doc = model_status_document(cat.models[0], predicted_pass(cat, held), cat.fleet)
    assert doc["replicas"][0]["phase"] == "Failed" and doc["replicas"][0]["failure"] == "permanent"
    assert list(doc["replicas"][0]) == ["id", "profile", "phase", "nodes", "message", "failure", "restarts"]

    changed = catalog(cat.fleet, model("m", profile("p", engine="command", gpu_class=None, command=("y",))))
    assert [a.replica for a in default_planner(changed, inv, now=far, memory=memory).actions] == ["m-0"]
    assert [a.replica for a in default_planner(cat, inv, now=NOW + PERMANENT_RECHECK_S, memory=memory).actions] == ["m-0"]


def test_the_node_changing_retries_a_stalled_start():
    cat, inv = setup()
    memory = after_failure(cat, inv, FailureKind.PERMANENT)
    grown = inventory(observed("n1", engines=("vllm", "sglang", "llama.cpp", "command-engine")))
    assert [a.replica for a in default_planner(cat, grown, now=NOW + 1, memory=memory).actions] == ["m-0"]


def test_a_start_that_took_forgets_the_failure_and_the_memory_survives_a_one_shot_apply():
    cat, inv = setup()
    memory = after_failure(cat, inv, FailureKind.PERMANENT)
    again = memory_from_document(memory_to_document(memory))
    assert again.backoff == memory.backoff
    started = {"m-0": ReplicaState("m-0", "m", "p", Phase.STARTING, "", (Assignment("n1", 0, (), (), 9000),))}
    planned = default_planner(cat, inv, now=NOW + PERMANENT_RECHECK_S, memory=again)
    assert remember(again, planned, inv, started, NOW + PERMANENT_RECHECK_S, ["m-0"]).backoff == {"m-0": Backoff()}


def test_a_replica_that_never_failed_is_started_with_no_wait():
    cat, inv = setup()
    plain = default_planner(cat, inv, now=NOW, memory=PassMemory())
    assert [a.action for a in plain.actions] == ["start"] and plain.waiting == ()
