"""The node agent's files: rank records under the state dir, and the logs it reads back
(a rank's own log, a Slurm job's output labelled by task). Stdlib only.

Part of the node agent's text (ssh_launcher.AGENT_MODULES: agent_keys, agent_proc, agent_files,
then node_agent, as one program on `python3 -I -S -`); see node_agent.py.
"""

import json
import os

if "Record" not in globals():
    # Not on a node: there, the text of agent_keys.py precedes this one and has defined these already.
    from reconciler.agent_keys import MANAGER, Record

TAIL_BYTES = 256 * 1024
START_MARK = "--- llm-reconciler: starting "  # the line written before each start


def state_paths(state_dir):
    root = os.path.expanduser(state_dir)
    return root, os.path.join(root, "replicas"), os.path.join(root, "logs")


_OWNER_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def owner_of(req):
    """The catalog this request acts for (fleet.yaml `owner:`, or derived), or None (one with no owner)."""
    owner = req.get("owner")
    if isinstance(owner, str) and owner and set(owner) <= _OWNER_CHARS:
        return owner
    return None


def record_name(replica, rank, owner=None):
    # The owner is part of the name: two catalogs sharing a node may both have a replica `llama-0`.
    base = "%s.rank%d" % (replica, rank)
    return "%s.%s" % (owner, base) if owner else base


def is_mine(rec, owner):
    """Another owner's records are never stopped, adopted or reported as ours. A record with no
    owner predates ownership: it belongs to whichever catalog runs that replica."""
    return owner is None or rec.get(Record.OWNER) in (None, owner)


def read_record(path):
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get(Record.MANAGED_BY) != MANAGER:
        return None
    return rec


def write_atomically(path, data):
    # Atomic (rename), not durable (no fsync): a record only has to outlive the
    # reconciler, not the machine; after a power loss its engine is gone too, and
    # an unreadable record is skipped like a missing one.
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def records(records_dir, replica=None, owner=None):
    """(path, record) of every readable record of `owner`, optionally of one replica, in name order."""
    try:
        names = sorted(os.listdir(records_dir))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(records_dir, name)
        rec = read_record(path)
        if rec is None or (replica is not None and rec.get(Record.ID) != replica) or not is_mine(rec, owner):
            continue
        found.append((path, rec))
    return found


def tail(path, lines):
    if lines <= 0:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    # The log is appended across starts: only the latest run's lines say why it is in the state it is.
    for i in range(len(text) - 1, -1, -1):
        if text[i].startswith(START_MARK):
            text = text[i + 1:]
            break
    return text[-lines:]


def appended(path, size, offset):
    """(the whole lines written since byte `offset`, where the next read starts)."""
    start = int(offset)
    if start > size:
        start = 0  # rotated (or truncated) since the last call: the new file from its start
    start = max(start, size - TAIL_BYTES)  # far behind: the recent part, not megabytes at once
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(size - start)
    # Only whole lines: a line still being written comes whole with the next call.
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8", "replace").splitlines(), start + end


# A Slurm job's output (launcher: slurm): one file for every rank, each line labelled with its
# Slurm task number by `srun --label` ("0: ..."); the step runner's first line of each task
# names the rank that task is ("0: --- llm-reconciler: starting rank 1 of m-0 on s2").
STEP_START = START_MARK + "rank "


def labelled(line):
    """(task, text) of a line `srun --label` wrote, or (None, line) for srun's and slurmstepd's own."""
    label, sep, text = line.partition(": ")
    if sep and label.strip().isdigit():
        return label.strip(), text
    return None, line


def task_of_rank(path, rank):
    """The Slurm task that runs `rank`, from the step runner's start lines; None before it wrote one."""
    with open(path, "rb") as f:
        head = f.read(TAIL_BYTES)
    for line in head.decode("utf-8", "replace").splitlines():
        task, text = labelled(line)
        if task is not None and text.startswith(STEP_START) and text[len(STEP_START):].split(" ")[0] == str(rank):
            return task
    return None


def lines_of_task(lines, task):
    """One rank's lines, unlabelled; the job's own lines (srun, slurmstepd: why it ended) belong to every rank."""
    out = []
    for line in lines:
        label, text = labelled(line)
        if label is None:
            out.append(line)
        elif label == task and not text.startswith(STEP_START):
            out.append(text)
    return out
