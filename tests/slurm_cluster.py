"""A real Slurm cluster on the test fleet: munged, slurmctld on the host, one slurmd per node.

Everything is per run, so engineers running the suite at once never meet:
the munge key and socket, slurm.conf (found through SLURM_CONF, never
/etc/slurm), the cluster name, slurmctld's port, state and spool directories.
Daemons are started by this module and torn down by pid.

Each slurmd runs inside its node's network and mount namespaces (so it sees the
node's own PATH entries, fake nvidia-smi and fake engines through the node's bind
mounts), in a UTS namespace whose host name is the node id, and in a cgroup
namespace rooted at a per-run, per-node directory of the cgroup2 hierarchy, with
cgroup2 mounted at /sys/fs/cgroup: `ip netns exec` alone leaves slurmd 22.05 on
this machine's hybrid cgroup v1 tree, which every node (and every other run)
shares. proctrack/cgroup then kills what a job leaves behind (setsid children,
double-forked orphans) on scancel.

GPUs are GRES with device files made by mknod (major 195, as the NVIDIA driver's):
a plain file gives no CUDA_VISIBLE_DEVICES.

Use::

    cluster = SlurmCluster(fleet, ["gpu-a", "gpu-b"])   # nodes already added to the fleet
    cluster.start()
    cluster.env                  # {"SLURM_CONF": ...} for sbatch/squeue/scontrol/scancel
    cluster.run(["squeue"])      # a client command on the host, with a deadline
    cluster.drain("gpu-a"); cluster.resume("gpu-a")
    cluster.kill_slurmd("gpu-b"); cluster.start_slurmd("gpu-b")
    cluster.close()
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from reconciler.observe.slurm import OUTPUT_DIR
from tests.apply_support.local import free_port as _free_port

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")  # this machine: hybrid cgroup v1 (slurm 22.05 refuses v2 in hybrid mode)
JOB_IDS_PER_RUN = 10_000  # more jobs than any run submits
COMMAND_DEADLINE_S = 20.0  # srun/sbatch wait forever on down or drained nodes


def available() -> str | None:
    """None when a cluster can be built here, else why not."""
    for exe in (SLURMCTLD, SLURMD, MUNGED, "/usr/bin/sbatch"):
        if not os.access(exe, os.X_OK):
            return f"{exe} is not installed (scripts/test.sh installs slurmctld slurmd slurm-client munge)"
    return None




class SlurmCluster:
    __test__ = False

    def __init__(self, fleet, nodes: Sequence[str], *, partition: str = "gpu", slurmd_timeout_s: int = 6,
                 kill_wait_s: int = 2, min_job_age_s: int = 600):
        self.fleet = fleet
        self.node_ids = list(nodes)
        self.partition = partition
        self.root = fleet.root / "slurm"
        self.name = f"lf{fleet.prefix}"
        self.slurmd_timeout_s = slurmd_timeout_s
        self.kill_wait_s = kill_wait_s
        self.min_job_age_s = min_job_age_s
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.ctld_port = 0
        # Job ids name files outside the run's directory (the jobs' output in /tmp, SPEC section 8):
        # each run numbers its jobs from its own random start, so two runs never write the same file.
        self.first_job_id = secrets.randbelow(60_000_000) + 1_000
        self.munged: subprocess.Popen | None = None
        self.slurmctld: subprocess.Popen | None = None
        self.slurmds: dict[str, subprocess.Popen] = {}
        self._cgroups: list[Path] = []

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    # -- configuration

    def _gpu_count(self, node_id: str) -> int:
        return len(self.fleet.nodes[node_id].hardware.get("gpus", []))

    def _write_config(self) -> None:
        etc = self.root / "etc"
        for sub in ("etc", "munge", "ctld", "slurmd", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.ctld_port = _free_port()
        hostname = socket.gethostname().split(".")[0]
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={hostname}({self.fleet.gateway})",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmdPort=6818",  # inside each node's own network namespace: no clash between runs
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root}/ctld",
            f"SlurmdSpoolDir={self.root}/slurmd/%n",
            f"SlurmctldPidFile={self.root}/ctld/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd/%n.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log",
            f"SlurmdLogFile={self.root}/slurmd/%n.log",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "GresTypes=gpu",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            "SlurmctldTimeout=10",
            f"KillWait={self.kill_wait_s}",
            f"MinJobAge={self.min_job_age_s}",
            f"FirstJobId={self.first_job_id}",
            "InactiveLimit=0",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SrunPortRange=60001-63000",
        ]
        gres = ["AutoDetect=off"]
        for nid in self.node_ids:
            node = self.fleet.nodes[nid]
            count = self._gpu_count(nid)
            spec = f"NodeName={nid} NodeAddr={node.address} NodeHostname={nid} CPUs=16 RealMemory=64000 State=UNKNOWN"
            if count:
                spec += f" Gres=gpu:{count}"
                devdir = self.root / "dev" / nid
                devdir.mkdir(parents=True, exist_ok=True)
                for i in range(count):
                    dev = devdir / f"nvidia{i}"
                    if not dev.exists():
                        os.mknod(dev, 0o600 | 0o020000, os.makedev(195, i))  # S_IFCHR
                gres.append(f"NodeName={nid} Name=gpu File={devdir}/nvidia[0-{count - 1}]")
            lines.append(spec)
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        (etc / "slurm.conf").write_text("\n".join(lines) + "\n")
        (etc / "gres.conf").write_text("\n".join(gres) + "\n")
        (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=no\n")

    # -- daemons

    def start(self) -> "SlurmCluster":
        self._write_config()
        self._start_munged()
        self._start_slurmctld()
        for nid in self.node_ids:
            self.start_slurmd(nid, wait=False)
        self.wait_nodes(self.node_ids, "IDLE")
        return self

    def _start_munged(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        (self.root / "munge").chmod(0o700)
        self.munged = subprocess.Popen(
            [MUNGED, "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={self.root}/munge/munged.pid", f"--log-file={self.root}/munge/munged.log",
             f"--seed-file={self.root}/munge/munged.seed"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        self._wait(lambda: self.munge_socket.exists(), "munged socket", self.munged)

    def _start_slurmctld(self) -> None:
        self.slurmctld = subprocess.Popen(
            [SLURMCTLD, "-D", "-i", "-f", str(self.conf)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            env={**os.environ, **self.env},
        )
        self._wait(lambda: self.run(["scontrol", "ping"], check=False, timeout=5).stdout.count("UP") > 0,
                   "slurmctld", self.slurmctld)

    def start_slurmd(self, node_id: str, *, wait: bool = True) -> None:
        proc = self.slurmds.get(node_id)
        if proc is not None and proc.poll() is None:
            return
        node = self.fleet.nodes[node_id]
        (self.root / "slurmd" / node_id).mkdir(parents=True, exist_ok=True)  # its spool dir
        cg = FREEZER_ROOT / f"llmfleet-{self.fleet.prefix}-{node_id}"
        cg.mkdir(exist_ok=True)
        if cg not in self._cgroups:
            self._cgroups.append(cg)
        # Join the node's freezer cgroup here (`ip netns exec` gave the node a fresh /sys without
        # the cgroup mounts), enter the node (net + mount), then new UTS/cgroup/mount namespaces
        # for slurmd alone: host name = node id, and a freezer hierarchy rooted at the node's
        # directory, so proctrack/cgroup's slurm/uid_0/job_N never meets another node's or run's.
        enter = " ".join(self.fleet._enter(node))
        inner = (
            f"echo $$ > {cg}/cgroup.procs && exec {enter} unshare -u -C -m --propagation private sh -c "
            f"'hostname {node_id} && mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer && "
            f"mount -t cgroup -o freezer freezer /sys/fs/cgroup/freezer && "
            f"exec {SLURMD} -D -N {node_id} -f {self.conf}'"
        )
        log = open(self.root / "slurmd" / f"{node_id}.stderr", "ab")
        self.slurmds[node_id] = subprocess.Popen(
            ["sh", "-c", inner],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, **self.env},
        )
        log.close()
        if wait:
            self.wait_nodes([node_id], "IDLE", "MIXED", "ALLOCATED")

    def kill_slurmd(self, node_id: str) -> None:
        proc = self.slurmds.get(node_id)
        if proc is None:
            return
        _kill_group(proc)

    # -- client side

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = COMMAND_DEADLINE_S) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def node_state(self, node_id: str) -> str:
        out = self.run(["sinfo", "-h", "-N", "-n", node_id, "-o", "%T"], check=False).stdout.split()
        return out[0].upper() if out else ""

    def wait_nodes(self, node_ids: Sequence[str], *states: str, timeout: float = 30) -> None:
        wanted = tuple(s.upper() for s in states)
        deadline = time.monotonic() + timeout
        while True:
            current = {n: self.node_state(n) for n in node_ids}
            if all(s.rstrip("*~#!%$@^-").startswith(wanted) for s in current.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm nodes not {'/'.join(wanted)} after {timeout}s: {current}\n{self.logs()}")
            time.sleep(0.1)

    def drain(self, node_id: str, reason: str = "test drain") -> None:
        self.run(["scontrol", "update", f"NodeName={node_id}", "State=DRAIN", f"Reason={reason}"])

    def resume(self, node_id: str) -> None:
        self.run(["scontrol", "update", f"NodeName={node_id}", "State=RESUME"])

    def submit_foreign(self, node_id: str, gpus: int, *, name: str = "someone-elses-job") -> str:
        """A job of another user of the cluster, holding GPUs on a node: `sleep` for an hour."""
        out = self.run(["sbatch", "--parsable", f"--job-name={name}", f"--nodelist={node_id}", "--nodes=1",
                        f"--gres=gpu:{gpus}", "--output=/dev/null", "--wrap", "exec sleep 3600"]).stdout
        return out.strip().split(";")[0]

    def jobs(self) -> list[dict]:
        """Every job Slurm knows, as {id, name, state, nodes, comment}."""
        out = self.run(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%N|%k"]).stdout
        rows = []
        for line in out.splitlines():
            i, name, state, nodes, comment = line.split("|", 4)
            rows.append({"id": i, "name": name, "state": state, "nodes": nodes, "comment": comment})
        return rows

    def logs(self) -> str:
        parts = []
        for p in [self.root / "slurmctld.log", *sorted((self.root / "slurmd").glob("*.log")), *sorted((self.root / "slurmd").glob("*.stderr"))]:
            try:
                parts.append(f"--- {p.name}\n" + p.read_text()[-3000:])
            except OSError:
                pass
        return "\n".join(parts)

    # -- teardown

    def close(self) -> None:
        for proc in list(self.slurmds.values()):
            _kill_group(proc)
        for proc in (self.slurmctld, self.munged):
            if proc is not None:
                _kill_group(proc)
        # A job's processes live in the node's cgroup (slurmstepd and its children): kill them too.
        for cg in self._cgroups:
            for procs in sorted(cg.rglob("cgroup.procs"), key=lambda p: -len(p.parts)):
                try:
                    for pid in procs.read_text().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except (ProcessLookupError, ValueError):
                            pass
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [cg]:
                while True:
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)
        self._remove_job_output()

    def _remove_job_output(self) -> None:
        """The output files this run's jobs left in /tmp (every job sbatch names with --output)."""
        for path in Path(OUTPUT_DIR).glob("llmrc.*.out"):
            job = path.name[:-len(".out")].rpartition(".")[2]
            if job.isdigit() and self.first_job_id <= int(job) < self.first_job_id + JOB_IDS_PER_RUN:
                path.unlink(missing_ok=True)

    @staticmethod
    def _wait(ready, what: str, proc: subprocess.Popen, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"{what} exited {proc.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not up after {timeout}s")
            time.sleep(0.05)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
