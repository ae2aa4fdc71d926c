"""Two faults users met that are expected, not bugs: said in words, with the permissions people need."""

import concurrent.futures
import os
import stat

from reconciler.model import NodeSpec
from reconciler.observe.probe.collect import warm_result
from reconciler.record.status.files import write_if_changed
from reconciler.vocabulary import NodeState


def _cancelled():
    raise concurrent.futures.CancelledError()


def test_a_probe_request_dropped_with_its_connection_is_a_reason_not_a_traceback():
    spec = NodeSpec("n1", "10.0.0.1", "10.0.0.1")
    probe = warm_result(spec, _cancelled, 10.0, 0.0, lambda: 10.5, None)
    assert probe is not None
    assert probe.node.state == NodeState.UNREACHABLE
    assert probe.node.reason == "no answer within 10 s"
    assert "CancelledError" not in probe.node.reason


def test_a_request_dropped_before_its_deadline_says_the_connection_closed():
    spec = NodeSpec("n1", "10.0.0.1", "10.0.0.1")
    probe = warm_result(spec, _cancelled, 10.0, 0.0, lambda: 1.0, None)
    assert probe.node.reason == "the connection closed before the node answered"


def test_status_files_get_the_mode_of_a_normal_file(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "status" / "endpoints.yaml"
        assert write_if_changed(path, "models: {}\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert write_if_changed(path, "models: {a: []}\n")  # rewritten atomically: the mode stays
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_git_add_in_the_deployed_checkout_never_sees_a_status_temporary(tmp_path):
    """The daemon writes status/ while a person commits there: a temporary that `git add -A` lists
    and the rename then removes made it fail with "unable to stat" (a CI run met this)."""
    import subprocess
    import tempfile

    from reconciler.record.status.documents import CatalogStatus
    from reconciler.record.status.write import write_catalog_status

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write_catalog_status(tmp_path, CatalogStatus(attempted=None, applied=None, message="no revision"))
    for directory in (tmp_path / "status", tmp_path / "status" / "models"):
        directory.mkdir(exist_ok=True)
        fd, half_written = tempfile.mkstemp(prefix=".alpha.yaml.", suffix=".tmp", dir=directory)
        os.close(fd)
        ignored = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", half_written])
        assert ignored.returncode == 0, f"{half_written} is not ignored by git"
    listed = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert ".tmp" not in listed and "status/catalog.yaml" in listed
