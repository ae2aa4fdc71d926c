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

Slurm's view folded into the probed inventory is slurm_fold's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from reconciler.errors import CommandTimeout, TransportError
from reconciler.act.launcher.base import RankState, StartOutcome, StopOutcome
from reconciler.model import Fleet, RankLaunch
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
from reconciler.vocabulary import FailureKind, LauncherKind

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
