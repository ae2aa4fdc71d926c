"""The node-side probe. Sent on stdin as `python3 - '<json args>'`; prints ONE JSON document.

Nothing is installed on nodes, so this program is self-contained: standard
library only, plus pynvml when the node happens to have it. This file is its
top: one pass (collect), the session loop and the payload. The pure parsers it
uses live in parse.py and health.py, the node's files and children in
system.py, its GPUs in gpus.py, everything else it reads in facts.py; their
text is sent ahead of this file (payload()); on the management side the same
names are imported normally, so tests of the parsers test what runs on the node.

It observes and never acts. In particular it runs no engine: presence of an
engine is a lookup on PATH, because a wrapper script named `vllm` that starts
a server when handed flags it does not know would otherwise start a server on
every probe. SGLang is a module, not a binary, so its test is a one-line
`import sglang` in a child interpreter with a deadline; its exit code is the
answer, and a failed import means not installed.

Every part that fails (nvidia-smi missing or printing something unexpected, a
sysfs file missing, an unreadable record) becomes a warning in the report and
the rest is still collected.

Arguments (JSON object, all optional):
  model_dirs: [path]       directories to report free/total space of, and to look for sources in
  sources:    [source]|null  model sources to look for (null: do not look; `weights` is then null)
  state_dir:  path          where managed-process records are (`~` is this node's home)
  sglang_timeout_s: number  deadline for the `import sglang` check (default 20)
  nvidia_smi_timeout_s: number
  gpu_health: bool          false: no health queries (bench/probe.py's comparison); default true
  health_recheck_s: number  in a session, how often the kernel log and remapped rows are read again (10)
  dmesg_timeout_s: number   deadline for reading the kernel log (default 5): a dmesg that hangs
                            costs the Xid check (`xid: unreadable`), never the probe
"""

import json
import os
import sys

if "parse_gpu_csv" not in globals():
    # Management side. On a node, the text of parse.py, agent_keys.py, health.py, system.py,
    # gpus.py and facts.py precedes this file in the payload and has defined these names already;
    # never let an installed copy of the package (maybe another version) replace what was sent.
    from reconciler.agent_keys import Record  # noqa: F401
    from reconciler.observe.probe.health import (  # noqa: F401
        CHECK_UNREADABLE,
        CHECK_UNSUPPORTED,
        DMESG_MAX_BYTES,
        assess,
        parse_boot_time,
        parse_xid_lines,
    )
    from reconciler.observe.probe.system import _now, _start, _subprocess, read_text, which  # noqa: F401
    from reconciler.observe.probe.gpus import finish_gpus, gpus_from_pynvml, start_nvidia_smi  # noqa: F401
    from reconciler.observe.probe.facts import (  # noqa: F401
        add_sglang,
        engines_on_path,
        exclude_managed,
        host_facts,
        listening_ports,
        llama_cpp_binaries,
        replica_records,
        sglang_installed,
        start_sglang_check,
    )

PROBE_VERSION = 1
NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"  # one directory per GPU the kernel module bound, by bus id


SGLANG_RECHECK_S = 300  # in a session, `import sglang` is re-run at most this often


def collect(args, cache=None):
    """One probe pass. `cache` (a dict kept by a session across passes) may hold slow facts."""
    warnings = []
    model_dirs = [d for d in args.get("model_dirs") or [] if isinstance(d, str)]
    report = {"probe_version": PROBE_VERSION, "python": "%d.%d.%d" % sys.version_info[:3], "warnings": warnings}

    # Slow children first, so they run while this process reads files.
    sglang_held = _held_while_fresh(cache, "sglang", lambda: SGLANG_RECHECK_S)
    sglang = None if sglang_held is not None else start_sglang_check()
    health = args.get("gpu_health", True) is not False
    # In a session, the kernel log and the remapped rows are read again at most every
    # HEALTH_RECHECK_S (ECC counts and device errors, in the GPU query, every pass).
    slow_held = _held_while_fresh(cache, "slow_health", lambda: float(args.get("health_recheck_s", HEALTH_RECHECK_S)))
    dmesg = start_dmesg() if health and slow_held is None else None
    gpus = gpus_from_pynvml(report, warnings)
    smi = start_nvidia_smi(args, cache, warnings, health, health and slow_held is None) if gpus is None else None

    host_facts(report, args, model_dirs, warnings)
    engines = engines_with_llama_cpp(report)
    records = replica_records(args.get("state_dir") or "~/.local/state/llm-reconciler", warnings)
    report["replicas"] = records
    report["ports_in_use"] = listening_ports(warnings)

    gpus = finish_gpus(report, gpus, smi, warnings)
    if health:
        gpus = gpu_health(report, gpus, smi, dmesg, float(args.get("dmesg_timeout_s", 5)), warnings, cache, slow_held)
    exclude_managed(gpus, records_of_owner(records, args.get("owner")))
    report["gpus"] = gpus
    if sglang_installed(args, cache, sglang_held, sglang, warnings):
        add_sglang(engines, warnings)
    report["engines"] = engines
    return report


