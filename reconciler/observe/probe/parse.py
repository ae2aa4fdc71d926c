"""Pure parsers for what a node prints: nvidia-smi, sysfs, /proc. Standard library only.

This module runs in two places. The management side imports it, and the probe
script sent to a node carries its text verbatim (see script.payload()), because
nothing is installed on nodes. So it must never import from `reconciler`, and
must keep working on an older python3 than ours.

Every parser raises ParseError (a ValueError) on output it does not recognise:
a driver that changed its format must become a reason in the node's report,
never a silently wrong inventory.
"""

from __future__ import annotations

import functools
import struct

DEFAULT_GID_PREFIX = "fe80:0000:0000:0000"  # an IB subnet manager left at its default

# Words in GPU names that are brand, not model: "NVIDIA GeForce RTX 4090", "Tesla T4".
_BRAND_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
# Series words that only name a model together with what follows: "RTX 4090", "RTX A6000".
_SERIES_WORDS = {"rtx", "gtx", "titan"}
_SIZE_IN_NAME = r"(?i)(?<![0-9])([0-9]{1,4})\s*GB?(?![A-Za-z])"
_ANSI = r"\x1b\[[0-9;]*[A-Za-z]"
_compiled: dict = {}


def _re(pattern: str):
    """Compile on first use: `import re` alone costs the node-side probe ~8 ms at every start."""
    if pattern not in _compiled:
        import re

        _compiled[pattern] = re.compile(pattern)
    return _compiled[pattern]
_NA = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Insufficient Permissions]", ""}


class ParseError(ValueError):
    pass


# --------------------------------------------------------------------------
# GPU class (SPEC section 1)
# --------------------------------------------------------------------------


def gpu_model_token(name: str) -> str:
    """The model part of a GPU name: `NVIDIA H100 80GB HBM3` -> `H100`, `NVIDIA A100-SXM4-40GB` -> `A100`,
    `NVIDIA GeForce RTX 4090` -> `RTX4090`, `Tesla V100-SXM2-32GB` -> `V100`."""
    words = [w for w in name.replace("_", " ").split() if w.lower() not in _BRAND_WORDS]
    if not words:
        return "GPU"
    first = words[0].split("-")[0]
    if first.lower() in _SERIES_WORDS and len(words) > 1:
        # "RTX 4090" and "RTX A6000" are one model; "RTX" alone names nothing.
        return first.upper() + words[1].split("-")[0]
    return first


@functools.lru_cache(maxsize=1024)  # a fleet has a few kinds of GPU, each probed on every node every pass
def gpu_class(name: str, memory_total_mb: int | None) -> str:
    """`<model>-<size>GB` as SPEC section 1 defines it.

    The size is the one printed in the name (`80GB`, `40GB`) when the name has
    one that agrees with the probed memory to within 25%, else the total memory
    in GiB rounded to the nearest integer. The agreement check exists because
    some names print a size that is not the GPU's: `NVIDIA GH200 480GB` counts
    the Grace CPU's LPDDR, while its GPU has 96 GiB of HBM.
    """
    model = gpu_model_token(name)
    mem_gib = (memory_total_mb / 1024.0) if memory_total_mb else None
    for m in _re(_SIZE_IN_NAME).finditer(name):
        size = int(m.group(1))
        if size <= 0:
            continue
        if mem_gib is None or abs(size - mem_gib) <= 0.25 * mem_gib:
            return "%s-%dGB" % (model, size)
    if mem_gib is None:
        return model + "-0GB"
    return "%s-%dGB" % (model, int(mem_gib + 0.5))


# --------------------------------------------------------------------------
# nvidia-smi
# --------------------------------------------------------------------------

# The GPUs, then the health fields of SPEC section 9 in the same query (one nvidia-smi, not two):
# the PCI bus id that Xid lines and /proc/driver/nvidia/gpus name a GPU by, uncorrected ECC
# errors since the driver loaded, and pages waiting to be retired.
GPU_QUERY = "index,uuid,name,memory.total,memory.used,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending"
GPU_QUERY_WITHOUT_HEALTH = "index,uuid,name,memory.total,memory.used"
APPS_QUERY = "gpu_uuid,pid,process_name,used_memory"
# What nvidia-smi prints in a field of a GPU it names but cannot answer for (SPEC section 9):
# such a GPU is unhealthy, and the other GPUs of the output are still read.
DEVICE_ERROR_VALUES = ("[GPU requires reset]", "ERR!", "[Unknown Error]", "[GPU is lost]")
# A whole line for such a GPU: `Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error`,
# `... for GPU0000:65:00.0: Unknown Error` (no space on some drivers), `... GPU is lost.  Reboot the system ...`.
_DEVICE_ERROR_LINE = (r"^(?:Unable to (?:determine|detect) the device handle for )?GPU ?"
                      r"((?:[0-9A-Fa-f]+:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?): *(.+)$")


