"""What is applied is what is committed: revisions, snapshots, pulling, status commits (real git)."""

from __future__ import annotations

import pytest

from reconciler.catalog.gitrev import GitCatalog
from tests.gitcatalog import CatalogRepo, git, model_yaml

pytestmark = [pytest.mark.process]


@pytest.fixture
def repo(tmp_path):
    return CatalogRepo(tmp_path / "catalog")


@pytest.fixture
def upstream(tmp_path):
    """origin (where people commit) -> bare upstream -> deployed (where the daemon runs)."""
    origin = CatalogRepo(tmp_path / "origin")
    bare = tmp_path / "upstream.git"
    git(tmp_path, "clone", "-q", "--bare", str(origin.path), str(bare))
    git(origin.path, "remote", "add", "origin", str(bare))
    git(origin.path, "fetch", "-q", "origin")
    git(origin.path, "branch", "-q", "--set-upstream-to=origin/main")
    git(tmp_path, "clone", "-q", str(bare), str(tmp_path / "deployed"))
    deployed = CatalogRepo(tmp_path / "deployed", init=False)
    git(deployed.path, "config", "user.email", "ops@example.com")
    git(deployed.path, "config", "user.name", "Ops")
    return origin, deployed


def test_status_commits_do_not_change_the_catalog_revision(repo):
    g = GitCatalog.open(repo.path)
    revision = g.catalog_revision()
    repo.write("status/catalog.yaml", "last_applied_revision: x\n")
    repo.commit("status only")
    assert repo.head() != revision
    assert g.catalog_revision() == revision


def test_the_snapshot_holds_the_committed_tree_not_the_working_tree(repo):
    g = GitCatalog.open(repo.path)
    repo.write("models/alpha.yaml", model_yaml("alpha", 9))
    repo.write("status/catalog.yaml", "x: 1\n")
    repo.write("models/new.yaml", "half-writ")
    tree = g.export(g.catalog_revision())
    assert "replicas: 1" in (tree / "models/alpha.yaml").read_text()
    assert not (tree / "models/new.yaml").exists()
    assert not (tree / "status").exists()
    assert g.uncommitted() == ["models/alpha.yaml", "models/new.yaml"]
    assert tree.parent.parent == g.private_dir and g.git_dir in tree.parents


def test_a_catalog_in_a_subdirectory_has_its_own_revision_and_snapshot(tmp_path):
    mono = CatalogRepo(tmp_path / "mono")
    mono.write("fleets/prod/fleet.yaml", "nodes: []\n")
    catalog_commit = mono.commit("prod catalog")
    mono.write("README.md", "unrelated\n")
    mono.commit("unrelated change")
    g = GitCatalog.open(mono.path / "fleets/prod")
    assert g.prefix == "fleets/prod/"
    assert g.catalog_revision() == catalog_commit
    assert (g.export(catalog_commit) / "fleet.yaml").read_text() == "nodes: []\n"


def test_old_snapshots_are_pruned(repo):
    g = GitCatalog.open(repo.path)
    first = g.catalog_revision()
    g.export(first)
    repo.write("models/alpha.yaml", model_yaml("alpha", 2))
    second = repo.commit("bump")
    g.export(second)
    g.prune_trees({second})
    assert sorted(p.name for p in (g.private_dir / "trees").iterdir()) == [second]


def test_pull_fast_forwards(upstream):
    origin, deployed = upstream
    origin.write("models/alpha.yaml", model_yaml("alpha", 2))
    new = origin.commit("bump")
    git(origin.path, "push", "-q")
    outcome = GitCatalog.open(deployed.path).pull()
    assert (outcome.state, outcome.new_head) == ("fast-forwarded", new)
    assert deployed.head() == new


def test_force_pushed_upstream_is_followed_when_nothing_made_here_is_lost(upstream):
    origin, deployed = upstream
    base = origin.head()
    origin.write("models/alpha.yaml", model_yaml("alpha", 2))
    origin.commit("bad idea")
    git(origin.path, "push", "-q")
    GitCatalog.open(deployed.path).pull()
    # upstream rewrites history: the bad commit is gone
    git(origin.path, "reset", "-q", "--hard", base)
    origin.write("models/alpha.yaml", model_yaml("alpha", 3))
    rewritten = origin.commit("better idea")
    git(origin.path, "push", "-q", "--force")
    # and the daemon had committed status on top of the old history
    deployed.write("status/catalog.yaml", "last_applied_revision: x\n")
    deployed.commit("status")

    outcome = GitCatalog.open(deployed.path).pull()
    assert outcome.state == "followed-rewrite", outcome.message
    assert deployed.head() == rewritten


