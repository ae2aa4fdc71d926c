"""Draining (SPEC section 10), as the plan decides it: a serving copy the reconciler chose to stop waits,
out of every gateway file, until its engine runs no request or drain_s has passed; a crash does not wait."""

from __future__ import annotations

import dataclasses

from reconciler.record.memory import (
    DRAIN_RECHECK_S, PassMemory, hold_drains, next_drain_check, plan_remembering, remember,
)
from reconciler.record.memory_document import memory_from_document, memory_to_document
from reconciler.model import spec_hash
from reconciler.decide.plan import plan
from reconciler.vocabulary import WaitKind
from reconciler.record.status.documents import endpoints_document, model_status_document
from reconciler.record.status.predict import predicted_pass, predicted_phases
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

P = profile("p", gpus_per_node=2)


def setup(replicas_wanted: int, *, alive=True, drain_s=10.0, running=3):
    m = dataclasses.replace(model("m", P, replicas=replicas_wanted), drain_s=drain_s)
    h = spec_hash(m, P)
    ranks = [rank(f"m-{i}", "m", "p", gpus=(2 * i, 2 * i + 1), port=8000 + i, spec_hash=h,
                  alive=alive or i < replicas_wanted) for i in range(running)]
    cat = catalog(fleet(node_spec("a")), m)
    inv = inventory(observed("a", gpu=gpus(8), replicas=ranks))
    return cat, inv


def kinds(p):
    return [(a.action, a.replica) for a in p.actions]


def handed(memory, **changes):
    """The memory with each drain's removal taken by the gateway (SPEC 13), and `changes` besides."""
    return dataclasses.replace(memory, draining={
        k: dataclasses.replace(v, out_at=v.started, handed_off=True, **changes) for k, v in memory.draining.items()})


def test_a_scale_down_of_a_serving_replica_drains_first_and_is_stopped_once_its_engine_is_idle():
    cat, inv = setup(2)
    first = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert kinds(first) == []  # no stop in the pass that begins the drain: the gateway files go first
    [w] = first.waiting
    assert (w.replica, w.kind, w.until) == ("m-2", WaitKind.DRAINING, 1010.0)
    assert "out of every gateway file" in w.reason and "requests: at most 10 s" in w.reason
    assert predicted_phases(first)["m-2"] == "Draining"
    predicted = predicted_pass(cat, first)
    doc = model_status_document(cat.model("m"), predicted, cat.fleet)
    assert [(r["id"], r["phase"]) for r in doc["replicas"]] == [("m-0", "Ready"), ("m-1", "Ready"), ("m-2", "Draining")]
    assert doc["ready"] == 2 and "out of every gateway file" in doc["replicas"][2]["message"]
    assert len(endpoints_document(cat, predicted)["models"]["m"]) == 2

    memory = remember(PassMemory(), first, inv, {}, 1000.0)
    [d] = memory.draining.values()
    assert (d.replica, d.nodes, d.port, d.started, d.until) == ("m-2", ("a",), 8002, 1000.0, 1010.0)

    busy = handed(memory, running=2.0)
    second = plan_remembering(cat, inv, now=1003.0, memory=busy)
    assert kinds(second) == [] and "2 requests running" in second.waiting[0].reason

    idle = handed(memory, running=0.0)
    third = plan_remembering(cat, inv, now=1004.0, memory=idle)
    assert kinds(third) == [("stop", "m-2")] and third.waiting == ()
    assert "drained: the gateway serves without it and its engine runs no request" in third.actions[0].reason


def test_a_drain_whose_engine_never_answers_ends_at_drain_s():
    cat, inv = setup(2)
    memory = remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0)
    unknown = handed(memory, running=None, note="its load is unknown (/metrics did not answer within 2 s)")
    before = plan_remembering(cat, inv, now=1009.0, memory=unknown)
    assert kinds(before) == [] and "/metrics did not answer" in before.waiting[0].reason
    after = plan_remembering(cat, inv, now=1010.0, memory=unknown)
    assert kinds(after) == [("stop", "m-2")] and "drain_s (10 s) has passed" in after.actions[0].reason


