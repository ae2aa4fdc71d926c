"""The layering contracts in .importlinter hold: pure decisions, paramiko only in ssh.py."""

import shutil
import subprocess


from tests.conftest import REPO
import pytest

pytestmark = [pytest.mark.process]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is a test dependency (pip install -e '.[test]')"
    out = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout
