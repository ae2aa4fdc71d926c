"""The event log written by the real daemon loop (tests/daemon_driver.py: the real `reconciler run`
with a recording pass) and by a real `reconciler apply`, read back with `reconciler events`; and the
metrics the shipped alert rules read, on the daemon's /metrics."""

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
from tests.conftest import REPO, run_cli
from tests.gitcatalog import CatalogRepo, DaemonProcess, model_yaml, wait_for

pytestmark = pytest.mark.process


def events(catalog, env) -> list[dict]:
    done = run_cli("events", str(catalog), "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_a_refused_revision_is_one_event_with_its_errors_and_the_fix_is_applied(tmp_path):
    repo = CatalogRepo(tmp_path / "catalog")
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    port = free_port()
    d = DaemonProcess(repo.path, "--interval", "1", "--metrics-address", f"127.0.0.1:{port}", workdir=tmp_path, env=env)
    try:
        good = repo.head()
        d.wait_pass(good)
        wait_for(lambda: metric(port, "reconciler_catalog_head_applied") == 1.0, 30, "HEAD applied")
        assert metric(port, "reconciler_resync_interval_seconds") == 1.0
        assert metric(port, "reconciler_last_pass_timestamp_seconds") > time.time() - 60
        repo.write("models/beta.yaml", "name: beta\nreplicas: 2\n")  # no source
        bad = repo.commit("beta without a source")
        wait_for(lambda: any(e["kind"] == "revision.refused" for e in events(repo.path, env)), 30, "revision.refused")
        wait_for(lambda: metric(port, "reconciler_catalog_head_applied") == 0.0, 30, "HEAD not applied")
        time.sleep(3)  # passes every second go on refusing it: still one event
        said = events(repo.path, env)
        [refused] = [e for e in said if e["kind"] == "revision.refused"]
        assert refused["revision"] == bad and any("models/beta.yaml" in x and "source" in x for x in refused["errors"])
        repo.write("models/beta.yaml", model_yaml("beta", 2))
        fixed = repo.commit("fix beta")
        d.wait_pass(fixed)
        wait_for(lambda: [e.get("revision") for e in events(repo.path, env) if e["kind"] == "revision.applied"]
                 == [good, fixed], 30, "the fix applied")
        # The driver's pass leaves fake-0 Ready: said once, by the first pass.
        assert [e["kind"] for e in events(repo.path, env) if e.get("replica") == "fake-0"] == ["replica.ready"]
    finally:
        d.stop()


def test_apply_writes_the_event_log_too(tmp_path):
    root = example_catalog(tmp_path)
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    try:
        done = run_cli("apply", str(root), env=env)
        assert done.returncode == 0, done.stderr
        said = events(root, env)
        kinds = [e["kind"] for e in said]
        assert kinds[0] == "revision.applied" and "by reconciler apply" in said[0]["message"]
        assert kinds.count("replica.started") == 1 and kinds.count("replica.ready") == 1
        assert kinds.index("replica.started") < kinds.index("replica.ready")
        again = run_cli("apply", str(root), env=env)  # nothing changed: nothing new to say
        assert again.returncode == 0, again.stderr
        assert events(root, env) == said
        text = run_cli("events", str(root), "--kind", "replica.ready", env=env)
        assert text.returncode == 0 and len(text.stdout.splitlines()) == 1 and "replica.ready" in text.stdout
    finally:
        kill_recorded(tmp_path / "state")


def test_follow_streams_until_interrupted_without_a_traceback(tmp_path, monkeypatch):
    from reconciler.record.eventlog import EventJournal
    from reconciler.record.events import Event
    from reconciler.vocabulary import EventKind

    root = tmp_path / "catalog"
    root.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))  # the child reads the same log
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    journal = EventJournal.for_catalog(root)
    journal.append([Event(time.time(), EventKind.NODE_UNREACHABLE, "does not answer", node="n1")])
    proc = subprocess.Popen([sys.executable, "-m", "reconciler", "events", str(root), "--follow"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "node.unreachable" in proc.stdout.readline()
        journal.append([Event(time.time(), EventKind.NODE_BACK, "answers again", node="n1")])
        assert "node.back" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
