"""Slurm's view folded into the probed inventory (SPEC section 8).

`SlurmInventory.fold` brings Slurm's view into the probed inventory: node states
(DOWN/NOT_RESPONDING -> unreachable, DRAIN -> cordoned), every GPU another job holds
(taken, so placement goes around it), and our jobs as the nodes' running ranks. When
Slurm cannot be asked, the Slurm nodes are unreachable for that pass: their jobs are
left alone, as with any node that does not answer. The questions go through the
Slurm launcher's client (slurm_launcher.SlurmClient).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from reconciler.act.launcher.slurm_launcher import OurJobs, SlurmClient, SlurmUnavailable, has_slurm, rank_states
from reconciler.model import Fleet, Inventory, RunningRank
from reconciler.owner import catalog_owner
from reconciler.observe.slurm import ENDING_STATES, JobDetail, QueuedJob, SlurmNode
from reconciler.vocabulary import LauncherKind, NodeState


class SlurmInventory:
    def __init__(self, fleet: Fleet, client: SlurmClient, owner: str, desired: set[str] | None = None):
        self.fleet = fleet
        self.client = client
        self.owner = owner
        self.desired = desired
        self.slurm_nodes = [n for n in fleet.nodes if n.launcher == LauncherKind.SLURM]

    def observe(self) -> tuple[list[QueuedJob], dict[str, SlurmNode], dict[str, JobDetail]]:
        """One round of questions: squeue, scontrol show node, scontrol show job (raises SlurmUnavailable)."""
        queue = self.client.queue()
        nodes = self.client.nodes([n.slurm_node_name for n in self.slurm_nodes])
        details = self.client.job_details() if any(j.state == "RUNNING" for j in queue) else {}
        return queue, nodes, details

    def fold(self, inventory: Inventory) -> Inventory:
        if not self.slurm_nodes:
            return inventory
        try:
            answer = self.observe()
        except SlurmUnavailable as exc:
            why = f"Slurm did not answer (on {exc.node}): {exc.reason}"
            return fold_unreachable(inventory, {n.id for n in self.slurm_nodes}, why)
        return fold(self.fleet, self.owner, inventory, *answer, desired=self.desired)


def fold_unreachable(inventory: Inventory, node_ids: set[str], why: str) -> Inventory:
    return Inventory(tuple(
        replace(n, state=NodeState.UNREACHABLE, reason=why) if n.id in node_ids and n.state != NodeState.UNREACHABLE else n
        for n in inventory.nodes
    ))


def fold(fleet: Fleet, owner: str, inventory: Inventory, queue: Sequence[QueuedJob],
         nodes: Mapping[str, SlurmNode], details: Mapping[str, JobDetail], desired: set[str] | None = None) -> Inventory:
    """The probed inventory with Slurm's facts on the `launcher: slurm` nodes (pure).

    desired: the catalog's replica ids. A job that ended counts (as a crash) only for a replica
    still desired; one of a replica taken away is history, not a copy to stop on every pass.
    """
    slurm_specs = {n.id: n for n in fleet.nodes if n.launcher == LauncherKind.SLURM}
    names = {n.id: n.slurm_node_name for n in fleet.nodes}
    jobs = _counted_jobs(OurJobs(owner, queue), desired)
    ours = {job.job_id for job, _ in jobs.by_replica.values()}
    ranks_by_node = _ranks_by_node(jobs, details, names)
    foreign = _foreign_gpus(details, ours)
    out = []
    for node in inventory.nodes:
        spec = slurm_specs.get(node.id)
        if spec is None:
            out.append(node)
            continue
        node = replace(node, replicas=tuple(ranks_by_node.get(node.id, ())))
        snode = nodes.get(spec.slurm_node_name)
        if snode is None:
            out.append(replace(node, state=NodeState.UNREACHABLE, reason=f"Slurm has no node {spec.slurm_node_name}"))
            continue
        node = replace(node, gpus=_gpus_held(node, snode, foreign.get(spec.slurm_node_name, {})))
        out.append(_with_slurm_state(node, spec.slurm_node_name, snode))
    return Inventory(tuple(out))


def _counted_jobs(jobs: OurJobs, desired: set[str] | None) -> OurJobs:
    if desired is not None:
        jobs.by_replica = {rid: (job, shape) for rid, (job, shape) in jobs.by_replica.items()
                           if rid in desired or job.live or job.state in ENDING_STATES}
    return jobs


def _ranks_by_node(jobs: OurJobs, details: Mapping[str, JobDetail],
                   names: Mapping[str, str]) -> dict[str, list[RunningRank]]:
    """Our jobs as the running ranks of the nodes they run on."""
    ranks_by_node: dict[str, list[RunningRank]] = {}
    for state in rank_states(jobs, details, names):
        ranks_by_node.setdefault(state.node, []).append(RunningRank(
            id=state.replica, model=state.model, profile=state.profile, rank=state.rank, gpus=state.gpus,
            port=state.port, spec_hash=state.spec_hash, nnodes=state.nnodes, alive=state.alive,
            slurm_job=state.slurm_job, waiting=state.waiting,
        ))
    return ranks_by_node


def _foreign_gpus(details: Mapping[str, JobDetail], ours: set[str]) -> dict[str, dict[int, str]]:
    """Slurm node name -> GPU index -> which other running job holds it, where Slurm says which."""
    foreign: dict[str, dict[int, str]] = {}
    for detail in details.values():
        if detail.job_id in ours or detail.state != "RUNNING":
            continue
        holder = f"Slurm job {detail.job_id}" + (f" of {detail.user}" if detail.user else "")
        for sname, idx in detail.gpus.items():
            for g in idx:
                foreign.setdefault(sname, {})[g] = holder
    return foreign


def _gpus_held(node, snode: SlurmNode, held: Mapping[int, str]) -> tuple:
    """The node's GPUs, those other jobs hold marked taken."""
    mine = {g for r in node.replicas if r.alive for g in r.gpus}
    # GresUsed counts every job's GPUs; where Slurm named no index for some, take the lowest unclaimed ones.
    unnamed = snode.gpus_used - len(mine) - len(held)
    gpus = []
    for g in sorted(node.gpus, key=lambda g: g.index):
        if g.index in held:
            gpus.append(replace(g, held_by=held[g.index]))
        elif unnamed > 0 and g.index not in mine:
            gpus.append(replace(g, held_by="another Slurm job"))
            unnamed -= 1
        else:
            gpus.append(g)
    return tuple(gpus)


def _with_slurm_state(node, slurm_name: str, snode: SlurmNode):
    """DOWN/NOT_RESPONDING: unreachable; DRAIN: cordoned (a node the probe could not reach stays so)."""
    said = f": {snode.reason}" if snode.reason else ""
    if node.state == NodeState.UNREACHABLE:
        return node
    if snode.unreachable:
        flags = "+".join(sorted(snode.flags))
        return replace(node, state=NodeState.UNREACHABLE, reason=f"Slurm reports {slurm_name} {flags}{said}")
    if snode.cordoned and node.state == NodeState.READY:
        return replace(node, state=NodeState.CORDONED, reason=f"Slurm drains {slurm_name}{said}")
    return node


def fold_slurm(catalog, transports: Any, inventory: Inventory, *, owner: str | None = None) -> Inventory:
    """The probed inventory with Slurm's view of the `launcher: slurm` nodes (no-op without any)."""
    fleet = catalog.fleet
    if not has_slurm(fleet):
        return inventory
    desired = {rid for m in catalog.models for rid in m.replica_ids()}
    return SlurmInventory(fleet, SlurmClient(fleet, transports), owner or catalog_owner(catalog), desired).fold(inventory)
