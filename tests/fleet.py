"""A real fleet on one machine: network namespaces running real OpenSSH servers.

Each node is a Linux network namespace with its own address on a bridge, a
real `sshd` listening on that address with its own host key, root login by a
per-run test key, and, through bind mounts private to that node (its own mount
namespace), its own:

  - fake `nvidia-smi` (same flags and output format as the real one for the
    queries the probe uses, `topo -m` included), driven by the node's hardware
    description, which tests can change while the node runs;
  - engine executables directory, on the login PATH;
  - python directory on the login PYTHONPATH (where a fake `sglang` lives);
  - /sys/class/infiniband tree;
  - model directory (the same path on every node, different contents);
  - home directory (HOME in the login environment), hence its own
    ~/.local/state/llm-reconciler.

Use (pytest)::

    from tests.fleet import fleet  # noqa: F401  (a module-scoped fixture)

    def test_something(fleet, tmp_path):
        fleet.add_node("gpu-a", gpus=["H100"] * 8, engines=["vllm"], models=["llama"])
        fleet.add_node("cpu-b", engines=["llama.cpp"], fabrics={"ib-pod1": ["mlx5_0"]})
        fleet.fleet_yaml(tmp_path)            # tmp_path/fleet.yaml (+ the key/known_hosts it names)
        spec = fleet.fleet_spec()             # or a reconciler.model.Fleet directly
        fleet.cut("cpu-b"); fleet.restore("cpu-b")    # link down / up
        fleet.kill_sshd("cpu-b"); fleet.start_sshd("cpu-b")
        fleet.rekey("gpu-a")                  # new host key; known_hosts keeps the old one
        fleet.set_hardware("gpu-a", gpus=["A100-80"] * 2, processes=[{"gpu": 0, "pid": 42, "used_mb": 10}])
        fleet.exec("gpu-a", ["cat", "/proc/meminfo"])      # inside the node, as root, no SSH
        proc = fleet.spawn("gpu-a", ["sleep", "60"])       # background, killed at teardown
        subprocess.run(fleet.ssh_argv("gpu-a") + ["vllm --version"])  # OpenSSH client login

`shared_fleet` is the same, session-scoped. Outside pytest: `with TestFleet() as f: ...`.
Teardown kills every process in the nodes' namespaces (by pid, all started through
this fleet) and deletes namespaces, links, bridge and files; a run that dies without
teardown is reaped by the next one (registry in /run/llmfleet).

What runs on a node sees the machine's own /usr, so `python3` on a node is
/usr/bin/python3 (the system Python, without the packages of the interpreter
running pytest). Logins get PATH=<engines>:<bin>:/usr/local/sbin:... (no python3 at
all with python=False), PYTHONPATH=<python dir>, HOME=<node home>,
LLMFLEET_NODE=<node id>, plus `login_env=`. `fleet.exec` and `fleet.spawn` run
as root with the caller's environment, not the login one.

Names carry a per-run random prefix (namespaces `lf-<prefix>-<node>`, links
`lf<prefix>...`) and each run takes its own /24 in 10.213.0.0/16, so two test
runs (or two engineers) on one machine never collide. Needs root, iproute2,
util-linux (unshare, nsenter) and openssh-server.

Engines: `engines=["vllm", "llama.cpp", "sglang"]` installs, per node, the fakes
from tests/fakes/bin (executables) and tests/fakes/python (the sglang package)
when that directory exists, else small placeholder scripts. `executables=` and
`python_modules=` put arbitrary scripts / module sources on a node.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
FAKES = HERE / "fakes"
SSHD = "/usr/sbin/sshd"
SUBNET_BASE = "10.213"
LOCK_FILE = "/run/llmfleet.lock"
REGISTRY = Path("/run/llmfleet")  # <prefix>.json per live fleet: owner pid, bridge, namespaces

# Names and memory sizes real drivers report (nvidia-smi --query-gpu=name,memory.total).
GPU_PRESETS = {
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "H100-PCIE": ("NVIDIA H100 PCIe", 81559),
    "H200": ("NVIDIA H200", 143771),
    "GH200": ("NVIDIA GH200 480GB", 97871),
    "A100-40": ("NVIDIA A100-SXM4-40GB", 40960),
    "A100-80": ("NVIDIA A100-SXM4-80GB", 81920),
    "A100-80-PCIE": ("NVIDIA A100 80GB PCIe", 81920),
    "L40S": ("NVIDIA L40S", 46068),
    "RTX4090": ("NVIDIA GeForce RTX 4090", 24564),
    "V100": ("Tesla V100-SXM2-32GB", 32768),
    "T4": ("Tesla T4", 15360),
}

# Engine name in the catalog -> executables that make it installed.
ENGINE_EXECUTABLES = {"vllm": ("vllm",), "llama.cpp": ("llama-server", "ggml-rpc-server"), "sglang": ("sglang",)}

PLACEHOLDER_ENGINE = """#!/bin/sh
# placeholder engine installed by tests/fleet.py (tests/fakes/bin has no {name})
echo "{name} placeholder $*"
"""
PLACEHOLDER_SGLANG = '__version__ = "0.0.0-fleet-placeholder"\n'

NVIDIA_SMI = r"""#!/bin/sh
# Fake nvidia-smi for a test fleet node: prints the outputs rendered from this node's
# hardware description (see tests/fleet.py), for exactly the queries the probe uses.
# Shell builtins only: fifty nodes probed at once on a small machine should not pay a fork per line.
# Like the real one, it exits 15 when it names a GPU it cannot answer for, after printing the rest.
D="${0%/*}/.nvidia-smi"
rc=0
out() {
  while IFS= read -r l || [ -n "$l" ]; do
    case "$l" in "Unable to determine"*) rc=15 ;; esac
    printf '%s\n' "$l"
  done < "$D/$1"
}
mode=ok
[ -f "$D/mode" ] && read -r mode < "$D/mode"
case "$mode" in
  fail)
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    exit 9 ;;
  garbage)
    echo "Segmentation fault (core dumped) <<garbage>> 0x0 ; ; ;"
    exit 0 ;;
