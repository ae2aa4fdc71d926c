"""Slurm, as the reconciler speaks it: command lines built as argv, stable text outputs parsed (pure).

Only Slurm's stable text interfaces are used (`sbatch --parsable`, `squeue -h -o`,
`scontrol -o show node/job -d`), never `--json`, which Slurm 22.05 (Debian 12) lacks.
Nothing here runs a command: reconciler/act/launcher/slurm_launcher.py does, through a
Transport, with a deadline on each.

A replica is one job. Its name is `llmrc.<owner>.<replica>`; its comment carries what
the reconciler needs to recognise the job after a restart without any record of its own:

    llmrc/1 <spec_hash> <model> <profile> <node>:<port>:<gpus>,<node>:<port>:<gpus>,...

(fleet node ids in rank order: the rank is the placement's, whatever order Slurm numbers
the nodes in; <gpus> the placement's GPU indices joined by `+`, which a restart of a job
that ended reuses, since Slurm forgets what an ended job held). No `=` in it, so `scontrol -o` output, which is `key=value` pairs, stays
parseable around it.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import field
from typing import Iterable, Mapping, Sequence

from reconciler.frozen import frozen
from reconciler.model import RankLaunch, SlurmSettings

JOB_PREFIX = "llmrc"
COMMENT_TAG = "llmrc/1"
# squeue fields, separated by the ASCII unit separator: no job name or comment holds one.
SEP = "\x1f"
SQUEUE_FORMAT = SEP.join(["%i", "%j", "%T", "%r", "%S", "%k"])
# Job states in which the job's processes run or are about to (squeue's long names).
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                         "REQUEUE_FED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT"})
# Still holding nodes while it ends: not serving, but not gone either.
ENDING_STATES = frozenset({"COMPLETING", "STOPPED"})


def job_name(owner: str, replica: str) -> str:
    return f"{JOB_PREFIX}.{owner}.{replica}"


# Where a job's output goes (sbatch --output): written by Slurm on the job's first node (its batch host).
OUTPUT_DIR = "/tmp"


def output_path(owner: str, replica: str, job_id: str) -> str:
    return f"{OUTPUT_DIR}/{job_name(owner, replica)}.{job_id}.out"


def replica_of_job(owner: str, name: str) -> str | None:
    prefix = f"{JOB_PREFIX}.{owner}."
    return name[len(prefix):] if name.startswith(prefix) and len(name) > len(prefix) else None


# --------------------------------------------------------------------------
# The job comment
# --------------------------------------------------------------------------


@frozen
class JobShape:
    """What the comment of one of our jobs says."""

    spec_hash: str
    model: str
    profile: str
    ranks: tuple[tuple[str, int], ...]  # (fleet node id, port), rank order
    gpus: tuple[tuple[int, ...], ...] = ()  # the placement's GPU indices per rank

    @property
    def nnodes(self) -> int:
        return len(self.ranks)


def job_comment(launches: Sequence[RankLaunch]) -> str:
    ordered = sorted(launches, key=lambda l: l.rank)
    head = ordered[0]
    ranks = ",".join(f"{l.node}:{l.port}:{'+'.join(str(g) for g in l.gpus)}" for l in ordered)
    return f"{COMMENT_TAG} {head.spec_hash} {head.model} {head.profile} {ranks}"


def parse_comment(comment: str) -> JobShape | None:
    parts = comment.split()
    if len(parts) != 5 or parts[0] != COMMENT_TAG:
        return None
    ranks = []
    gpus = []
    for item in parts[4].split(","):
        fields = item.split(":")
        if len(fields) != 3 or not fields[0] or not fields[1].isdigit():
            return None
        idx = fields[2].split("+") if fields[2] else []
        if not all(i.isdigit() for i in idx):
            return None
        ranks.append((fields[0], int(fields[1])))
        gpus.append(tuple(int(i) for i in idx))
    return JobShape(parts[1], parts[2], parts[3], tuple(ranks), tuple(gpus))


# --------------------------------------------------------------------------
# sbatch: the command and the batch script
# --------------------------------------------------------------------------


# The step's one task per node: picks its rank by the node Slurm says it is on and
# becomes that rank's engine (stdlib only, runs under any python3 on the node).
STEP_RUNNER = r'''
import base64, json, os, sys
plan = json.loads(base64.b64decode(PLAN_B64))
me = os.environ.get("SLURMD_NODENAME", "")
rank = plan["ranks"].get(me)
if rank is None:
    sys.stderr.write("llm-reconciler: Slurm ran this step on %r, which is none of %s\n" % (me, sorted(plan["ranks"])))
    sys.exit(3)
env = dict(os.environ)
slurm_gpus = env.get("CUDA_VISIBLE_DEVICES")
env.update(rank["env"])
if slurm_gpus is not None:
    env["CUDA_VISIBLE_DEVICES"] = slurm_gpus  # GPUs are Slurm's to hand out
fd = os.open(os.devnull, os.O_RDONLY)
os.dup2(fd, 0)
sys.stdout.write("--- llm-reconciler: starting rank %d of %s on %s\n" % (rank["rank"], plan["replica"], me))
sys.stdout.flush()
try:
    os.execvpe(rank["argv"][0], rank["argv"], env)
except OSError as exc:
    sys.stderr.write("llm-reconciler: cannot run %s: %s\n" % (rank["argv"][0], exc))
    sys.exit(127)
'''


def batch_script(launches: Sequence[RankLaunch], slurm_names: Mapping[str, str]) -> bytes:
    """The job's script: one srun step, one task per node, each task running its own rank.

    Argv and env travel as base64 JSON inside a quoted here-document (no shell expansion,
    and base64 cannot close it) on the step's stdin, which srun copies to every task:
    never on a command line, where `ps` on any node would show the engine's secrets.
    """
    plan = {
        "replica": launches[0].replica,
        "ranks": {
            slurm_names.get(l.node, l.node): {"rank": l.rank, "argv": list(l.argv), "env": dict(l.env)}
            for l in launches
        },
    }
    encoded = base64.b64encode(json.dumps(plan, separators=(",", ":")).encode()).decode()
    runner = f'PLAN_B64 = "{encoded}"\n' + STEP_RUNNER
    return (
        "#!/bin/sh\n"
        f"# llm-reconciler: replica {_shell_comment(launches[0].replica)}\n"
        "exec srun --input=all --kill-on-bad-exit=1 --label python3 -I -S - <<'LLMRC_STEP_EOF'\n"
        f"{runner}"
        "LLMRC_STEP_EOF\n"
    ).encode()


def _shell_comment(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def sbatch_argv(settings: SlurmSettings, owner: str, launches: Sequence[RankLaunch],
                slurm_names: Mapping[str, str]) -> list[str]:
    ordered = sorted(launches, key=lambda l: l.rank)
    gpus = len(ordered[0].gpus)
    argv = [
        "sbatch", "--parsable",
        f"--job-name={job_name(owner, ordered[0].replica)}",
        f"--comment={job_comment(ordered)}",
        f"--nodes={len(ordered)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(slurm_names.get(l.node, l.node) for l in ordered)}",
        f"--time={settings.time_limit}",
        f"--output={output_path(owner, ordered[0].replica, '%j')}",
    ]
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    for flag, value in (("--partition", settings.partition), ("--account", settings.account), ("--qos", settings.qos)):
        if value:
            argv.append(f"{flag}={value}")
    argv += list(settings.extra_args)
    return argv


def parse_sbatch(stdout: str) -> str | None:
    """`sbatch --parsable` prints `<jobid>` or `<jobid>;<cluster>`."""
    first = stdout.strip().splitlines()[-1:] or [""]
    job = first[0].split(";")[0].strip()
    return job if job.isdigit() else None


def slurm_error(stderr: str, rc: int) -> str:
    """Slurm's own words, one line: `sbatch: error: ...` lines joined."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    errors = [l for l in lines if "error" in l.lower()] or lines
    return "; ".join(errors) or f"exit {rc}"


