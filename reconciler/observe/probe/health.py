"""Pure parsers and judgements of GPU health (SPEC section 9). Standard library only.

Like parse.py, this runs in two places: the management side imports it, and the probe
script sent to a node carries its text, after parse.py's and before script.py's (see
script.payload()). So it imports nothing from `reconciler` on the node (parse.py's names are
already defined there), has no `from __future__` line (it is not the payload's first text),
and keeps to what an older python3 understands.

The facts come from three places, each a check whose result is kept (`health_checks`):
  ecc    nvidia-smi's `ecc.errors.uncorrected.volatile.total` or NVML's total ECC errors
  remap  `--query-remapped-rows` (rows pending remap, failed remaps) and `retired_pages.pending`
  xid    the kernel log (`dmesg`): `NVRM: Xid (PCI:0000:3b:00): 79, ...` lines, matched by bus id
A check that did not run is `unreadable` or `unsupported`, never `ok`, and a GPU is judged on
the checks that ran.
"""

if "pci_bus_key" not in globals():
    # Management side; on a node parse.py's text precedes this one.
    from reconciler.observe.probe.parse import (  # noqa: F401
        _NA,
        DEVICE_ERROR_VALUES,
        ParseError,
        _re,
        _yes_no,
        device_error_line,
        pci_bus_key,
    )

OK, UNHEALTHY, LOST = "ok", "unhealthy", "lost"  # vocabulary.GpuHealth, spelled here for the node
CHECK_OK, CHECK_UNREADABLE, CHECK_UNSUPPORTED = "ok", "unreadable", "unsupported"  # vocabulary.CheckResult

# Xids that mean the GPU needs a reset or a replacement (NVIDIA's Xid catalog: 48 double-bit ECC,
# 61/62 internal micro-controller halt, 63/64 row-remap or page-retirement event/failure, 74 NVLink,
# 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP).
# Every other Xid (13 a program's fault, 31 its page fault, 43 a stopped channel) is an application's
# and is kept as information only.
FATAL_XIDS = frozenset((48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120))

REMAP_QUERY = "gpu_bus_id,remapped_rows.pending,remapped_rows.failure"
DMESG_MAX_BYTES = 4 << 20  # the newest 4 MiB of a kernel log are read; older lines are dropped
XID_EVENTS_KEPT = 8  # per GPU, the newest

_XID = r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): *([0-9]+), *(.*)$"
_SINCE_BOOT = r"^\[ *([0-9]+\.[0-9]+)\]"  # `[ 6781741.548779] ` (dmesg's default)
_CTIME = r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} +[0-9]{1,2} [0-9:]{8} [0-9]{4})\]"  # `[Fri Aug 30 11:43:09 2024] ` (-T)
_ISO = r"^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8})[,.0-9]*([+-][0-9:]{4,5}|Z)?"  # --time-format iso
_XID_NOISE = r"^(?:pid=[^,]*, *)?(?:name=[^,]*, *)?(?:channel [^,]*, *)?"


def parse_remapped_rows_csv(text):
    """`nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure
    --format=csv,noheader` -> {bus key: {"pending": bool|None, "failure": bool|None[, "error": str]}}.

    None: the GPU does not remap rows (before Ampere); a GPU the driver cannot answer for
    carries `error`. `No devices were found` is no GPUs."""
    rows = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.lower().startswith("no devices"):
            continue
        lost = device_error_line(line)
        if lost is not None:
            rows[lost[0]] = {"pending": None, "failure": None, "error": lost[1]}
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            raise ParseError("nvidia-smi --query-remapped-rows line %d has %d fields, expected 3: %r"
                             % (lineno, len(parts), line[:120]))
        key = pci_bus_key(parts[0])
        error = next(("%s reads %s" % (n, v) for n, v in zip(("remapped_rows.pending", "remapped_rows.failure"), parts[1:])
                      if v in DEVICE_ERROR_VALUES), "")
        row = {"pending": None, "failure": None}
        if error:
            row["error"] = error
        else:
            row["pending"], row["failure"] = _yes_no(parts[1]), _yes_no(parts[2])
        rows[key] = row
    return rows


def _iso_from_boot(seconds, boot_time):
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(boot_time + seconds))