esac
case "$*" in
  "--query-gpu=index,uuid,name,memory.total,memory.used,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending --format=csv,noheader,nounits") out gpus.csv ;;
  "--query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits") out gpus5.csv ;;
  "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure --format=csv,noheader") out remap.csv ;;
  "--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits") out apps.csv ;;
  "topo -m") out topo.txt ;;
  "-L") out list.txt ;;
  *) echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."; exit 2 ;;
esac
exit $rc
"""

# Fake dmesg: the node's kernel log as tests/fleet.py rendered it, or the ways reading it fails.
DMESG = r"""#!/bin/sh
D="${0%/*}/.dmesg"
mode=ok
[ -f "$D/mode" ] && read -r mode < "$D/mode"
case "$mode" in
  unreadable) echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1 ;;
  hang) exec sleep 600 ;;
  huge) exec cat "$D/log.txt" ;;
esac
while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done < "$D/log.txt"
"""

# The ways a fleet GPU can be broken (SPEC section 9), as `faults={index: kind}` of add_node/set_hardware:
#   ecc              2 uncorrected ECC errors          retired_pending  a page waiting to be retired
#   remap_pending    a row waiting to be remapped      remap_failed     a remap that failed
#   xid79            `NVRM: Xid ... 79 ... fallen off the bus` in the kernel log
#   xid13            an application's Xid: information only, the GPU stays healthy
#   handle           `Unable to determine the device handle for GPU ...: Unknown Error`
#   reset            `[GPU requires reset]` in its fields     err   `ERR!` in its ECC field
#   lost             no longer listed by the driver, still in /proc/driver/nvidia/gpus
#   leak             71200 MiB in use with no process listed (a dead engine's context)
GPU_FAULTS = ("ecc", "retired_pending", "remap_pending", "remap_failed", "xid79", "xid13", "handle", "reset", "err",
              "lost", "leak")
DMESG_MODES = ("ok", "unreadable", "hang", "huge", "absent")
KERNEL_LOG_HEAD = (
    "[    0.000000] Linux version 5.15.0-91-generic (buildd@lcy02-amd64-045) #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023",
    "[   12.901223] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023",
)


def bus_id(index: int) -> str:
    """The PCI bus id the fake gives GPU `index`, as nvidia-smi prints it."""
    return f"00000000:{0x18 + 0x11 * index:02X}:00.0"


# --------------------------------------------------------------------------
# Hardware descriptions and what nvidia-smi prints for them
# --------------------------------------------------------------------------


def gpu_entry(spec: str | Mapping, index: int, node_id: str) -> dict:
    """A GPU dict from a preset name (`"H100"`), a driver name, or a dict with name/memory_total_mb."""
    if isinstance(spec, Mapping):
        d = dict(spec)
    elif spec in GPU_PRESETS:
        name, mem = GPU_PRESETS[spec]
        d = {"name": name, "memory_total_mb": mem}
    else:
        raise ValueError(f"unknown GPU preset {spec!r}; use one of {sorted(GPU_PRESETS)} or a dict")
    d.setdefault("memory_used_mb", 0)
    seed = hashlib.sha1(f"{node_id}-{index}".encode()).hexdigest()
    d.setdefault("uuid", f"GPU-{seed[:8]}-{seed[8:12]}-{seed[12:16]}-{seed[16:20]}-{seed[20:32]}")
    return d


def render_gpus_csv(gpus: Sequence[Mapping], processes: Sequence[Mapping], faults: Mapping[int, str] | None = None,
                    *, health: bool = True) -> str:
    faults = faults or {}
    lines = []
    for i, g in enumerate(gpus):
        fault = faults.get(i)
        if fault == "lost":
            continue
        bus = bus_id(i)
        if fault == "handle" and health:
            lines.append(f"Unable to determine the device handle for GPU {bus[4:]}: Unknown Error")
            continue
        used = g.get("memory_used_mb", 0) + sum(p.get("used_mb", 0) for p in processes if p["gpu"] == i)
        if fault == "leak":
            used = 71200
        total = g["memory_total_mb"]
        ecc, pending = {"ecc": ("2", "No"), "err": ("ERR!", "No"), "retired_pending": ("0", "Yes")}.get(fault, ("0", "No"))
        if fault == "reset":
            total = used = ecc = pending = "[GPU requires reset]"
        line = f"{i}, {g['uuid']}, {g['name']}, {total}, {used}"
        lines.append(line + (f", {bus}, {ecc}, {pending}" if health else ""))
    return "\n".join(lines) + ("\n" if lines else "")


def render_remap_csv(gpus: Sequence[Mapping], faults: Mapping[int, str] | None = None) -> str:
    faults = faults or {}
    lines = []
    for i, _ in enumerate(gpus):
        fault = faults.get(i)
        if fault == "lost":
            continue
        if fault == "handle":
            lines.append(f"Unable to determine the device handle for GPU {bus_id(i)[4:]}: Unknown Error")
            continue
        pending, failure = {"remap_pending": ("1", "0"), "remap_failed": ("0", "1")}.get(fault, ("0", "0"))
        lines.append(f"{bus_id(i)}, {pending}, {failure}")
    return "\n".join(lines) + ("\n" if lines else "")


def render_kernel_log(gpus: Sequence[Mapping], faults: Mapping[int, str] | None = None, extra: Sequence[str] = ()) -> str:
    """dmesg's default output: the Xid lines of the faults that leave them, then `extra` lines."""
    lines = list(KERNEL_LOG_HEAD)
    for i, fault in sorted((faults or {}).items()):
        pci = "PCI:0000:" + bus_id(i)[9:14].lower()
        if fault == "xid79":
            lines.append(f"[ 8211.548779] NVRM: Xid ({pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
        elif fault == "xid13":
            lines.append(f"[ 8100.004512] NVRM: Xid ({pci}): 13, pid=48213, name=python3, Graphics SM Warp Exception on "
                         "(GPC 1, TPC 3, SM 0): Out Of Range Address")
    return "\n".join(lines + list(extra)) + "\n"


def render_apps_csv(gpus: Sequence[Mapping], processes: Sequence[Mapping]) -> str:
    lines = [f"{gpus[p['gpu']]['uuid']}, {p['pid']}, {p.get('name', 'python3')}, {p.get('used_mb', 0)}" for p in processes]
    return "\n".join(lines) + ("\n" if lines else "")


def render_topo(gpus: Sequence[Mapping], groups: Sequence[Sequence[int]], nics: Sequence[str] = ()) -> str:
    """`nvidia-smi topo -m` as driver 535+ prints it: tab-separated matrix, then the legend."""
    n = len(gpus)
    domain = {}
    for gi, group in enumerate(groups):
        for i in group:
            domain[i] = gi
    cols = [f"GPU{i}" for i in range(n)] + [f"NIC{j}" for j in range(len(nics))]
    out = ["\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for i in range(n):
        cells = []
        for j in range(n):
            if i == j:
                cells.append(" X ")
            elif i in domain and domain.get(j) == domain[i]:
                cells.append("NV18")
            else:
                cells.append("SYS" if (i < n // 2) != (j < n // 2) else "NODE")
        cells += ["PXB"] * len(nics)
        out.append(f"GPU{i}\t" + "\t".join(cells) + f"\t0-{max(1, n) * 8 - 1}\t0\t\tN/A")
    for j in range(len(nics)):
        cells = ["PXB"] * n + [" X " if k == j else "PIX" for k in range(len(nics))]
        out.append(f"NIC{j}\t" + "\t".join(cells))
    out += [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
    ]
    if nics:
        out += ["", "NIC Legend:", ""] + [f"  NIC{j}: {name}" for j, name in enumerate(nics)]
    return "\n".join(out) + "\n"


def fabric_prefix(fabric: str) -> str:
    """A deterministic non-default GID subnet prefix for a fabric name."""
    h = int.from_bytes(fabric.encode()[:8].ljust(8, b"\0"), "big") % 0xFFFF or 1
    return f"fec0:0000:0000:{h:04x}"


# --------------------------------------------------------------------------
# The fleet
# --------------------------------------------------------------------------


@dataclass
class NodeHandle:
    id: str
    address: str
    netns: str
    dir: Path
    veth_host: str
    hardware: dict
    labels: dict = field(default_factory=dict)
    fabrics: dict = field(default_factory=dict)  # declared in fleet.yaml
    state: str = "ready"
    python: bool = True
    login_env: dict = field(default_factory=dict)
    holder: subprocess.Popen | None = None
    sshd: subprocess.Popen | None = None
    host_key_line: str = ""

    @property
    def sshd_pid(self) -> int | None:
        return self.sshd.pid if self.sshd and self.sshd.poll() is None else None


class TestFleet:
    """A fleet of namespaced nodes. See the module docstring."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, root: str | os.PathLike | None = None, *, connect_timeout_s: float = 2.0):
        if os.geteuid() != 0:
            raise RuntimeError("the test fleet needs root (network namespaces, bind mounts, sshd)")
        self.prefix = secrets.token_hex(3)
        self.root = Path(root) if root else Path("/tmp") / f"llmfleet-{self.prefix}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.mnt = self.root / "mnt"  # the per-node private mount points, same paths on every node
        for sub in ("bin", "engines", "python", "models"):
            (self.mnt / sub).mkdir(parents=True, exist_ok=True)
        self.models_dir = str(self.mnt / "models")
        self.connect_timeout_s = connect_timeout_s
        self.bridge = f"lf{self.prefix}br"
        self.key = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.nodes: dict[str, NodeHandle] = {}
        self._next_host = 10
        self._closed = False
        self._spawned: list[subprocess.Popen] = []
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"llmfleet-{self.prefix}", "-f", str(self.key)])
        self.public_key = (self.root / "id_ed25519.pub").read_text().strip()
        self.octet = self._make_bridge()
        self.gateway = f"{SUBNET_BASE}.{self.octet}.1"

    # -- network ----------------------------------------------------------

    def _register(self) -> None:
        REGISTRY.mkdir(exist_ok=True)
        doc = {"pid": os.getpid(), "pidns": _pid_namespace(), "bridge": self.bridge, "root": str(self.root),
               "netns": [n.netns for n in self.nodes.values()], "veths": [n.veth_host for n in self.nodes.values()]}
        tmp = REGISTRY / f".{self.prefix}.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, REGISTRY / f"{self.prefix}.json")

    @staticmethod
    def _reap_stale() -> None:
        """Remove fleets left behind by test runs that died without teardown (their owner pid is gone):
        otherwise each killed run keeps a /24, a bridge and its sshds forever."""
        if not REGISTRY.is_dir():
            return
        for entry in REGISTRY.glob("*.json"):
            try:
                doc = json.loads(entry.read_text())
                if doc.get("pidns") != _pid_namespace():
                    continue  # its owner's pid means nothing here: cannot tell whether it lives
                os.kill(doc["pid"], 0)
                continue  # its owner is alive: not ours to touch
            except ProcessLookupError:
                pass
            except (OSError, ValueError, KeyError):
                continue
            for ns in doc.get("netns", []):
                for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _run(["ip", "netns", "del", ns], check=False)
            for link in doc.get("veths", []) + [doc.get("bridge", "")]:
                if link:
                    _run(["ip", "link", "del", link], check=False)
            shutil.rmtree(doc.get("root", "/nonexistent"), ignore_errors=True)
            entry.unlink(missing_ok=True)

    def _make_bridge(self) -> int:
        # Allocation of a /24 is serialised across runs by a lock file: two runs must never share one.
        with open(LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._reap_stale()
            used = _run(["ip", "-4", "-o", "addr", "show"]).stdout
            octet = next(o for o in range(7, 255) if f" {SUBNET_BASE}.{o}." not in used)
            _run(["ip", "link", "add", "name", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{SUBNET_BASE}.{octet}.1/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            self._register()
        return octet

    # -- nodes ------------------------------------------------------------

    def add_node(
        self,
        node_id: str,
        *,
        gpus: Sequence[str | Mapping] = (),
        nvlink: str | Sequence[Sequence[int]] = "all",
        processes: Sequence[Mapping] = (),
        engines: Iterable[str] = (),
        executables: Mapping[str, str] | None = None,
        binaries: Mapping[str, str | os.PathLike] | None = None,
        python_modules: Mapping[str, str] | None = None,
        fabrics: Mapping[str, Sequence[str]] | None = None,
        hcas: Sequence[Mapping] | None = None,
        declare_fabrics: bool = True,
        models: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        state: str = "ready",
        python: bool = True,
        nvidia_smi: str | None = None,
        login_env: Mapping[str, str] | None = None,
        faults: Mapping[int, str] | None = None,
        dmesg: str = "ok",
        kernel_log: Sequence[str] = (),
    ) -> NodeHandle:
        """Create and start a node.

        gpus: preset names (GPU_PRESETS) or dicts {name, memory_total_mb[, memory_used_mb, uuid]}.
        nvlink: "all" (one NVLink domain), "none", or groups of GPU indices, e.g. [[0,1,2,3],[4,5,6,7]].
        processes: foreign GPU processes [{gpu, pid, name, used_mb}] that nvidia-smi reports.
        engines: catalog engine names to install: vllm, llama.cpp, sglang.
        executables: {file name: script text} put in the engines dir (on PATH), mode 755.
        binaries: {file name: path of a real program on this machine} linked into the engines dir
                  (real llama.cpp, say); replaces a fake of that name.
        python_modules: {package name: __init__.py text} put on the login PYTHONPATH.
        fabrics: {fabric: [hca, ...]}: creates the HCAs (ACTIVE, InfiniBand, a GID subnet prefix per
                 fabric) and, unless declare_fabrics=False, declares them in fleet.yaml.
        hcas: raw HCA ports [{name, state, link_layer, subnet_prefix}] added to the sysfs tree.
        models: directories created under the node's model dir (`llama`, or hub ids `org/name`).
        python: False leaves python3 off the login PATH.
        nvidia_smi: None (present when the node has GPUs), "absent", "fail" or "garbage".
        login_env: extra environment of every SSH login on the node (e.g. FAKE_ENGINE_RECORD_DIR).
        faults: {GPU index: how it is broken} (GPU_FAULTS); dmesg: how its kernel log reads (DMESG_MODES);
        kernel_log: more lines for the kernel log (an Xid for a bus id no GPU has, say).
        """
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} already exists")
        n = len(self.nodes)
        host = self._next_host
        self._next_host += 1
        if host > 254:
            raise ValueError("a test fleet holds at most 245 nodes")
        d = self.root / "nodes" / node_id
        for sub in ("bin", "engines", "python", "models", "home", "sysclass/infiniband", "procdriver"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        node = NodeHandle(
            id=node_id,
            address=f"{SUBNET_BASE}.{self.octet}.{host}",
            netns=f"lf-{self.prefix}-{node_id}",
            dir=d,
            veth_host=f"lf{self.prefix}h{n}",
            hardware={},
            labels=dict(labels or {}),
            fabrics={k: list(v) for k, v in (fabrics or {}).items()} if declare_fabrics else {},
            state=state,
            python=python,
            login_env=dict(login_env or {}),
        )
        self.nodes[node_id] = node
        self._install_engines(node, engines, executables or {}, python_modules or {}, binaries or {})
        for m in models:
            (d / "models" / m).mkdir(parents=True, exist_ok=True)
            (d / "models" / m / "config.json").write_text("{}\n")
        ports = list(hcas or [])
        for fabric, names in (fabrics or {}).items():
            for name in names:
                ports.append({"name": name, "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": fabric_prefix(fabric)})
        for port in ports:
            self._write_hca(node, port)
        self.set_hardware(node_id, gpus=gpus, nvlink=nvlink, processes=processes, nvidia_smi=nvidia_smi,
                          faults=faults or {}, dmesg=dmesg, kernel_log=kernel_log)
        self._write_sshd_config(node)
        self._make_host_key(node)
        self._register()  # before the namespace exists, so a crash right after still gets it reaped
        self._make_namespace(node)
        self.start_sshd(node_id)
        return node

    def node(self, node_id: str) -> NodeHandle:
        return self.nodes[node_id]

    def _install_engines(self, node: NodeHandle, engines, executables, python_modules, binaries=None) -> None:
        bin_dir, py_dir = node.dir / "engines", node.dir / "python"
        for engine in engines:
            if engine == "sglang":
                # The module (the probe's `import sglang`) and its `sglang` command (what is launched).
                target = py_dir / "sglang"
                fake = FAKES / "python" / "sglang"
                if fake.is_dir():
                    shutil.copytree(fake, target, dirs_exist_ok=True)
                else:
                    target.mkdir(exist_ok=True)
                    (target / "__init__.py").write_text(PLACEHOLDER_SGLANG)
            if engine not in ENGINE_EXECUTABLES:
                raise ValueError(f"unknown engine {engine!r}")
            for exe in ENGINE_EXECUTABLES[engine]:
                fake = FAKES / "bin" / exe
                dest = bin_dir / exe
                if fake.is_file():
                    dest.symlink_to(fake)
                else:
                    dest.write_text(PLACEHOLDER_ENGINE.format(name=exe))
                    dest.chmod(0o755)
        for name, target in (binaries or {}).items():
            dest = bin_dir / name
            if dest.is_symlink() or dest.exists():
                dest.unlink()
            dest.symlink_to(Path(target).resolve())
        for name, text in executables.items():
            dest = bin_dir / name
            if dest.is_symlink() or dest.exists():
                dest.unlink()
            dest.write_text(text)
            dest.chmod(0o755)
        for name, text in python_modules.items():
            (py_dir / name).mkdir(exist_ok=True)
            (py_dir / name / "__init__.py").write_text(text)

    def _write_hca(self, node: NodeHandle, port: Mapping) -> None:
        base = node.dir / "sysclass" / "infiniband" / port["name"] / "ports" / str(port.get("port", 1))
        (base / "gids").mkdir(parents=True, exist_ok=True)
        state = port.get("state", "ACTIVE").upper()
        code = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}.get(state, 1)
        (base / "state").write_text(f"{code}: {state}\n")
        (base / "link_layer").write_text(port.get("link_layer", "InfiniBand") + "\n")
        prefix = port.get("subnet_prefix", "fe80:0000:0000:0000")
        (base / "gids" / "0").write_text(f"{prefix}:0002:c903:00{len(node.id):02x}:{abs(hash(node.id)) % 0xFFFF:04x}\n")

    def set_hardware(
        self,
        node_id: str,
        *,
        gpus: Sequence[str | Mapping] | None = None,
        nvlink: str | Sequence[Sequence[int]] | None = None,
        processes: Sequence[Mapping] | None = None,
        nvidia_smi: str | None = None,
        faults: Mapping[int, str] | None = None,
        dmesg: str | None = None,
        kernel_log: Sequence[str] | None = None,
    ) -> dict:
        """Change what the node's nvidia-smi (and dmesg, and /proc/driver/nvidia/gpus) report;
        unspecified parts stay. Returns the hardware dict."""
        node = self.nodes[node_id]
        hw = node.hardware
        if gpus is not None:
            hw["gpus"] = [gpu_entry(g, i, node_id) for i, g in enumerate(gpus)]
        if nvlink is not None:
            hw["nvlink"] = nvlink
        if processes is not None:
            hw["processes"] = [dict(p) for p in processes]
        if nvidia_smi is not None:
            hw["nvidia_smi"] = nvidia_smi
        if faults is not None:
            unknown = sorted(set(faults.values()) - set(GPU_FAULTS))
            if unknown:
                raise ValueError(f"unknown GPU faults {unknown}; use {GPU_FAULTS}")
            hw["faults"] = {int(k): v for k, v in faults.items()}
        if dmesg is not None:
            if dmesg not in DMESG_MODES:
                raise ValueError(f"unknown dmesg mode {dmesg!r}; use {DMESG_MODES}")
            hw["dmesg"] = dmesg
        if kernel_log is not None:
            hw["kernel_log"] = list(kernel_log)
        hw.setdefault("faults", {})
        hw.setdefault("dmesg", "ok")
        hw.setdefault("kernel_log", [])
        hw.setdefault("gpus", [])
        hw.setdefault("nvlink", "all")
        hw.setdefault("processes", [])
        hw.setdefault("nvidia_smi", None)
        g = hw["gpus"]
        groups = {"all": [list(range(len(g)))], "none": []}.get(hw["nvlink"], hw["nvlink"]) if isinstance(hw["nvlink"], str) else hw["nvlink"]
        mode = hw["nvidia_smi"] or ("ok" if g else "absent")
        bin_dir = node.dir / "bin"
        smi_dir = bin_dir / ".nvidia-smi"
        smi_dir.mkdir(exist_ok=True)
        faults = {int(k): v for k, v in hw["faults"].items()}
        (smi_dir / "gpus.csv").write_text(render_gpus_csv(g, hw["processes"], faults))
        (smi_dir / "gpus5.csv").write_text(render_gpus_csv(g, hw["processes"], faults, health=False))
        (smi_dir / "remap.csv").write_text(render_remap_csv(g, faults))
        self._write_kernel_log(node, bin_dir, g, faults, hw["dmesg"], hw["kernel_log"])
        self._write_proc_gpus(node, g if mode != "absent" else [])
        (smi_dir / "apps.csv").write_text(render_apps_csv(g, hw["processes"]))
        nics = sorted(p.name for p in (node.dir / "sysclass" / "infiniband").iterdir())
        (smi_dir / "topo.txt").write_text(render_topo(g, groups, nics))
        (smi_dir / "list.txt").write_text("".join(f"GPU {i}: {x['name']} (UUID: {x['uuid']})\n" for i, x in enumerate(g)))
        (smi_dir / "mode").write_text(mode + "\n")
        (node.dir / "hardware.json").write_text(json.dumps(hw, indent=1) + "\n")
        smi = bin_dir / "nvidia-smi"
        if mode == "absent":
            smi.unlink(missing_ok=True)
        elif not smi.exists():
            smi.write_text(NVIDIA_SMI)
            smi.chmod(0o755)
        return hw

    def _write_kernel_log(self, node: NodeHandle, bin_dir: Path, gpus, faults, mode: str, extra) -> None:
        d = bin_dir / ".dmesg"
        d.mkdir(exist_ok=True)
        log = render_kernel_log(gpus, faults, extra)
        if mode == "huge":  # megabytes of noise before the lines that matter
            log = "[  100.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n" * 80_000 + log
        (d / "log.txt").write_text(log)
        (d / "mode").write_text(mode + "\n")
        dmesg = bin_dir / "dmesg"
        if mode == "absent" or not gpus:
            dmesg.unlink(missing_ok=True)
        elif not dmesg.exists():
            dmesg.write_text(DMESG)
            dmesg.chmod(0o755)

    def _write_proc_gpus(self, node: NodeHandle, gpus) -> None:
        """/proc/driver/nvidia/gpus/<bus id>/ of every GPU the kernel module bound, lost ones included."""
        root = node.dir / "procdriver" / "nvidia" / "gpus"
        if root.exists():
            shutil.rmtree(root)
        if gpus:
            root.mkdir(parents=True)
            for i, _ in enumerate(gpus):
                (root / bus_id(i)[4:].lower()).mkdir()

    def _write_sshd_config(self, node: NodeHandle) -> None:
        m = self.mnt
        path = f"{m}/engines:{m}/bin"
        if node.python:
            path += ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        (node.dir / "authorized_keys").write_text(self.public_key + "\n")
        env = {"PATH": path, "PYTHONPATH": f"{m}/python", "HOME": f"{node.dir}/home", "LLMFLEET_NODE": node.id, **node.login_env}
        setenv = " ".join(f'"{k}={v}"' if " " in str(v) else f"{k}={v}" for k, v in env.items())
        (node.dir / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {node.address}",
                    "Port 22",
                    f"HostKey {node.dir}/ssh_host_ed25519_key",
                    f"AuthorizedKeysFile {node.dir}/authorized_keys",
                    "PidFile none",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "UseDNS no",  # no reverse lookups on the handshake path
                    "GSSAPIAuthentication no",
                    "StrictModes no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "MaxStartups 200:30:400",
                    "MaxSessions 100",
                    "LogLevel ERROR",
                    "Subsystem sftp internal-sftp",
                    f"SetEnv {setenv}",
                    "",
                ]
            )
        )

    def _make_host_key(self, node: NodeHandle) -> None:
        key = node.dir / "ssh_host_ed25519_key"
        for p in (key, key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.id, "-f", str(key)])
        kind, blob = (node.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        node.host_key_line = f"{node.address} {kind} {blob}"

    def _write_known_hosts(self) -> None:
        lines = [n.host_key_line for n in self.nodes.values() if n.host_key_line]
        tmp = self.known_hosts.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.known_hosts)

    def _make_namespace(self, node: NodeHandle) -> None:
        peer = f"lf{self.prefix}p{len(self.nodes) - 1}"
        _run(["ip", "netns", "add", node.netns])
        _run(["ip", "link", "add", node.veth_host, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", node.veth_host, "master", self.bridge, "up"])
        _run(["ip", "link", "set", peer, "netns", node.netns])
        ns = ["ip", "-n", node.netns]
        _run(ns + ["link", "set", peer, "name", "eth0"])
        _run(ns + ["addr", "add", f"{node.address}/24", "dev", "eth0"])
        _run(ns + ["link", "set", "eth0", "up"])
        _run(ns + ["link", "set", "lo", "up"])
        _run(ns + ["route", "add", "default", "via", self.gateway])
        # The holder owns the node's private mount namespace, so sshd can die and restart
        # (and tests can nsenter) without losing the node's view of the file system.
        m = self.mnt
        mounts = [
            (node.dir / "bin", m / "bin"),
            (node.dir / "engines", m / "engines"),
            (node.dir / "python", m / "python"),
            (node.dir / "models", m / "models"),
            (node.dir / "sysclass", Path("/sys/class")),
            (node.dir / "procdriver", Path("/proc/driver")),  # /proc/driver/nvidia/gpus of this node's GPUs
        ]
        script = " && ".join(f"mount --bind {src} {dst}" for src, dst in mounts) + " && exec sleep infinity"
        node.holder = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "unshare", "-m", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:  # mounts done once the holder has become `sleep`
            if node.holder.poll() is not None:
                raise RuntimeError(f"node {node.id}: mount setup failed: {node.holder.stderr.read().decode()}")
            try:
                if Path(f"/proc/{node.holder.pid}/comm").read_text().strip() == "sleep":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node.id}: mount setup did not finish")
            time.sleep(0.005)

    def _enter(self, node: NodeHandle) -> list[str]:
        if node.holder is None or node.holder.poll() is not None:
            raise RuntimeError(f"node {node.id} has no namespace holder")
        return ["nsenter", "-t", str(node.holder.pid), "-n", "-m", "--"]

    # -- controls ---------------------------------------------------------

    def start_sshd(self, node_id: str, *, wait: bool = True) -> None:
        node = self.nodes[node_id]
        if node.sshd_pid:
            return
        log = open(node.dir / "sshd.log", "ab")
        node.sshd = subprocess.Popen(
            self._enter(node) + [SSHD, "-D", "-e", "-f", str(node.dir / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
        log.close()
        self._write_known_hosts()
        if wait:
            self._wait_listening(node)

    def _wait_listening(self, node: NodeHandle, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if node.sshd.poll() is not None:
                raise RuntimeError(f"node {node.id}: sshd exited: {(node.dir / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection((node.address, 22), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node.id}: sshd not answering on {node.address}:22")
            time.sleep(0.01)

    def kill_sshd(self, node_id: str) -> None:
        """Kill the node's sshd and every session it holds: new connections are refused."""
        node = self.nodes[node_id]
        if node.sshd is None:
            return
        # Each connection's sshd calls setsid(), so the listener's process group does not hold
        # them: kill every sshd in the node's namespace (engines started through it survive).
        for pid in _run(["ip", "netns", "pids", node.netns], check=False).stdout.split():
            try:
                if os.readlink(f"/proc/{pid}/exe") == SSHD or Path(f"/proc/{pid}/comm").read_text().startswith("sshd"):
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        try:
            node.sshd.kill()
        except ProcessLookupError:
            pass
        node.sshd.wait()

    def rekey(self, node_id: str) -> None:
        """Give the node a new host key (a reinstalled host), restart sshd, and leave known_hosts
        holding the OLD key, so a connection sees a changed host key."""
        node = self.nodes[node_id]
        old = node.host_key_line
        self.kill_sshd(node_id)
        self._make_host_key(node)
        new = node.host_key_line
        node.host_key_line = old
        self.start_sshd(node_id)
        node.host_key_line = new  # what a re-trust would write; known_hosts keeps `old`

    def trust_current_keys(self) -> None:
        self._write_known_hosts()

    def cut(self, node_id: str) -> None:
        """Link down: the node stops answering (packets to it are dropped)."""
        _run(["ip", "link", "set", self.nodes[node_id].veth_host, "down"])

    def restore(self, node_id: str) -> None:
        _run(["ip", "link", "set", self.nodes[node_id].veth_host, "up"])

    def exec(self, node_id: str, argv: Sequence[str], *, check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        """Run argv inside the node's network and mount namespaces (as root, not via SSH)."""
        proc = subprocess.run(self._enter(self.nodes[node_id]) + list(argv), capture_output=True, text=True, timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{node_id}: {argv} exited {proc.returncode}: {proc.stderr}")
        return proc

    def spawn(self, node_id: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv in the background inside the node's namespaces; killed at teardown if still running."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(self._enter(self.nodes[node_id]) + list(argv), start_new_session=True, **kw)
        self._spawned.append(proc)
        return proc

    def ssh_argv(self, node_id: str) -> list[str]:
        """An OpenSSH client command line that logs into the node (for baselines and debugging)."""
        return [
            "ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "GSSAPIAuthentication=no", "-o", f"ConnectTimeout={int(self.connect_timeout_s) or 1}",
            "-l", "root", self.nodes[node_id].address,
        ]

    # -- catalog ----------------------------------------------------------

    def ssh_settings(self) -> dict:
        return {
            "user": "root",
            "identity_file": str(self.key),
            "known_hosts": str(self.known_hosts),
            "connect_timeout_s": self.connect_timeout_s,
        }

    def node_document(self, node: NodeHandle) -> dict:
        d: dict = {"id": node.id, "address": node.address}
        if node.labels:
            d["labels"] = dict(node.labels)
        if node.state != "ready":
            d["state"] = node.state
        d["model_dirs"] = [self.models_dir]
        if node.fabrics:
            d["fabrics"] = {k: list(v) for k, v in node.fabrics.items()}
        return d

    def fleet_document(self, nodes: Iterable[str] | None = None, extra_nodes: Sequence[Mapping] = ()) -> dict:
        ids = list(nodes) if nodes is not None else list(self.nodes)
        return {"ssh": self.ssh_settings(), "nodes": [self.node_document(self.nodes[i]) for i in ids] + [dict(x) for x in extra_nodes]}

    def fleet_yaml(self, catalog_dir: str | os.PathLike, nodes: Iterable[str] | None = None, extra_nodes: Sequence[Mapping] = ()) -> Path:
        """Write <catalog_dir>/fleet.yaml for these nodes (default: all), pointing at this run's key and known_hosts."""
        import yaml

        path = Path(catalog_dir) / "fleet.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.fleet_document(nodes, extra_nodes), sort_keys=False))
        return path

    def fleet_spec(self, nodes: Iterable[str] | None = None):
        """The same fleet as a reconciler.model.Fleet, for tests that need no catalog files."""
        from reconciler.model import Fleet, NodeSpec, SshSettings, frozen_map

        ssh = SshSettings(**self.ssh_settings())
        ids = list(nodes) if nodes is not None else list(self.nodes)
        specs = []
        for i in ids:
            n = self.nodes[i]
            specs.append(
                NodeSpec(
                    id=n.id, address=n.address, data_address=n.address, labels=frozen_map(n.labels), state=n.state,
                    model_dirs=(self.models_dir,), fabrics=frozen_map({k: tuple(v) for k, v in n.fabrics.items()}), ssh=ssh,
                )
            )
        return Fleet(nodes=tuple(specs), ssh=ssh)

    # -- teardown ---------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self._spawned:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for node in self.nodes.values():
            # Everything in the node's network namespace was started by this fleet or by a
            # test through it (sshd sessions, engines): kill those pids, then the holder.
            pids = _run(["ip", "netns", "pids", node.netns], check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            for proc in (node.sshd, node.holder):
                if proc is not None:
                    try:
                        proc.kill()
                    except ProcessLookupError:
                        pass
                    proc.wait()
            _run(["ip", "link", "del", node.veth_host], check=False)
            _run(["ip", "netns", "del", node.netns], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        (REGISTRY / f"{self.prefix}.json").unlink(missing_ok=True)

    def __enter__(self) -> "TestFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


@pytest.fixture(scope="module")
def fleet():
    """A fresh, empty TestFleet per test module; add nodes with fleet.add_node(...)."""
    f = TestFleet()
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(scope="session")
def shared_fleet():
    """One TestFleet for the whole session, for tests that only add nodes with ids of their own
    and leave them as they found them (restore what they cut, restart what they kill)."""
    f = TestFleet()
    try:
        yield f
    finally:
        f.close()