# --------------------------------------------------------------------------
# squeue
# --------------------------------------------------------------------------


@frozen
class QueuedJob:
    job_id: str
    name: str
    state: str  # squeue's long state name: PENDING, RUNNING, COMPLETED, ...
    reason: str  # why it is pending ("Resources", "Priority", ...); "None" when it runs
    start_time: str  # ISO local time, "N/A" when not started
    comment: str

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


def squeue_argv() -> list[str]:
    # -t all: jobs that ended stay listed for MinJobAge, so an end is seen as a crash, not an absence.
    return ["squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT]


def parse_squeue(stdout: str) -> list[QueuedJob]:
    jobs = []
    for line in stdout.splitlines():
        parts = line.split(SEP)
        if len(parts) != 6 or not parts[0].strip():
            continue
        jobs.append(QueuedJob(parts[0].strip(), parts[1], parts[2].strip().upper(), parts[3].strip(),
                              parts[4].strip(), parts[5]))
    return jobs


# --------------------------------------------------------------------------
# Host lists
# --------------------------------------------------------------------------


# The widest range a host list or GPU index list is expanded over (Slurm's own bound on a host list
# is 64k names): a wider one is taken as the text it is, never as millions of names to build.
MAX_RANGE = 1 << 16


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host lists: `a[1-3,5]`, `gpu-a[01-02],login1`, `n[1-2]-ib[3-4]`."""
    names: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            item = text[start:i].strip()
            if item and item not in ("(null)", "N/A"):
                names.extend(_expand_one(item))
            start = i + 1
    return names


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if m is None:
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    out = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if sep and lo.isdigit() and hi.isdigit():
            if int(hi) - int(lo) >= MAX_RANGE:
                return [item]
            width = len(lo) if lo.startswith("0") else 0
            values = [str(v).zfill(width) for v in range(int(lo), int(hi) + 1)]
        else:
            values = [part]
        for v in values:
            out.extend(_expand_one(head + v + tail))
            if len(out) > MAX_RANGE:  # ranges multiplied (n[1-60000]-ib[1-60000]): the text as it is
                return [item]
    return out


def parse_index_list(text: str) -> tuple[int, ...]:
    """`0-1,3` -> (0, 1, 3)."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if lo.isdigit() and (not sep or (hi.isdigit() and int(hi) - int(lo) < MAX_RANGE)):
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return tuple(sorted(set(out)))


_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:(\d+)(?:\(IDX:([^)]*)\))?")