def _when(line, boot_time):
    """The time a kernel-log line carries, as text, or None (printk.time=0, or no boot time to add to)."""
    m = _re(_SINCE_BOOT).match(line)
    if m:
        return _iso_from_boot(float(m.group(1)), boot_time) if boot_time is not None else None
    m = _re(_ISO).match(line)
    if m:
        zone = m.group(2) or ""
        return m.group(1) + ("Z" if zone in ("Z", "+00:00", "+0000") else zone)
    m = _re(_CTIME).match(line)
    if m:
        return m.group(1)  # the node's local time, as dmesg -T printed it
    return None


def parse_xid_lines(text, boot_time=None):
    """Xid events of a kernel log (dmesg's output, with or without timestamps), oldest first:
    [{"bus": bus key, "xid": int, "message": str, "time": str|None}].

    `boot_time` (seconds since the epoch, /proc/stat's btime) turns dmesg's seconds since boot
    into a UTC time. Lines that are not NVRM Xid lines (an NVSwitch's `SXid`, anything else)
    are passed over; an Xid line whose bus id cannot be read is too, as it names no GPU."""
    events = []
    if "Xid" not in text:
        return events
    for line in text.splitlines():
        at = line.find("NVRM: Xid")
        if at < 0:
            continue
        m = _re(_XID).match(line[at:].rstrip())
        if m is None:
            continue
        try:
            bus = pci_bus_key(m.group(1))
        except ParseError:
            continue
        message = _re(_XID_NOISE).sub("", m.group(3)).strip().rstrip(".")
        events.append({"bus": bus, "xid": int(m.group(2)), "message": message[:160], "time": _when(line, boot_time)})
    return events


def parse_boot_time(proc_stat_text):
    """/proc/stat -> btime (seconds since the epoch), or None."""
    for line in proc_stat_text.splitlines():
        if line.startswith("btime "):
            value = line.split()[1:2]
            return int(value[0]) if value and value[0].isdigit() else None
    return None


def xid_events_by_bus(events):
    """{bus key: the newest XID_EVENTS_KEPT events of that GPU}."""
    by_bus = {}
    for e in events:
        by_bus.setdefault(e["bus"], []).append(e)
    return {bus: evs[-XID_EVENTS_KEPT:] for bus, evs in by_bus.items()}


def _xid_text(event):
    at = " at %s" % event["time"] if event.get("time") else ""
    return "Xid %d%s: %s" % (event["xid"], at, event["message"] or "no message")


def judge_gpu(gpu, remap=None, xids=(), checks=None):
    """(health, reason) of one GPU from its facts. Pure.

    gpu:    a GPU entry of the report: `error` (the driver could not answer for it), `lost`,
            `ecc_uncorrected` (int or None), `retired_pending` (bool or None)
    remap:  its row of parse_remapped_rows_csv, or None
    xids:   its Xid events, oldest first
    checks: {"ecc", "remap", "xid"} -> CHECK_*: a fact of a check that did not run is not read
    Every reason found is said, the worst first, in one line."""
    checks = checks or {}
    if gpu.get("lost"):
        return LOST, gpu.get("error") or "listed in /proc/driver/nvidia/gpus but not by the driver"
    reasons = []
    if gpu.get("error"):
        reasons.append("the driver cannot answer for it: %s" % gpu["error"])
    if checks.get("xid", CHECK_OK) == CHECK_OK:
        reasons += _xid_reasons(xids)
    if checks.get("ecc", CHECK_OK) == CHECK_OK:
        reasons += _ecc_reasons(gpu)
    if checks.get("remap", CHECK_OK) == CHECK_OK:
        reasons += _remap_reasons(gpu, remap)
    if not reasons:
        return OK, ""
    return UNHEALTHY, "; ".join(reasons)[:300]


def _xid_reasons(xids):
    """The newest fatal Xid, said; none where no Xid is fatal."""
    fatal = [e for e in xids if e["xid"] in FATAL_XIDS]
    return [_xid_text(fatal[-1])] if fatal else []


def _ecc_reasons(gpu):
    ecc = gpu.get("ecc_uncorrected")
    if isinstance(ecc, int) and ecc > 0:
        return ["%d uncorrected ECC error%s" % (ecc, "" if ecc == 1 else "s")]
    return []


