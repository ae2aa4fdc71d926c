"""`reconciler run --dashboard-address`: the daemon serves the dashboard of the status it writes.

A real daemon (`python -m reconciler run`) on the single-machine example: a real tiny server
through the local transport, stopped after by its process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.apply_support.local import example_catalog, kill_recorded
from tests.conftest import REPO

pytestmark = pytest.mark.process


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def example(tmp_path):
    root = example_catalog(tmp_path)
    yield root
    kill_recorded(tmp_path / "state")


def test_the_daemon_serves_the_dashboard_of_what_it_writes(example, tmp_path):
    log = tmp_path / "daemon.log"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XDG_STATE_HOME=str(tmp_path / "xdg"))
    with log.open("w") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "reconciler", "run", str(example), "--interval", "1",
                                   "--log-format", "json", "--dashboard-address", "127.0.0.1:0"],
                                  stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        def serving():
            for line in log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "dashboard.serving":
                    return json.loads(line)["address"]
        address = wait_for(serving, what=f"dashboard.serving in the log:\n{log.read_text()}")
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"

        def ready():
            with urllib.request.urlopen(f"http://{address}/api/status", timeout=10) as answer:
                doc = json.load(answer)
            return doc["models"] and doc["models"][0]["ready"] == 1 and doc
        doc = wait_for(ready, what="tiny-echo Ready on /api/status")
        assert doc["models"][0]["name"] == "tiny-echo"
        with urllib.request.urlopen(f"http://{address}/fleet", timeout=10) as answer:
            assert 'id="node-local"' in answer.read().decode()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        with pytest.raises(OSError):  # the dashboard went with the daemon
            socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_bad_dashboard_address_is_a_usage_error(example, cli):
    result = cli("run", str(example), "--dashboard-address", "nowhere", "--max-passes", "1")
    assert result.returncode == 2 and "--dashboard-address 'nowhere'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_dashboard_command_refuses_an_address_in_use(example, cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        result = cli("dashboard", str(example), "--address", f"127.0.0.1:{taken.getsockname()[1]}")
    assert result.returncode == 1 and "cannot serve the dashboard on" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_dashboard_command_wants_a_catalog(tmp_path, cli):
    result = cli("dashboard", str(tmp_path))
    assert result.returncode == 1 and "is not a catalog" in result.stderr and "Traceback" not in result.stderr
    result = cli("dashboard", str(tmp_path / "nope"))
    assert result.returncode == 1 and "no such catalog directory" in result.stderr