def gpu_gres(text: str) -> tuple[int, tuple[int, ...] | None]:
    """GPU count and indices of a GRES string: `gpu:2(IDX:0-1)`, `gpu:h100:1(IDX:3),mps:0`, `gpu:1`."""
    count = 0
    indices: list[int] | None = None
    for m in _GPU_GRES.finditer(text or ""):
        count += int(m.group(1))
        if m.group(2) is not None:
            indices = (indices or []) + list(parse_index_list(m.group(2)))
    return count, (tuple(sorted(set(indices))) if indices is not None else None)


@frozen
class SlurmNode:
    name: str
    state: str  # e.g. IDLE, MIXED+DRAIN, DOWN+NOT_RESPONDING, IDLE*
    reason: str = ""
    gpus_used: int = 0
    gpus_used_idx: tuple[int, ...] | None = None  # None: Slurm did not say which

    @property
    def flags(self) -> frozenset[str]:
        base = self.state.rstrip("*~#!%$@^-")
        words = set(base.split("+"))
        if self.state.endswith("*"):
            words.add("NOT_RESPONDING")
        return frozenset(w.upper() for w in words if w)

    @property
    def unreachable(self) -> bool:
        return bool(self.flags & {"DOWN", "NOT_RESPONDING", "FAIL", "POWERED_DOWN", "POWER_DOWN", "FUTURE"})

    @property
    def cordoned(self) -> bool:
        return bool(self.flags & {"DRAIN", "DRAINING", "DRAINED", "FAILING"})


_NODE_NAME = re.compile(r"^NodeName=(\S+)")
_NODE_STATE = re.compile(r"\sState=(\S+)")
_GRES_USED = re.compile(r"\sGresUsed=(\S+)")


def parse_show_nodes(stdout: str) -> dict[str, SlurmNode]:
    """`scontrol -o show node -d`: the four fields needed, searched for directly (a 4,000-node
    cluster is a few megabytes of output, parsed on every pass)."""
    nodes = {}
    for line in stdout.splitlines():
        m = _NODE_NAME.match(line)
        if m is None:
            continue
        name = m.group(1)
        state = _NODE_STATE.search(line)
        used = _GRES_USED.search(line)
        count, idx = gpu_gres(used.group(1) if used else "")
        # scontrol prints Reason last, and an operator's words may hold `key=value`: take the rest of the line.
        reason = line.split(" Reason=", 1)[1].strip() if " Reason=" in line else ""
        nodes[name] = SlurmNode(name, state.group(1) if state else "UNKNOWN",
                                "" if reason in ("(null)", "None") else reason, count, idx)
    return nodes


@frozen
class JobDetail:
    job_id: str
    name: str
    state: str
    user: str
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # Slurm node name -> GPU indices
    batch_host: str = ""  # the Slurm node that runs the batch script and writes the job's output


_JOB_ID = re.compile(r"^JobId=(\d+)")
_JOB_NAME = re.compile(r"\sJobName=(.*?)\s+UserId=")
_JOB_USER = re.compile(r"\sUserId=([^\s(]*)")
_JOB_STATE = re.compile(r"\sJobState=(\S+)")
_JOB_BATCH_HOST = re.compile(r"\sBatchHost=(\S+)")
_JOB_GROUP = re.compile(r"\sNodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)")


def parse_show_jobs(stdout: str) -> dict[str, JobDetail]:
    """`scontrol -o show job -d`: id, name, state, user and, per node set, the GPU indices held."""
    jobs = {}
    for line in stdout.splitlines():
        m = _JOB_ID.match(line)
        if m is None:
            continue
        name = _JOB_NAME.search(line)
        user = _JOB_USER.search(line)
        state = _JOB_STATE.search(line)
        gpus: dict[str, tuple[int, ...]] = {}
        for group in _JOB_GROUP.finditer(line):
            _, idx = gpu_gres(group.group(2))
            for n in expand_hostlist(group.group(1)):
                gpus[n] = tuple(sorted(set(gpus.get(n, ())) | set(idx or ())))
        batch = _JOB_BATCH_HOST.search(line)
        host = batch.group(1) if batch and batch.group(1) not in ("(null)", "None") else ""
        jobs[m.group(1)] = JobDetail(m.group(1), name.group(1) if name else "", state.group(1) if state else "",
                                     user.group(1) if user else "", gpus, host)
    return jobs


def scontrol_nodes_argv(names: Iterable[str] | None = None) -> list[str]:
    argv = ["scontrol", "-o", "show", "node", "-d"]
    names = list(names or ())
    return argv + [",".join(names)] if names else argv


def scontrol_jobs_argv(job_id: str | None = None) -> list[str]:
    argv = ["scontrol", "-o", "show", "job", "-d"]
    return argv + [job_id] if job_id else argv
