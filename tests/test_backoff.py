"""One backoff per replica (reconciler/decide/backoff.py): the crash it restarts after and the start that failed and
left nothing running are one record, one delay curve, one decision of whether a try waits; and the memory
file an apply wrote before that record existed (`history`, `start_failures`) still loads into it."""

from __future__ import annotations

import json

import pytest

from reconciler.decide.backoff import BACKOFF_RESET_S, JITTER_FRACTION, PERMANENT_RECHECK_S, Backoff, attempt_key
from reconciler.record.memory import PassMemory, load_memory, plan_remembering, save_memory
from reconciler.record.memory_document import memory_from_document
from reconciler.model import spec_hash
from reconciler.vocabulary import FailureKind, WaitKind
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

NOW = 1_000_000.0
P = profile("p", gpus_per_node=8)
M = model("m", P)

# A memory file as the code before one Backoff wrote it (memory_to_document, json.dumps sort_keys): the
# plan's crash bookkeeping under `history`, the starts that failed and left nothing under `start_failures`.
OLD_FILE = {
    "draining": {}, "gpu_strikes": {}, "last_seen": None, "quarantines": [],
    "history": {"crashy-0": {"last_restart": 1000.0, "restarts": 3, "streak": 2},
                "slow-0": {"last_restart": None, "restarts": 0, "streak": 0},
                "stuck-0": {"last_restart": None, "restarts": 0, "streak": 0}},
    "placed_on": {"crashy-0": ["g1"]},
    "start_failures": {
        "slow-0": {"attempts": 1, "key": "fedcba9876543210", "kind": "temporary",
                   "message": "rank 0 on g1 did not start: timed out", "nodes": ["g1"], "retry_at": 1010.0},
        "stuck-0": {"attempts": 2, "key": "0123456789abcdef", "kind": "permanent",
                    "message": "rank 0 on g1 did not start: no such file", "nodes": ["g1"], "retry_at": 1300.0}},
    "unreachable_since": {"g2": 900.0},
}


def test_a_memory_file_written_before_one_backoff_loads_both_halves_into_it(tmp_path):
    path = tmp_path / "memory.json"
    path.write_text(json.dumps(OLD_FILE, sort_keys=True))
    loaded = load_memory(path)
    assert loaded.backoff == {
        "crashy-0": Backoff(restarts=3, streak=2, last_restart=1000.0),
        "slow-0": Backoff(failure=FailureKind.TEMPORARY, failed_starts=1, retry_at=1010.0, key="fedcba9876543210",
                          message="rank 0 on g1 did not start: timed out", nodes=("g1",)),
        "stuck-0": Backoff(failure=FailureKind.PERMANENT, failed_starts=2, retry_at=1300.0, key="0123456789abcdef",
                           message="rank 0 on g1 did not start: no such file", nodes=("g1",)),
    }
    assert loaded.unreachable_since == {"g2": 900.0} and loaded.placed_on == {"crashy-0": ("g1",)}

    # Saved again it is written in today's form, one `backoff` entry per replica, and reads back the same.
    save_memory(path, loaded)
    doc = json.loads(path.read_text())
    assert "history" not in doc and "start_failures" not in doc
    assert doc["backoff"]["crashy-0"] == {"restarts": 3, "streak": 2, "last_restart": 1000.0}
    assert load_memory(path) == loaded


@pytest.mark.parametrize("broken", [
    {"history": {"x": {"bogus": 1}}},
    {"start_failures": {"x": {"kind": "bug", "attempts": 1, "retry_at": 1.0, "key": "", "message": ""}}},
    {"start_failures": {"x": {"kind": "temporary", "attempts": 1}}},
    {"backoff": {"x": {"bogus": 1}}},
    {"backoff": {"x": {"failure": "permanent"}}},  # a failure with no time to try again
    {"backoff": {"x": {"restarts": float("inf")}}},  # json.loads reads Infinity; int() of it overflows
])
def test_a_backoff_that_cannot_be_read_forgets_the_memory_never_an_error(broken):
    assert memory_from_document({**OLD_FILE, **broken}) == PassMemory()


def setup_start():
    cat = catalog(fleet(node_spec("n1")), model("m", profile("p", engine="command", gpu_class=None, command=("x",))))
    inv = inventory(observed("n1"))
    [start] = plan_remembering(cat, inv, now=NOW, memory=PassMemory()).actions
    return cat, inv, start


