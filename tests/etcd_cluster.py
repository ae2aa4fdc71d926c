"""A real etcd cluster of three members on loopback (Debian's etcd-server), for the leader tests.

Each member has its own data directory under the test's tmp and two free ports; members are
started and killed by their process id. `stop(i)` / `start(i)` restart one member in place.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def have_etcd() -> bool:
    return os.path.exists(ETCD)


class EtcdCluster:
    def __init__(self, base: Path, size: int = 3):
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * size)
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        self.names = [f"m{i}" for i in range(size)]
        self.procs: dict[int, subprocess.Popen] = {}
        self.initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def start(self, i: int | None = None) -> None:
        for k in ([i] if i is not None else [k for k in range(len(self.names)) if k not in self.procs]):
            data = self.base / self.names[k]
            state = "existing" if data.exists() else "new"
            log = open(self.base / f"{self.names[k]}.log", "ab")
            self.procs[k] = subprocess.Popen(
                [ETCD, "--name", self.names[k], "--data-dir", str(data),
                 "--listen-client-urls", f"http://127.0.0.1:{self.client_ports[k]}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.client_ports[k]}",
                 "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[k]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[k]}",
                 "--initial-cluster", self.initial, "--initial-cluster-state", state,
                 "--initial-cluster-token", f"t{self.client_ports[0]}",
                 "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap",
                 "--log-outputs", "stderr"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            log.close()
        self.wait_healthy()

    def stop(self, i: int) -> None:
        proc = self.procs.pop(i, None)
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(self._healthy(p) for k, p in enumerate(self.client_ports) if k in self.procs):
                return
            time.sleep(0.1)
        raise RuntimeError("etcd cluster did not become healthy: " + self.log_tail())

    def _healthy(self, port: int) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            ok = json.loads(conn.getresponse().read()).get("health") == "true"
            conn.close()
            return ok
        except (OSError, ValueError, http.client.HTTPException):
            return False

    def log_tail(self) -> str:
        out = []
        for n in self.names:
            p = self.base / f"{n}.log"
            if p.exists():
                out.append(n + ": " + p.read_text(errors="replace")[-800:])
        return "\n".join(out)

    def close(self) -> None:
        for i in list(self.procs):
            self.stop(i)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A real 3-member etcd cluster for the test module that imports this fixture, closed after it."""
    c = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    c.start()
    yield c
    c.close()
