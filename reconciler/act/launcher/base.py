"""The launcher protocol and what its calls come to (see the package's docstring)."""

from __future__ import annotations

from typing import Protocol

from reconciler.frozen import frozen
from reconciler.model import RankLaunch, RunningRank
from reconciler.vocabulary import FailureKind


@frozen
class StartOutcome:
    node: str
    replica: str
    rank: int
    ok: bool
    reason: str = ""  # why it failed: names the port and holder, the missing binary, the unreachable node
    pid: int | None = None
    log: str | None = None
    already_running: bool = False  # found running with the same spec: adopted, not launched again
    port_in_use: int | None = None  # the port that was taken, so the next pass avoids it
    slurm_job: str = ""  # launcher: slurm: the job the replica runs in
    # The node stopped answering mid-request: the rank may be running (its record says so) or not.
    uncertain: bool = False
    revision: str | None = None  # an adopted rank: the revision its record says it was started from
    # Not ok: whether retrying can help (FailureKind.TEMPORARY: a timeout, a taken port) or not until the
    # catalog or the node changes (FailureKind.PERMANENT: the engine's binary is not there). None reads as temporary.
    failure: FailureKind | None = None
    # Refused by the node for an epoch older than one it has seen (SPEC 14): this host no longer leads.
    fenced: bool = False


@frozen
class StopOutcome:
    node: str
    replica: str
    ok: bool
    detail: str = ""
    # The node did not answer the request (a TransportError: no connection, or no answer by the deadline):
    # the pass reports it unreachable, as a probe would have, so what follows does not wait on it again.
    unanswered: bool = False
    fenced: bool = False  # refused for an old epoch, as StartOutcome.fenced


# A managed rank as its node reports it now: the one rank type (model.RunningRank), with node,
# started_at and log_tail set.
RankState = RunningRank


@frozen
class LogChunk:
    """Part of a rank's log as its node has it. `offset`: where the next read starts."""

    exists: bool  # False: the rank was never started on that node (no log file)
    lines: tuple[str, ...] = ()
    offset: int = 0
    path: str = ""


class Launcher(Protocol):
    def start(self, launch: RankLaunch) -> StartOutcome:
        """Start one rank, or find it already running with the same spec. Never raises for a node's failure."""

    def stop(self, node: str, replica: str, rank: int | None = None, *, keep_record: bool = False) -> StopOutcome:
        """Stop one rank (or every rank of the replica on that node) and confirm it is gone.

        Stopping what is already gone succeeds. keep_record: end the processes but leave the rank
        known, as a dead one (a start that timed out reads as a crash, restarted with backoff)."""

    def ranks(self, node: str, replica: str | None = None, *, log_lines: int = 0) -> list[RankState]:
        """The managed ranks on a node, with liveness; raises TransportError when the node cannot answer."""
