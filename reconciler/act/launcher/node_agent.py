"""The node-side lifecycle agent: start, stop and inspect managed engine ranks.

This file is sent, as text, on the stdin of `python3 -I -S -` on a node
(through any Transport), and runs there, after the text of agent_proc.py (its
/proc facts) and agent_files.py (its records and logs), themselves after agent_keys.py (the keys
of its records and answers, named once: the probe reads the same records): ssh_launcher.AGENT_MODULES.
The program must stay self-contained: stdlib only, nothing imported from
`reconciler` on the node, Python 3.8+ (nodes run whatever their distribution ships).

The request is ONE JSON document, base64-encoded into a first line
`REQUEST_B64 = "..."` that the sender puts before this text (base64 cannot
break out of the string literal). It travels on stdin rather than in argv
because it holds the engine's environment, API keys included, and a node's
/proc/<pid>/cmdline is world-readable. (For debugging by hand, the JSON may
instead be given as argv[1].) The engine's argv and env reach `execve`
unchanged, so no shell ever sees a catalog value. The answer is ONE JSON
document on stdout.
A logical failure (port taken, binary missing) is an answer with `"ok":
false` and a reason; a non-zero exit means the agent itself broke.

Each rank has a record, `<state_dir>/replicas/<replica>.rank<rank>.json`,
written atomically before the agent answers, so a management host that loses
the node mid-launch still finds the rank on its next probe. A record's
`start_time` (field 22 of /proc/<pid>/stat) guards against a reused pid being
taken for the engine, or, worse, signalled in its place.
"""

import binascii
import fcntl
import json
import os
import signal
import sys
import time

if "proc_stat" not in globals():
    # Not on a node (this file run or read by itself): there, the text of agent_keys.py,
    # agent_proc.py and agent_files.py precedes this one and has defined these names already.
    from reconciler.agent_keys import MANAGER, Answer, Record  # noqa: F401
    from reconciler.act.launcher.agent_proc import (  # noqa: F401
        group_members,
        holds_socket,
        listening_inodes,
        port_problem,
        proc_stat,
        rank_alive,
        running,
    )
    from reconciler.act.launcher.agent_files import (  # noqa: F401
        START_MARK,
        TAIL_BYTES,
        appended,
        is_mine,
        lines_of_task,
        owner_of,
        read_record,
        record_name,
        records,
        state_paths,
        tail,
        task_of_rank,
        write_atomically,
    )

# socket and subprocess are imported where used: only `start` needs them, and on a
# cold interpreter they cost a third of a status call (base64 likewise: binascii is enough).

PERMANENT = "permanent"  # a refusal no retry mends until the node changes (errors.PERMANENT)
LOG_ROTATE_BYTES = 64 * 1024 * 1024


# ---------------------------------------------------------------- operations


