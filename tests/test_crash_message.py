"""A crashed replica waiting for its restart backoff: its message names the dead rank once."""

from __future__ import annotations

from reconciler.decide.backoff import Backoff
from reconciler.model import spec_hash
from reconciler.decide.plan import plan
from reconciler.vocabulary import WaitKind
from reconciler.control.reconcile import replica_states
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank

P = profile("p", gpus_per_node=8)
M = model("m", P)


def test_a_crash_in_its_backoff_says_which_rank_died_once_and_until_when_it_waits():
    c = catalog(fleet(node_spec("a")), M)
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=range(8), spec_hash=spec_hash(M, P),
                                                                 alive=False)]))
    p = plan(c, inv, now=5, backoff={"m-0": Backoff(restarts=1, streak=1, last_restart=0)})
    [w] = p.waiting
    assert w.kind is WaitKind.BACKOFF and "rank 0 on a is dead" in w.reason  # the plan's own words stay whole

    state = replica_states(c, inv, {}, p, launcher=None, health=lambda host, port, path: (False, "down"))["m-0"]
    assert state.phase == "Failed"
    assert state.message == f"rank 0 on a is not running; {w.next_step}"
    assert w.next_step.startswith("waiting for backoff until ") and w.next_step.endswith("(restart 2)")