def test_a_start_stalled_before_the_upgrade_stays_stalled_after_it():
    cat, inv, start = setup_start()
    old = {"history": {"m-0": {"restarts": 0, "streak": 0, "last_restart": None}},
           "start_failures": {"m-0": {"kind": "permanent", "attempts": 1, "retry_at": NOW + PERMANENT_RECHECK_S,
                                      "key": attempt_key(cat, inv, start), "nodes": ["n1"],
                                      "message": "rank 0 on n1 did not start: boom"}}}
    memory = memory_from_document(json.loads(json.dumps(old)))
    held = plan_remembering(cat, inv, now=NOW + 1, memory=memory)
    [w] = held.waiting
    assert held.actions == () and w.kind is WaitKind.STALLED and w.until == NOW + PERMANENT_RECHECK_S
    assert "boom; stalled until the catalog or node n1 changes (1 failed start;" in w.reason


def test_a_crash_backing_off_before_the_upgrade_still_waits_after_it():
    c = catalog(fleet(node_spec("a")), M)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=range(8), spec_hash=spec_hash(M, P),
                                                                 alive=False)]))
    memory = memory_from_document({"history": {"m-0": {"restarts": 2, "streak": 2, "last_restart": NOW}}})
    [w] = plan_remembering(c, inv, now=NOW + 19, memory=memory).waiting
    assert w.kind is WaitKind.BACKOFF and w.until == NOW + 20 and "(restart 3)" in w.reason
    [restart] = plan_remembering(c, inv, now=NOW + 20, memory=memory).actions
    assert restart.action == "restart" and "restart 3 (next backoff 40 s)" in restart.reason


def test_one_curve_for_both_kinds_of_try():
    crashed = Backoff(restarts=2, streak=2, last_restart=NOW)
    assert crashed.held_until(NOW + 19) == NOW + 20 and crashed.held_until(NOW + 20) is None
    failed = Backoff().start_failed(FailureKind.TEMPORARY, NOW, "k", "timed out", ("n1",), jitter=lambda: 0.0)
    failed = failed.start_failed(FailureKind.TEMPORARY, NOW, "k", "timed out", ("n1",), jitter=lambda: 1.0)
    assert failed.failed_starts == 2 and failed.retry_at == pytest.approx(NOW + 20 * (1 - JITTER_FRACTION))
    # A start waits for the same key only: what it tries changed, it goes at once.
    assert failed.held_until(NOW + 1, start=lambda: "k") == failed.retry_at
    assert failed.held_until(NOW + 1, start=lambda: "other") is None
    # A restart never waits on a failed start's clock, nor a start on a crash's.
    assert failed.held_until(NOW + 1) is None
    assert crashed.held_until(NOW + 1, start=lambda: "k") is None


def test_a_fresh_copy_forgets_its_crashes_not_its_failed_start_and_a_start_that_took_forgets_that():
    both = Backoff(restarts=4, streak=3, last_restart=NOW).start_failed(FailureKind.PERMANENT, NOW, "k", "gone", ("n1",),
                                                                        jitter=lambda: 0.0)
    assert both.anew() == Backoff().start_failed(FailureKind.PERMANENT, NOW, "k", "gone", ("n1",), jitter=lambda: 0.0)
    assert both.anew().stalled and both.anew().held_until(NOW + 1, start=lambda: "k") == NOW + PERMANENT_RECHECK_S
    assert both.start_took() == Backoff(restarts=4, streak=3, last_restart=NOW)
    # A quiet spell resets the streak that sets the delay, not the count status shows.
    assert both.start_took().calmed(NOW + BACKOFF_RESET_S) == Backoff(restarts=4, streak=0, last_restart=NOW)
    assert both.start_took().calmed(NOW + BACKOFF_RESET_S - 1).streak == 3


def test_a_failed_start_after_none_failed_counts_from_one_whatever_count_was_kept():
    # failure None with a count left (an older memory file, one a person edited): no failed start is
    # remembered, so this one is the first and waits the first step of the curve, not the fourth.
    stale = Backoff(failed_starts=3)
    failed = stale.start_failed(FailureKind.TEMPORARY, NOW, "k", "timed out", ("n1",), jitter=lambda: 0.0)
    assert failed.failed_starts == 1 and failed.retry_at == NOW + 10.0
