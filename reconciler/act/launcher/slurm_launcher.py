"""The Slurm launcher: a replica on `launcher: slurm` nodes is one Slurm job (SPEC section 8).

It sits behind the same per-rank Launcher interface as the SSH launcher. The Actor
starts a replica's ranks workers first, head last; this launcher holds each rank
until the replica's last one arrives, then submits the one job that runs them all
(so a refused job fails the rank that completed it, and the Actor rolls back the
others, which were never more than held). Stopping any rank of a replica cancels its
job. Liveness, GPU indices and pending reasons come from squeue and scontrol.

Every command runs on `slurm.submit_via` (a fleet node, over its Transport, or this
machine) as an argv, quoted once by the transport, with a deadline: sbatch and srun
wait forever for nodes that are down or drained.

`SlurmInventory.fold` brings Slurm's view into the probed inventory: node states
(DOWN/NOT_RESPONDING -> unreachable, DRAIN -> cordoned), every GPU another job holds
(taken, so placement goes around it), and our jobs as the nodes' running ranks. When
Slurm cannot be asked, the Slurm nodes are unreachable for that pass: their jobs are
left alone, as with any node that does not answer.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from reconciler.errors import CommandTimeout, TransportError
from reconciler.act.launcher.base import RankState, StartOutcome, StopOutcome
from reconciler.model import Fleet, Inventory, RankLaunch, RunningRank
from reconciler.owner import catalog_owner
from reconciler.observe.slurm import (
    ENDING_STATES,
    JobDetail,
    JobShape,
    QueuedJob,
    SlurmNode,
    batch_script,
    job_name,
    output_path,
    parse_comment,
    parse_sbatch,
    parse_show_jobs,
    parse_show_nodes,
    parse_squeue,
    replica_of_job,
    sbatch_argv,
    scontrol_jobs_argv,
    scontrol_nodes_argv,
    slurm_error,
    squeue_argv,
)
from reconciler.observe.transport import LocalTransport, Transport
from reconciler.vocabulary import FailureKind, LauncherKind, NodeState

POLL_S = 0.1


class SlurmUnavailable(TransportError):
    """Slurm could not be asked (submit_via unreachable, a command past its deadline, slurmctld down)."""


class SlurmClient:
    """Runs Slurm commands on submit_via. `pool` is anything with `transport_for(spec)` (FleetTransports, SshPool)."""

    def __init__(self, fleet: Fleet, pool: Any = None, *, transport: Transport | None = None):
        if fleet.slurm is None:
            raise ValueError("the fleet has no slurm: section")
        self.fleet = fleet
        self.settings = fleet.slurm
        self.pool = pool
        self._transport = transport
        self.where = self.settings.submit_via

    def transport(self) -> Transport:
        if self._transport is not None:
            return self._transport
        if self.where == "local":
            self._transport = LocalTransport("local")
            return self._transport
        spec = self.fleet.node(self.where)
        if spec is None or self.pool is None:
            raise SlurmUnavailable(self.where, "submit_via names no node of this fleet")
        return self.pool.transport_for(spec)

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, check: bool = True) -> tuple[int, str, str]:
        """(rc, stdout, stderr); raises SlurmUnavailable when the command could not run or, with check, failed."""
        timeout = self.settings.command_timeout_s
        try:
            result = self.transport().run(list(argv), stdin=stdin, timeout=timeout)
        except CommandTimeout as exc:
            raise SlurmUnavailable(self.where, f"{argv[0]} ran past its {timeout:g}s deadline") from exc
        except TransportError as exc:
            raise SlurmUnavailable(self.where, f"{argv[0]}: {exc.reason}") from exc
        out = result.stdout.decode("utf-8", "replace")
        err = result.stderr.decode("utf-8", "replace")
        if check and result.rc != 0:
            if result.rc == 127:
                raise SlurmUnavailable(self.where, f"{argv[0]} is not installed on {self.where}")
            raise SlurmUnavailable(self.where, f"{argv[0]}: {slurm_error(err, result.rc)}")
        return result.rc, out, err

    def queue(self) -> list[QueuedJob]:
        return parse_squeue(self.run(squeue_argv())[1])

    def nodes(self, names: Sequence[str] | None = None) -> dict[str, SlurmNode]:
        return parse_show_nodes(self.run(scontrol_nodes_argv(names))[1])

    def job_details(self) -> dict[str, JobDetail]:
        return parse_show_jobs(self.run(scontrol_jobs_argv())[1])


def _epoch(iso: str) -> float | None:
    try:
        return time.mktime(time.strptime(iso, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


class OurJobs:
    """This owner's jobs in one squeue answer: per replica, the one that counts.

    A live (queued or running) job wins over ended ones; among equals the newest.
    Jobs that ended stay listed for Slurm's MinJobAge, so a job that ended is seen as
    a crash (its ranks not alive), not as a replica that was never started.
    """

    def __init__(self, owner: str, queue: Sequence[QueuedJob]):
        self.by_replica: dict[str, tuple[QueuedJob, JobShape]] = {}
        self.live: dict[str, list[QueuedJob]] = {}
        for job in queue:
            replica = replica_of_job(owner, job.name)
            shape = parse_comment(job.comment) if replica else None
            if replica is None or shape is None:
                continue
            if job.live or job.state in ENDING_STATES:
                self.live.setdefault(replica, []).append(job)
            best = self.by_replica.get(replica)
            if best is None or (job.live, int(job.job_id)) > (best[0].live, int(best[0].job_id)):
                self.by_replica[replica] = (job, shape)


def rank_states(jobs: OurJobs, details: Mapping[str, JobDetail], slurm_names: Mapping[str, str],
                node: str | None = None, replica: str | None = None) -> list[RankState]:
    out = []
    for rid, (job, shape) in sorted(jobs.by_replica.items()):
        if replica is not None and rid != replica:
            continue
        detail = details.get(job.job_id)
        for rank, (nid, port) in enumerate(shape.ranks):
            if node is not None and nid != node:
                continue
            # Slurm's indices while the job holds them; the placement's for a job that ended (a restart reuses them).
            gpus = detail.gpus.get(slurm_names.get(nid, nid)) if detail is not None else None
            if gpus is None and rank < len(shape.gpus):
                gpus = shape.gpus[rank]
            out.append(RankState(
                node=nid, id=rid, rank=rank, alive=job.live, spec_hash=shape.spec_hash, port=port,
                started_at=_epoch(job.start_time), model=shape.model, profile=shape.profile, nnodes=shape.nnodes,
                gpus=tuple(gpus or ()), slurm_job=job.job_id, waiting=job.reason if job.pending else "",
            ))
    return out


@dataclass(frozen=True)
class JobOutput:
    """A replica's Slurm job and where its output file is: on its batch host, the job's first node."""

    job: QueuedJob
    batch_host: str  # Slurm's node name; "" while the job has no nodes (pending)
    node: str | None  # that node's fleet id; None when the fleet has no node of that name
    path: str


class SlurmLauncher:
    """One Slurm job per replica, behind the per-rank Launcher interface."""

    def __init__(self, fleet: Fleet, client: SlurmClient, owner: str, *, stop_grace_s: float = 10.0,
                 fence: Callable[[], str | None] = lambda: None):
        """fence: asked before every sbatch and scancel (SPEC 14): None while this host's epoch may act
        on submit_via, else why not (a newer leader's epoch was seen there, or the lease ran out)."""
        self.fence = fence
        self.fleet = fleet
        self.client = client
        self.owner = owner
        self.stop_grace_s = stop_grace_s
        self.slurm_names = {n.id: n.slurm_node_name for n in fleet.nodes}
        self._held: dict[str, dict[int, RankLaunch]] = {}
        self._lock = threading.Lock()
        self._replica_locks: dict[str, threading.Lock] = {}

    def _replica_lock(self, replica: str) -> threading.Lock:
        with self._lock:
            return self._replica_locks.setdefault(replica, threading.Lock())

    def _details_for(self, jobs: OurJobs) -> dict[str, JobDetail]:
        if not any(job.state == "RUNNING" for job, _ in jobs.by_replica.values()):
            return {}
        return self.client.job_details()

    # -- Launcher

    def start(self, launch: RankLaunch) -> StartOutcome:
        if launch.secret_env:
            # The batch script would carry a value into slurmctld's spool (a file on the controller),
            # and the step runner does not read from_file yet: refused, never dropped silently.
            names = ", ".join(f"{k} {v}" for k, v in sorted(launch.secret_env.items()))
            return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, failure=FailureKind.PERMANENT,
                                reason=f"env {names}: secret references are not supported on launcher: slurm nodes yet")
        with self._lock:
            held = self._held.setdefault(launch.replica, {})
            held[launch.rank] = launch
            if len(held) < launch.nnodes:
                return StartOutcome(launch.node, launch.replica, launch.rank, ok=True,
                                    reason="held until the replica's job is submitted")
            launches = [held[r] for r in sorted(held)]
            del self._held[launch.replica]
        name = job_name(self.owner, launch.replica)
        with self._replica_lock(launch.replica):
            try:
                jobs = OurJobs(self.owner, self.client.queue())
            except SlurmUnavailable as exc:
                return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, reason=f"job {name}: {exc}")
            live = [j for j in jobs.live.get(launch.replica, []) if j.live]
            refusal = self.fence()
            if refusal is not None:
                return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, fenced=True,
                                    reason=f"job {name}: {refusal}")
            if live:
                job, shape = jobs.by_replica[launch.replica]
                wanted = tuple((l.node, l.port) for l in launches)
                if job.live and shape.spec_hash == launch.spec_hash and shape.ranks == wanted:
                    return StartOutcome(launch.node, launch.replica, launch.rank, ok=True, already_running=True,
                                        slurm_job=job.job_id)
                # Never a second job for a replica that is queued or running: the Actor starts a copy
                # only once it has given up the old one (a replace, a move off a lost node, a restart),
                # and Slurm can cancel a job on a node that no longer answers, so the old job goes first.
                for old in live:
                    gone, how = self._cancel(old)
                    if not gone:
                        return StartOutcome(launch.node, launch.replica, launch.rank, ok=False,
                                            reason=f"job {name}: the replica's earlier Slurm job {old.job_id} {how}")
            argv = sbatch_argv(self.client.settings, self.owner, launches, self.slurm_names)
            try:
                rc, out, err = self.client.run(argv, stdin=batch_script(launches, self.slurm_names), check=False)
            except SlurmUnavailable as exc:
                # It may have been submitted before the deadline: uncertain, so the Actor cancels by name.
                return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, uncertain=True,
                                    reason=f"sbatch of job {name}: {exc.reason}")
            job_id = parse_sbatch(out) if rc == 0 else None
            if job_id is None:
                return StartOutcome(launch.node, launch.replica, launch.rank, ok=False,
                                    reason=f"sbatch refused job {name}: {slurm_error(err, rc)}")
            return StartOutcome(launch.node, launch.replica, launch.rank, ok=True, slurm_job=job_id,
                                log=f"/tmp/{name}.{job_id}.out on the job's first node")

    def stop(self, node: str, replica: str, rank: int | None = None, *, keep_record: bool = False) -> StopOutcome:
        # keep_record has nothing to keep here: a cancelled job is one that ended, which reads as a crash.
        with self._lock:
            self._held.pop(replica, None)
        with self._replica_lock(replica):
            try:
                jobs = OurJobs(self.owner, self.client.queue())
            except SlurmUnavailable as exc:
                return StopOutcome(node, replica, ok=False, detail=exc.reason)
            targets = []
            for job in jobs.live.get(replica, []):
                shape = parse_comment(job.comment)
                if shape is not None and any(n == node and (rank is None or r == rank)
                                             for r, (n, _) in enumerate(shape.ranks)):
                    targets.append(job)
            if not targets:
                return StopOutcome(node, replica, ok=True, detail="no Slurm job running")
            refusal = self.fence()
            if refusal is not None:
                return StopOutcome(node, replica, ok=False, detail=refusal, fenced=True)
            details = []
            ok = True
            for job in targets:
                gone, how = self._cancel(job)
                ok = ok and gone
                details.append(f"Slurm job {job.job_id} {how}")
            return StopOutcome(node, replica, ok=ok, detail="; ".join(details))

    def _cancel(self, job: QueuedJob) -> tuple[bool, str]:
        """scancel with TERM; KILL after the grace; confirmed gone from the running states."""
        try:
            if job.pending:
                self.client.run(["scancel", job.job_id], check=False)
                return self._wait_gone(job.job_id, self.stop_grace_s), "cancelled while pending"
            self.client.run(["scancel", "--signal=TERM", "--full", job.job_id], check=False)
            if self._wait_gone(job.job_id, self.stop_grace_s):
                return True, "stopped (TERM)"
            self.client.run(["scancel", "--signal=KILL", "--full", job.job_id], check=False)
            self.client.run(["scancel", job.job_id], check=False)
            if self._wait_gone(job.job_id, max(self.stop_grace_s, 5.0)):
                return True, f"killed (KILL after {self.stop_grace_s:g}s)"
            return False, "still running after TERM and KILL"
        except SlurmUnavailable as exc:
            return False, f"could not be cancelled: {exc.reason}"

    def _wait_gone(self, job_id: str, budget_s: float) -> bool:
        deadline = time.monotonic() + budget_s
        while True:
            rc, out, _ = self.client.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], check=False)
            state = out.strip().upper()
            if rc == 0 and (not state or (state not in ENDING_STATES and not QueuedJob(job_id, "", state, "", "", "").live)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)

    def ranks(self, node: str, replica: str | None = None, *, log_lines: int = 0) -> list[RankState]:
        jobs = OurJobs(self.owner, self.client.queue())
        return rank_states(jobs, self._details_for(jobs), self.slurm_names, node=node, replica=replica)

    def job_output(self, replica: str) -> JobOutput | None:
        """Where the replica's job (the live one, else the latest that ended) writes its output,
        as Slurm says now; None when Slurm knows no job of it. Raises SlurmUnavailable."""
        found = OurJobs(self.owner, self.client.queue()).by_replica.get(replica)
        if found is None:
            return None
        job = found[0]
        # check=False: a job that ended may leave scontrol's memory between the two questions.
        rc, out, _ = self.client.run(scontrol_jobs_argv(job.job_id), check=False)
        detail = parse_show_jobs(out).get(job.job_id) if rc == 0 else None
        batch_host = detail.batch_host if detail is not None else ""
        by_slurm_name = {name: nid for nid, name in self.slurm_names.items()}
        return JobOutput(job, batch_host, by_slurm_name.get(batch_host), output_path(self.owner, replica, job.job_id))