def _remap_reasons(gpu, remap):
    """What the remapped rows and the retired pages say against a GPU."""
    reasons = []
    if remap and remap.get("error") and not gpu.get("error"):
        reasons.append("the driver cannot answer for it: %s" % remap["error"])
    if remap and remap.get("failure"):
        reasons.append("row remap failed")
    elif remap and remap.get("pending"):
        reasons.append("row remap pending")
    if gpu.get("retired_pending"):
        reasons.append("page retirement pending")
    return reasons


def ecc_check(gpus):
    """How the ECC check went on a node: ok where some GPU answered a count, else unsupported
    (consumer GPUs, ECC off) or, where no GPU could answer at all, unreadable."""
    if any(isinstance(g.get("ecc_uncorrected"), int) for g in gpus):
        return CHECK_OK
    if gpus and all(g.get("error") for g in gpus):
        return CHECK_UNREADABLE
    return CHECK_UNSUPPORTED


def remap_check(gpus, rows, query_failed):
    """ok where rows pending remap or pages pending retirement were answered for some GPU."""
    if rows and any(r.get("pending") is not None for r in rows.values()):
        return CHECK_OK
    if any(g.get("retired_pending") is not None for g in gpus):
        return CHECK_OK
    return CHECK_UNREADABLE if query_failed else CHECK_UNSUPPORTED


def lost_gpus(listed, proc_bus_ids):
    """GPU entries for bus ids /proc/driver/nvidia/gpus has and the driver's listing does not:
    each at an index after the listed ones (the driver numbers what it lists; these have no index)."""
    known = set(g.get("bus_id") for g in listed)
    keys = []
    for b in proc_bus_ids:
        try:
            key = pci_bus_key(b)
        except ParseError:
            continue
        if key not in known and key not in keys:
            keys.append(key)
    next_index = max([g["index"] for g in listed] + [-1]) + 1
    out = []
    for i, key in enumerate(sorted(keys)):
        out.append({"index": next_index + i, "uuid": "", "name": "", "memory_total_mb": 0, "memory_used_mb": 0,
                    "bus_id": key, "lost": True,
                    "error": "GPU %s is in /proc/driver/nvidia/gpus but the driver does not list it" % key})
    return out


# --------------------------------------------------------------------------
# NVML: the same facts from pynvml's answers
# --------------------------------------------------------------------------

NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION = 3, 4
NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, NVML_ERROR_UNKNOWN = 15, 16, 999
_NVML_DEVICE_ERRORS = {NVML_ERROR_GPU_IS_LOST: "GPU is lost", NVML_ERROR_RESET_REQUIRED: "GPU requires reset",
                       NVML_ERROR_UNKNOWN: "Unknown Error"}


class NvmlFailed(object):
    """An NVML call that raised: its return code (pynvml.NVMLError.value)."""

    def __init__(self, code):
        self.code = code


def health_from_nvml(answers):
    """The facts of one GPU from what NVML answered, as parse_gpu_csv's 8-field form and
    parse_remapped_rows_csv give them: (gpu facts, remap row, {check: result}). Pure.

    answers: {"ecc": int, "retired_pending": int (NVML_FEATURE_ENABLED 1 / DISABLED 0),
              "remapped_rows": (corrected, uncorrected, is_pending, failure_occurred)}, each
              value possibly an NvmlFailed: NOT_SUPPORTED is unsupported, NO_PERMISSION
              unreadable, GPU_IS_LOST / RESET_REQUIRED / UNKNOWN make the GPU unhealthy."""
    facts, remap, checks, error = {"ecc_uncorrected": None, "retired_pending": None}, None, {}, ""

    def failed(name, check):
        v = answers.get(name)
        if not isinstance(v, NvmlFailed):
            return False
        checks.setdefault(check, CHECK_UNREADABLE if v.code == NVML_ERROR_NO_PERMISSION else CHECK_UNSUPPORTED)
        return True

    for name in ("ecc", "retired_pending", "remapped_rows"):
        v = answers.get(name)
        if isinstance(v, NvmlFailed) and v.code in _NVML_DEVICE_ERRORS and not error:
            error = _NVML_DEVICE_ERRORS[v.code]
    if not failed("ecc", "ecc") and answers.get("ecc") is not None:
        facts["ecc_uncorrected"] = int(answers["ecc"])
        checks["ecc"] = CHECK_OK
    if not failed("retired_pending", "retired") and answers.get("retired_pending") is not None:
        facts["retired_pending"] = bool(answers["retired_pending"])
    rows = answers.get("remapped_rows")
    if not failed("remapped_rows", "remap") and rows is not None:
        remap = {"pending": bool(rows[2]), "failure": bool(rows[3])}
        checks["remap"] = CHECK_OK
    if facts["retired_pending"] is not None:
        checks["remap"] = CHECK_OK
    elif "remap" not in checks:
        checks["remap"] = checks.get("retired", CHECK_UNSUPPORTED)
    checks.pop("retired", None)
    checks.setdefault("ecc", CHECK_UNSUPPORTED)
    if error:
        facts["error"] = error
    return facts, remap, checks


