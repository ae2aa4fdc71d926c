"""The node side of a weights fetch: list, read, write, pull and finish a copy of a model's files.

Sent as text to `python3 -I -S -c <this file> <request JSON>` on a node, through
any Transport, and run there: stdlib only, nothing imported from `reconciler`,
Python 3.8+. Data to write arrives on stdin; data read goes to stdout raw; every
other answer is ONE JSON document on stdout. The request names paths only (no
secrets), so it may ride in argv.

A copy of `<dir>/<name>` is built as `<dir>/.<name>.fetch-<token>/<name>` and
renamed onto `<dir>/<name>` only once every file is there with the size the
source listed: the probe looks for `<dir>/<name>` itself, so a copy killed
halfway is never taken for the weights, and the next copy's `begin` removes it.
"""

import json
import os
import shutil
import subprocess
import sys

TEMP_MARK = ".fetch-"


def temp_root(path, token):
    parent, name = os.path.split(os.path.normpath(path))
    return os.path.join(parent, "." + name + TEMP_MARK + token)


def staged(path, token):
    """Where the copy is built: the same name, inside the temporary directory."""
    return os.path.join(temp_root(path, token), os.path.basename(os.path.normpath(path)))


def listing(path):
    """(relative path, size) of every regular file under path ("" for path itself when it is a file)."""
    if os.path.isfile(path):
        return [["", os.path.getsize(path)]]
    files = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for n in sorted(names):
            full = os.path.join(root, n)
            if os.path.isfile(full):
                files.append([os.path.relpath(full, path), os.path.getsize(full)])
    return files


def op_manifest(req):
    path = req["path"]
    if not os.path.exists(path):
        return {"ok": False, "reason": "%s does not exist on this node" % path}
    try:
        files = listing(path)
    except OSError as exc:
        return {"ok": False, "reason": "cannot list %s: %s" % (path, exc.strerror or exc)}
    return {"ok": True, "kind": "file" if os.path.isfile(path) else "dir", "files": files,
            "total": sum(size for _, size in files)}


def op_read(req):
    full = os.path.join(req["path"], req["rel"]) if req["rel"] else req["path"]
    with open(full, "rb") as f:
        f.seek(int(req["offset"]))
        left = int(req["length"])
        out = sys.stdout.buffer
        while left > 0:
            block = f.read(min(left, 1 << 20))
            if not block:
                break
            out.write(block)
            left -= len(block)
    return None


def op_begin(req):
    """Make an empty temporary directory for this copy, removing what earlier, unfinished copies left."""
    path = os.path.normpath(req["path"])
    parent, name = os.path.split(path)
    try:
        os.makedirs(parent, exist_ok=True)
        for entry in os.listdir(parent):
            if entry.startswith("." + name + TEMP_MARK):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        os.makedirs(temp_root(path, req["token"]), mode=0o755)
    except OSError as exc:
        return {"ok": False, "reason": "cannot prepare %s: %s" % (parent, exc.strerror or exc)}
    return {"ok": True, "staged": staged(path, req["token"])}


