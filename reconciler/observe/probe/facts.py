"""Everything the probe reads on a node besides its GPUs: memory, disks, weights, InfiniBand
ports, CPUs, managed-process records, listening ports, and which engines are installed.

Part of the program sent to a node (see script.payload()); standard library only. On the node
the names below are already defined by the text sent ahead of this file; the management side
imports them.
"""

import json
import os
import sys

if "parse_gpu_csv" not in globals():
    # Management side (see script.py): never let an installed copy replace what was sent.
    from reconciler.agent_keys import MANAGER, Record  # noqa: F401
    from reconciler.observe.probe.parse import (  # noqa: F401
        NETLINK_SOCK_DIAG,
        ParseError,
        inet_diag_listen_request,
        parse_ib_port,
        parse_inet_diag,
        parse_meminfo,
        parse_proc_net_tcp,
        parse_proc_stat,
    )
    from reconciler.observe.probe.system import _now, _subprocess, read_text, which  # noqa: F401

# Engine -> the executable whose presence on PATH means the engine is installed.
ENGINE_BINARIES = {"vllm": "vllm"}
# llama.cpp has one binary per role: llama-server for the head (rank 0), its RPC server for
# ranks above 0. Current builds name the RPC server ggml-rpc-server, older ones rpc-server.
LLAMA_SERVER = "llama-server"
LLAMA_RPC_SERVERS = ("ggml-rpc-server", "rpc-server")
# SGLang is launched as `sglang serve`: usable when the module imports AND its command is on PATH.
SGLANG_COMMAND = "sglang"
_HUB_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
IB_ROOT = "/sys/class/infiniband"


def is_hub_id(source):
    """`org/name` with the characters the Hugging Face hub allows; no `..`, no leading dot or dash."""
    parts = source.split("/")
    return (
        len(parts) == 2
        and all(p and set(p) <= _HUB_NAME_CHARS and p[0].isalnum() and ".." not in p for p in parts)
    )


def llama_cpp_binaries(path=None):
    """Which llama.cpp roles this node can run: llama-server (the head), and the RPC server's name (ranks above 0)."""
    return {
        "server": which(LLAMA_SERVER, path) is not None,
        "rpc_server": next((name for name in LLAMA_RPC_SERVERS if which(name, path)), None),
    }


def host_facts(report, args, model_dirs, warnings):
    """Memory, disks, weights, InfiniBand ports and CPUs: files this process reads itself."""
    try:
        report["memory_total_mb"] = parse_meminfo(read_text("/proc/meminfo"))
    except (OSError, ParseError) as e:
        report["memory_total_mb"] = None
        warnings.append("host memory unknown: %s" % e)
    report["disks"] = disks(model_dirs, warnings)
    sources = args.get("sources")
    report["weights"] = None if sources is None else [s for s in sources if isinstance(s, str) and source_present(s, model_dirs)]
    report["hcas"] = infiniband(warnings)
    report["cpu_count"] = usable_cpus()


