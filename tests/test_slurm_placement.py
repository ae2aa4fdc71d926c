"""Placement around Slurm (pure): launchers never mix in one multi-node replica; other jobs' GPUs are taken."""

from __future__ import annotations

from dataclasses import replace

from reconciler.model import RejectKind
from reconciler.decide.placement import place
from tests.builders import fleet, gpus, inventory, model, node_spec, observed, profile


def spec(nid: str, launcher: str):
    return replace(node_spec(nid, fabrics={"ib": ["mlx5_0"]}), launcher=launcher)


def node(nid: str, *, held=()):
    gs = tuple(replace(g, held_by="Slurm job 9 of alice") if g.index in held else g for g in gpus(2))
    return observed(nid, gpu=gs, fabrics={"ib": ["mlx5_0"]})


def test_a_multi_node_replica_takes_nodes_of_one_launcher_only():
    f = fleet(spec("a-slurm", "slurm"), spec("b-ssh", "ssh"), spec("c-slurm", "slurm"))
    inv = inventory(node("a-slurm"), node("b-ssh"), node("c-slurm"))
    result = place([model("m", profile(nodes=2))], f, inv)
    assert [a.node for a in result.placements[0].nodes] in (["a-slurm", "c-slurm"], ["c-slurm", "a-slurm"])


def test_mixed_launchers_that_would_fit_together_are_a_rejection_that_says_so():
    f = fleet(spec("a-slurm", "slurm"), spec("b-ssh", "ssh"))
    result = place([model("m", profile(nodes=2))], f, inventory(node("a-slurm"), node("b-ssh")))
    assert not result.placements
    pool = [r for r in result.unplaced[0].rejections if r.node == ""]
    assert pool and pool[0].kind is RejectKind.MIXED_LAUNCHERS
    assert "never mixes slurm and ssh nodes" in pool[0].reason and "1 slurm, 1 ssh" in pool[0].reason


def test_gpus_other_slurm_jobs_hold_are_taken_and_the_rejection_names_the_job():
    f = fleet(spec("a", "slurm"), spec("b", "slurm"))
    result = place([model("m", profile(gpus_per_node=2), replicas=2)], f, inventory(node("a", held=(1,)), node("b")))
    assert [a.node for p in result.placements for a in p.nodes] == ["b"]
    why = {r.node: r.reason for r in result.unplaced[0].rejections}
    assert why["a"] == "has 1 free H100-80GB GPUs, needs 2 (1 held by other Slurm jobs: Slurm job 9 of alice)"


def test_a_node_slurm_drains_is_cordoned_whatever_fleet_yaml_says():
    f = fleet(spec("a", "slurm"))
    drained = replace(node("a"), state="cordoned", reason="Slurm drains a: disk")
    result = place([model("m", profile())], f, inventory(drained))
    assert not result.placements
    assert result.unplaced[0].rejections[0].reason == "node is cordoned: Slurm drains a: disk"


def test_status_records_the_gpus_slurm_gave_not_the_placements():
    from reconciler.act.launcher import RankState
    from reconciler.model import Assignment
    from reconciler.decide.outcomes import ReplicaState
    from reconciler.act.readiness import Liveness, observed_gpus

    state = ReplicaState("m-0", "m", "p", "Ready", "", (Assignment("a", 0, (2, 3)), Assignment("b", 1, (0, 1))), None)
    def rank(node, number, gpus, job=""):
        return RankState("m-0", "m", "p", number, gpus, 8000, "h", node=node, slurm_job=job)

    liveness = Liveness({("a", 0): rank("a", 0, (0, 1), "7"),
                         ("b", 1): rank("b", 1, (5,))})  # no job: an SSH rank keeps its own
    assert [a.gpus for a in observed_gpus(state, liveness).nodes] == [(0, 1), (0, 1)]
    assert observed_gpus(state, Liveness({})) is state
