"""The node-side probe. Sent on stdin as `python3 - '<json args>'`; prints ONE JSON document.

Nothing is installed on nodes, so this file is self-contained: standard
library only, plus pynvml when the node happens to have it. The pure parsers
it uses live in parse.py, whose text is sent ahead of this file (payload());
on the management side the same names are imported normally, so tests of the
parsers test what runs on the node.

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
    # Management side. On a node, parse.py's text precedes this file in the payload and has
    # defined these names already; never let an installed copy of the package (maybe another
    # version) replace what was sent.
    from reconciler.probe.parse import (  # noqa: F401
        APPS_QUERY,
        GPU_QUERY,
        GPU_QUERY_WITHOUT_HEALTH,
        NETLINK_SOCK_DIAG,
        ParseError,
        inet_diag_listen_request,
        parse_compute_apps_csv,
        parse_gpu_csv,
        parse_ib_port,
        parse_inet_diag,
        parse_meminfo,
        parse_proc_net_tcp,
        parse_proc_stat,
        parse_topo_matrix,
    )
    from reconciler.probe.health import (  # noqa: F401
        CHECK_UNREADABLE,
        CHECK_UNSUPPORTED,
        DMESG_MAX_BYTES,
        REMAP_QUERY,
        NvmlFailed,
        assess,
        health_from_nvml,
        parse_boot_time,
        parse_remapped_rows_csv,
        parse_xid_lines,
        pci_bus_key,
    )

PROBE_VERSION = 1
MANAGED_BY = "llm-reconciler"
# Engine -> the executable whose presence on PATH means the engine is installed.
ENGINE_BINARIES = {"vllm": "vllm"}
# llama.cpp has one binary per role: llama-server for the head (rank 0), its RPC server for
# ranks above 0. Current builds name the RPC server ggml-rpc-server, older ones rpc-server.
LLAMA_SERVER = "llama-server"
LLAMA_RPC_SERVERS = ("ggml-rpc-server", "rpc-server")
# SGLang is launched as `sglang serve`: usable when the module imports AND its command is on PATH.
SGLANG_COMMAND = "sglang"
_HUB_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def is_hub_id(source):
    """`org/name` with the characters the Hugging Face hub allows; no `..`, no leading dot or dash."""
    parts = source.split("/")
    return (
        len(parts) == 2
        and all(p and set(p) <= _HUB_NAME_CHARS and p[0].isalnum() and ".." not in p for p in parts)
    )
IB_ROOT = "/sys/class/infiniband"
NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"  # one directory per GPU the kernel module bound, by bus id
NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND = 9, 12  # nvml.h return codes


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


def llama_cpp_binaries(path=None):
    """Which llama.cpp roles this node can run: llama-server (the head), and the RPC server's name (ranks above 0)."""
    return {
        "server": which(LLAMA_SERVER, path) is not None,
        "rpc_server": next((name for name in LLAMA_RPC_SERVERS if which(name, path)), None),
    }


def read_text(path):
    with open(path, "r", errors="replace") as f:
        return f.read()


# --------------------------------------------------------------------------
# GPUs
# --------------------------------------------------------------------------


def _decode(v):
    return v.decode() if isinstance(v, bytes) else v


def _bus_key(bus_id):
    """NVML prints bus ids with an 8- or 4-digit domain; compare on domain number + the rest."""
    bus_id = _decode(bus_id).strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 3:
        try:
            return "%x:%s:%s" % (int(parts[0], 16), parts[1], parts[2])
        except ValueError:
            pass
    return bus_id


