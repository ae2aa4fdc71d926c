"""The shipped alert rules fired for real, and the event log of a real daemon run (SPEC section 15).

A real Prometheus scrapes a real daemon (`reconciler run --metrics-address`) on the namespaced test
fleet and loads the rules exactly as `reconciler alert-rules --for 0s` prints them (the shipped
`for:` durations would make the test wait minutes; the expressions are the shipped ones); a real
Alertmanager delivers to a webhook receiver on loopback, in this process. Cutting a node fires
ReconcilerNodeUnreachable naming it; a replica killed again and again fires
ReconcilerReplicaCrashLooping naming it. Every process is started here and stopped by its pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.apply_support.local import terminate_all
from tests.fleet import fleet  # noqa: F401  (module-scoped fixture)
from tests.gitcatalog import REPO, CatalogRepo, DaemonProcess, git, marked_pids, stop_all, wait_for

pytestmark = [pytest.mark.fleet, pytest.mark.external]

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager")
NODES = ("al1", "al2", "al3")


@pytest.fixture(scope="module")
def nodes(fleet):  # noqa: F811
    for n in NODES:
        fleet.add_node(n)
    return fleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_doc(name: str, replicas: int, marker: str, port: int) -> str:
    return yaml.safe_dump({
        "name": name, "source": f"{name}-weights", "replicas": replicas, "drain_s": 2,
        "profiles": [{
            "name": "cpu", "engine": "command", "port": port,
            "command": ["python3", "-m", "reconciler.tiny_server", "--host", "0.0.0.0", "--port", "${PORT}",
                        "--model", "${MODEL_SOURCE}"],
            "env": {"E2E_MARKER": marker, "E2E_MODEL": name, "PYTHONPATH": str(REPO)},
            "start_timeout_s": 30,
        }],
    }, sort_keys=False)


class Catalog:
    def __init__(self, fleet, tmp_path, request, grace_s: float):  # noqa: F811
        self.tmp = tmp_path
        self.marker = f"alerts-{os.getpid()}-{request.node.name}"
        self.repo = CatalogRepo(tmp_path / "catalog", init=False)
        self.repo.path.mkdir()
        git(self.repo.path, "init", "-q", "-b", "main")
        git(self.repo.path, "config", "user.email", "person@example.com")
        git(self.repo.path, "config", "user.name", "A Person")
        path = fleet.fleet_yaml(self.repo.path)
        doc = yaml.safe_load(path.read_text())
        doc["unreachable_grace_s"] = grace_s
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.daemons: list[DaemonProcess] = []
        self.env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}

    def model(self, name: str, replicas: int, port: int) -> None:
        self.repo.write(f"models/{name}.yaml", model_doc(name, replicas, self.marker, port))

    def daemon(self, *flags: str) -> DaemonProcess:
        d = DaemonProcess(self.repo.path, "--interval", "1", *flags, workdir=self.tmp, real=True, env=self.env)
        self.daemons.append(d)
        return d

    def status(self, name: str) -> dict:
        try:
            return yaml.safe_load((self.repo.path / "status/models" / f"{name}.yaml").read_text()) or {}
        except FileNotFoundError:
            return {}

    def wait_ready(self, name: str, count: int, timeout: float = 90.0) -> dict:
        return wait_for(lambda: (s := self.status(name)) and s.get("ready") == count == s.get("desired") and s,
                        timeout, f"{count} Ready replicas of {name}:\n"
                        + "\n".join(d.logfile.read_text()[-4000:] for d in self.daemons))

    def events(self) -> list[dict]:
        done = subprocess.run([sys.executable, "-m", "reconciler", "events", str(self.repo.path), "--format", "json"],
                              capture_output=True, text=True, env={**os.environ, **self.env, "PYTHONPATH": str(REPO)},
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
def cat(nodes, tmp_path, request):
    c = Catalog(nodes, tmp_path, request, grace_s=3)
    yield c
    stop_all(c.daemons, c.marker)
    for n in NODES:
        nodes.restore(n)


class Webhook:
    """Alertmanager's webhook receiver: every alert it is sent, kept."""

    def __init__(self):
        self.alerts: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.alerts += body.get("alerts", [])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, alertname: str) -> list[dict]:
        return [a for a in self.alerts if a["labels"].get("alertname") == alertname and a["status"] == "firing"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def monitoring(tmp_path):
    """A real Alertmanager and a real Prometheus on loopback; the caller names the daemon's metrics port."""
    if PROMETHEUS is None or ALERTMANAGER is None:
        pytest.skip("prometheus and prometheus-alertmanager (Debian) are not installed")
    hook = Webhook()
    procs: list[subprocess.Popen] = []
    am_port, prom_port, metrics_port = free_port(), free_port(), free_port()
    (tmp_path / "am.yml").write_text(yaml.safe_dump({
        "route": {"receiver": "hook", "group_by": ["alertname", "node", "replica"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook.port}/"}]}],
    }))
    rules = subprocess.run([sys.executable, "-m", "reconciler", "alert-rules", "--for", "0s"], capture_output=True,
                           text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60).stdout
    (tmp_path / "rules.yml").write_text(rules)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "reconciler", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    logs = []
    for name, argv in (
        ("alertmanager", [ALERTMANAGER, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
                          f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="]),
        ("prometheus", [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"]),
    ):
        log = open(tmp_path / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
    try:
        yield hook, metrics_port, tmp_path
    finally:
        terminate_all(procs, timeout=15)
        for log in logs:
            log.close()
        hook.close()


def test_a_cut_node_and_a_crash_looping_replica_page_through_prometheus_and_alertmanager(cat, nodes, monitoring):
    hook, metrics_port, tmp = monitoring
    cat.model("loop", 1, 24700)
    cat.repo.commit("loop: 1")
    cat.daemon("--metrics-address", f"127.0.0.1:{metrics_port}")
    placed = cat.wait_ready("loop", 1)["replicas"][0]["nodes"][0]["node"]

    # A node with nothing on it stops answering: paged once its grace period (3 s) has passed, by name.
    quiet = next(n for n in NODES if n != placed)
    nodes.cut(quiet)
    wait_for(lambda: any(a["labels"].get("node") == quiet for a in hook.firing("ReconcilerNodeUnreachable")), 90,
             f"ReconcilerNodeUnreachable for {quiet}:\n{(tmp / 'prometheus.log').read_text()[-3000:]}")
    assert all(a["labels"]["node"] == quiet for a in hook.firing("ReconcilerNodeUnreachable"))
    assert "reconciler nodes" in hook.firing("ReconcilerNodeUnreachable")[0]["annotations"]["action"]
    nodes.restore(quiet)

    # The replica killed each time it comes back: after three crashes in a row, paged by name.
    def kill_loop():
        pids = marked_pids(cat.marker)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return hook.firing("ReconcilerReplicaCrashLooping")

    firing = wait_for(kill_loop, 180, "ReconcilerReplicaCrashLooping", interval=0.5)
    assert {(a["labels"]["model"], a["labels"]["replica"]) for a in firing} == {("loop", "loop-0")}


def test_the_event_log_of_a_real_daemon_run_says_each_step_once_in_order(cat, nodes):
    cat.model("echo", 2, 24800)
    cat.repo.commit("echo: 2")
    cat.daemon()
    status = cat.wait_ready("echo", 2)
    used = {r["nodes"][0]["node"] for r in status["replicas"]}
    quiet = next(n for n in NODES if n not in used)
    nodes.cut(quiet)
    wait_for(lambda: any(e["kind"] == "node.unreachable" for e in cat.events()), 60, "node.unreachable")
    cat.model("echo", 1, 24800)
    cat.repo.commit("echo: 1")
    wait_for(lambda: any(e["kind"] == "replica.stopped" for e in cat.events()), 90, "replica.stopped")
    time.sleep(2)  # a few more passes: nothing said twice
    events = cat.events()
    about_echo1 = [e["kind"] for e in events if e.get("replica") == "echo-1"]
    assert about_echo1 == ["replica.started", "replica.ready", "replica.draining", "replica.stopped"], events
    assert [e["kind"] for e in events if e.get("replica") == "echo-0"] == ["replica.started", "replica.ready"]
    assert [e["kind"] for e in events if e.get("node") == quiet] == ["node.unreachable"]
    order = [e["kind"] for e in events if e["kind"] in ("replica.ready", "node.unreachable", "replica.draining",
                                                         "replica.stopped")]
    assert order == ["replica.ready", "replica.ready", "node.unreachable", "replica.draining", "replica.stopped"]
    assert events[0]["kind"] == "revision.applied"
