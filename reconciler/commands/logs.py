"""`reconciler logs REPLICA [CATALOG] [--rank N] [--tail N] [--follow]`: an engine's own log, from its node.

Where the replica runs comes from status/ (what the reconciler last wrote); the
log itself is read over the same transport as every other action:

- on an SSH node, the node agent's per-rank file (the engine's stdout and stderr,
  latest start);
- on a `launcher: slurm` node, the output file of the replica's Slurm job (the
  live one, else the latest that ended), which Slurm writes on the job's first
  node: one file for every rank, of which the node agent returns the rank's own
  lines and the job's (srun's and slurmstepd's, which say why a job ended). Slurm
  (on `slurm.submit_via`) says which job and which node.

`--follow` asks the node for what was appended since the last read, once a
second, until interrupted; for a Slurm replica it asks Slurm every few seconds
which job is the replica's, and follows the new job's output after a restart.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

from reconciler.catalog import load_catalog
from reconciler.commands._status_files import read_catalog_status
from reconciler.constants import Exit
from reconciler.errors import FleetUnreachable, ReconcilerError, TransportError, UsageError
from reconciler.act.launcher import LogChunk, SshLauncher
from reconciler.act.launcher.slurm_launcher import SlurmClient, SlurmLauncher, SlurmUnavailable
from reconciler.model import Catalog, NodeSpec
from reconciler.vocabulary import LauncherKind
from reconciler.owner import catalog_owner
from reconciler.observe.ssh import TransportPool

FOLLOW_POLL_S = 1.0
CALL_TIMEOUT_S = 30.0
DEFAULT_TAIL = 100
RECHECK_JOB_EVERY = 5  # polls: how often --follow asks Slurm whether the replica's job is another now


@dataclass(frozen=True)
class LogSource:
    """One rank's log: `read(lines=N)` for its last N lines, `read(offset=K)` for what came after K."""

    where: str  # "m-0 rank 0 on a1", how messages name it
    read: Callable[..., LogChunk]
    # A Slurm replica's restart is a new job writing a new file: `job` is the one read, and
    # `now()` the source of whichever job is the replica's now (raises when it cannot say).
    job: str = ""
    now: Callable[[], "LogSource"] | None = None


def main(args) -> int:
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: give a number of lines, 0 or more")
    node_id = _rank_node(args)
    catalog = load_catalog(args.catalog, with_revision=False)
    node = catalog.fleet.node(node_id)
    if node is None:
        raise ReconcilerError(f"{args.replica} rank {args.rank} runs on node {node_id}, which fleet.yaml no longer has")
    with TransportPool() as pool:
        # The owner names the rank's files on the node (records and logs of another catalog sharing it differ).
        agent = SshLauncher(_Transports(pool, catalog), {n.id: n.state_dir for n in catalog.fleet.nodes},
                            timeout_s=CALL_TIMEOUT_S, owner=catalog_owner(catalog))
        if node.launcher == LauncherKind.SLURM and catalog.fleet.slurm is not None:
            source = _slurm_source(args, catalog, pool, agent)
        else:
            source = _agent_source(args, node, agent)
        _print_log(source, args)
    return Exit.OK


def _rank_node(args) -> str:
    """The node the asked-for rank runs on, by status/; refused in one line when there is none."""
    status = read_catalog_status(args.catalog)
    replicas = status.replicas()
    if args.replica not in replicas:
        known = ", ".join(sorted(replicas)) or "none (nothing has written status/ yet)"
        raise ReconcilerError(f"no replica {args.replica!r} in {status.root / 'status'}; replicas: {known}")
    _, replica = replicas[args.replica]
    ranks = {n.get("rank"): n.get("node") for n in replica.get("nodes") or []}
    if not ranks:
        why = " ".join(str(replica.get("message") or "").split())
        raise ReconcilerError(f"{args.replica} runs on no node ({replica.get('phase') or 'Unknown'}"
                              f"{': ' + why if why else ''}), so it has no log")
    if args.rank not in ranks:
        raise ReconcilerError(f"{args.replica} has no rank {args.rank}; its ranks: "
                              + ", ".join(f"{r} on {n}" for r, n in sorted(ranks.items())))
    return ranks[args.rank]


class _Transports:
    """node id -> transport, opened on first use (the agent reads from one node, not all of them)."""

    def __init__(self, pool: TransportPool, catalog: Catalog):
        self.pool, self.fleet = pool, catalog.fleet

    def get(self, node_id: str):
        spec = self.fleet.node(node_id)
        return None if spec is None else self.pool.transport_for(spec)


def _agent_source(args, node: NodeSpec, agent: SshLauncher) -> LogSource:
    def read(**kw) -> LogChunk:
        return agent.logs(node.id, args.replica, args.rank, **kw)

    return LogSource(f"{args.replica} rank {args.rank} on {node.id}", read)


def _slurm_source(args, catalog: Catalog, pool: TransportPool, agent: SshLauncher) -> LogSource:
    """The replica's Slurm job output, on the job's batch host: Slurm says which job and where."""
    slurm = SlurmLauncher(catalog.fleet, SlurmClient(catalog.fleet, pool), catalog_owner(catalog))
    where = f"{args.replica} rank {args.rank}"
    try:
        output = slurm.job_output(args.replica)
    except SlurmUnavailable as exc:
        raise FleetUnreachable(f"{where}: Slurm did not answer (on {exc.node}): {exc.reason}") from None
    if output is None:
        raise ReconcilerError(f"{where}: no log yet (Slurm knows no job of it)")
    job = output.job
    if not output.batch_host:
        waiting = f" ({job.reason})" if job.pending and job.reason not in ("", "None") else ""
        raise ReconcilerError(f"{where}: no log yet (its Slurm job {job.job_id} is {job.state.lower()}{waiting})")
    if output.node is None:
        raise ReconcilerError(f"{where}: Slurm job {job.job_id} writes its output on {output.batch_host}, "
                              "which is no node of fleet.yaml")

    def read(**kw) -> LogChunk:
        return agent.job_output(output.node, output.path, args.rank, **kw)

    return LogSource(f"{where} (Slurm job {job.job_id}, output on {output.node})", read, job.job_id,
                     lambda: _slurm_source(args, catalog, pool, agent))


def _print_log(source: LogSource, args) -> None:
    try:
        chunk = source.read(lines=DEFAULT_TAIL if args.tail is None else args.tail)
        if not chunk.exists:
            raise ReconcilerError(f"{source.where}: no log yet (that rank has not been started there)")
        _print(chunk.lines)
        offset = chunk.offset
        polls = 0
        while args.follow:
            time.sleep(FOLLOW_POLL_S)
            polls += 1
            if polls % RECHECK_JOB_EVERY == 0 and (newer := _newer_job(source)) is not None:
                source, offset = newer, 0  # the restarted replica's new job: its output from the start
            chunk = source.read(offset=offset)
            _print(chunk.lines)
            offset = chunk.offset
    except TransportError as exc:
        raise FleetUnreachable(f"{source.where}: node did not answer: {exc.reason}") from None


def _newer_job(source: LogSource) -> LogSource | None:
    """The source of the replica's job where it is another than the one followed (a restart), else None."""
    if source.now is None:
        return None
    try:
        now = source.now()
    except ReconcilerError:
        return None  # pending, or Slurm not answering now: the file followed stays the one there is
    if now.job == source.job:
        return None
    print(f"reconciler: now {now.where}", file=sys.stderr, flush=True)
    return now


def _print(lines) -> None:
    if lines:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