def rank_lock(records_dir, name):
    """An exclusive lock per rank: two reconcilers (a daemon and a manual `apply`) racing to start
    the same rank would otherwise both launch it, and one engine would end up without a record."""
    fd = os.open(os.path.join(records_dir, "." + name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def read_epoch(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def epoch_fence(req, records_dir):
    """Fencing (SPEC section 14): an action carries its leader's epoch, and this node keeps the highest
    epoch it has seen for the owner, in a file beside the records. Returns (fd, None) with a shared lock
    held for the action (an action of a newer epoch waits for it, then no older one gets in), or (None,
    the refusal) for an epoch older than one seen here. No epoch (no `leader:` in fleet.yaml): (None, None).
    """
    epoch = req.get("epoch")
    if not epoch:
        return None, None
    epoch = int(epoch)
    os.makedirs(records_dir, mode=0o700, exist_ok=True)
    path = os.path.join(records_dir, ".epoch.%s" % (owner_of(req) or "-"))
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        seen = read_epoch(path)
        if epoch > seen:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the actions of older epochs in progress here
            seen = read_epoch(path)
            if epoch > seen:
                write_atomically(path, "%d\n" % epoch)
                seen = epoch
            fcntl.flock(fd, fcntl.LOCK_SH)  # not atomic: a newer epoch may have come in between
            seen = read_epoch(path)
        if epoch < seen:
            os.close(fd)
            return None, {Answer.OK: False, Answer.FENCED: seen,
                          Answer.REASON: "fenced: this node has seen epoch %d of a newer leader; an action of "
                                         "epoch %d comes from a leader that was deposed" % (seen, epoch)}
    except BaseException:
        os.close(fd)
        raise
    return fd, None


def fenced(op):
    """`op` run under the epoch fence."""
    def run(req):
        fd, refusal = epoch_fence(req, state_paths(req["state_dir"])[1])
        if refusal is not None:
            return refusal
        try:
            return op(req)
        finally:
            if fd is not None:
                os.close(fd)
    return run


def op_fence(req):
    """A new leader's first word to a node: its epoch recorded, nothing else done."""
    return {Answer.OK: True}


def op_start(req):
    root, records_dir, logs_dir = state_paths(req["state_dir"])
    for d in (records_dir, logs_dir):
        # Private: records hold argv (which may carry secrets) and logs what engines print.
        os.makedirs(d, mode=0o700, exist_ok=True)
    name = record_name(req["replica"], int(req["rank"]), owner_of(req))
    lock = rank_lock(records_dir, name)
    try:
        return start_locked(req, records_dir, logs_dir)
    finally:
        os.close(lock)


class Refused(Exception):
    """A start that cannot go on: `answer` is what the agent says ("ok": false and why)."""

    def __init__(self, reason, failure=None, port_in_use=None):
        Exception.__init__(self, reason)
        self.answer = {Answer.OK: False, Answer.REASON: reason}
        if failure is not None:
            self.answer[Answer.FAILURE] = failure
        if port_in_use is not None:
            self.answer[Answer.PORT_IN_USE] = port_in_use


def start_locked(req, records_dir, logs_dir):
    replica, rank, port = req["replica"], int(req["rank"]), int(req["port"])
    owner = owner_of(req)
    name = record_name(replica, rank, owner)
    record_path = os.path.join(records_dir, name + ".json")
    log_path = os.path.join(logs_dir, name + ".log")
    try:
        existing = existing_record(records_dir, record_path, replica, rank, owner)
        if existing is not None and rank_alive(existing):
            return running_answer(existing, req, log_path)
        problem = port_problem(port)
        if problem:
            raise Refused(problem, port_in_use=port)
        env = engine_env(req)
        env["LLM_RECONCILER_REPLICA"] = name
        argv = [str(a) for a in req["argv"]]
        proc = launch(argv, env, log_path, req)
        record = new_record(req, proc, argv, log_path, owner)
        # Written before answering: if the connection drops now, the next probe still finds this rank.
        write_atomically(record_path, json.dumps(record, sort_keys=True, indent=1))
        if req.get("listen_timeout_s"):
            confirm_listening(proc, record, record_path, req, log_path)
    except Refused as refusal:
        return refusal.answer
    return {Answer.OK: True, Answer.ALREADY_RUNNING: False, Answer.PID: proc.pid, Answer.PGID: proc.pid,
            Answer.LOG: log_path, Answer.START_TIME: record[Record.START_TIME]}


def existing_record(records_dir, record_path, replica, rank, owner):
    """The rank's record on this node, if it has one."""
    existing = read_record(record_path)
    if existing is None and owner is not None:
        # A rank started before records carried an owner is still this replica's rank.
        legacy = read_record(os.path.join(records_dir, record_name(replica, rank) + ".json"))
        if legacy is not None and is_mine(legacy, owner):
            existing = legacy
    return existing


def running_answer(existing, req, log_path):
    """The answer for a rank that runs already: adopted when it is this very start, else refused."""
    if existing.get(Record.SPEC_HASH) == req["spec_hash"] and existing.get(Record.PORT) == int(req["port"]):
        # Launched before (a retried pass, a restarted reconciler): never launch twice.
        return {Answer.OK: True, Answer.ALREADY_RUNNING: True, Answer.PID: existing[Record.PID],
                Answer.PGID: existing.get(Record.PGID), Answer.LOG: existing.get(Record.LOG, log_path),
                Answer.REVISION: existing.get(Record.REVISION)}
    return {Answer.OK: False, Answer.REASON: "%s rank %d already runs here (pid %d, spec %s, port %s); stop it first"
            % (req["replica"], int(req["rank"]), existing[Record.PID], existing.get(Record.SPEC_HASH),
               existing.get(Record.PORT))}


def engine_env(req):
    """The engine's environment: this node's, the request's, and each secret read from its file here."""
    env = dict(os.environ)
    env.update(req.get("env") or {})
    for key, path in sorted((req.get("env_files") or {}).items()):
        # A secret the catalog names by its path on this node: read now, handed to the engine's
        # environment only (never written anywhere, never in an argv).
        env[key] = read_secret(key, path)
    return env


def read_secret(key, path):
    try:
        with open(path, "rb") as f:
            value = f.read().decode("utf-8")
    except OSError as exc:
        raise Refused("env %s: {from_file: %s}: %s on this node" % (key, path, exc.strerror or exc), failure=PERMANENT)
    except UnicodeDecodeError:
        raise Refused("env %s: {from_file: %s}: not UTF-8 text" % (key, path), failure=PERMANENT)
    if value.endswith("\n"):  # `echo token > file` leaves one newline that is no part of the token
        value = value[:-2] if value.endswith("\r\n") else value[:-1]
    if "\x00" in value:
        raise Refused("env %s: {from_file: %s}: holds a NUL byte" % (key, path), failure=PERMANENT)
    return value


def rotate_log(log_path):
    try:
        if os.path.getsize(log_path) > LOG_ROTATE_BYTES:
            os.replace(log_path, log_path + ".1")  # one generation kept: enough to read why the last run died
    except OSError:
        pass


def launch(argv, env, log_path, req):
    """The engine started in its own session, its output appended to its log after a start line."""
    import subprocess
    rotate_log(log_path)
    log = open(log_path, "ab")
    try:
        log.write((START_MARK + "%s rank %d, spec %s, at %s\n"
                   % (req["replica"], int(req["rank"]), req["spec_hash"],
                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))).encode())
        log.flush()
        try:
            # Own session and process group: survives the SSH session, and stop can signal every process it spawned.
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True, close_fds=True)
        except FileNotFoundError:
            raise Refused("cannot run %s: no such file on this node's PATH" % argv[0], failure=PERMANENT)
        except PermissionError:
            raise Refused("cannot run %s: permission denied" % argv[0], failure=PERMANENT)
        except OSError as exc:
            raise Refused("cannot run %s: %s" % (argv[0], exc.strerror or exc))
    finally:
        log.close()


def new_record(req, proc, argv, log_path, owner):
    stat = proc_stat(proc.pid)
    record = {
        Record.ID: req["replica"],
        Record.MODEL: req["model"],
        Record.PROFILE: req["profile"],
        Record.RANK: int(req["rank"]),
        Record.NNODES: int(req.get("nnodes", 1)),
        Record.SPEC_HASH: req["spec_hash"],
        Record.PID: proc.pid,
        Record.PGID: proc.pid,
        Record.START_TIME: stat[3] if stat else None,
        Record.STARTED_AT: time.time(),
        Record.PORT: int(req["port"]),
        Record.GPUS: list(req.get("gpus") or []),
        Record.ARGV: argv,
        Record.ENV_KEYS: sorted(set(req.get("env") or {}) | set(req.get("env_files") or {})),
        Record.LOG: log_path,
        Record.MANAGED_BY: MANAGER,
        Record.REVISION: req.get("revision"),  # the catalog commit it was started from, for status
    }
    if owner is not None:
        record[Record.OWNER] = owner
    return record


def confirm_listening(proc, record, record_path, req, log_path):
    """Refused, its processes ended and its record gone, unless the rank listens within the deadline."""
    port = int(req["port"])
    problem = await_listening(proc, port, float(req["listen_timeout_s"]), log_path, int(req.get("log_lines", 16)))
    if problem is None:
        return
    if proc.poll() is None:
        stop_rank(record, 5.0)
    proc.poll()
    try:
        os.unlink(record_path)  # it did not start; its log stays for `logs`
    except OSError:
        pass
    raise Refused(problem)


def group_listens(pgid, port):
    """Whether a process of group `pgid` holds a socket LISTENing on `port`."""
    wanted = {"socket:[%s]" % i for i in listening_inodes(port)}
    return bool(wanted) and any(holds_socket(pid, wanted) for pid in group_members(pgid))


def _log_tail(log_path, lines):
    return " | ".join(line.strip() for line in tail(log_path, lines) if line.strip()) or "(no log)"


def await_listening(proc, port, timeout_s, log_path, log_lines):
    """None once the started rank listens on its port; else why not: it exited first (whatever its
    exit code: llama.cpp's RPC server exits 0 on a taken port or a flag it does not know), or time
    ran out."""
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        code = proc.poll()
        if code is not None:
            how = "killed by signal %d" % -code if code < 0 else "exit code %d" % code
            return "exited at once (%s) without listening on port %d; last log lines: %s" % (
                how, port, _log_tail(log_path, log_lines))
        if group_listens(proc.pid, port):
            return None
        if time.monotonic() >= deadline:
            return "did not listen on port %d within %gs; last log lines: %s" % (
                port, timeout_s, _log_tail(log_path, log_lines))
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def stop_rank(record, grace_s):
    """Stop one rank's process group. Returns (ok, what happened)."""
    pid, pgid = record.get(Record.PID), record.get(Record.PGID) or record.get(Record.PID)
    if not isinstance(pid, int) or not isinstance(pgid, int) or pgid <= 1:
        return True, "no process recorded"
    leader = proc_stat(pid)
    if running(leader) and leader[3] != record.get(Record.START_TIME):
        # The pid now belongs to someone else. A pid number is not reused while its
        # group still has members, so nothing of ours is left: signal nothing.
        return True, "already gone (pid %d reused by another process)" % pid
    if not group_members(pgid):
        return True, "already gone"
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        pause = 0.005
        while True:
            left = group_members(pgid)
            if not left:
                return True, "stopped by %s" % ("SIGTERM" if sig == signal.SIGTERM else "SIGKILL")
            if time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
    return False, "still running after SIGKILL: pids %s" % ", ".join(str(p) for p in left)


def op_stop(req):
    _, records_dir, _ = state_paths(req["state_dir"])
    rank = req.get("rank")
    results = []
    ok = True
    owner = owner_of(req)
    for path, rec in records(records_dir, req["replica"], owner):
        if rank is not None and rec.get(Record.RANK) != rank:
            continue
        lock = rank_lock(records_dir, record_name(req["replica"], int(rec.get(Record.RANK, 0)), rec.get(Record.OWNER)))
        try:
            current = read_record(path)  # re-read under the lock: a racing start may have replaced it
            if current is None:
                continue
            stopped, what = stop_rank(current, float(req.get("grace_s", 10.0)))
            # keep_record: the rank reads as crashed afterwards (its process is gone, its record and log stay),
            # so the next pass restarts it with backoff: how a start that never became Ready ends.
            if stopped and not req.get("keep_record"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        finally:
            os.close(lock)
        ok = ok and stopped
        results.append({Answer.RANK: rec.get(Record.RANK), Answer.PID: rec.get(Record.PID), Answer.OK: stopped,
                        Answer.DETAIL: what})
    return {Answer.OK: ok, Answer.RANKS: results}


def op_status(req):
    _, records_dir, _ = state_paths(req["state_dir"])
    lines = int(req.get("log_lines", 0))
    ranks = []
    for _, rec in records(records_dir, req.get("replica"), owner_of(req)):
        rec = dict(rec)
        rec[Record.ALIVE] = rank_alive(rec)
        rec[Record.LOG_TAIL] = tail(rec.get(Record.LOG, ""), lines)
        ranks.append(rec)
    return {Answer.OK: True, Answer.RANKS: ranks}


def log_answer(path, exists, lines, offset):
    """The answer of `logs` and `output`: the file's path, whether it is there, its lines and where
    the next read starts."""
    return {Answer.OK: True, Answer.LOG: path, Answer.EXISTS: exists, Answer.LINES: lines, Answer.OFFSET: offset}


def op_logs(req):
    """A rank's log: its last `lines` lines (of the latest run), or with `offset` what was
    appended since that byte offset (`reconciler logs --follow` polls with it)."""
    _, _, logs_dir = state_paths(req["state_dir"])
    path = os.path.join(logs_dir, record_name(req["replica"], int(req["rank"]), owner_of(req)) + ".log")
    if not os.path.exists(path):  # a rank started before records carried an owner
        path = os.path.join(logs_dir, record_name(req["replica"], int(req["rank"])) + ".log")
    try:
        size = os.path.getsize(path)
    except OSError:
        return log_answer(path, False, [], 0)
    offset = req.get("offset")
    if offset is None:
        return log_answer(path, True, tail(path, int(req.get("lines", 50))), size)
    lines, offset = appended(path, size, offset)
    return log_answer(path, True, lines, offset)


def op_output(req):
    """A rank's lines of a Slurm job's output file: like `logs`, the last `lines` or, with `offset`,
    what was appended since."""
    path = req["path"]
    try:
        size = os.path.getsize(path)
        task = task_of_rank(path, int(req["rank"]))
    except OSError:
        return log_answer(path, False, [], 0)
    offset = req.get("offset")
    if offset is None:
        # The last TAIL_BYTES hold every rank's lines: the rank's own last `lines` are among them.
        lines, offset = appended(path, size, max(0, size - TAIL_BYTES))
        if size > TAIL_BYTES and lines:
            lines = lines[1:]  # the read began mid-line
        wanted = int(req.get("lines", 50))
        lines = lines_of_task(lines, task)[-wanted:] if wanted > 0 else []
        return log_answer(path, True, lines, offset)
    lines, offset = appended(path, size, offset)
    return log_answer(path, True, lines_of_task(lines, task), offset)


def op_port(req):
    problem = port_problem(int(req["port"]))
    return {Answer.OK: problem is None, Answer.REASON: problem or ""}


# What changes a node is fenced; what only reads is not (a standby may read).
OPS = {"start": fenced(op_start), "stop": fenced(op_stop), "fence": fenced(op_fence), "status": op_status,
       "logs": op_logs, "output": op_output, "port": op_port}


_TERM_REQUESTED = []


def _defer_term(signum, frame):
    _TERM_REQUESTED.append(signum)


def main(argv):
    # A dropped SSH connection must not kill the agent between launching and recording.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Nor must the reconciler ending an agent it gave up on (its deadline passed): SIGTERM is
    # taken once the operation is done, so a launched engine always has its record. A caught
    # signal is reset by exec, so engines still get SIGTERM's default action.
    signal.signal(signal.SIGTERM, _defer_term)
    encoded = globals().get("REQUEST_B64")
    if encoded is not None:
        req = json.loads(binascii.a2b_base64(encoded))
    elif len(argv) == 2:
        req = json.loads(argv[1])
    else:
        sys.stderr.write("usage: python3 - REQUEST_JSON (or a REQUEST_B64 line before the script)\n")
        return 2
    op = OPS.get(req.get("op"))
    if op is None:
        sys.stderr.write("unknown op %r\n" % req.get("op"))
        return 2
    answer = op(req)
    if _TERM_REQUESTED:
        return 143  # the reconciler gave up on this answer
    try:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # the management host went away; the record already says what happened
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
