"""The node's GPUs, as the probe sees them on the node: through NVML where pynvml works,
else through nvidia-smi's queries (started together, so their latencies overlap).

Part of the program sent to a node (see script.payload()); standard library only, plus
pynvml when the node happens to have it. On the node the names below are already defined by
the text sent ahead of this file; the management side imports them.
"""

if "parse_gpu_csv" not in globals():
    # Management side (see script.py): never let an installed copy replace what was sent.
    from reconciler.observe.probe.parse import (  # noqa: F401
        APPS_QUERY,
        GPU_QUERY,
        GPU_QUERY_WITHOUT_HEALTH,
        ParseError,
        parse_compute_apps_csv,
        parse_gpu_csv,
        parse_topo_matrix,
    )
    from reconciler.observe.probe.health import (  # noqa: F401
        CHECK_UNREADABLE,
        CHECK_UNSUPPORTED,
        REMAP_QUERY,
        NvmlFailed,
        health_from_nvml,
        parse_remapped_rows_csv,
        pci_bus_key,
    )
    from reconciler.observe.probe.system import _finish, _now, _start, _stdout_of_failed, read_text, which  # noqa: F401

NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND = 9, 12  # nvml.h return codes


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
        handles, gpus, by_bus = [], [], {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except pynvml.NVMLError as e:
                gpus.append(_unopenable_gpu(i, e))
                continue
            handles.append(h)
            gpus.append(_nvml_gpu(pynvml, h, by_bus))
        gpus_with_handles = [g for g in gpus if "_checks" in g]
        if _nvlink_peers(pynvml, gpus_with_handles, handles, by_bus):
            _nvswitch_peers(pynvml, gpus_with_handles, handles)
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _unopenable_gpu(index, error):
    """A GPU NVML counts but cannot open (fallen off the bus, needs a reset): unhealthy, not absent."""
    return {"index": index, "uuid": "", "name": "", "memory_total_mb": 0, "memory_used_mb": 0,
            "nvlink_peers": [], "processes": [], "bus_id": None, "error": str(error)[:200] or "Unknown Error"}


def _nvml_gpu(pynvml, h, by_bus):
    """One opened GPU's facts, processes and health; its bus id is noted in `by_bus` (bus key -> index)."""
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
    return gpu


def _nvlink_peers(pynvml, gpus, handles, by_bus):
    """Each GPU's NVLink peers from its links' far ends; True when a link ends at an NVSwitch."""
    behind_switch = False
    max_links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
    for gpu, h in zip(gpus, handles):
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
    return behind_switch


def _nvswitch_peers(pynvml, gpus, handles):
    """NVSwitch systems: links end at switches, so ask NVML which pairs can talk over NVLink."""
    caps = getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
    ok = getattr(pynvml, "NVML_P2P_STATUS_OK", 0)
    for gpu, h in zip(gpus, handles):
        peers = set(gpu["nvlink_peers"])
        for other, h2 in zip(gpus, handles):
            if other is gpu:
                continue
            try:
                if pynvml.nvmlDeviceGetP2PStatus(h, h2, caps) == ok:
                    peers.add(other["index"])
            except pynvml.NVMLError:
                pass
        gpu["nvlink_peers"] = sorted(peers)


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
