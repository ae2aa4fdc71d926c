"""The SSH launcher: the node agent sent through a node's Transport, one command per call."""

from __future__ import annotations

import base64
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping

from reconciler.agent_keys import Answer, Record
from reconciler.errors import TransportError, kind_of, parse_json
from reconciler.act.launcher.base import LogChunk, RankState, StartOutcome, StopOutcome
from reconciler.model import RankLaunch, SshSettings
from reconciler.vocabulary import FailureKind, SecretKind
from reconciler.observe.transport import Transport

DEFAULT_STATE_DIR = "~/.local/state/llm-reconciler"
DEFAULT_COMMAND_TIMEOUT_S = SshSettings.command_timeout_s
LOG_LINES_ON_FAILURE = 16  # of a rank that exited at once: enough to reach an error above a usage text


# The node agent's modules (paths under reconciler/), in the order its text carries them: each only
# uses names defined above it. The keys come first: the probe's payload opens with the same text.
AGENT_MODULES = ("agent_keys.py", "act/launcher/agent_proc.py", "act/launcher/agent_files.py",
                 "act/launcher/node_agent.py")  # paths inside the reconciler package


@lru_cache(maxsize=1)
def agent_source() -> bytes:
    """The node agent's program: its modules' text, one after the other (see node_agent.py)."""
    package = Path(__file__).parents[2]  # reconciler/
    return b"\n\n".join((package / name).read_bytes() for name in AGENT_MODULES)


def _failure_kind(word) -> FailureKind | None:
    """The agent's failure word typed (it sends text, stdlib only); anything else reads as unknown (None)."""
    return FailureKind(word) if word in (FailureKind.TEMPORARY, FailureKind.PERMANENT) else None


def agent_stdin(request: dict) -> bytes:
    """The agent's text with the request as a base64 literal on its first line (see node_agent.py)."""
    encoded = base64.b64encode(json.dumps(request, separators=(",", ":")).encode())
    return b'REQUEST_B64 = "' + encoded + b'"\n' + agent_source()


def request_of(stdin: bytes) -> dict:
    """The request inside an agent's stdin (for tests and debugging)."""
    first = stdin.split(b"\n", 1)[0]
    return json.loads(base64.b64decode(first.split(b'"')[1]))


FENCED_OPS = ("start", "stop", "fence")  # the agent's operations that change a node


def not_leading(reason: str) -> str:
    return f"not acting: {reason}"