def gpus_from_nvml(pynvml):
    """GPUs, their compute processes and NVLink peers through NVML. Raises pynvml.NVMLError when NVML is unusable."""
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles, gpus, by_bus = [], [], {}
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except pynvml.NVMLError as e:
                # A GPU NVML counts but cannot open (fallen off the bus, needs a reset): unhealthy, not absent.
                gpus.append({"index": i, "uuid": "", "name": "", "memory_total_mb": 0, "memory_used_mb": 0,
                             "nvlink_peers": [], "processes": [], "bus_id": None, "error": str(e)[:200] or "Unknown Error"})
                continue
            handles.append(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            index = pynvml.nvmlDeviceGetIndex(h)
            gpu = {
                "index": index,
                "uuid": _decode(pynvml.nvmlDeviceGetUUID(h)),
                "name": _decode(pynvml.nvmlDeviceGetName(h)),
                "memory_total_mb": int(mem.total) // 1048576,
                "memory_used_mb": int(mem.used) // 1048576,
                "nvlink_peers": [],
                "processes": [],
                "bus_id": None,
            }
            try:
                bus = _decode(pynvml.nvmlDeviceGetPciInfo(h).busId)
                by_bus[_bus_key(bus)] = index
                gpu["bus_id"] = pci_bus_key(bus)
            except (pynvml.NVMLError, ValueError):
                pass
            try:
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = getattr(p, "usedGpuMemory", None)
                    gpu["processes"].append(
                        {"pid": int(p.pid), "name": _comm(p.pid), "used_mb": int(used) // 1048576 if used else 0}
                    )
            except pynvml.NVMLError:
                pass
            facts, remap, checks = health_from_nvml(nvml_health_answers(pynvml, h))
            gpu.update(facts)
            gpu["_checks"] = checks
            if remap is not None:
                gpu["_remap"] = remap
            gpus.append(gpu)
        gpus_with_handles = [g for g in gpus if "_checks" in g]
        behind_switch = False
        max_links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
        for gpu, h in zip(gpus_with_handles, handles):
            peers = set()
            for link in range(max_links):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
                except pynvml.NVMLError:
                    continue  # link not present on this GPU, or NVLink not supported at all
                peer = by_bus.get(_bus_key(remote.busId))
                if peer is None:
                    behind_switch = True  # the far end is an NVSwitch, not a GPU
                elif peer != gpu["index"]:
                    peers.add(peer)
            gpu["nvlink_peers"] = sorted(peers)
        if behind_switch:
            # NVSwitch systems: links end at switches, so ask NVML which pairs can talk over NVLink.
            caps = getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
            ok = getattr(pynvml, "NVML_P2P_STATUS_OK", 0)
            for gpu, h in zip(gpus_with_handles, handles):
                peers = set(gpu["nvlink_peers"])
                for other, h2 in zip(gpus_with_handles, handles):
                    if other is gpu:
                        continue
                    try:
                        if pynvml.nvmlDeviceGetP2PStatus(h, h2, caps) == ok:
                            peers.add(other["index"])
                    except pynvml.NVMLError:
                        pass
                gpu["nvlink_peers"] = sorted(peers)
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def nvml_health_answers(pynvml, h):
    """What NVML says of one GPU's health, each answer a value or NvmlFailed (health_from_nvml reads them)."""
    def ask(call, *args):
        try:
            return call(h, *args)
        except pynvml.NVMLError as e:
            return NvmlFailed(getattr(e, "value", None))
        except AttributeError:  # an old pynvml without the call: as the driver not supporting it
            return NvmlFailed(3)

    uncorrected = getattr(pynvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = getattr(pynvml, "NVML_VOLATILE_ECC", 0)
    return {
        "ecc": ask(lambda h, *a: pynvml.nvmlDeviceGetTotalEccErrors(h, *a), uncorrected, volatile),
        "retired_pending": ask(lambda h: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "remapped_rows": ask(lambda h: pynvml.nvmlDeviceGetRemappedRows(h)),
    }


def _comm(pid):
    try:
        return read_text("/proc/%d/comm" % int(pid)).strip()
    except OSError:
        return ""


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


def _gpus_despite_exit(out):
    """The GPUs of a query that exited non-zero, where its output names a GPU the driver cannot answer for."""
    if out is None:
        return None
    try:
        gpus = parse_gpu_csv(out)
    except ParseError:
        return None
    return gpus if any(g.get("error") for g in gpus) else None


class NvidiaSmi:
    """The nvidia-smi queries, started together so their latencies overlap.

    In a session, `cache` keeps the NVLink matrix for as long as the set of GPUs
    (their UUIDs) is unchanged: topology only changes with the hardware.
    """

    def __init__(self, binary, timeout, cache=None, health=True, remap=True):
        self.binary = binary
        self.timeout = timeout
        # One deadline for every query: waited for one after another, their timeouts would add up
        # past the probe's own deadline, and a hung nvidia-smi would take the whole node with it.
        self.deadline = _now() + timeout
        self.cache = cache
        query = GPU_QUERY if health else GPU_QUERY_WITHOUT_HEALTH
        self.gpus = _start([binary, "--query-gpu=" + query, "--format=csv,noheader,nounits"])
        self.apps = _start([binary, "--query-compute-apps=" + APPS_QUERY, "--format=csv,noheader,nounits"])
        self.remap = _start([binary, "--query-remapped-rows=" + REMAP_QUERY, "--format=csv,noheader"]) if remap else None
        self.topo = _start([binary, "topo", "-m"]) if cache is None else None
        self.remap_rows, self.remap_state = None, CHECK_UNSUPPORTED

    def _left(self):
        return max(0.1, self.deadline - _now())

    def _peers(self, gpus, warnings):
        key = tuple(g["uuid"] for g in gpus)
        if self.cache is not None:
            held = self.cache.get("topo")
            if held and held[0] == key:
                return held[1]
        if self.topo is None:
            self.topo = _start([self.binary, "topo", "-m"])
        out, why = _finish(self.topo, self._left(), "nvidia-smi topo -m")
        if why:
            warnings.append(why + " (NVLink peers unknown)")
            return {}
        try:
            peers = parse_topo_matrix(out)
        except ParseError as e:
            warnings.append("%s (NVLink peers unknown)" % e)
            return {}
        if self.cache is not None:
            self.cache["topo"] = (key, peers)
        return peers

    def collect(self, warnings):
        """The GPUs, or None with a warning; `self.error` says why when nvidia-smi answered
        unusably (garbage, a hang): GPUs unknown, which is not the same as no GPUs."""
        self.error = None
        gpus_out, why = _finish(self.gpus, self._left(), "nvidia-smi --query-gpu")
        apps_out, apps_why = _finish(self.apps, self._left(), "nvidia-smi --query-compute-apps")
        self._finish_remap(warnings)
        gpus = None
        if why and self.gpus.returncode is not None and self.gpus.returncode > 0:
            # nvidia-smi exits non-zero when one GPU cannot be answered for, and still lists the others;
            # any other failure (no driver: exit 9) leaves the node without GPUs, as before.
            gpus = _gpus_despite_exit(_stdout_of_failed(self.gpus))
            if gpus is not None:
                warnings.append(why)
                why = None
        if why:
            self._drop_topo()
            warnings.append(why)
            if self.gpus.returncode is not None and self.gpus.returncode < 0:  # killed at its deadline, or by a signal
                self.error = why
            return None
        try:
            gpus = parse_gpu_csv(gpus_out) if gpus is None else gpus
        except ParseError as e:
            self._drop_topo()
            self.error = "nvidia-smi printed an unexpected format: %s" % str(e)[:300]
            warnings.append(self.error)
            return None
        by_uuid = {}
        for g in gpus:
            g["nvlink_peers"] = []
            g["processes"] = []
            by_uuid[g["uuid"]] = g
        if apps_why:
            warnings.append(apps_why)
        else:
            try:
                for app in parse_compute_apps_csv(apps_out):
                    g = by_uuid.get(app["gpu_uuid"])
                    if g is not None:
                        g["processes"].append({"pid": app["pid"], "name": app["name"], "used_mb": app["used_mb"]})
            except ParseError as e:
                warnings.append("nvidia-smi --query-compute-apps printed an unexpected format: %s" % e)
        if len(gpus) > 1:
            peers = self._peers(gpus, warnings)
            for g in gpus:
                g["nvlink_peers"] = peers.get(g["index"], [])
        else:
            self._drop_topo()
        return gpus

    def _finish_remap(self, warnings):
        """Rows pending remap, or why not: unsupported where the driver has no such query, unreadable
        where it answered something else (a check that did not run is never taken as clean)."""
        if self.remap is None:
            return
        out, why = _finish(self.remap, self._left(), "nvidia-smi --query-remapped-rows")
        if why:
            said = why.lower()
            if "not a valid" in said or "invalid combination" in said or "not supported" in said:
                self.remap_state = CHECK_UNSUPPORTED
                return
            out = _stdout_of_failed(self.remap)
            if out is None:
                warnings.append(why + " (row remapping unknown)")
                self.remap_state = CHECK_UNREADABLE
                return
        try:
            self.remap_rows = parse_remapped_rows_csv(out)
            self.remap_state = CHECK_UNSUPPORTED if not self.remap_rows else "ok"
        except ParseError as e:
            warnings.append("nvidia-smi --query-remapped-rows printed an unexpected format: %s (row remapping unknown)" % e)
            self.remap_state = CHECK_UNREADABLE

    def _drop_topo(self):
        if self.topo is not None:
            _finish(self.topo, self._left(), "nvidia-smi topo -m")


# --------------------------------------------------------------------------
# Everything else
# --------------------------------------------------------------------------


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
        if not isinstance(rec, dict) or rec.get("managed_by") != MANAGED_BY:
            continue
        st = proc_stat(rec.get("pid", -1)) if isinstance(rec.get("pid"), int) else None
        # A zombie has exited: it only waits for a parent to reap it, and where PID 1 does not reap
        # (containers), it waits forever. Counting it alive would hide every crashed engine.
        rec["alive"] = bool(st) and st["state"] not in ("Z", "X") and st["start_time"] == rec.get("start_time")
        rec["file"] = name
        records.append(rec)
    return records


def exclude_managed(gpus, records):
    """Drop GPU processes that belong to a live managed replica (its pid, process group or session)."""
    pids, groups = set(), set()
    for rec in records:
        if rec.get("alive"):
            if isinstance(rec.get("pid"), int):
                pids.add(rec["pid"])
                groups.add(rec["pid"])
            if isinstance(rec.get("pgid"), int):
                groups.add(rec["pgid"])
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


SGLANG_RECHECK_S = 300  # in a session, `import sglang` is re-run at most this often


def collect(args, cache=None):
    """One probe pass. `cache` (a dict kept by a session across passes) may hold slow facts."""
    warnings = []
    model_dirs = [d for d in args.get("model_dirs") or [] if isinstance(d, str)]
    report = {"probe_version": PROBE_VERSION, "python": "%d.%d.%d" % sys.version_info[:3], "warnings": warnings}

    # Slow children first, so they run while this process reads files.
    held = cache.get("sglang") if cache is not None else None
    sglang_fresh = held is not None and _now() - held[0] < SGLANG_RECHECK_S
    sglang = None if sglang_fresh else start_sglang_check()
    health = args.get("gpu_health", True) is not False
    # In a session, the kernel log and the remapped rows are read again at most every
    # HEALTH_RECHECK_S (ECC counts and device errors, in the GPU query, every pass).
    slow = cache.get("slow_health") if cache is not None else None
    slow_fresh = slow is not None and _now() - slow[0] < float(args.get("health_recheck_s", HEALTH_RECHECK_S))
    dmesg = start_dmesg() if health and not slow_fresh else None
    gpus = gpus_from_pynvml(report, warnings)
    smi = start_nvidia_smi(args, cache, warnings, health, health and not slow_fresh) if gpus is None else None

    host_facts(report, args, model_dirs, warnings)
    engines = engines_on_path()
    llama_cpp = llama_cpp_binaries()
    report["llama_cpp"] = llama_cpp
    if llama_cpp["server"] or llama_cpp["rpc_server"]:
        engines["llama.cpp"] = ""
    records = replica_records(args.get("state_dir") or "~/.local/state/llm-reconciler", warnings)
    owner = args.get("owner")
    report["replicas"] = records
    report["ports_in_use"] = listening_ports(warnings)

    gpus = finish_gpus(report, gpus, smi, warnings)
    if health:
        gpus = gpu_health(report, gpus, smi, dmesg, float(args.get("dmesg_timeout_s", 5)), warnings,
                          cache, slow if slow_fresh else None)
    # Only this catalog's ranks are left out of the GPUs' processes: another owner's stay foreign.
    exclude_managed(gpus, [r for r in records if owner is None or r.get("owner") in (None, owner)])
    report["gpus"] = gpus
    if sglang_installed(args, cache, held if sglang_fresh else None, sglang, warnings):
        add_sglang(engines, warnings)
    report["engines"] = engines
    return report


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


def gpus_from_pynvml(report, warnings):
    """The GPUs through NVML where pynvml is installed and works; None: ask nvidia-smi."""
    try:
        import pynvml  # noqa: F811 - optional on nodes
    except ImportError:
        return None
    try:
        gpus = gpus_from_nvml(pynvml)
    except pynvml.NVMLError as e:
        # No library or no driver is simply a machine without NVIDIA GPUs (pynvml is often
        # installed with Python packages everywhere); anything else is worth saying.
        if getattr(e, "value", None) not in (NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND):
            warnings.append("NVML unusable (%s), trying nvidia-smi" % e)
        return None
    except ImportError:  # a part of pynvml that does not load: as if it were not installed
        return None
    report["gpu_source"] = "nvml"
    return gpus


def start_nvidia_smi(args, cache, warnings, health=True, remap=True):
    """nvidia-smi started (it runs while the rest is read), or None where there is none."""
    binary = which("nvidia-smi")
    if not binary:
        return None
    try:
        return NvidiaSmi(binary, float(args.get("nvidia_smi_timeout_s", 20)), cache, health, remap)
    except OSError as e:
        warnings.append("cannot run nvidia-smi: %s" % (e.strerror or e))
        return None


def finish_gpus(report, gpus, smi, warnings):
    """The GPUs, from NVML or from nvidia-smi's answer; [] where neither said anything."""
    if smi is not None:
        gpus = smi.collect(warnings)
        report["gpu_source"] = "nvidia-smi" if gpus is not None else "none"
        if smi.error:
            report["gpu_error"] = smi.error
    if gpus is None:
        gpus = []
        report.setdefault("gpu_source", "none")
    return gpus


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


def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def engines_on_path():
    return {engine: "" for engine, binary in sorted(ENGINE_BINARIES.items()) if which(binary)}


def add_sglang(engines, warnings):
    """SGLang imports: counted where its command is on the PATH too (what a launch runs)."""
    if which(SGLANG_COMMAND):
        engines["sglang"] = ""
    else:
        warnings.append("sglang imports but its `sglang` command is not on the PATH: not counted as installed")


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


def payload(minify=True):
    """The program text sent to a node: parse.py, health.py, then this file, as one module.

    Minified (docstrings dropped, comments and layout gone through an AST
    round trip): the node compiles it at every cold start, and a third less
    text is a third less compile time, fifty nodes at a time.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    parse_src = read_text(os.path.join(here, "parse.py"))
    health_src = read_text(os.path.join(here, "health.py"))
    script_src = read_text(os.path.abspath(__file__))
    source = parse_src + "\n\n# ---- health.py ----\n" + health_src + "\n\n# ---- script.py ----\n" + script_src
    if minify:
        import ast

        tree = ast.parse(source)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        source = ast.unparse(tree) + "\n"
    return source.encode()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