def pci_bus_key(bus_id: str) -> str:
    """One spelling of a PCI bus id for comparing: nvidia-smi's `00000000:3B:00.0`, NVML's
    `0000:3b:00.0`, an Xid line's `PCI:0000:3b:00` and /proc's `0000:3b:00.0` are all `0000:3b:00`
    (domain as a number, bus and device in lower case; the function left out, as Xid lines do)."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0"] + parts
    if len(parts) != 3:
        raise ParseError("not a PCI bus id: %r" % bus_id[:60])
    device = parts[2].split(".")[0]
    try:
        return "%04x:%02x:%02x" % (int(parts[0], 16), int(parts[1], 16), int(device, 16))
    except ValueError:
        raise ParseError("not a PCI bus id: %r" % bus_id[:60])


def device_error_line(line: str) -> tuple[str, str] | None:
    """(bus key, what the driver said) for a line naming a GPU it cannot answer for, else None."""
    m = _re(_DEVICE_ERROR_LINE).match(line.strip())
    if m is None:
        return None
    try:
        key = pci_bus_key(m.group(1))
    except ParseError:
        return None
    return key, m.group(2).strip().rstrip(".").split(".  ")[0][:200]


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    if text in _NA:
        return None
    try:
        return int(float(text))
    except ValueError:
        raise ParseError("not a number: %r" % text)


def _yes_no(text: str) -> bool | None:
    word = text.strip().lower()
    if word in ("yes", "1", "true"):
        return True
    if word in ("no", "0", "false"):
        return False
    if text.strip() in _NA:
        return None
    raise ParseError("not yes or no: %r" % text[:40])


def _device_error(fields: list[tuple[str, str]]) -> str:
    """`memory.total reads [GPU requires reset]` for the first field that says the GPU cannot answer."""
    for name, value in fields:
        if value in DEVICE_ERROR_VALUES:
            return "%s reads %s" % (name, value)
    return ""


def parse_gpu_csv(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` (8 fields), or the older
    5-field query `index,uuid,name,memory.total,memory.used`.

    A line for a GPU the driver cannot answer for (`Unable to determine the device handle ...`)
    becomes that GPU, at the index its place in the output gives it, with `error` set; so does a
    line whose fields read `[GPU requires reset]` or `ERR!`. The 8-field form adds `bus_id` (as
    pci_bus_key spells it), `ecc_uncorrected` and `retired_pending` (None: not supported)."""
    gpus = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        lost = device_error_line(line)
        if lost is not None:
            gpus.append({"index": gpus[-1]["index"] + 1 if gpus else 0, "uuid": "", "name": "", "memory_total_mb": 0,
                         "memory_used_mb": 0, "bus_id": lost[0], "error": lost[1]})
            continue
        gpus.append(_gpu_csv_line(lineno, line))
    return gpus


def _gpu_csv_fields(lineno: int, line: str) -> tuple:
    """(index, uuid, name, [(field, value)] of the other fields, whether it is the 8-field form)."""
    parts = [p.strip() for p in line.split(",")]
    health = len(parts) >= 8
    if len(parts) < 5 or len(parts) in (6, 7):
        raise ParseError("nvidia-smi --query-gpu line %d has %d fields, expected 8 (or 5): %r" % (lineno, len(parts), line[:120]))
    tail = 5 if health else 2  # fields after the name
    # A name never holds a comma on any driver seen, but keep index/uuid first and the rest last regardless.
    index, uuid, name = parts[0], parts[1], ", ".join(parts[2:-tail])
    total, used = parts[-tail], parts[-tail + 1]
    if not index.isdigit():
        raise ParseError("nvidia-smi --query-gpu line %d: index %r is not a number" % (lineno, index))
    named = [("memory.total", total), ("memory.used", used)]
    if health:
        named += [("pci.bus_id", parts[-3]), ("ecc.errors.uncorrected.volatile.total", parts[-2]),
                  ("retired_pages.pending", parts[-1])]
    return index, uuid, name, named, health


