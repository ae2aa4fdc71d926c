import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SLOW_TIERS = ("fleet", "slurm", "real_engine", "external", "process")


def pytest_collection_modifyitems(items):
    # A test that runs the command line (the `cli` fixture) starts a Python process: not the fast tier.
    for item in items:
        if "cli" in getattr(item, "fixturenames", ()) and item.get_closest_marker("process") is None:
            item.add_marker(pytest.mark.process)


def pytest_runtest_setup(item):
    # A fleet test without root cannot build its network namespaces: skipped, saying why, rather than
    # a RuntimeError from the fixture in every test.
    if item.get_closest_marker("fleet") is not None and os.geteuid() != 0:
        pytest.skip("the test fleet needs root (network namespaces, bind mounts, sshd); run as root, "
                    "or run the fast tier: bash scripts/test.sh --fast")


def run_cli(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None, timeout: float = 120):
    """Run `python -m reconciler ARGS` in a subprocess, importing this checkout's package."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def pool():
    """The SSH pool `reconciler apply` uses, closed after the test (tests/test_ssh.py has its own, without backoff)."""
    from reconciler.observe.ssh import TransportPool

    p = TransportPool()
    yield p
    p.close()


def copy_tracked(src: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Copy the files of `src` that this repository tracks, and nothing else.

    A bundled example is also what a person runs by hand (the README's first command
    writes examples/single-machine/status/): a test that copied the directory whole
    would start from whatever the last command left there. Outside a git checkout
    (an unpacked release) there is nothing to tell apart, and everything but status/
    is copied.
    """
    src, dest = Path(src), Path(dest)
    listed = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=src, capture_output=True, timeout=60)
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else []
    if not names:
        import shutil

        shutil.copytree(src, dest, ignore=lambda d, _: ["status"] if Path(d) == src else [])
        return dest
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((src / name).read_bytes())
    return dest
