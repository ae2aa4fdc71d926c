"""The daemon driven by git, with a recording fake pass (tests/daemon_driver.py).

Real git repositories, real child processes, real signals, the real watcher.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from tests.gitcatalog import FLEET, CatalogRepo, DaemonProcess, deployed_from_upstream, git, model_yaml, wait_for

pytestmark = [pytest.mark.process]

QUIET = ["--interval", "3600"]  # only commits and signals trigger passes
SCHEMA = Path(__file__).resolve().parent.parent / "schema" / "status-catalog.schema.json"


def conforms_to_schema(status: dict) -> None:
    jsonschema.validate(status, json.loads(SCHEMA.read_text()))


@pytest.fixture
def repo(tmp_path):
    return CatalogRepo(tmp_path / "catalog")


@pytest.fixture
def daemon(tmp_path, repo):
    started: list[DaemonProcess] = []

    def start(*flags, env=None, name="daemon", catalog=None):
        d = DaemonProcess(catalog or repo.path, *flags, workdir=tmp_path, env=env, name=name)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def test_committing_a_change_triggers_a_pass_with_the_new_revision(repo, daemon):
    d = daemon(*QUIET)
    first = d.wait_pass(repo.head())[0]
    assert first["models"] == {"alpha": 1}

    repo.write("models/alpha.yaml", model_yaml("alpha", 3))
    bumped = repo.commit("alpha: 3 replicas")

    p = d.wait_pass(bumped)[0]
    assert p["models"] == {"alpha": 3}
    assert p["pid"] == d.pid
    status = repo.status()
    assert status["last_attempted_revision"] == bumped
    assert status["last_applied_revision"] == bumped
    assert status["errors"] == []


def test_invalid_commit_applies_nothing_records_every_error_and_next_valid_commit_applies(repo, daemon):
    good = repo.head()
    d = daemon(*QUIET)
    d.wait_pass(good)

    repo.write("models/beta.yaml", "name: beta\nreplicas: 2\n")  # no source
    repo.write("models/gamma.yaml", "name: gamma\nsource: [unclosed\nreplicas: 1\n")  # YAML syntax
    bad = repo.commit("two broken models")

    wait_for(lambda: repo.status()["last_attempted_revision"] == bad, what="the bad revision attempted")
    status = repo.status()
    assert status["last_applied_revision"] == good
    assert sorted({e["file"] for e in status["errors"]}) == ["models/beta.yaml", "models/gamma.yaml"]
    assert any("source" in e["message"] for e in status["errors"] if e["file"] == "models/beta.yaml")
    assert status["message"].startswith(f"revision {bad[:12]} refused") and good[:12] in status["message"]
    conforms_to_schema(status)
    for error in status["errors"]:
        assert error["line"] >= 1 and error["column"] >= 1 and error["message"]
    assert all(p["revision"] == good for p in d.passes("begin")), "the invalid revision reached the pass"
    assert d.events("pass.refused")

    repo.write("models/beta.yaml", model_yaml("beta", 2))
    repo.write("models/gamma.yaml", model_yaml("gamma", 1))
    fixed = repo.commit("fix both")
    p = d.wait_pass(fixed)[0]
    assert p["models"] == {"alpha": 1, "beta": 2, "gamma": 1}
    status = repo.status()
    assert (status["last_applied_revision"], status["errors"]) == (fixed, [])
    conforms_to_schema(status)


def test_a_daemon_started_on_an_invalid_head_keeps_the_revision_status_says_was_applied(repo, daemon):
    good = repo.head()
    d = daemon("--max-passes", "1")
    assert d.wait_exit() == 0
    repo.write("models/beta.yaml", "name: beta\n")
    bad = repo.commit("broken while the daemon was down")

    d2 = daemon(*QUIET, name="second")
    wait_for(lambda: repo.status()["last_attempted_revision"] == bad, what="bad revision attempted")
    assert repo.status()["last_applied_revision"] == good
    d2.signal(signal.SIGHUP)  # a resync keeps reconciling the revision in force
    assert d2.wait_pass(good)[0]["models"] == {"alpha": 1}
    assert all(p["revision"] == good for p in d2.passes("begin"))


def test_an_uncommitted_edit_is_not_applied_and_status_says_so(repo, daemon):
    committed = repo.head()
    d = daemon(*QUIET)
    d.wait_pass(committed)

    repo.write("models/alpha.yaml", model_yaml("alpha", 7))  # saved, never committed
    repo.write("models/half.yaml", "name: half\nsource: [")  # half-written new file
    d.signal(signal.SIGHUP)
    d.wait_pass(committed, count=2)

    assert all(p["models"] == {"alpha": 1} for p in d.passes())
    status = repo.status()
    assert status["uncommitted_changes"] == ["models/alpha.yaml", "models/half.yaml"]
    assert status["errors"] == [] and status["last_applied_revision"] == committed
    assert any("uncommitted" in w for w in status["warnings"])
    assert d.events("worktree.uncommitted")


def test_two_passes_with_nothing_changed_write_zero_bytes_and_leave_git_status_clean(repo, daemon):
    d = daemon("--max-passes", "1", "--commit-status")
    assert d.wait_exit() == 0
    assert repo.porcelain() == ""

    def snapshot():
        out = {}
        for p in sorted(repo.path.rglob("*")):
            if ".git" not in p.relative_to(repo.path).parts and p.is_file():
                st = p.stat()
                out[str(p)] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return out

    before, head = snapshot(), repo.head()
    d2 = daemon("--max-passes", "2", "--interval", "1", name="second")
    assert d2.wait_exit() == 0
    assert len(d2.passes()) == 2
    assert snapshot() == before
    assert repo.porcelain() == ""
    assert repo.head() == head


def test_a_second_daemon_on_the_same_catalog_refuses_and_names_the_holder(repo, daemon):
    first = daemon(*QUIET)
    first.wait_pass()
    second = daemon(*QUIET, name="second")
    assert second.wait_exit() == 1
    message = second.logfile.read_text()
    assert f"pid {first.pid}" in message and "already running" in message
    assert second.passes("begin") == []
    assert first.proc.poll() is None


LOCAL_FLEET = "nodes:\n  - id: here\n    address: 127.0.0.1\n    transport: local\n"


def test_apply_refuses_while_a_daemon_acts_on_the_catalog_and_changes_nothing(repo, daemon, cli, tmp_path):
    repo.write("fleet.yaml", LOCAL_FLEET)  # were the lock ignored, apply would act on this host only
    repo.commit("a local node")
    d = daemon(*QUIET)
    d.wait_pass(repo.head())
    before = (repo.path / "status" / "catalog.yaml").read_bytes()
    result = cli("apply", str(repo.path), cwd=tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"reconciler daemon (pid {d.pid}) is already acting on {repo.path}" in result.stderr
    assert "nothing was applied" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert (repo.path / "status" / "catalog.yaml").read_bytes() == before
    assert d.proc.poll() is None


def test_a_daemon_started_while_apply_holds_the_lock_names_it_and_exits(repo, daemon):
    import os

    from reconciler.control.lock import APPLY, CatalogLock, lock_path
    from reconciler.catalog.gitrev import GitCatalog

    held = CatalogLock(lock_path(repo.path, GitCatalog.open(repo.path)), str(repo.path), APPLY)
    assert held.acquire() is None
    try:
        d = daemon(*QUIET)
        assert d.wait_exit() == 1
        assert f"reconciler apply (pid {os.getpid()}) is acting on" in d.logfile.read_text()
        assert d.passes("begin") == []
    finally:
        held.release()
    after = daemon(*QUIET, name="after")  # released: the next one takes it
    after.wait_pass()


def test_a_lock_file_written_before_roles_names_a_daemon(tmp_path):
    from reconciler.control.lock import DAEMON, CatalogLock, Holder

    path = tmp_path / "daemon.lock"
    path.write_text("4242\n")  # a bare pid, as daemons wrote it; its holder is gone (no flock)
    lock = CatalogLock(path, "the catalog")
    assert lock.acquire() == Holder(4242, DAEMON)
    assert path.read_text().split()[1] == DAEMON
    lock.release()
    assert path.read_text() == ""


def test_a_lock_left_by_a_killed_daemon_is_taken_over(repo, daemon):
    first = daemon(*QUIET)
    first.wait_pass()
    first.proc.kill()
    first.wait_exit()

    second = daemon(*QUIET, name="second")
    second.wait_pass()
    taken = second.wait_event("lock.taken-over")[0]
    assert taken["previous_pid"] == first.pid
    assert any(f"pid {first.pid}" in w for w in repo.status()["warnings"])

    second.signal(signal.SIGTERM)  # a clean exit leaves nothing to take over
    assert second.wait_exit() == 0
    third = daemon(*QUIET, name="third")
    third.wait_pass(count=1)
    assert third.events("lock.taken-over") == []
    assert not any("took over" in w for w in repo.status()["warnings"])


def test_sigterm_finishes_the_pass_in_progress_then_exits_leaving_status_written(repo, daemon):
    d = daemon(*QUIET, env={"FAKE_PASS_SLEEP": "1.5"})
    wait_for(lambda: d.passes("begin"), what="a pass to begin")
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0
    assert len(d.passes("end")) == 1, "the pass in progress was cut short"
    assert d.events("daemon.stopped")[0]["reason"] == "SIGTERM"
    assert repo.status()["last_applied_revision"] == repo.head()


def test_sigint_stops_the_daemon_cleanly(repo, daemon):
    d = daemon(*QUIET)
    d.wait_pass()
    d.signal(signal.SIGINT)
    assert d.wait_exit() == 0
    assert d.events("daemon.stopped")[0]["reason"] == "SIGINT"


def test_sighup_starts_a_pass_now(repo, daemon):
    d = daemon(*QUIET)
    d.wait_pass()
    d.signal(signal.SIGHUP)
    passes = d.wait_pass(count=2)
    assert [p["revision"] for p in passes] == [repo.head(), repo.head()]
    assert [e["trigger"] for e in d.events("pass.end")][:2] == ["start", "SIGHUP"]


def test_commit_status_commits_only_status_and_a_status_commit_starts_no_pass(repo, daemon):
    catalog_revision = repo.head()
    repo.write("models/staged.yaml", model_yaml("staged", 1))
    git(repo.path, "add", "models/staged.yaml")  # staged by a person, not committed

    d = daemon(*QUIET, "--commit-status")
    d.wait_event("status.committed")
    d.wait_event("head.moved")  # the daemon saw its own commit move HEAD

    changed = git(repo.path, "show", "--name-only", "--format=%s%n%b", "HEAD").split("\n")
    assert catalog_revision[:12] in changed[0]
    assert f"Reconciler-Status-For: {catalog_revision}" in changed
    files = [f for f in changed[2:] if f and not f.startswith("Reconciler-")]
    assert files and all(f.startswith("status/") for f in files)
    assert git(repo.path, "diff", "--cached", "--name-only").split() == ["models/staged.yaml"]
    assert len(d.passes()) == 1, "a status commit must not start a pass"
    assert repo.status()["last_attempted_revision"] == catalog_revision


def test_detached_head_is_applied_and_said_in_status(repo, daemon):
    first = repo.head()
    repo.write("models/alpha.yaml", model_yaml("alpha", 2))
    repo.commit("alpha: 2")
    git(repo.path, "checkout", "-q", "--detach", first)

    d = daemon(*QUIET)
    assert d.wait_pass(first)[0]["models"] == {"alpha": 1}
    status = repo.status()
    assert status["branch"] is None
    assert any("detached" in w for w in status["warnings"])
    conforms_to_schema(status)


def metrics_after_one_pass(daemon) -> str:
    """The exposition a daemon serves on an ephemeral port once its first pass has ended."""
    d = daemon(*QUIET, "--metrics-address", "127.0.0.1:0")
    d.wait_pass()
    d.wait_event("pass.end")
    address = d.wait_event("metrics.serving")[0]["address"]
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()


def test_metrics_endpoint_serves_pass_and_action_counters(repo, daemon):
    body = metrics_after_one_pass(daemon)
    assert 'reconciler_passes_total{result="applied"} 1' in body
    assert 'reconciler_actions_total{action="start",outcome="ok"} 1' in body
    assert 'reconciler_replicas{phase="Ready"} 1' in body
    assert 'reconciler_replicas{phase="Failed"} 0' in body
    assert "reconciler_pass_duration_seconds_count 1" in body


def test_push_without_commit_status_is_a_usage_error(repo, tmp_path, cli):
    result = cli("run", str(repo.path), "--push", cwd=tmp_path)
    assert result.returncode == 2 and "--commit-status" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_lock_that_cannot_be_created_is_a_message_not_a_traceback(tmp_path, cli):
    root = tmp_path / "plain"  # not a git repository: the lock lives in the catalog directory
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text("nodes:\n  - id: here\n    address: 127.0.0.1\n    transport: local\n")
    (root / ".llm-reconciler.lock").mkdir()  # in the lock's place, as a catalog this user cannot write would be
    result = cli("run", str(root), "--max-passes", "1", cwd=tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert result.returncode == 1
    assert f"cannot create the daemon's lock {root}/.llm-reconciler.lock" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_catalog_that_is_no_directory_is_a_message_not_a_traceback(tmp_path, cli):
    result = cli("run", str(tmp_path / "nope"), "--max-passes", "1", cwd=tmp_path)
    assert result.returncode == 1
    assert "no such catalog directory" in result.stderr and "Traceback" not in result.stderr


def test_git_pull_fast_forwards_to_a_commit_pushed_upstream(tmp_path, daemon):
    origin, bare, deployed = deployed_from_upstream(tmp_path)
    git(origin.path, "remote", "add", "origin", str(bare))

    d = daemon("--git-pull", "--interval", "1", catalog=deployed.path)
    d.wait_pass(origin.head())

    origin.write("models/alpha.yaml", model_yaml("alpha", 4))
    pushed = origin.commit("alpha: 4")
    git(origin.path, "push", "-q", "origin", "main")

    assert d.wait_pass(pushed)[0]["models"] == {"alpha": 4}
    assert deployed.head() == pushed
    assert deployed.status()["upstream"] == {"ref": "origin/main", "state": "up-to-date", "message": ""}
    conforms_to_schema(deployed.status())


def test_a_refused_pull_keeps_the_revision_in_force_and_says_why_in_status(tmp_path, daemon):
    origin, bare, deployed = deployed_from_upstream(tmp_path)
    git(deployed.path, "config", "user.email", "ops@example.com")
    git(deployed.path, "config", "user.name", "Ops")
    deployed.write("models/hotfix.yaml", model_yaml("hotfix", 1))
    local = deployed.commit("hotfix made here")
    git(origin.path, "remote", "add", "origin", str(bare))
    origin.write("models/alpha.yaml", model_yaml("alpha", 5))
    git(origin.path, "commit", "-q", "-a", "--amend", "-m", "rewritten")
    git(origin.path, "push", "-q", "--force", "origin", "main")

    d = daemon("--git-pull", *QUIET, catalog=deployed.path)
    assert d.wait_pass(local)[0]["models"] == {"alpha": 1, "hotfix": 1}
    upstream = deployed.status()["upstream"]
    assert upstream["state"] == "refused" and "made only here" in upstream["message"]
    assert d.events("git.pull.refused")
    assert deployed.head() == local
    conforms_to_schema(deployed.status())


def test_text_log_lines_carry_the_decision_and_its_reason():
    import io

    from reconciler.control.log import EventLog

    out = io.StringIO()
    log = EventLog("text", out, clock=lambda: 0.0)
    log("replica.start", replica="alpha-1", node="node-a", msg="replica missing")
    log({"event": "replica.stop", "replica": "old-0", "reason": "model removed from the catalog"})

    from reconciler.decide.outcomes import Decision

    log(Decision("alpha-0", "node-a", "start", "replica missing", True))
    lines = out.getvalue().splitlines()
    assert lines[2] == "1970-01-01T00:00:00.000Z decision replica=alpha-0 node=node-a action=start " \
        'reason="replica missing" ok=True'
    assert lines[:2] == [
        "1970-01-01T00:00:00.000Z replica.start replica=alpha-1 node=node-a - replica missing",
        '1970-01-01T00:00:00.000Z replica.stop replica=old-0 reason="model removed from the catalog"',
    ]


def test_metrics_address_must_be_host_and_port(repo, tmp_path, cli):
    result = cli("run", str(repo.path), "--metrics-address", "localhost", cwd=tmp_path)
    assert result.returncode == 2 and "HOST:PORT" in result.stderr


def test_a_commit_made_while_a_pass_runs_is_applied_by_the_next_pass(repo, daemon):
    d = daemon(*QUIET, env={"FAKE_PASS_SLEEP": "1"})
    wait_for(lambda: d.passes("begin"), what="the first pass to begin")
    repo.write("models/alpha.yaml", model_yaml("alpha", 2))
    bumped = repo.commit("alpha: 2, mid-pass")
    assert d.wait_pass(bumped)[0]["models"] == {"alpha": 2}
    assert d.passes()[0]["models"] == {"alpha": 1}  # the pass in progress kept the revision it started with


def test_a_catalog_without_git_is_applied_from_its_directory_when_a_file_changes(tmp_path, daemon):
    plain = tmp_path / "plain"
    (plain / "models").mkdir(parents=True)
    (plain / "fleet.yaml").write_text(FLEET)
    (plain / "models/alpha.yaml").write_text(model_yaml("alpha", 1))
    d = daemon(*QUIET, catalog=plain)
    assert d.wait_pass()[0] == {**d.passes()[0], "revision": None, "models": {"alpha": 1}}
    (plain / "models/alpha.yaml").write_text(model_yaml("alpha", 2))
    wait_for(lambda: any(p["models"] == {"alpha": 2} for p in d.passes()), what="a pass with the edit")
    status = CatalogRepo(plain, init=False).status()
    assert status["last_attempted_revision"] is None and "branch" not in status


def test_a_repository_with_no_commit_applies_nothing_and_says_so(tmp_path, daemon):
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    (empty / "fleet.yaml").write_text(FLEET)  # written, not committed
    d = daemon("--max-passes", "1", catalog=empty)
    assert d.wait_exit() == 0
    assert d.passes("begin") == []
    status = CatalogRepo(empty, init=False).status()
    assert "no commit yet" in status["message"] and status["last_applied_revision"] is None
    assert status["uncommitted_changes"] == ["fleet.yaml"]
    conforms_to_schema(status)


def test_a_second_sigterm_exits_without_waiting_for_the_pass(repo, daemon):
    d = daemon(*QUIET, env={"FAKE_PASS_SLEEP": "60"})
    wait_for(lambda: d.passes("begin"), what="a pass to begin")
    d.signal(signal.SIGTERM)
    d.wait_event("daemon.stopping")
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 128 + signal.SIGTERM
    assert d.passes("end") == []
    assert d.events("daemon.interrupted")
    again = daemon(*QUIET, name="again")  # the lock went with the process
    again.wait_pass()


def test_a_catalog_in_a_linked_worktree_sees_commits_made_there(repo, tmp_path, daemon):
    linked = tmp_path / "linked"
    git(repo.path, "worktree", "add", "-q", "-b", "deploy", str(linked))
    work = CatalogRepo(linked, init=False)
    d = daemon(*QUIET, catalog=linked)
    d.wait_pass(work.head())
    work.write("models/alpha.yaml", model_yaml("alpha", 6))
    bumped = work.commit("alpha: 6 on the deploy branch")
    assert d.wait_pass(bumped)[0]["models"] == {"alpha": 6}
    assert work.status()["branch"] == "deploy"
    assert repo.porcelain() == ""  # the daemon's lock and snapshots are not in either working tree


def test_a_half_written_file_in_a_plain_directory_applies_nothing_until_it_is_whole(tmp_path, daemon):
    plain = tmp_path / "plain"
    (plain / "models").mkdir(parents=True)
    (plain / "fleet.yaml").write_text(FLEET)
    (plain / "models/alpha.yaml").write_text(model_yaml("alpha", 1))
    d = daemon(*QUIET, catalog=plain)
    d.wait_pass()
    text = model_yaml("alpha", 2)
    (plain / "models/alpha.yaml").write_text(text[: text.index("profiles")] + "profiles:\n  - name: [")
    status_of = lambda: CatalogRepo(plain, init=False).status()  # noqa: E731
    wait_for(lambda: status_of()["errors"], what="the half-written file reported")
    assert status_of()["errors"][0]["file"] == "models/alpha.yaml"
    assert all(p["models"] == {"alpha": 1} for p in d.passes())

    (plain / "models/alpha.yaml").write_text(text)
    wait_for(lambda: any(p["models"] == {"alpha": 2} for p in d.passes()), what="the whole file applied")
    wait_for(lambda: status_of()["errors"] == [], what="errors cleared")


def test_commit_status_with_push_puts_the_status_history_upstream(tmp_path, daemon):
    origin, bare, deployed = deployed_from_upstream(tmp_path)

    d = daemon(*QUIET, "--commit-status", "--push", catalog=deployed.path)
    committed = d.wait_event("status.committed")[0]
    assert committed["pushed"] == "yes"
    upstream_files = git(bare, "show", "--name-only", "--format=", "main").split()
    assert "status/catalog.yaml" in upstream_files
    assert git(bare, "rev-parse", "main").strip() == deployed.head()


def test_metrics_follow_prometheus_naming_and_carry_the_fleet_figures(repo, daemon):
    from prometheus_client.parser import text_string_to_metric_families

    body = metrics_after_one_pass(daemon)
    families = {f.name: f for f in text_string_to_metric_families(body)}  # the official parser reads it whole
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("reconciler_model_replicas_desired", (("model", "alpha"),))] == 1
    assert ("reconciler_model_replicas_ready", (("model", "alpha"),)) in samples
    assert samples[("reconciler_model_replicas_unplaced", (("model", "alpha"),))] == 0
    assert samples[("reconciler_applied_revision_info", (("revision", repo.head()),))] == 1
    assert samples[("reconciler_last_successful_pass_timestamp_seconds", ())] > 0
    assert families["reconciler_passes"].type == "counter" and families["reconciler_pass_duration_seconds"].type == "histogram"
    assert not any(name.endswith("_created") for name, _ in samples)


def test_json_log_lines_carry_a_level(repo, daemon):
    d = daemon(*QUIET)
    d.wait_event("pass.end")
    assert all(e["level"] in ("info", "warning", "error") for e in d.events())
    assert next(e for e in d.events() if e["event"] == "pass.end")["level"] == "info"


def test_a_node_going_unreachable_and_coming_back_is_one_event_each(tmp_path):
    import io

    from reconciler.control.loop import Daemon
    from reconciler.control.log import EventLog
    from reconciler.model import Catalog, Fleet, Inventory, NodeSpec, ObservedNode
    from reconciler.decide.outcomes import PassResult

    (tmp_path / "models").mkdir()
    out = io.StringIO()
    d = Daemon(tmp_path, pass_fn=lambda *a, **k: None, log=EventLog("json", stream=out))
    catalog = Catalog(root=str(tmp_path), fleet=Fleet(nodes=(NodeSpec(id="a", address="10.0.0.1", data_address="10.0.0.1"),)),
                      models=(), revision=None)

    def pass_seeing(state: str, reason: str = "") -> None:
        inventory = Inventory((ObservedNode(id="a", state=state, reason=reason),))
        d._observe(PassResult(revision=None, inventory=inventory, plan=None), catalog)

    for seen in (("ready",), ("unreachable", "timed out after 10s"), ("unreachable", "timed out after 10s"), ("ready",)):
        pass_seeing(*seen)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e["level"], e["node"]) for e in events] == [
        ("node.unreachable", "warning", "a"), ("node.reachable", "info", "a")]
    assert events[0]["reason"] == "timed out after 10s"
    body = d.metrics.render()
    assert 'reconciler_node_up{node="a"} 1.0' in body and 'reconciler_probe_failures_total{node="a"} 2.0' in body


def test_probe_durations_stand_through_a_pass_that_probed_nothing_and_go_with_their_node():
    from prometheus_client.parser import text_string_to_metric_families

    from reconciler.record.metrics import FleetFigures, Metrics

    def durations(metrics: Metrics) -> dict[str, float]:
        families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
        return {s.labels["node"]: s.value for s in families["reconciler_node_probe_duration_seconds"].samples}

    m = Metrics()
    m.fleet(FleetFigures(node_up={"a": True, "b": False}, probe_seconds={"a": 0.25, "b": 10.0}))
    assert durations(m) == {"a": 0.25, "b": 10.0}
    m.fleet(FleetFigures(node_up={"a": True}, probe_seconds=None))  # reused inventory; b left fleet.yaml
    assert durations(m) == {"a": 0.25}
    m.fleet(FleetFigures(node_up={"a": True}, probe_seconds={}))  # a probe that ended for no node
    assert durations(m) == {}


def test_apply_beside_an_apply_waits_for_it_not_for_a_daemon(tmp_path):
    from reconciler.control.lock import APPLY, CatalogLock, DaemonLocked

    path = tmp_path / "daemon.lock"
    first = CatalogLock(path, "the catalog", APPLY)
    assert first.acquire() is None
    try:
        with pytest.raises(DaemonLocked) as refused:
            CatalogLock(path, "the catalog", APPLY).acquire()
    finally:
        first.release()
    import os

    assert str(refused.value).startswith(f"a reconciler apply (pid {os.getpid()}) is already acting on the catalog")
    then = str(refused.value).split("nothing was applied: ")[1]
    assert then == "run it again once that one is done"  # no word of a daemon: none runs