# --------------------------------------------------------------------------
# The inventory: Slurm's view folded into the probe's
# --------------------------------------------------------------------------


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


class RoutingLauncher:
    """Each node's ranks go to the launcher its fleet.yaml `launcher:` names."""

    def __init__(self, by_node: Mapping[str, Any], default: Any):
        self.by_node = dict(by_node)
        self.default = default

    def _for(self, node: str):
        return self.by_node.get(node, self.default)

    def start(self, launch: RankLaunch) -> StartOutcome:
        return self._for(launch.node).start(launch)

    def stop(self, node: str, replica: str, rank: int | None = None, *, keep_record: bool = False) -> StopOutcome:
        return self._for(node).stop(node, replica, rank, keep_record=keep_record)

    def ranks(self, node: str, replica: str | None = None, *, log_lines: int = 0) -> list[RankState]:
        return self._for(node).ranks(node, replica, log_lines=log_lines)


# --------------------------------------------------------------------------
# Wiring: what a pass uses for a catalog
# --------------------------------------------------------------------------


def has_slurm(fleet: Fleet) -> bool:
    return fleet.slurm is not None and any(n.launcher == LauncherKind.SLURM for n in fleet.nodes)


def fleet_launcher(catalog, transports: Any, ssh_launcher: Any, *, owner: str | None = None,
                   stop_grace_s: float = 10.0) -> Any:
    """The pass's launcher: the SSH one, with `launcher: slurm` nodes routed to a SlurmLauncher."""
    fleet = catalog.fleet
    if not has_slurm(fleet):
        return ssh_launcher
    client = SlurmClient(fleet, transports)
    slurm = SlurmLauncher(fleet, client, owner or catalog_owner(catalog), stop_grace_s=stop_grace_s,
                          fence=slurm_fence(client, ssh_launcher))
    return RoutingLauncher({n.id: slurm for n in fleet.nodes if n.launcher == LauncherKind.SLURM}, ssh_launcher)