def test_an_idle_copy_is_never_stopped_before_the_gateway_serves_without_it():
    # SPEC 13: idle from the start, and drain_s long past, it stays until its removal reached the gateway.
    cat, inv = setup(2)
    memory = remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0)
    [d] = memory.draining.values()
    assert d.out_at is None and not d.handed_off  # the pass that began it has not written the files yet
    idle = dataclasses.replace(memory, draining={k: dataclasses.replace(v, running=0.0) for k, v in memory.draining.items()})
    for now in (1000.0, 1004.0, 5000.0):
        p = plan_remembering(cat, inv, now=now, memory=idle)
        assert kinds(p) == [] and [(w.replica, w.kind) for w in p.waiting] == [("m-2", WaitKind.DRAINING)]
        assert "waiting for the gateway to serve without it" in p.waiting[0].reason
    assert kinds(plan_remembering(cat, inv, now=1004.0, memory=handed(idle))) == [("stop", "m-2")]


def test_drain_s_0_skips_waiting_for_requests_never_the_hand_off():
    cat, inv = setup(2, drain_s=0.0)
    p = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert kinds(p) == [] and [w.replica for w in p.waiting] == ["m-2"] and list(p.draining) == ["m-2@a"]
    memory = remember(PassMemory(), p, inv, {}, 1000.0)
    busy = dataclasses.replace(memory, draining={k: dataclasses.replace(v, running=5.0) for k, v in memory.draining.items()})
    assert kinds(plan_remembering(cat, inv, now=1001.0, memory=busy)) == []  # not handed off yet
    assert kinds(plan_remembering(cat, inv, now=1001.0, memory=handed(busy))) == [("stop", "m-2")]


def test_a_crashed_replica_is_stopped_at_once():
    cat, inv = setup(2, alive=False)
    p = plan(cat, inv)
    assert kinds(p) == [("stop", "m-2")] and not p.actions[0].drain
    assert kinds(plan_remembering(cat, inv, now=1000.0, memory=PassMemory())) == [("stop", "m-2")]


def test_a_draining_copy_keeps_its_gpus_so_nothing_is_placed_on_them_in_the_meantime():
    # Node a has 8 GPUs; m-2 holds 4,5 while it drains; another model needing 4 GPUs finds only 6,7 free.
    cat, inv = setup(2)
    other = model("o", profile("q", gpus_per_node=4))
    cat = catalog(cat.fleet, cat.model("m"), other)
    p = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert kinds(p) == [] and [o.replica for o in p.unplaced] == ["o-0"]


def test_scaling_back_up_while_draining_keeps_the_replica_and_forgets_the_drain():
    cat, inv = setup(2)
    memory = remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0)
    back, _ = setup(3)
    p = plan_remembering(back, inv, now=1002.0, memory=memory)
    assert kinds(p) == [] and p.waiting == () and p.draining == {}
    assert remember(memory, p, inv, {}, 1002.0).draining == {}


def test_a_drain_survives_one_shot_apply_runs_in_the_memory_file():
    cat, inv = setup(2)
    memory = remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0)
    again = memory_from_document(memory_to_document(memory))
    assert again.draining == memory.draining and again.draining


def test_hold_drains_leaves_a_plan_without_drains_as_it_is():
    cat, inv = setup(3)
    p = plan(cat, inv)
    assert hold_drains(p, cat, {}, 1000.0) is p


# --------------------------------------------------------------------------
# What the engine says during a drain, asked over real HTTP on loopback
# --------------------------------------------------------------------------

import socket  # noqa: E402
import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

from reconciler.model import Fleet, NodeSpec  # noqa: E402
from reconciler.decide.plan_values import Drain  # noqa: E402
from reconciler.control.reconcile import with_drain_loads  # noqa: E402


def metrics_server(body: bytes | None):
    """A loopback server whose /metrics answers `body`, or (None) accepts and never answers."""
    if body is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        return sock, sock.getsockname()[1], sock.close

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def close():
        server.shutdown()
        server.server_close()
    return server, server.server_address[1], close


def asked(body: bytes | None, engine: str = "llama.cpp") -> Drain:
    _, port, close = metrics_server(body)
    try:
        cat = catalog(Fleet(nodes=(NodeSpec(id="a", address="127.0.0.1", data_address="127.0.0.1"),)), model("m", P))
        d = Drain("m-2", "m", ("a",), port, engine, 1000.0, 1010.0)
        [answer] = with_drain_loads(cat, PassMemory(draining={d.key: d}), timeout_s=0.5).draining.values()
        return answer
    finally:
        close()


def test_an_engine_that_reports_its_running_requests_is_read():
    d = asked(b"llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n")
    assert d.running == 1.0 and d.note == ""