def _held_while_fresh(cache, key, max_age_s):
    """The session's answer under `key` while younger than max_age_s() seconds, else None."""
    held = cache.get(key) if cache is not None else None
    return held if held is not None and _now() - held[0] < max_age_s() else None


def engines_with_llama_cpp(report):
    """The engines installed here; llama.cpp's binaries are reported as `llama_cpp` and count as one."""
    engines = engines_on_path()
    llama_cpp = llama_cpp_binaries()
    report["llama_cpp"] = llama_cpp
    if llama_cpp["server"] or llama_cpp["rpc_server"]:
        engines["llama.cpp"] = ""
    return engines


def records_of_owner(records, owner):
    """Only this catalog's ranks are left out of the GPUs' processes: another owner's stay foreign."""
    return [r for r in records if owner is None or r.get(Record.OWNER) in (None, owner)]


def start_dmesg():
    """The kernel log's reader, started with the GPU queries, on a node that has an NVIDIA driver."""
    if not (os.path.isdir(NVIDIA_PROC_GPUS) or which("nvidia-smi")):
        return None
    binary = which("dmesg")
    if not binary:
        return None
    try:
        return _start([binary])
    except OSError:
        return None


def read_bounded(proc, timeout, limit):
    """(the newest `limit` bytes of a child's stdout as text, None), or (None, why): a child that
    prints megabytes is read in bounded memory, and one that hangs is killed at its deadline."""
    import select

    fd = proc.stdout.fileno()
    buf, trimmed, deadline = bytearray(), False, _now() + timeout
    while True:
        left = deadline - _now()
        if left <= 0:
            proc.kill()
            proc.wait()
            return None, "dmesg ran past %gs" % timeout
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        if len(buf) > 2 * limit:
            del buf[:len(buf) - limit]
            trimmed = True
    subprocess = _subprocess()
    try:
        err = proc.communicate(timeout=max(0.1, deadline - _now()))[1] or b""
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, "dmesg ran past %gs" % timeout
    if proc.returncode != 0:
        msg = err.decode(errors="replace").strip().splitlines()
        return None, "dmesg exited %d%s" % (proc.returncode, (": " + msg[-1][:200]) if msg else "")
    text = bytes(buf[-limit:]).decode(errors="replace")
    if trimmed or len(buf) > limit:
        text = text.split("\n", 1)[-1]  # the first line was cut
    return text, None


HEALTH_RECHECK_S = 10  # in a session, the kernel log and the remapped rows are read at most this often