def slurm_fence(client: SlurmClient, ssh_launcher: Any) -> Callable[[], str | None]:
    """The fence of a leader's Slurm actions: its epoch recorded by the node agent on submit_via (where
    sbatch and scancel run), refused there when a newer leader's was seen. No epoch: nothing to check."""
    if not getattr(ssh_launcher, "epoch", None):
        return lambda: None
    where = client.where
    spec = client.fleet.node(where)
    state_dir = spec.state_dir if spec is not None else ssh_launcher.state_dirs.get(where, "~/.local/state/llm-reconciler")

    def fence() -> str | None:
        refusal = ssh_launcher.may_act()
        if refusal is not None:
            return f"not acting: {refusal}"
        try:
            transport = client.transport()
        except SlurmUnavailable as exc:
            return str(exc)
        on_submit_host = type(ssh_launcher)({where: transport}, {where: state_dir}, owner=ssh_launcher.owner,
                                            epoch=ssh_launcher.epoch, python=ssh_launcher.python)
        outcome = on_submit_host.fence(where)
        return None if outcome is None else f"on {where}: {outcome.reason}"
    return fence


def fold_slurm(catalog, transports: Any, inventory: Inventory, *, owner: str | None = None) -> Inventory:
    """The probed inventory with Slurm's view of the `launcher: slurm` nodes (no-op without any)."""
    fleet = catalog.fleet
    if not has_slurm(fleet):
        return inventory
    desired = {rid for m in catalog.models for rid in m.replica_ids()}
    return SlurmInventory(fleet, SlurmClient(fleet, transports), owner or catalog_owner(catalog), desired).fold(inventory)
