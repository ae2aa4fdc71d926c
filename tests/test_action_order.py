"""What orders the actions of a pass when they run at once (actor.action_dependencies), pure."""

from __future__ import annotations

from dataclasses import replace

from reconciler.decide.scheduling import action_dependencies
from reconciler.model import Action, Assignment, Placement
from tests.builders import inventory, observed, rank


def placed(rid: str, *nodes: tuple[str, tuple[int, ...], int], dist_port: int | None = None) -> Placement:
    return Placement(rid, rid.rsplit("-", 1)[0], "p", None, "none/H100",
                     tuple(Assignment(n, r, gpus, (), port) for r, (n, gpus, port) in enumerate(nodes)), dist_port)


def test_actions_on_other_nodes_gpus_and_ports_wait_for_nothing():
    actions = [
        Action("stop", "a-0", "a", "removed", placed("a-0", ("n1", (0,), 8000))),
        Action("start", "b-0", "b", "missing", placed("b-0", ("n2", (0,), 8000))),
        Action("start", "c-0", "c", "missing", placed("c-0", ("n1", (1,), 8001))),
    ]
    assert action_dependencies(actions, inventory(observed("n1"), observed("n2"))) == [(), (), ()]


def test_a_start_waits_for_the_stop_that_frees_its_gpu_or_port_and_for_earlier_actions_on_its_replica():
    actions = [
        Action("stop", "a-0", "a", "removed", placed("a-0", ("n1", (0,), 8000))),
        Action("start", "b-0", "b", "missing", placed("b-0", ("n1", (0,), 8100))),  # a-0's GPU
        Action("start", "c-0", "c", "missing", placed("c-0", ("n1", (1,), 8000))),  # a-0's port
        Action("stop", "d-1", "d", "stale copy", placed("d-1", ("n3", (), 9000))),
        Action("restart", "d-1", "d", "crashed", placed("d-1", ("n2", (2,), 9001))),  # the same replica
    ]
    assert action_dependencies(actions, inventory(observed("n1"), observed("n2"), observed("n3"))) == [
        (), (0,), (0,), (), (3,)]


def test_what_the_probe_found_of_a_replica_counts_as_freed_by_its_action():
    # A replace whose old copy the plan does not name: the records say it holds GPU 3 on n1.
    held = replace(observed("n1"), replicas=(rank("a-0", "a", "p", gpus=(3,), port=8200),))
    actions = [
        Action("replace", "a-0", "a", "drained", placed("a-0", ("n2", (0,), 8000))),
        Action("start", "b-0", "b", "missing", placed("b-0", ("n1", (3,), 8300))),
    ]
    assert action_dependencies(actions, inventory(held, observed("n2"))) == [(), (0,)]


def test_a_multi_node_replicas_rendezvous_port_is_its_heads():
    actions = [
        Action("stop", "a-0", "a", "removed", placed("a-0", ("n1", (), 29500))),
        Action("start", "m-0", "m", "missing", placed("m-0", ("n1", (0,), 8000), ("n2", (0,), 8000), dist_port=29500)),
    ]
    assert action_dependencies(actions, inventory(observed("n1"), observed("n2"))) == [(), (0,)]


def test_actions_on_nodes_a_scheduler_launches_on_are_submitted_in_the_plans_order():
    # Slurm's controller hands out GPUs in the order jobs arrive: the plan's order, as one after another.
    actions = [
        Action("start", "pair-0", "pair", "missing", placed("pair-0", ("s1", (0,), 8100), ("s2", (0,), 8100))),
        Action("start", "solo-0", "solo", "missing", placed("solo-0", ("s3", (0,), 8100))),
        Action("start", "ssh-0", "ssh", "missing", placed("ssh-0", ("n1", (0,), 8100))),
    ]
    nodes = inventory(observed("s1"), observed("s2"), observed("s3"), observed("n1"))
    assert action_dependencies(actions, nodes, scheduled_nodes={"s1", "s2", "s3"}) == [(), (0,), ()]
