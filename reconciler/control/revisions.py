"""Which revision is in force: pulling, reading what is committed, loading it, and saying so in status.

What is applied is what is committed (see gitrev.py). A revision that does not
validate applies nothing; the last good revision stays in force, and
status/catalog.yaml says what was attempted, what is applied and every error.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reconciler.constants import STATUS_DIR
from reconciler.control.log import EventLog
from reconciler.errors import CatalogInvalid, Problem
from reconciler.catalog.gitrev import GitCatalog, GitError, PullOutcome
from reconciler.catalog.load import catalog_tree
from reconciler.model import Catalog
from reconciler.record.status.documents import CatalogStatus, LeaderStatus, Upstream, catalog_document
from reconciler.vocabulary import PullState

DETACHED = "HEAD is detached: the commit checked out is applied; --git-pull has no branch to follow"

LoadFn = Callable[[str], Catalog]


@dataclass
class DaemonState:
    attempted: str | None = None  # last revision attempted
    attempted_any: bool = False
    in_force: Catalog | None = None  # the last good catalog
    applied: str | None = None  # its revision
    errors: list[Problem] = field(default_factory=list)
    uncommitted: list[str] = field(default_factory=list)
    branch: str | None = None
    pull: PullOutcome | None = None
    detached: bool = False
    no_commit: bool = False
    watcher_error: str | None = None
    took_over_from: int | None = None  # pid of a daemon that died holding the lock
    unreachable: set[str] = field(default_factory=set)  # nodes the last pass found unreachable
    out_of_sync: tuple[str, ...] = ()  # models whose canary rollout of HEAD's spec was aborted (SPEC 13)
    leader: LeaderStatus | None = None  # under `leader:` in fleet.yaml, while this daemon leads (SPEC 14)


def directory_stamp(root: Path) -> tuple:
    """What the catalog's files are now, by their metadata: every folder the loader looks in
    (catalog_tree: not status/, not hidden folders) and every file in them, with its size, inode and
    modification and change times (ns). A file written in place changes its times; one replaced by a
    rename changes its inode. A file the catalog names outside itself (a TLS file under `leader:`) is
    checked again when the catalog changes, as a git catalog's are at its next commit."""
    stamp: list[tuple] = []
    for dirpath, filenames in catalog_tree(root):
        stamp.append((os.path.relpath(dirpath, root),))  # a folder by its name: its files say the rest
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:  # gone while walked: the next pass sees the rest
                continue
            stamp.append((os.path.relpath(path, root), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamp)


class Revisions:
    """The catalog's revisions as the daemon sees them; every fact lands in `state`."""

    def __init__(self, root: Path, git: GitCatalog | None, load: LoadFn, log: EventLog, state: DaemonState,
                 git_pull: bool):
        self.root, self.git, self.load, self.log, self.state = root, git, load, log, state
        self.git_pull = git_pull
        # A catalog that is not a git repository: the stamp of the files last loaded, and whether
        # they were refused (directory_stamp).
        self._loaded_stamp: tuple | None = None
        self._loaded_refused = False

    def revision_moved(self) -> bool:
        """Git refs moved: is there a catalog revision not yet attempted? (A status commit is not one.)"""
        try:
            revision = self.git.catalog_revision()
        except GitError:
            return True
        if revision != self.state.attempted:
            return True
        self.log("head.moved", revision=short(revision), msg="git refs moved but the catalog revision did not "
                 "(a status commit, a fetch, or a commit outside the catalog): no pass")
        return False

    def pull(self) -> None:
        try:
            outcome = self.git.pull()
        except GitError as exc:
            outcome = PullOutcome(PullState.FETCH_FAILED, None, str(exc))
        previous, self.state.pull = self.state.pull, outcome
        if outcome.state in (PullState.FAST_FORWARDED, PullState.FOLLOWED_REWRITE):
            self.log("git.pull", state=outcome.state, upstream=outcome.upstream, msg=outcome.message)
        elif outcome.problem and (previous is None or previous.message != outcome.message):  # once, not per interval
            self.log("git.pull.refused", state=outcome.state, upstream=outcome.upstream, msg=outcome.message)

    def read_worktree_facts(self) -> None:
        if self.git is None:
            return
        self.state.branch = self.git.branch()
        detached = self.state.branch is None and self.git.head() is not None
        if detached and not self.state.detached:
            self.log("git.detached", msg=DETACHED)
        self.state.detached = detached
        uncommitted = self.git.uncommitted()
        if uncommitted and uncommitted != self.state.uncommitted:
            self.log("worktree.uncommitted", paths=uncommitted,
                     msg="uncommitted changes in the catalog are not applied; commit them to apply")
        self.state.uncommitted = uncommitted

    def load_revision(self) -> bool:
        """Load the committed revision if it is new. True when it was refused (invalid)."""
        st = self.state
        if self.git is None:
            # Not a git repository: the directory is the revision (said once at start-up), loaded
            # again when a file in it changed. Every pass loading a 10,000-node fleet.yaml again
            # took a tenth of an idle pass.
            stamp = directory_stamp(self.root)
            if st.attempted_any and stamp == self._loaded_stamp:
                return self._loaded_refused
            refused = self.load_tree(self.root, None, first=not st.attempted_any)
            self._loaded_stamp, self._loaded_refused = stamp, refused
            return refused
        self.read_worktree_facts()
        revision = self.git.catalog_revision()
        if st.attempted_any and revision == st.attempted:
            return False
        st.no_commit = revision is None
        if revision is None:
            st.attempted, st.attempted_any, st.errors = None, True, []
            return True
        tree = self.git.export(revision)
        try:
            refused = self.load_tree(tree, revision, first=True)
        finally:
            self.git.prune_trees({st.applied, revision})
        return refused

    def load_tree(self, tree: Path, revision: str | None, first: bool) -> bool:
        st = self.state
        st.attempted, st.attempted_any = revision, True
        try:
            catalog = self.load(str(tree))
        except CatalogInvalid as exc:
            st.errors = sorted(_relative_problem(p, tree) for p in exc.problems)
            for problem in st.errors:
                self.log("catalog.invalid", revision=short(revision), file=problem.file, line=problem.line,
                         column=problem.column, msg=problem.message)
            return True
        # Status and relative paths belong to the real catalog directory, not the snapshot.
        st.in_force = dataclasses.replace(catalog, root=str(self.root), revision=revision)
        st.applied, st.errors = revision, []
        if first and revision:
            self.log("catalog.loaded", revision=short(revision), models=len(catalog.models),
                     nodes=len(catalog.fleet.nodes))
        return False

    def restore_from_status(self) -> None:
        """After a restart, the revision in force is the one status says was applied, until a new one validates."""
        if self.git is None:
            return
        doc = _read_yaml(self.root / STATUS_DIR / "catalog.yaml")
        previous = doc.get("last_applied_revision") if isinstance(doc, dict) else None
        if not isinstance(previous, str) or not self.git.has_commit(previous):
            return
        try:
            catalog = self.load(str(self.git.export(previous)))
        except (CatalogInvalid, GitError):
            return
        self.state.in_force = dataclasses.replace(catalog, root=str(self.root), revision=previous)
        self.state.applied = previous

    # ------------------------------------------------------------ status/catalog.yaml

    def catalog_status(self) -> CatalogStatus:
        st = self.state
        upstream = None
        if self.git is not None and self.git_pull and st.pull is not None:
            shown = PullState.UP_TO_DATE if st.pull.state == PullState.FAST_FORWARDED else st.pull.state
            upstream = Upstream(st.pull.upstream, shown,
                                st.pull.message if st.pull.problem else "")
        return CatalogStatus(
            st.attempted, st.applied, self.message(), tuple(st.errors),
            # Never HEAD's own id here: a status commit moves HEAD, and status naming it would
            # change with every status commit, which would then need another status commit.
            branch=st.branch if self.git is not None else None,
            uncommitted=tuple(st.uncommitted) if self.git is not None else None,
            upstream=upstream, warnings=tuple(self.warnings()), out_of_sync=st.out_of_sync,
            leader=self.state.leader,
        )

    def status_document(self) -> dict:
        return catalog_document(self.catalog_status())

    def warnings(self) -> list[str]:
        st = self.state
        warnings = []
        if st.took_over_from:
            warnings.append(f"this daemon took over from one (pid {st.took_over_from}) that ended without stopping "
                            "cleanly; what it had started was adopted")
        if st.detached:
            warnings.append(DETACHED)
        if st.watcher_error:
            warnings.append(f"the file watcher failed ({st.watcher_error}): changes are seen on the resync interval only")
        if st.uncommitted:
            warnings.append("uncommitted changes are not applied: " + ", ".join(st.uncommitted))
        return warnings

    def message(self) -> str:
        """One line on the last attempt; no clock and no counters, so it changes only when the facts do."""
        st = self.state
        if self.git is None:
            head = "not a git repository: the directory is applied as it is"
            return head if not st.errors else f"{head}; it does not validate ({_errors(st.errors)}): nothing applied"
        if st.no_commit:
            return "the catalog has no commit yet: nothing is applied until fleet.yaml and models/ are committed"
        if st.errors:
            kept = f"{st.applied[:12]} stays in force" if st.applied else "no revision has been applied yet"
            return f"revision {short(st.attempted)} refused ({_errors(st.errors)}); {kept}"
        if st.applied:
            return f"revision {st.applied[:12]} applied"
        return "waiting for the first pass"


def _errors(errors) -> str:
    return f"{len(errors)} error{'s' if len(errors) != 1 else ''}"


def short(revision: str | None) -> str | None:
    return revision[:12] if revision else None


def _relative_problem(problem: Problem, tree: Path) -> Problem:
    """Errors name files as the user knows them (fleet.yaml), never our private snapshot path."""
    path = problem.file
    try:
        if path and os.path.isabs(path):
            path = str(Path(path).resolve().relative_to(tree.resolve()))
    except ValueError:
        pass
    return dataclasses.replace(problem, file=path) if path != problem.file else problem


def _read_yaml(path: Path) -> Any:
    import yaml

    from reconciler import pyyaml_bounded

    try:
        return pyyaml_bounded.load(path.read_text(), yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