def _gpu_csv_line(lineno: int, line: str) -> dict:
    """One GPU of the query's output, from a line that is not a device error line."""
    index, uuid, name, named, health = _gpu_csv_fields(lineno, line)
    error = _device_error(named)
    values = {k: ("" if v in DEVICE_ERROR_VALUES else v) for k, v in named}
    total_mb = _int_or_none(values["memory.total"])
    if total_mb is None and not error:
        raise ParseError("nvidia-smi --query-gpu line %d: no memory.total for GPU %s" % (lineno, index))
    gpu = {
        "index": int(index),
        "uuid": uuid,
        "name": name,
        "memory_total_mb": total_mb or 0,
        "memory_used_mb": _int_or_none(values["memory.used"]) or 0,
    }
    if health:
        bus = values["pci.bus_id"]
        gpu["bus_id"] = pci_bus_key(bus) if bus and bus not in _NA else None
        gpu["ecc_uncorrected"] = _int_or_none(values["ecc.errors.uncorrected.volatile.total"])
        gpu["retired_pending"] = _yes_no(values["retired_pages.pending"])
    if error:
        gpu["error"] = error
    return gpu


def parse_compute_apps_csv(text: str) -> list[dict]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.lower().startswith("no running"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            raise ParseError("nvidia-smi --query-compute-apps line %d has %d fields, expected 4: %r" % (lineno, len(parts), line[:120]))
        uuid, pid, name, used = parts[0], parts[1], ",".join(parts[2:-1]), parts[-1]
        if not pid.isdigit():
            raise ParseError("nvidia-smi --query-compute-apps line %d: pid %r is not a number" % (lineno, pid))
        apps.append({"gpu_uuid": uuid, "pid": int(pid), "name": name, "used_mb": _int_or_none(used) or 0})
    return apps


_DEVICE_COLUMN = r"^(GPU[0-9]+|NIC[0-9]+|mlx[0-9]+_[0-9]+|[a-z]+[0-9]+_[0-9]+)$"


def parse_topo_matrix(text: str) -> dict[int, list[int]]:
    """`nvidia-smi topo -m`: GPU index -> indices of GPUs it reaches over NVLink (`NV#` cells)."""
    if "\x1b" in text:  # printed on a terminal: underline codes around the header
        text = _re(_ANSI).sub("", text)
    lines = [line.rstrip() for line in text.splitlines()]
    header_at = _topo_header_at(lines)
    columns = _topo_columns(lines[header_at])
    gpu_columns = {j: int(c[3:]) for j, c in enumerate(columns) if c.startswith("GPU")}
    peers: dict[int, list[int]] = {}
    for line in lines[header_at + 1:]:
        tokens = line.split()
        if not tokens:
            if peers:
                break  # the legend follows the matrix after a blank line
            continue
        if tokens[0].startswith("GPU"):
            index, row_peers = _topo_row(tokens, columns, gpu_columns)
            peers[index] = row_peers
    if not peers and gpu_columns:
        raise ParseError("nvidia-smi topo -m: header names GPUs but no GPU rows follow")
    return peers


def _topo_header_at(lines: list) -> int:
    for i, line in enumerate(lines):
        tokens = line.split()
        # The header starts with GPU0; so does GPU0's own row, whose next cell is "X" (itself).
        if tokens[:1] == ["GPU0"] and tokens[1:2] != ["X"]:
            return i
    raise ParseError("nvidia-smi topo -m: no header row naming GPU0")


def _topo_columns(header: str) -> list:
    """The header's device columns (GPUs, NICs), up to the first that is none (CPU Affinity...)."""
    columns = []
    for token in header.split():
        if not _re(_DEVICE_COLUMN).match(token):
            break
        columns.append(token)
    return columns


def _topo_row(tokens: list, columns: list, gpu_columns: dict) -> tuple:
    """(GPU index, the GPUs it reaches over NVLink) of one `GPUn ...` row."""
    label = tokens[0]
    if not label[3:].isdigit():
        raise ParseError("nvidia-smi topo -m: unexpected row label %r" % label)
    cells = tokens[1:1 + len(columns)]
    if len(cells) < len(columns):
        raise ParseError("nvidia-smi topo -m: row %s has %d cells, expected %d" % (label, len(cells), len(columns)))
    return int(label[3:]), sorted(gpu_columns[j] for j, cell in enumerate(cells) if j in gpu_columns and cell.startswith("NV"))


# --------------------------------------------------------------------------
# /proc and sysfs
# --------------------------------------------------------------------------


def parse_meminfo(text: str) -> int:
    """/proc/meminfo -> MemTotal in MiB."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                kib = int(parts[1])
                unit = parts[2].lower() if len(parts) > 2 else "kb"
                if unit != "kb":
                    raise ParseError("/proc/meminfo: MemTotal in unexpected unit %r" % parts[2])
                return kib // 1024
            raise ParseError("/proc/meminfo: unreadable MemTotal line %r" % line)
    raise ParseError("/proc/meminfo: no MemTotal line")


_TCP_LISTEN = "0A"


def parse_proc_net_tcp(text: str) -> list[int]:
    """/proc/net/tcp or tcp6 -> sorted local ports in LISTEN state."""
    ports = set()
    lines = text.splitlines()
    if not lines:
        return []
    if "local_address" not in lines[0]:
        raise ParseError("/proc/net/tcp: no header line")
    for line in lines[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        local, state = fields[1], fields[3]
        if state != _TCP_LISTEN:
            continue
        _, _, port_hex = local.rpartition(":")
        try:
            ports.add(int(port_hex, 16))
        except ValueError:
            raise ParseError("/proc/net/tcp: unreadable local address %r" % local)
    return sorted(ports)


# sock_diag netlink (what `ss -ltn` uses): asks the kernel for listening TCP sockets only.
# Reading /proc/net/tcp instead walks the whole connection hash table, sized for the host:
# about 10 ms per file even in an empty network namespace.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_TCP_LISTEN_STATE = 10
_NLMSG_HDR = struct.Struct("=LHHLL")


def inet_diag_listen_request(family: int, seq: int = 1) -> bytes:
    """A SOCK_DIAG_BY_FAMILY dump request for TCP sockets in LISTEN state of one address family."""
    req = struct.pack("=BBBBI", family, 6, 0, 0, 1 << _TCP_LISTEN_STATE) + b"\0" * 48  # + an empty inet_diag_sockid
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, seq, 0) + req


def parse_inet_diag(data: bytes) -> tuple[list[int], bool]:
    """One recv() of a sock_diag dump -> (local ports, whether the dump is complete)."""
    ports, offset, done = [], 0, False
    while offset + _NLMSG_HDR.size <= len(data):
        length, kind, _, _, _ = _NLMSG_HDR.unpack_from(data, offset)
        if length < _NLMSG_HDR.size or offset + length > len(data):
            raise ParseError("sock_diag: truncated message")
        body = offset + _NLMSG_HDR.size
        if kind == NLMSG_DONE:
            done = True
        elif kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, body)
            raise ParseError("sock_diag: kernel answered error %d" % err)
        elif kind == SOCK_DIAG_BY_FAMILY:
            # inet_diag_msg: family, state, timer, retrans (1 byte each), then the sockid whose
            # first field is the source port, in network byte order.
            (port,) = struct.unpack_from("!H", data, body + 4)
            ports.append(port)
        offset += (length + 3) & ~3
    return ports, done


def parse_proc_stat(text: str) -> dict:
    """/proc/<pid>/stat -> pid, state (field 3: Z is a zombie), pgrp, session, start_time (field 22, clock ticks since boot).

    The command name (field 2) may hold spaces and parentheses, so fields are
    counted from the last ')'.
    """
    close = text.rfind(")")
    if close < 0:
        raise ParseError("/proc/<pid>/stat: no command field")
    rest = text[close + 1:].split()
    if len(rest) < 20:
        raise ParseError("/proc/<pid>/stat: %d fields after the command, expected at least 20" % len(rest))
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return {
        "pid": int(text[: text.find("(")].strip()),
        "state": rest[0],
        "pgrp": int(rest[2]),
        "session": int(rest[3]),
        "start_time": int(rest[19]),
    }


def parse_ib_port(files: dict) -> dict:
    """One /sys/class/infiniband/<hca>/ports/<n>/ directory, as {file name: content}, to
    {state, link_layer, subnet_prefix}. Needs `state` (`4: ACTIVE`); `link_layer` and
    `gids/0` are optional (older kernels, RoCE ports without a GID yet)."""
    state_text = (files.get("state") or "").strip()
    if not state_text:
        raise ParseError("no state file")
    state = state_text.split(":", 1)[-1].strip().upper()
    link_layer = (files.get("link_layer") or "InfiniBand").strip() or "InfiniBand"
    gid = (files.get("gids/0") or "").strip().lower()
    prefix = None
    if gid:
        groups = gid.split(":")
        if len(groups) != 8 or not all(0 < len(g) <= 4 and all(c in "0123456789abcdef" for c in g) for g in groups):
            raise ParseError("unreadable GID %r" % gid)
        prefix = ":".join(g.zfill(4) for g in groups[:4])
    return {"state": state, "link_layer": link_layer, "subnet_prefix": prefix}


def fabric_name_for_prefix(prefix: str) -> str:
    """A name for a fabric found only by its non-default GID subnet prefix: `ib-fec0-0-0-1`."""
    return "ib-" + "-".join(format(int(g, 16), "x") for g in prefix.split(":"))
