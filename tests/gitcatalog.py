"""Test helpers: a real git catalog repository, and a daemon process to drive it.

`CatalogRepo` is a catalog in a fresh `git init` with real commits. `DaemonProcess`
runs tests/daemon_driver.py (the real daemon loop, a recording fake pass) as a
child process, so signals, the lock and the watcher are all real; it logs JSON
lines to a file that tests read. Waiting is polling for a condition with a
generous deadline: a test never asserts how long something took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "daemon_driver.py"

FLEET = """\
nodes:
  - id: node-a
    address: 10.213.9.11
"""


def model_yaml(name: str, replicas: int = 1) -> str:
    return (
        f"name: {name}\n"
        f"source: /models/{name}\n"
        f"replicas: {replicas}\n"
        "profiles:\n"
        "  - name: cpu\n"
        "    engine: command\n"
        "    command: [/bin/true]\n"
        "    port: 9000\n"
    )


def git(cwd, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


class CatalogRepo:
    def __init__(self, path: Path, init: bool = True):
        self.path = path
        if init:
            path.mkdir(parents=True, exist_ok=True)
            git(path, "init", "-q", "-b", "main")
            git(path, "config", "user.email", "person@example.com")
            git(path, "config", "user.name", "A Person")
            self.write("fleet.yaml", FLEET)
            self.write("models/alpha.yaml", model_yaml("alpha", 1))
            self.commit("initial catalog")

    def write(self, rel: str, text: str) -> None:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def commit(self, message: str, *paths: str) -> str:
        git(self.path, "add", "-A", *(["--", *paths] if paths else []))
        git(self.path, "commit", "-q", "-m", message)
        return self.head()

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD").strip()

    def status(self) -> dict:
        return yaml.safe_load((self.path / "status" / "catalog.yaml").read_text())

    def porcelain(self) -> str:
        return git(self.path, "status", "--porcelain", "--untracked-files=all")


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class DaemonProcess:
    """The daemon as a child process. Always `stop()` it (tests use it as a context manager)."""

    def __init__(
        self, catalog: Path, *flags: str, workdir: Path, env: dict | None = None, name: str = "daemon", real: bool = False
    ):
        """real=False: tests/daemon_driver.py (recording fake pass); True: `python -m reconciler run`."""
        self.record = workdir / f"{name}.passes.jsonl"
        self.logfile = workdir / f"{name}.log"
        self.record.touch()
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.update(env or {})
        self._log = self.logfile.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, *(["-m", "reconciler"] if real else [str(DRIVER), str(self.record)]),
             "run", str(catalog), "--log-format", "json", *flags],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=workdir,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self, name: str | None = None) -> list[dict]:
        out = []
        for line in self.logfile.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if name is None or doc.get("event") == name:
                out.append(doc)
        return out

    def passes(self, event: str = "end") -> list[dict]:
        return [json.loads(x) for x in self.record.read_text().splitlines() if json.loads(x)["event"] == event]

    def wait_event(self, name: str, count: int = 1, timeout: float = 30.0) -> list[dict]:
        return wait_for(lambda: (e := self.events(name)) and len(e) >= count and e, timeout,
                        f"{count} x {name!r} in the daemon log:\n{self.logfile.read_text()}")

    def wait_pass(self, revision: str | None = None, count: int = 1, timeout: float = 30.0) -> list[dict]:
        def done():
            ps = [p for p in self.passes() if revision is None or p["revision"] == revision]
            return len(ps) >= count and ps

        found = wait_for(done, timeout, f"pass of {revision}:\n{self.logfile.read_text()}")
        # status is written after the pass returns, then `pass.end` is logged: wait for that too
        wait_for(lambda: len([e for e in self.events("pass.end") if e["result"] == "applied"]) >= len(self.passes()),
                 timeout, "status written after the pass")
        return found

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def marked_pids(marker: str) -> set[int]:
    """Every live process whose environment carries this test's marker."""
    needle = f"E2E_MARKER={marker}".encode()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle in env.split(b"\0") and stat.rsplit(")", 1)[1].split()[0] != "Z":
            out.add(int(entry))
    return out


def stop_all(daemons, marker: str) -> None:
    """Stop the test's daemons, then kill every process still carrying its marker (engines they started)."""
    for d in daemons:
        d.stop()
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def deployed_from_upstream(tmp_path: Path) -> tuple["CatalogRepo", Path, "CatalogRepo"]:
    """An origin catalog, a bare upstream cloned from it, and a deployed clone of that upstream."""
    origin = CatalogRepo(tmp_path / "origin")
    bare = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", str(origin.path), str(bare))
    git(tmp_path, "clone", "-q", str(bare), str(tmp_path / "deployed"))
    return origin, bare, CatalogRepo(tmp_path / "deployed", init=False)