class SshLauncher:
    """Starts and stops ranks through each node's Transport (LocalTransport or SshTransport).

    `state_dirs` maps node id -> that node's state dir (NodeSpec.state_dir);
    `~` in it is expanded on the node, by the agent.
    """

    def __init__(
        self,
        transports: Mapping[str, Transport],
        state_dirs: Mapping[str, str] | None = None,
        *,
        python: str = "python3",
        stop_grace_s: float = 10.0,
        timeout_s: float | None = None,
        owner: str | None = None,
        epoch: int | None = None,
        may_act: Callable[[], str | None] = lambda: None,
    ):
        """owner: the catalog's owner (reconciler.owner); its records carry it and only its
        own ranks are started, stopped, reported or adopted (None: records without an owner).
        epoch: the leader's (SPEC 14), carried by every start and stop for the node to fence; None
        without `leader:`. may_act: None while this host may act, else why not (a leader whose lease
        could not be renewed stops before its next start or stop, even inside a pass)."""
        self.owner = owner
        self.epoch = epoch
        self.may_act = may_act
        self.transports = transports
        self.state_dirs = dict(state_dirs or {})
        self.python = python
        self.stop_grace_s = stop_grace_s
        self.timeout_s = timeout_s

    @classmethod
    def for_fleet(cls, fleet, transports: Mapping[str, Transport], **kw) -> "SshLauncher":
        return cls(transports, {n.id: n.state_dir for n in fleet.nodes}, **kw)

    def _timeout(self, transport: Transport) -> float:
        """timeout_s when given, else the node's own ssh.command_timeout_s (what its transport enforces)."""
        if self.timeout_s is not None:
            return self.timeout_s
        return float(transport.command_timeout_s)

    def _call(self, node: str, request: dict, timeout: float | None = None) -> dict:
        transport = self.transports.get(node)
        if transport is None:
            raise TransportError(node, "no transport for this node")
        request = {**request, "state_dir": self.state_dirs.get(node, DEFAULT_STATE_DIR)}
        if self.owner is not None:
            request["owner"] = self.owner
        if self.epoch and request.get("op") in FENCED_OPS:
            request["epoch"] = self.epoch
        # -I -S: the agent needs nothing but the stdlib, so skip site-packages and PYTHON* variables
        # (a third of the interpreter's start-up, and immune to a node's stray PYTHONPATH).
        # The argv is constant; the request rides on stdin, where `ps` on the node cannot read its secrets.
        result = transport.run(
            [self.python, "-I", "-S", "-"],
            stdin=agent_stdin(request),
            timeout=timeout or self._timeout(transport),
        )
        if result.rc != 0:
            last = (result.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
            if result.rc == 127:
                last = f"{self.python} not found on the node"
            raise TransportError(node, f"node agent failed (exit {result.rc}): {last}")
        try:
            answer = parse_json(result.stdout)
        except ValueError:
            raise TransportError(node, "node agent answered something that is not JSON") from None
        if not isinstance(answer, dict):
            raise TransportError(node, "node agent answered something that is not a JSON object")
        return answer

    def fence(self, node: str) -> StartOutcome | None:
        """A new leader's epoch recorded on `node` before anything else (None when it was): from then
        on no older leader's action reaches it. A fenced or unanswered node is an outcome."""
        try:
            answer = self._call(node, {"op": "fence"})
        except TransportError as exc:
            return StartOutcome(node, "-", 0, ok=False, reason=exc.reason, uncertain=True)
        if answer.get(Answer.OK):
            return None
        return StartOutcome(node, "-", 0, ok=False, reason=str(answer.get(Answer.REASON, "")),
                            fenced=Answer.FENCED in answer)

    def start(self, launch: RankLaunch) -> StartOutcome:
        refusal = self.may_act()
        if refusal is not None:
            return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, reason=not_leading(refusal),
                                fenced=True)
        env = dict(launch.env)
        env_files: dict[str, str] = {}
        for name, ref in sorted(launch.secret_env.items()):
            if ref.kind == SecretKind.FROM_FILE:
                env_files[name] = ref.name  # read by the agent on the node: the value never leaves it
                continue
            value = os.environ.get(ref.name)
            if value is None:
                return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, failure=FailureKind.PERMANENT,
                                    reason=f"env {name}: {ref} is not set in the reconciler's environment")
            env[name] = value  # travels on the agent's stdin, never in an argv
        request = {
            "op": "start",
            "replica": launch.replica,
            "model": launch.model,
            "profile": launch.profile,
            "rank": launch.rank,
            "nnodes": launch.nnodes,
            "spec_hash": launch.spec_hash,
            "argv": list(launch.argv),
            "env": env,
            "env_files": env_files,
            "port": launch.port,
            "gpus": list(launch.gpus),
            "listen_timeout_s": launch.listen_timeout_s,
            "log_lines": LOG_LINES_ON_FAILURE,
            "revision": launch.revision,
        }
        try:
            transport = self.transports.get(launch.node)
            base = self._timeout(transport) if transport is not None else DEFAULT_COMMAND_TIMEOUT_S
            answer = self._call(launch.node, request, timeout=base + (launch.listen_timeout_s or 0))
        except TransportError as exc:
            return StartOutcome(launch.node, launch.replica, launch.rank, ok=False, reason=exc.reason, uncertain=True,
                                failure=kind_of(exc))
        return StartOutcome(
            launch.node,
            launch.replica,
            launch.rank,
            ok=bool(answer.get(Answer.OK)),
            reason=answer.get(Answer.REASON, ""),
            pid=answer.get(Answer.PID),
            log=answer.get(Answer.LOG),
            already_running=bool(answer.get(Answer.ALREADY_RUNNING)),
            port_in_use=answer.get(Answer.PORT_IN_USE),
            revision=answer.get(Answer.REVISION) if isinstance(answer.get(Answer.REVISION), str) else None,
            # The agent says which of its refusals no retry can mend (a binary not on the node).
            failure=_failure_kind(answer.get(Answer.FAILURE)),
            fenced=Answer.FENCED in answer,
        )

    def stop(self, node: str, replica: str, rank: int | None = None, *, keep_record: bool = False) -> StopOutcome:
        refusal = self.may_act()
        if refusal is not None:
            return StopOutcome(node, replica, ok=False, detail=not_leading(refusal), fenced=True)
        request = {"op": "stop", "replica": replica, "rank": rank, "grace_s": self.stop_grace_s,
                   "keep_record": keep_record}
        try:
            transport = self.transports.get(node)
            base = self._timeout(transport) if transport is not None else DEFAULT_COMMAND_TIMEOUT_S
            answer = self._call(node, request, timeout=base + 2 * self.stop_grace_s)
        except TransportError as exc:
            return StopOutcome(node, replica, ok=False, detail=exc.reason, unanswered=True)
        if Answer.FENCED in answer:
            return StopOutcome(node, replica, ok=False, detail=str(answer.get(Answer.REASON, "")), fenced=True)
        details = "; ".join(f"rank {r[Answer.RANK]}: {r[Answer.DETAIL]}" for r in answer.get(Answer.RANKS, []))
        return StopOutcome(node, replica, ok=bool(answer.get(Answer.OK)), detail=details or "nothing running")

    def ranks(self, node: str, replica: str | None = None, *, log_lines: int = 0) -> list[RankState]:
        answer = self._call(node, {"op": "status", "replica": replica, "log_lines": log_lines})
        return [
            RankState(
                node=node,
                id=r.get(Record.ID, ""),
                rank=int(r.get(Record.RANK, 0)),
                alive=bool(r.get(Record.ALIVE)),
                spec_hash=r.get(Record.SPEC_HASH, ""),
                port=int(r.get(Record.PORT) or 0),
                pid=r.get(Record.PID),
                started_at=r.get(Record.STARTED_AT),
                log_tail=tuple(r.get(Record.LOG_TAIL) or ()),
                model=r.get(Record.MODEL, ""),
                profile=r.get(Record.PROFILE, ""),
                nnodes=int(r.get(Record.NNODES) or 1),
                gpus=tuple(r.get(Record.GPUS) or ()),
            )
            for r in answer.get(Answer.RANKS, [])
        ]

    def logs(self, node: str, replica: str, rank: int, *, lines: int = 100, offset: int | None = None) -> LogChunk:
        """A rank's log on its node: the last `lines` lines, or what came after `offset`.

        Raises TransportError when the node cannot answer."""
        return self._log_chunk(node, {"op": "logs", "replica": replica, "rank": rank, "lines": lines}, offset)

    def job_output(self, node: str, path: str, rank: int, *, lines: int = 100, offset: int | None = None) -> LogChunk:
        """One rank's lines of a Slurm job's output file on `node` (the job's batch host), as `logs`.

        Raises TransportError when the node cannot answer."""
        return self._log_chunk(node, {"op": "output", "path": path, "rank": rank, "lines": lines}, offset)

    def _log_chunk(self, node: str, request: dict, offset: int | None) -> LogChunk:
        if offset is not None:
            request = {**request, "offset": offset}
        answer = self._call(node, request)
        return LogChunk(
            exists=bool(answer.get(Answer.EXISTS, True)),
            lines=tuple(str(line) for line in answer.get(Answer.LINES) or ()),
            offset=int(answer.get(Answer.OFFSET) or 0),
            path=str(answer.get(Answer.LOG) or ""),
        )