def merge_checks(per_gpu):
    """A node's result of one check from its GPUs': ok where any GPU's ran, else the first other."""
    results = list(per_gpu)
    if CHECK_OK in results:
        return CHECK_OK
    if CHECK_UNREADABLE in results:
        return CHECK_UNREADABLE
    return CHECK_UNSUPPORTED


def assess(gpus, remap_rows=None, remap_state=CHECK_UNSUPPORTED, xid_events=None, xid_state=CHECK_UNSUPPORTED,
           proc_bus_ids=(), nvml_checks=None):
    """Judge every GPU of a report; returns (GPUs with `health`, `health_reason`, maybe `xid_info`,
    the lost ones added; health_checks; warnings). Pure.

    remap_rows:  parse_remapped_rows_csv's answer (None: not asked or not readable: see remap_state)
    xid_events:  parse_xid_lines' answer (None: the kernel log was not read: see xid_state)
    proc_bus_ids: the names in /proc/driver/nvidia/gpus/
    nvml_checks: where NVML answered, each GPU's own check results (`_checks` on the GPU)."""
    out = [dict(g) for g in gpus] + lost_gpus(gpus, proc_bus_ids)
    checks = _checks_run(gpus, remap_state, nvml_checks)
    checks["xid"] = xid_state if xid_events is None else CHECK_OK
    by_bus = xid_events_by_bus(xid_events or ())
    warnings = _xids_of_no_gpu(by_bus, out)
    for g in out:
        _judge_entry(g, remap_rows, by_bus, checks, nvml_checks)
    return out, checks, warnings


def _checks_run(gpus, remap_state, nvml_checks):
    """The node's ecc and remap check results: NVML's per GPU merged, else nvidia-smi's."""
    if nvml_checks is not None:
        return {"ecc": merge_checks(g.get("_checks", {}).get("ecc", CHECK_UNSUPPORTED) for g in gpus),
                "remap": merge_checks(g.get("_checks", {}).get("remap", CHECK_UNSUPPORTED) for g in gpus)}
    return {"ecc": ecc_check(gpus), "remap": remap_state}


def _xids_of_no_gpu(by_bus, gpus):
    """A warning for each bus id with Xid events that no GPU of this node has."""
    warnings = []
    known = set(g.get("bus_id") for g in gpus)
    for bus in sorted(set(by_bus) - known):
        evs = by_bus[bus]
        warnings.append("the kernel log has %d Xid event%s for PCI %s, which no GPU of this node has (newest: %s)"
                        % (len(evs), "" if len(evs) == 1 else "s", bus, _xid_text(evs[-1])))
    return warnings


def _judge_entry(g, remap_rows, by_bus, checks, nvml_checks):
    """One GPU entry judged in place: `health`, maybe `health_reason` and `xid_info`; the facts it was judged on dropped."""
    row = (remap_rows or {}).get(g.get("bus_id")) if g.get("bus_id") else None
    if nvml_checks is not None and "_remap" in g:
        row = g["_remap"]
    evs = by_bus.get(g.get("bus_id"), []) if g.get("bus_id") else []
    g["health"], reason = judge_gpu(g, row, evs, checks)
    if reason:
        g["health_reason"] = reason
    info = [_xid_text(e) for e in evs if e["xid"] not in FATAL_XIDS]
    if info:
        g["xid_info"] = info[-3:]
    for k in ("_checks", "_remap", "lost", "error", "ecc_uncorrected", "retired_pending"):
        g.pop(k, None)