def disks(model_dirs, warnings):
    out = []
    for d in model_dirs:
        try:
            st = os.statvfs(d)
        except OSError as e:
            warnings.append("model dir %s: %s" % (d, e.strerror or e))
            continue
        out.append({"path": d, "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize})
    return out


def source_present(source, model_dirs):
    """Whether a model source is on this node.

    - An absolute path counts when it exists and lies under one of the model dirs.
    - A hub id `org/name` counts when a model dir holds `org/name/` (a plain
      download) or `models--org--name/` (the Hugging Face hub cache layout).
    Anything else is not present.
    """
    if source.startswith("/"):
        path = os.path.normpath(source)
        for d in model_dirs:
            d = os.path.normpath(d)
            if (path == d or path.startswith(d.rstrip("/") + "/")) and os.path.exists(path):
                return True
        return False
    if is_hub_id(source):
        org, name = source.split("/", 1)
        for d in model_dirs:
            if os.path.isdir(os.path.join(d, org, name)) or os.path.isdir(os.path.join(d, "models--%s--%s" % (org, name))):
                return True
    return False


def infiniband(warnings, root=IB_ROOT):
    """HCA ports from sysfs; None when this node has no InfiniBand class at all."""
    if not os.path.isdir(root):
        return None
    ports = []
    for hca in sorted(os.listdir(root)):
        ports_dir = os.path.join(root, hca, "ports")
        try:
            port_names = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError as e:
            warnings.append("%s: %s" % (ports_dir, e.strerror or e))
            continue
        for port in port_names:
            base = os.path.join(ports_dir, port)
            files = {}
            for name in ("state", "link_layer", "gids/0"):
                try:
                    files[name] = read_text(os.path.join(base, name))
                except OSError:
                    pass
            try:
                info = parse_ib_port(files)
            except ParseError as e:
                warnings.append("%s: %s" % (base, e))
                continue
            info["hca"] = hca
            info["port"] = int(port) if port.isdigit() else port
            ports.append(info)
    return ports


def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def proc_stat(pid):
    try:
        return parse_proc_stat(read_text("/proc/%d/stat" % int(pid)))
    except (OSError, ValueError):
        return None


def replica_records(state_dir, warnings):
    """Managed-process records, each checked against /proc: a pid that is gone, or reused by
    another process (different start time), is a dead rank."""
    rdir = os.path.join(os.path.expanduser(state_dir), "replicas")
    try:
        names = sorted(n for n in os.listdir(rdir) if n.endswith(".json"))
    except OSError:
        return []  # no records yet: nothing was ever started here
    records = []
    for name in names:
        try:
            rec = json.loads(read_text(os.path.join(rdir, name)))
        except (OSError, ValueError) as e:
            warnings.append("record %s unreadable: %s" % (name, e))
            continue
        if not isinstance(rec, dict) or rec.get(Record.MANAGED_BY) != MANAGER:
            continue
        pid = rec.get(Record.PID)
        st = proc_stat(pid) if isinstance(pid, int) else None
        # A zombie has exited: it only waits for a parent to reap it, and where PID 1 does not reap
        # (containers), it waits forever. Counting it alive would hide every crashed engine.
        rec[Record.ALIVE] = bool(st) and st["state"] not in ("Z", "X") and st["start_time"] == rec.get(Record.START_TIME)
        rec[Record.FILE] = name
        records.append(rec)
    return records


def exclude_managed(gpus, records):
    """Drop GPU processes that belong to a live managed replica (its pid, process group or session)."""
    pids, groups = set(), set()
    for rec in records:
        if rec.get(Record.ALIVE):
            if isinstance(rec.get(Record.PID), int):
                pids.add(rec[Record.PID])
                groups.add(rec[Record.PID])
            if isinstance(rec.get(Record.PGID), int):
                groups.add(rec[Record.PGID])
    if not pids and not groups:
        return
    for g in gpus:
        kept = []
        for p in g["processes"]:
            if p["pid"] in pids:
                continue
            st = proc_stat(p["pid"])
            if st and (st["pgrp"] in groups or st["session"] in groups):
                continue
            kept.append(p)
        g["processes"] = kept


def listening_ports_netlink():
    """Listening TCP ports of this network namespace through sock_diag; raises OSError/ParseError."""
    import _socket  # the C module: socket.py's enum set-up alone costs ~6 ms per cold start

    ports = set()
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    try:
        sock.settimeout(5)
        for seq, family in enumerate((_socket.AF_INET, _socket.AF_INET6), 1):
            sock.send(inet_diag_listen_request(family, seq))
            while True:
                found, done = parse_inet_diag(sock.recv(1 << 16))
                ports.update(found)
                if done:
                    break
    finally:
        sock.close()
    return sorted(ports)


def listening_ports(warnings):
    try:
        return listening_ports_netlink()
    except (OSError, ParseError, ValueError):
        pass  # no sock_diag (old kernel, seccomp): the slower /proc files say the same
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            ports.update(parse_proc_net_tcp(read_text(path)))
        except OSError:
            pass  # no IPv6 on this node
        except ParseError as e:
            warnings.append(str(e))
    return sorted(ports)


def engines_on_path():
    return {engine: "" for engine, binary in sorted(ENGINE_BINARIES.items()) if which(binary)}


def start_sglang_check():
    """Start `import sglang` in a child interpreter, or return None when no sglang module is even on the path."""
    try:
        import importlib.util

        if importlib.util.find_spec("sglang") is None:
            return None
    except (ImportError, ValueError):
        return None
    subprocess = _subprocess()
    return subprocess.Popen(
        [sys.executable, "-c", "import sglang"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )


def finish_sglang_check(proc, timeout, warnings):
    subprocess = _subprocess()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        warnings.append("import sglang ran past %gs: not counted as installed" % timeout)
        return False
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        warnings.append("sglang is on the path but does not import%s" % ((": " + lines[-1][:200]) if lines else ""))
        return False
    return True


def sglang_installed(args, cache, held, proc, warnings):
    """Whether sglang imports: the session's answer while fresh (`held`), else the check's (`proc`)."""
    if held is not None:
        installed, notes = held[1], held[2]
    else:
        notes = []
        installed = proc is not None and finish_sglang_check(proc, float(args.get("sglang_timeout_s", 20)), notes)
        if cache is not None:
            cache["sglang"] = (_now(), installed, notes)
    warnings.extend(notes)
    return installed


def add_sglang(engines, warnings):
    """SGLang imports: counted where its command is on the PATH too (what a launch runs)."""
    if which(SGLANG_COMMAND):
        engines["sglang"] = ""
    else:
        warnings.append("sglang imports but its `sglang` command is not on the PATH: not counted as installed")