def op_write(req):
    target = staged(req["path"], req["token"])
    full = os.path.join(target, req["rel"]) if req["rel"] else target
    os.makedirs(os.path.dirname(full), exist_ok=True)
    # Never truncating: chunks of one file arrive in parallel, each written at its own offset.
    fd = os.open(full, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        offset = int(req["offset"])
        data = sys.stdin.buffer
        while True:
            block = data.read(1 << 20)
            if not block:
                break
            while block:
                n = os.pwrite(fd, block, offset)
                offset += n
                block = block[n:]
    finally:
        os.close(fd)
    return {"ok": True}


def op_progress(req):
    target = staged(req["path"], req["token"])
    done = 0
    for root, _, names in os.walk(temp_root(req["path"], req["token"])):
        for n in names:
            try:
                done += os.path.getsize(os.path.join(root, n))
            except OSError:
                pass
    return {"ok": True, "done": done, "exists": os.path.exists(target)}


def op_finish(req):
    """Verify the staged copy against the source's listing, then rename it onto the path."""
    path = os.path.normpath(req["path"])
    target = staged(path, req["token"])
    if not os.path.exists(target):
        return {"ok": False, "reason": "the copy left nothing at %s" % target}
    want = req.get("files")
    if want is not None:
        have = dict((rel, size) for rel, size in listing(target))
        for rel, size in want:
            got = have.pop(rel, None)
            if got != size:
                shown = rel or os.path.basename(path)
                return {"ok": False, "reason": "%s is %s bytes in the copy, %d at the source"
                        % (shown, "missing" if got is None else got, size)}
        if have:
            return {"ok": False, "reason": "the copy holds files the source does not: %s" % ", ".join(sorted(have)[:3])}
    if os.path.exists(path):
        return {"ok": False, "reason": "%s appeared while copying; left as it is" % path}
    os.rename(target, path)
    shutil.rmtree(temp_root(path, req["token"]), ignore_errors=True)
    return {"ok": True}


def op_abort(req):
    shutil.rmtree(temp_root(req["path"], req["token"]), ignore_errors=True)
    return {"ok": True}


def ssh_argv(req):
    """The OpenSSH client towards the source node, with this login's own ~/.ssh (HOME's, as ssh-copy-id
    and friends use; OpenSSH itself reads the passwd entry, which differs only in containers and test fleets)."""
    home = os.path.expanduser("~")
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=%d" % int(req.get("connect_timeout_s", 10))]
    known = os.path.join(home, ".ssh", "known_hosts")
    if os.path.exists(known):
        argv += ["-o", "UserKnownHostsFile=" + known]
    for key in ("id_ed25519", "id_ecdsa", "id_rsa"):
        if os.path.exists(os.path.join(home, ".ssh", key)):
            argv += ["-i", os.path.join(home, ".ssh", key)]
    if req.get("port"):
        argv += ["-p", str(int(req["port"]))]
    if req.get("user"):
        argv += ["-l", req["user"]]
    return argv + [req["address"], "--"]


def quote(arg):
    # The remote side of ssh is a shell: every word is quoted once, here, and nowhere else.
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def op_reach(req):
    """Whether this node can log into the source node by itself (then copies go node to node)."""
    try:
        r = subprocess.run(ssh_argv(req) + ["true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=float(req.get("connect_timeout_s", 10)) + 5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "reason": str(exc)}
    last = (r.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
    return {"ok": r.returncode == 0, "reason": last}


def op_pull(req):
    """Node to node: `ssh source tar -c` piped into a local `tar -x`, into the temporary directory."""
    path = os.path.normpath(req["path"])
    parent, name = os.path.split(path)
    remote = " ".join(quote(a) for a in ["tar", "-C", parent, "-cf", "-", name])
    dest = temp_root(path, req["token"])
    try:
        src = subprocess.Popen(ssh_argv(req) + [remote], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        dst = subprocess.Popen(["tar", "-C", dest, "-xf", "-"], stdin=src.stdout, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    except OSError as exc:
        return {"ok": False, "reason": "cannot run %s: %s" % (exc.filename or "ssh/tar", exc.strerror or exc)}
    src.stdout.close()  # tar -x holds the pipe now; ssh sees SIGPIPE if tar dies
    dst_err = dst.stderr.read()
    dst.wait()
    src_err = src.stderr.read()
    src.wait()
    if src.returncode != 0 or dst.returncode != 0:
        err = (src_err or dst_err).decode("utf-8", "replace").strip().splitlines()
        return {"ok": False, "reason": "copy from %s failed (ssh exit %d, tar exit %d): %s"
                % (req["address"], src.returncode, dst.returncode, err[-1] if err else "no message")}
    return {"ok": True}


def op_run(req):
    """fetch.command: its argv runs with ${MODEL_SOURCE} already pointing at the staged path."""
    try:
        r = subprocess.run(req["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        return {"ok": False, "reason": "cannot run %s: %s" % (req["argv"][0], exc.strerror or exc)}
    tail = r.stdout.decode("utf-8", "replace").strip().splitlines()[-5:]
    if r.returncode != 0:
        return {"ok": False, "reason": "%s exited %d: %s" % (req["argv"][0], r.returncode, " | ".join(tail) or "no output")}
    return {"ok": True}


OPS = {"manifest": op_manifest, "read": op_read, "begin": op_begin, "write": op_write, "progress": op_progress,
       "finish": op_finish, "abort": op_abort, "reach": op_reach, "pull": op_pull, "run": op_run}


def main(argv):
    req = json.loads(argv[1])
    answer = OPS[req["op"]](req)
    if answer is not None:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