def gpu_health(report, gpus, smi, dmesg, dmesg_timeout, warnings, cache=None, held=None):
    """Each GPU's health and the node's health_checks (SPEC section 9), judged by health.assess.
    `held`: the session's kernel-log and remap answers while fresh (then neither was asked again)."""
    if held is not None:
        _, remap_rows, remap_state, xid_events, xid_state, notes = held
        warnings.extend(notes)
    else:
        notes = []
        xid_events, xid_state = None, CHECK_UNSUPPORTED
        if dmesg is not None:
            text, why = read_bounded(dmesg, dmesg_timeout, DMESG_MAX_BYTES)
            if why:
                notes.append(why + ": Xid events unknown")
                xid_state = CHECK_UNREADABLE
            else:
                boot = None
                if "Xid" in text:
                    try:
                        boot = parse_boot_time(read_text("/proc/stat"))
                    except OSError:
                        pass
                xid_events = parse_xid_lines(text, boot)
        remap_rows = smi.remap_rows if smi is not None else None
        remap_state = smi.remap_state if smi is not None else CHECK_UNSUPPORTED
        warnings.extend(notes)
        if cache is not None and (dmesg is not None or (smi is not None and smi.remap is not None)):
            cache["slow_health"] = (_now(), remap_rows, remap_state, xid_events, xid_state, notes)
    proc_bus_ids = []
    if report.get("gpu_source") in ("nvml", "nvidia-smi"):
        # Lost is said of a GPU missing from a listing the driver gave; a driver that answered
        # nothing (nvidia-smi failed) leaves every GPU unknown, as it always did.
        try:
            proc_bus_ids = sorted(os.listdir(NVIDIA_PROC_GPUS))
        except OSError:
            pass
    if not gpus and not proc_bus_ids:
        return gpus
    nvml = report.get("gpu_source") == "nvml"
    gpus, checks, notes = assess(
        gpus,
        remap_rows=remap_rows,
        remap_state=remap_state,
        xid_events=xid_events,
        xid_state=xid_state,
        proc_bus_ids=proc_bus_ids,
        nvml_checks=True if nvml else None,
    )
    for g in gpus:
        g.setdefault("nvlink_peers", [])
        g.setdefault("processes", [])
    warnings.extend(notes)
    report["health_checks"] = checks
    return gpus


SESSION_IDLE_EXIT_S = 900  # a session nobody asks for a quarter of an hour ends itself


def serve(cache):
    """Session mode: one JSON request per line in, one JSON report per line out, until end of input.

    The interpreter stays up between passes (it lives on the management side's
    open connection and dies with it), so a warm pass costs a few file reads,
    not a Python start-up and a compile.
    """
    import signal

    inp = sys.stdin.buffer
    while True:
        if hasattr(signal, "alarm"):
            signal.alarm(SESSION_IDLE_EXIT_S)  # SIGALRM's default action ends the process
        line = inp.readline()
        if hasattr(signal, "alarm"):
            signal.alarm(0)
        if not line:
            return 0
        try:
            args = json.loads(line)
            report = collect(args if isinstance(args, dict) else {}, cache)
        except Exception as e:  # one bad pass must not end the session
            report = {"probe_version": PROBE_VERSION, "error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def main(argv):
    if len(argv) > 1 and argv[1] == "--serve":
        return serve({})
    try:
        args = json.loads(argv[1]) if len(argv) > 1 else {}
    except ValueError:
        args = {}
    report = collect(args if isinstance(args, dict) else {})
    sys.stdout.write(json.dumps(report, sort_keys=True, separators=(",", ":")))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


# Session bootstrap, run as `python3 -c BOOTSTRAP --serve`: reads a length line, then that many
# bytes of program (this payload), and runs it; the rest of stdin is the request stream.
BOOTSTRAP = (
    "import sys;f=sys.stdin.buffer;"
    "exec(compile(f.read(int(f.readline())),'llm-reconciler-probe','exec'))"
)


# The node side's modules (paths under reconciler/), in the order the payload carries them: each only
# uses names defined above it. parse.py opens it, for its `from __future__` line must open the program;
# the node agent's keys (the records facts.py reads) come next, before anything that uses them.
# Paths inside the reconciler package.
PAYLOAD_MODULES = ("observe/probe/parse.py", "agent_keys.py", "observe/probe/health.py", "observe/probe/system.py",
                   "observe/probe/gpus.py", "observe/probe/facts.py", "observe/probe/script.py")


def payload(minify=True):
    """The program text sent to a node: parse.py, the node agent's keys (reconciler/agent_keys.py),
    health.py, system.py, gpus.py, facts.py, then this file, as one module.

    Minified (docstrings dropped, comments and layout gone through an AST
    round trip): the node compiles it at every cold start, and a third less
    text is a third less compile time, fifty nodes at a time.
    """
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # reconciler/
    source = read_text(os.path.join(package, PAYLOAD_MODULES[0]))
    for name in PAYLOAD_MODULES[1:]:
        source += "\n\n# ---- %s ----\n" % name + read_text(os.path.join(package, name))
    if minify:
        import ast

        def is_text(stmt):
            return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)

        tree = ast.parse(source)
        # Each module's docstring, not only the first one's: the modules are joined into one.
        tree.body = [stmt for stmt in tree.body if not is_text(stmt)]
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and is_text(body[0]):
                node.body = body[1:] or [ast.Pass()]
        source = ast.unparse(tree) + "\n"
    return source.encode()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
