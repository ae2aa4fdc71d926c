"""The daemon raises its own soft limit of open files at start, and says so in its log.

About three descriptors are held per node while its connection is open, so systemd's
default soft limit of 1024 runs out at about 330 nodes where a unit sets no LimitNOFILE
(examples/systemd sets one); bench/simfleet.py measures it at 1,000 and 4,000 simulated nodes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_cli_ux import local_catalog

pytestmark = [pytest.mark.process]


def _daemon_log(catalog, soft: int) -> list[dict]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    r = subprocess.run(
        [sys.executable, "-m", "reconciler", "run", str(catalog), "--max-passes", "1", "--log-format", "json"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), preexec_fn=limit, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]


def test_a_daemon_started_under_systemds_default_limit_raises_it_to_the_hard_limit_and_logs_it(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        raise AssertionError(f"this machine's hard limit of open files ({hard}) leaves nothing to raise")
    events = _daemon_log(local_catalog(tmp_path / "catalog"), 256)
    (raised,) = [e for e in events if e["event"] == "limits.nofile"]
    assert raised["was"] == 256 and raised["soft"] > 256
    assert raised["soft"] == hard or hard == resource.RLIM_INFINITY
    assert "raised from 256" in raised["msg"]
    assert [e["event"] for e in events].index("limits.nofile") < [e["event"] for e in events].index("pass.start")


def test_a_daemon_already_at_its_hard_limit_says_nothing_about_it(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("unlimited hard limit: the soft one is raised to nr_open (the test above)")
    events = _daemon_log(local_catalog(tmp_path / "catalog"), hard)
    assert not [e for e in events if e["event"] == "limits.nofile"]