def test_force_pushed_upstream_is_refused_when_a_commit_made_only_here_would_be_lost(upstream):
    origin, deployed = upstream
    deployed.write("models/hotfix.yaml", model_yaml("hotfix", 1))
    local = deployed.commit("hotfix made on the management host")
    git(origin.path, "commit", "-q", "--amend", "-m", "rewritten initial")
    git(origin.path, "push", "-q", "--force")

    outcome = GitCatalog.open(deployed.path).pull()
    assert outcome.state == "refused" and outcome.problem
    assert "made only here" in outcome.message and local[:12] in outcome.message
    assert "reset --hard origin/main" in outcome.message
    assert deployed.head() == local


def test_pull_on_a_detached_head_or_without_upstream_changes_nothing(upstream, repo):
    _origin, deployed = upstream
    git(deployed.path, "checkout", "-q", "--detach")
    head = deployed.head()
    assert GitCatalog.open(deployed.path).pull().state == "detached"
    assert deployed.head() == head
    assert GitCatalog.open(repo.path).pull().state == "no-upstream"


def test_a_failed_fetch_is_reported_not_raised(upstream, tmp_path):
    _origin, deployed = upstream
    git(deployed.path, "remote", "set-url", "origin", str(tmp_path / "gone.git"))
    outcome = GitCatalog.open(deployed.path).pull()
    assert outcome.state == "fetch-failed" and outcome.problem and "origin" in outcome.message


def test_status_commit_takes_only_status_and_names_both_revisions(repo):
    g = GitCatalog.open(repo.path)
    repo.write("status/catalog.yaml", "x: 1\n")
    repo.write("models/other.yaml", model_yaml("other", 1))
    git(repo.path, "add", "models/other.yaml")
    result = g.commit_status("a" * 40, "b" * 40)
    assert result.commit == repo.head()
    assert git(repo.path, "show", "--name-only", "--format=", "HEAD").split() == ["status/catalog.yaml"]
    subject = git(repo.path, "log", "-1", "--format=%s").strip()
    assert subject == f"status: catalog revision {'b' * 12} refused, {'a' * 12} stays in force"
    assert g.commit_status("a" * 40).commit is None  # nothing changed: no empty commit


def test_status_commit_works_without_a_configured_identity(tmp_path, monkeypatch):
    repo = CatalogRepo(tmp_path / "c")
    git(repo.path, "config", "--unset", "user.email")
    git(repo.path, "config", "--unset", "user.name")
    monkeypatch.setenv("HOME", str(tmp_path))  # no global identity either
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    repo.write("status/catalog.yaml", "x: 1\n")
    assert GitCatalog.open(repo.path).commit_status("c" * 40).commit
    assert git(repo.path, "log", "-1", "--format=%an <%ae>").strip() == "llm-reconciler <llm-reconciler@localhost>"


def test_status_commits_are_pushed_when_asked(upstream):
    _origin, deployed = upstream
    deployed.write("status/catalog.yaml", "x: 1\n")
    result = GitCatalog.open(deployed.path).commit_status(deployed.head(), push=True)
    assert result.pushed, result.message
    assert git(deployed.path, "rev-parse", "origin/main").strip() == result.commit


def test_not_a_git_repository(tmp_path):
    assert GitCatalog.open(tmp_path) is None


def test_a_status_commit_blocked_by_a_stale_index_lock_raises_a_git_error_naming_it(repo):
    from reconciler.catalog.gitrev import GitError

    repo.write("status/catalog.yaml", "x: 1\n")
    (repo.path / ".git/index.lock").write_text("")
    with pytest.raises(GitError, match="index.lock"):
        GitCatalog.open(repo.path).commit_status("d" * 40)


def test_unpushed_status_commits_do_not_stop_following_an_upstream_that_moved_on(upstream):
    origin, deployed = upstream
    deployed.write("status/catalog.yaml", "last_applied_revision: x\n")
    deployed.commit("status (push failed)")
    origin.write("models/alpha.yaml", model_yaml("alpha", 2))
    new = origin.commit("bump")
    git(origin.path, "push", "-q")

    outcome = GitCatalog.open(deployed.path).pull()
    assert outcome.state == "fast-forwarded" and "1 unpushed status commit(s) dropped" in outcome.message
    assert deployed.head() == new
