"""The node's files and commands, for the probe that runs there: reading a file, looking a
command up on PATH, and children run against a deadline. Standard library only.

Part of the program sent to a node (script.payload(): parse.py, agent_keys.py, health.py, this
file, gpus.py, facts.py, script.py, as one module); the management side imports it normally.
"""

import os


def _now():
    return os.times()[4]  # elapsed real time, without importing time


def which(name, path=None):
    """PATH lookup without running anything (shutil.which costs an import we do not need)."""
    for d in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        if not d:
            continue
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def read_text(path):
    with open(path, "r", errors="replace") as f:
        return f.read()


def _subprocess():
    # Imported on first use: a CPU node with no nvidia-smi and no sglang never pays for it.
    import subprocess

    return subprocess


def _start(argv):
    subprocess = _subprocess()
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _finish(proc, timeout, what):
    """(stdout text, None) or (None, reason)."""
    subprocess = _subprocess()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, "%s ran past %gs" % (what, timeout)
    if proc.returncode != 0:
        proc._out = out.decode(errors="replace")
        msg = (err or out).decode(errors="replace").strip().splitlines()
        return None, "%s exited %d%s" % (what, proc.returncode, (": " + msg[-1][:200]) if msg else "")
    return out.decode(errors="replace"), None


def _stdout_of_failed(proc):
    """What a finished child that exited non-zero printed on stdout, where it printed something."""
    out = getattr(proc, "_out", None)
    return out if out and out.strip() else None
