"""A wheel built from this checkout, installed into a fresh venv, works from any directory (SPEC section 16).

An editable install or PYTHONPATH run reads whatever sits beside the package in the clone; a wheel
holds only what the package data names. These tests run the installed `reconciler` from another
directory with PYTHONPATH unset, so a file the package reads at run time but the wheel lacks (the
JSON Schemas before they moved into reconciler/schema/, a template, a node-side script) fails here.

The venv sees the system's site-packages (`--system-site-packages`) so the dependencies need not be
installed again; the package itself is the wheel's (each test checks `reconciler.__file__`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.apply_support.local import example_catalog, free_port, is_running, kill_recorded, wait_for
from tests.conftest import REPO, copy_tracked, run_cli

pytestmark = [pytest.mark.process]


def _copy_checkout(dest: Path) -> Path:
    """The tracked files of this checkout, symbolic links kept (schema/ is one): the wheel is built
    from what a clone holds, and the build's egg-info and build/ land in the copy, not the worktree."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60)
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else []
    if not names:  # an unpacked release: no git to ask
        shutil.copytree(REPO, dest, symlinks=True,
                        ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "status"))
        return dest
    for name in names:
        src, target = REPO / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)
    return dest


class Installed:
    """The venv with the wheel in it, and how to run its `reconciler` from elsewhere."""

    def __init__(self, venv: Path, elsewhere: Path):
        self.venv = venv
        self.elsewhere = elsewhere
        self.bin = venv / "bin"

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        # As an activated venv: `python3` in a command profile (the single-machine example's stand-in
        # server) is the venv's, so the server runs from the wheel too.
        env["PATH"] = str(self.bin) + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(self.venv)
        env["XDG_STATE_HOME"] = str(self.elsewhere / "xdg-state")
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "reconciler"), *args], cwd=self.elsewhere, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def python(self, code: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "python"), "-c", code], cwd=self.elsewhere, env=self.env(),
                              capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    source = _copy_checkout(base / "source")
    wheels = base / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = wheels.glob("*.whl")
    venv = base / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    # --force-reinstall: the system's site-packages may hold an editable install of the project, which
    # pip would otherwise take as already satisfying the wheel.
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--force-reinstall", str(wheel)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return Installed(venv, elsewhere)


def test_the_package_imported_is_the_wheels_not_the_checkouts(installed):
    where = installed.python("import reconciler; print(reconciler.__file__)")
    assert where.returncode == 0, where.stderr
    path = Path(where.stdout.strip()).resolve()
    assert path.is_relative_to(installed.venv.resolve()), path
    assert not path.is_relative_to(REPO.resolve())


def test_every_file_the_package_reads_at_run_time_is_in_the_wheel(installed):
    # The node-side programs are sent as the text of the package's own modules, the option tables and
    # schemas are JSON beside them: each read here as the commands read it.
    code = (
        "from reconciler.observe.probe.script import payload; assert payload()\n"
        "from reconciler.act.launcher.ssh_launcher import agent_source; assert agent_source()\n"
        "from reconciler.act.fetch import agent_source as fetch_agent; assert fetch_agent()\n"
        "from reconciler.engines import flags; assert sorted(flags.TABLES.glob('*.json'))\n"
        "from reconciler import schemas; assert sorted(schemas.SCHEMA_DIR.glob('*.schema.json'))\n"
        "from reconciler.dashboard import app; assert (app.STATIC / 'dashboard.css').is_file()\n"
    )
    result = installed.python(code)
    assert result.returncode == 0, result.stderr


def test_validate_a_good_catalog_and_a_bad_one(installed, tmp_path):
    good = copy_tracked(REPO / "catalog", tmp_path / "good")
    result = installed.run("validate", str(good))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr

    bad = copy_tracked(REPO / "catalog", tmp_path / "bad")
    (bad / "models" / "qwen2.5-7b.yaml").write_text("name: qwen2.5-7b\nsource: x\nreplicas: -1\nprofiles: []\n")
    result = installed.run("validate", str(bad))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "models/qwen2.5-7b.yaml:3:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_plan_of_the_bundled_catalog_and_its_snapshot_is_the_checkouts(installed, tmp_path):
    catalog = copy_tracked(REPO / "catalog", tmp_path / "catalog")
    args = ("plan", str(catalog), "--inventory", str(catalog / "status" / "nodes.yaml"), "--format", "json")
    wheel = installed.run(*args)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    document = json.loads(wheel.stdout)
    assert document["actions"] and all(a["action"] == "start" for a in document["actions"])
    checkout = run_cli(*args, cwd=installed.elsewhere)
    assert checkout.returncode == 0, checkout.stderr
    assert document == json.loads(checkout.stdout)


def test_apply_of_the_single_machine_example_then_its_removal(installed, tmp_path):
    root = example_catalog(tmp_path)
    state = tmp_path / "state"
    try:
        first = installed.run("apply", str(root))
        assert first.returncode == 0, first.stdout + first.stderr
        assert "tiny-echo-0  local  health  Ready" in first.stdout
        [record] = (state / "replicas").glob("*.json")
        pid = json.loads(record.read_text())["pid"]
        assert is_running(pid)
        # The stand-in server is the wheel's too (the example runs `python3 -m reconciler.tiny_server`).
        argv0 = Path(f"/proc/{pid}/exe").resolve()
        assert argv0 == (installed.bin / "python3").resolve()

        # Removed from the catalog: it leaves the gateway files first, and an idle copy is stopped once the
        # gateway serves without it (SPEC 13's hand-off: apply waits gateway.settle_s for it within its run);
        # one with requests running would be left Draining for a later apply, hence the loop.
        (root / "models" / "tiny-echo.yaml").unlink()
        said = []

        def stopped() -> bool:
            again = installed.run("apply", str(root))
            assert again.returncode == 0, again.stdout + again.stderr
            said.append(again.stdout)
            return "tiny-echo-0  local  stop" in again.stdout

        wait_for(stopped, timeout=120, what="an apply that stops the removed model's replica")
        assert "waiting for the gateway to serve without it" in said[0]
        assert "model removed from the catalog; drained" in said[-1]
        wait_for(lambda: not is_running(pid), timeout=30, what=f"the stand-in server (pid {pid}) to end")
        assert not list((state / "replicas").glob("*.json"))
    finally:
        kill_recorded(state)


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


def test_the_dashboard_serves_its_pages_and_static_files(installed, tmp_path):
    catalog = copy_tracked(REPO / "catalog", tmp_path / "catalog")
    port = free_port()
    server = subprocess.Popen([str(installed.bin / "reconciler"), "dashboard", str(catalog),
                               "--address", f"127.0.0.1:{port}"], cwd=installed.elsewhere, env=installed.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def answers():
            if server.poll() is not None:
                raise AssertionError(f"the dashboard exited {server.returncode}: {server.stderr.read().decode()}")
            try:
                return _get(base + "/api/version")[0] == 200
            except OSError:
                return False

        wait_for(answers, timeout=60, what="the dashboard to answer")
        for page in ("/", "/models", "/fleet"):
            status, body = _get(base + page)
            assert status == 200 and b"<html" in body.lower(), page
        assert b"h100-a1" in _get(base + "/fleet")[1]  # a node of the bundled snapshot
        for name in ("dashboard.css", "dashboard.js"):
            status, body = _get(f"{base}/static/{name}")
            assert status == 200 and body == (REPO / "reconciler" / "dashboard" / "static" / name).read_bytes(), name
        status, body = _get(base + "/api/status")
        assert status == 200 and json.loads(body)
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        server.stdout.close()
        server.stderr.close()
    assert not is_running(server.pid)