def test_a_removed_models_engine_is_read_under_whichever_series_it_reports():
    assert asked(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 2\n", engine="").running == 0.0


def test_a_metrics_endpoint_that_hangs_or_lies_leaves_the_load_unknown_so_drain_s_ends_the_drain():
    hung = asked(None)
    assert hung.running is None and "did not answer within 0.5 s" in hung.note
    lying = asked(b"llamacpp:requests_processing -3\nllamacpp:requests_deferred 0\n")
    assert lying.running is None and "not a count of requests" in lying.note
    garbage = asked(b"\x00\x01 not metrics {{{\n")
    assert garbage.running is None and garbage.note
    cat, inv = setup(2)
    memory = remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0)
    unknown = dataclasses.replace(memory, draining={k: dataclasses.replace(v, running=hung.running, note=hung.note)
                                                    for k, v in memory.draining.items()})
    assert kinds(plan_remembering(cat, inv, now=1010.0, memory=handed(unknown))) == [("stop", "m-2")]


def test_a_replaces_old_copy_left_draining_beside_the_new_one_is_stopped_once_idle():
    # The actor left m-0's old copy on a draining after the new copy on b turned Ready (Actor.begin_drain).
    m = model("m", P, replicas=1)
    h = spec_hash(m, P)
    cat = catalog(fleet(node_spec("a"), node_spec("b")), m)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=(0, 1), port=8000, spec_hash="0ld")]),
                    observed("b", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=(0, 1), port=8000, spec_hash=h)]))
    from reconciler.decide.plan_values import Drain

    old = Drain("m-0", "m", ("a",), 8000, "vllm", 1000.0, 1010.0)
    memory = PassMemory(placed_on={"m-0": ("b",)}, draining={old.key: old})
    held = plan_remembering(cat, inv, now=1002.0, memory=memory)
    assert kinds(held) == [] and [(w.replica, w.kind) for w in held.waiting] == [("m-0", WaitKind.DRAINING)]
    assert held.outcomes["m-0"].placement.nodes[0].node == "b"  # the replica is the new copy meanwhile
    idle = handed(memory, running=0.0)
    stopped = plan_remembering(cat, inv, now=1003.0, memory=idle)
    assert kinds(stopped) == [("stop", "m-0")] and [a.node for a in stopped.actions[0].placement.nodes] == ["a"]


def test_an_in_place_replace_of_a_serving_copy_drains_it_before_the_stop_and_start():
    from reconciler.model import UpdatePolicy

    big = profile("p", gpus_per_node=8)
    m = dataclasses.replace(model("m", big, replicas=1), update=UpdatePolicy(max_unavailable=1))
    cat = catalog(fleet(node_spec("a")), m)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=range(8), spec_hash="0ld")]))
    assert [(a.action, a.stop_first, a.drain) for a in plan(cat, inv).actions] == [("replace", True, True)]
    held = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert kinds(held) == [] and predicted_phases(held)["m-0"] == "Draining"
    memory = remember(PassMemory(), held, inv, {}, 1000.0)
    late = plan_remembering(cat, inv, now=1011.0, memory=handed(memory))
    assert kinds(late) == [("replace", "m-0")] and "drain_s (10 s) has passed" in late.actions[0].reason


def test_a_replica_on_a_gpu_gone_bad_moves_at_once_without_draining():
    from reconciler.vocabulary import GpuHealth

    m = model("m", P, replicas=1)
    cat = catalog(fleet(node_spec("a"), node_spec("b")), m)
    bad = tuple(dataclasses.replace(g, health=GpuHealth.UNHEALTHY) if g.index == 0 else g for g in gpus(8))
    inv = inventory(observed("a", gpu=bad, replicas=[rank("m-0", "m", "p", gpus=(0, 1), spec_hash=spec_hash(m, P))]),
                    observed("b", gpu=gpus(8)))
    [a] = plan(cat, inv).actions
    assert (a.action, a.drain) == ("replace", False)
    p = plan_remembering(cat, inv, now=1000.0, memory=PassMemory())
    assert kinds(p) == [("replace", "m-0")] and p.waiting == ()


def test_a_drain_going_on_asks_for_a_pass_at_its_deadline_or_sooner_to_ask_its_engine_again():
    cat, inv = setup(2, drain_s=60)
    memory = remember(PassMemory(), plan_remembering(cat, inv, now=1000.0, memory=PassMemory()), inv, {}, 1000.0)
    assert next_drain_check({}, 1000.0) is None
    assert next_drain_check(memory.draining, 1000.0) == 1000.0 + DRAIN_RECHECK_S  # the engine asked again soon
    assert next_drain_check(memory.draining, 1058.0) == 1060.0  # the deadline comes first
    assert next_drain_check(memory.draining, 1075.0) == 1075.0 + DRAIN_RECHECK_S  # kept past it: never a loop
