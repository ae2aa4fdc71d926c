"""The catalog's revision is a git commit, and what is applied is what is committed.

The working tree is where people edit, save half a file, and try things: the
daemon never loads it. It exports the committed tree of a revision into a
private snapshot under the repository's git directory and loads that, so an
uncommitted edit or a file half-written when the watcher fires is never applied.

The revision of the catalog is the last commit that changed anything in the
catalog other than `status/`: the one definition `plan`, `apply`, the daemon
and `status` all use (catalog_revision_of), because it is the commit a person
means when they ask "what runs": the last change to what they declared. Status commits (`--commit-status`) move HEAD but
change nothing desired, so they leave the revision alone: status that names
the revision does not change, the next status commit never happens, and the
loop "status commit -> new HEAD -> pass -> status names new HEAD -> commit"
cannot start.

Every git call is an argv list through subprocess; nothing is spliced into a
shell line.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.constants import STATUS_DIR
from reconciler.errors import ReconcilerError
from reconciler.vocabulary import PullState

STATUS_TRAILER = "Reconciler-Status-For"
# Identity used for status commits only when the repository has none configured.
BOT_NAME, BOT_EMAIL = "llm-reconciler", "llm-reconciler@localhost"


class GitError(ReconcilerError):
    def __init__(self, argv: list[str], rc: int, stderr: str):
        self.argv, self.rc, self.stderr = argv, rc, stderr.strip()
        super().__init__(f"git {' '.join(argv)} failed ({rc}): {self.stderr}")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # A daemon has no terminal: never wait for a password prompt or a pager.
    env.update(GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", LC_ALL="C", GIT_OPTIONAL_LOCKS="0")
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


def git(cwd: str | os.PathLike, *args: str, check: bool = True, timeout: float = 60.0, binary: bool = False):
    """Run one git command in `cwd`; returns CompletedProcess (stdout text unless binary)."""
    argv = list(args)
    try:
        proc = subprocess.run(
            ["git", *argv], cwd=cwd, env=_env(), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise GitError(argv, -1, f"timed out after {timeout:g}s") from exc
    except OSError as exc:
        raise GitError(argv, -1, f"cannot run git: {exc.strerror}") from exc
    if check and proc.returncode != 0:
        raise GitError(argv, proc.returncode, proc.stderr.decode(errors="replace"))
    if not binary:
        proc.stdout = proc.stdout.decode(errors="replace")
        proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def catalog_revision_of(root: str | os.PathLike) -> str | None:
    """The catalog's revision (see the module docstring) for the catalog directory `root`.

    None when `root` is not in a git working tree, has no commit touching it, or git cannot run:
    a plan of a plain directory has no revision, it is not an error.
    """
    try:
        repo = GitCatalog.open(root)
        return repo.catalog_revision() if repo is not None else None
    except GitError:
        return None


@dataclass(frozen=True)
class PullOutcome:
    """What `--git-pull` found. `state` is stable (goes into status); `message` says why."""

    state: PullState
    upstream: str | None = None
    message: str = ""
    old_head: str | None = None
    new_head: str | None = None

    @property
    def problem(self) -> bool:
        return self.state in (PullState.REFUSED, PullState.FETCH_FAILED)


@dataclass(frozen=True)
class StatusCommit:
    commit: str | None  # None: nothing under status/ changed
    pushed: bool = False
    message: str = ""


@dataclass
class GitCatalog:
    """A catalog directory inside a git working tree (the catalog may be a subdirectory)."""

    root: Path  # the catalog directory, absolute
    toplevel: Path
    prefix: str  # catalog dir relative to toplevel, "" or "sub/dir/"
    git_dir: Path  # this worktree's git dir (HEAD lives here)
    common_dir: Path  # refs and objects live here (same as git_dir unless a linked worktree)
    _export_cache: dict[str, Path] = field(default_factory=dict, repr=False)

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, root: str | os.PathLike) -> "GitCatalog | None":
        """The repository holding `root`, or None when `root` is not in a git working tree."""
        root = Path(root).resolve()
        proc = git(
            root, "rev-parse", "--show-toplevel", "--show-prefix", "--absolute-git-dir", "--git-common-dir", check=False
        )
        if proc.returncode != 0:
            return None
        lines = proc.stdout.splitlines()
        if len(lines) < 4:  # --show-prefix prints an empty line at the top level
            lines.insert(1, "")
        toplevel, prefix, git_dir, common = lines[0], lines[1], lines[2], lines[3]
        common_dir = Path(common) if os.path.isabs(common) else (root / common)
        return cls(root, Path(toplevel), prefix, Path(git_dir), common_dir.resolve())

    @property
    def private_dir(self) -> Path:
        """Where the daemon keeps its lock and snapshots: inside the git dir, never in the working tree."""
        name = "llm-reconciler" if not self.prefix else "llm-reconciler-" + self.prefix.strip("/").replace("/", "--")
        return self.git_dir / name

    # ---------------------------------------------------------------- reading

    def head(self) -> str | None:
        proc = git(self.root, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def branch(self) -> str | None:
        """The checked-out branch, or None on a detached HEAD."""
        proc = git(self.root, "symbolic-ref", "-q", "--short", "HEAD", check=False)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def catalog_revision(self) -> str | None:
        """The last commit that changed the catalog outside status/ (None: no such commit)."""
        proc = git(self.root, "log", "-1", "--format=%H", "HEAD", "--", ".", f":(exclude){STATUS_DIR}", check=False)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def has_commit(self, revision: str) -> bool:
        return git(self.root, "cat-file", "-e", f"{revision}^{{commit}}", check=False).returncode == 0

    def uncommitted(self) -> list[str]:
        """Catalog paths (relative to the catalog) whose working copy differs from HEAD, status/ excepted."""
        proc = git(
            self.root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ".", f":(exclude){STATUS_DIR}",
            check=False,
        )
        if proc.returncode != 0:
            return []
        out, entries = proc.stdout.split("\0"), []
        i = 0
        while i < len(out):
            item = out[i]
            i += 1
            if len(item) < 4:
                continue
            code, path = item[:2], item[3:]
            if code[0] in "RC":  # renames carry the source path as the next entry
                i += 1
            if self.prefix and path.startswith(self.prefix):
                path = path[len(self.prefix):]
            entries.append(path)
        return sorted(set(entries))

    def export(self, revision: str) -> Path:
        """The committed catalog tree of `revision` (status/ left out), as a private directory.

        Snapshots live under the git dir, named by revision, written to a temporary
        name and renamed into place, so a daemon killed mid-export never loads half a tree.
        """
        cached = self._export_cache.get(revision)
        if cached is not None and cached.is_dir():
            return cached
        trees = self.private_dir / "trees"
        dest = trees / revision
        if not dest.is_dir():
            trees.mkdir(parents=True, exist_ok=True)
            treeish = f"{revision}:{self.prefix}" if self.prefix else revision
            data = git(self.toplevel, "archive", "--format=tar", treeish, binary=True).stdout
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=trees))
            try:
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    members = [
                        m for m in tar.getmembers()
                        if m.name != STATUS_DIR and not m.name.startswith(STATUS_DIR + "/")
                    ]
                    tar.extractall(tmp, members=members, filter="data")
                os.replace(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self._export_cache[revision] = dest
        return dest

    def prune_trees(self, keep: set[str | None]) -> None:
        """Drop snapshots other than `keep` (the revision in force and the one last attempted)."""
        keep = {r for r in keep if r}
        self._export_cache = {r: p for r, p in self._export_cache.items() if r in keep}
        try:
            entries = list((self.private_dir / "trees").iterdir())
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)

    # ---------------------------------------------------------------- pulling

    def upstream(self) -> str | None:
        proc = git(self.root, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}", check=False)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def _rev(self, ref: str) -> str | None:
        proc = git(self.root, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", check=False)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def _is_ancestor(self, a: str, b: str) -> bool:
        return git(self.root, "merge-base", "--is-ancestor", a, b, check=False).returncode == 0

    def _status_only(self, commit: str) -> bool:
        proc = git(self.root, "diff-tree", "--no-commit-id", "--name-only", "-r", "--root", commit, check=False)
        status_prefix = self.prefix + STATUS_DIR + "/"
        paths = [p for p in proc.stdout.splitlines() if p]
        return bool(paths) and all(p.startswith(status_prefix) for p in paths)

    def pull(self, timeout: float = 120.0) -> PullOutcome:
        """Fetch the upstream branch and move HEAD to it when that loses nothing.

        Fast-forward when possible. When upstream was rewritten (force-pushed),
        follow it only if every commit that would drop out of HEAD's history was
        either in the upstream before this fetch (upstream itself chose to drop
        it) or is one of our own status commits (regenerated on the next pass);
        a commit made only here by a person is never discarded: refuse, keep the
        revision in force, and say how to follow upstream by hand. `reset
        --keep` (never --hard) so an uncommitted edit is kept or the move refused.
        """
        branch = self.branch()
        if branch is None:
            return PullOutcome(PullState.DETACHED, None, "HEAD is detached: nothing to pull; the committed HEAD is applied as is")
        upstream = self.upstream()
        if upstream is None:
            return PullOutcome(PullState.NO_UPSTREAM, None, f"branch {branch} has no upstream: nothing to pull")
        before_upstream = self._rev(upstream)
        failed = self._fetch(branch, upstream, timeout)
        if failed is not None:
            return failed
        head, up = self.head(), self._rev(upstream)
        if up is None:
            return PullOutcome(PullState.NO_UPSTREAM, upstream, f"upstream {upstream} has no commits")
        if head == up:
            return PullOutcome(PullState.UP_TO_DATE, upstream, "", head, head)
        if head is None or self._is_ancestor(head, up):
            return self._fast_forward(upstream, head, up)
        if self._is_ancestor(up, head):
            return PullOutcome(PullState.AHEAD, upstream, f"{branch} is ahead of {upstream}", head, head)
        return self._follow_rewrite(branch, upstream, before_upstream, head, up)

    def _fetch(self, branch: str, upstream: str, timeout: float) -> PullOutcome | None:
        """Fetch the branch's remote; None when that worked, else the outcome that says why not."""
        remote = git(self.root, "config", "--get", f"branch.{branch}.remote", check=False).stdout.strip() or "origin"
        fetch = git(self.root, "fetch", "--quiet", "--no-tags", remote, check=False, timeout=timeout)
        if fetch.returncode != 0:
            msg = fetch.stderr.strip().splitlines()[-1:] or ["unknown error"]
            return PullOutcome(PullState.FETCH_FAILED, upstream, f"git fetch {remote} failed: {msg[0]}")
        return None

    def _fast_forward(self, upstream: str, head: str | None, up: str) -> PullOutcome:
        proc = git(self.root, "merge", "--ff-only", "--quiet", up, check=False)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["merge failed"])[0]
            return PullOutcome(PullState.REFUSED, upstream, f"cannot fast-forward to {upstream} {up[:12]}: {why}", head, head)
        return PullOutcome(PullState.FAST_FORWARDED, upstream, f"fast-forwarded {_short(head)}..{up[:12]}", head, up)

    def _follow_rewrite(self, branch: str, upstream: str, before_upstream: str | None, head: str, up: str) -> PullOutcome:
        """Diverged: upstream was rewritten, or both sides moved (someone, or our status commits,
        committed here). Follow upstream only where what would be lost is ours to lose."""
        rewritten = before_upstream is not None and not self._is_ancestor(before_upstream, up)
        how = f"{upstream} was rewritten (force-push)" if rewritten else f"{branch} and {upstream} have diverged"
        rev_list = ["rev-list", head, f"^{up}"] + ([f"^{before_upstream}"] if before_upstream else [])
        local_only = [c for c in git(self.root, *rev_list).stdout.split() if c]
        personal = [c for c in local_only if not self._status_only(c)]
        if personal:
            return PullOutcome(
                PullState.REFUSED, upstream,
                f"{how} and {branch} has {len(personal)} commit(s) made only here "
                f"(newest {personal[0][:12]}); refusing to discard them, the revision in force stays; "
                f"to follow upstream: git -C {self.toplevel} reset --hard {upstream}",
                head, head,
            )
        proc = git(self.root, "reset", "--keep", "--quiet", up, check=False)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["reset failed"])[0]
            return PullOutcome(PullState.REFUSED, upstream, f"{how}; cannot move to {up[:12]}: {why}", head, head)
        dropped = f"; {len(local_only)} unpushed status commit(s) dropped (the next pass writes status again)" \
            if local_only else ""
        return PullOutcome(
            PullState.FOLLOWED_REWRITE if rewritten else PullState.FAST_FORWARDED, upstream,
            f"{how}; moved from {head[:12]} to {up[:12]}{dropped}", head, up,
        )

    # ---------------------------------------------------------------- status commits

    def commit_status(self, applied: str | None, attempted: str | None = None, push: bool = False) -> StatusCommit:
        """Commit what changed under status/ (and nothing else), naming the revision it describes."""
        # Fails loudly (GitError, logged by the daemon) on a stale .git/index.lock or an ignored status/:
        # a status history that silently stops is worse than an error line every pass.
        git(self.root, "add", "-A", "--", STATUS_DIR)
        if git(self.root, "diff", "--cached", "--quiet", "--", STATUS_DIR, check=False).returncode == 0:
            return StatusCommit(None)
        if attempted and attempted != applied:
            subject = f"status: catalog revision {attempted[:12]} refused, {_short(applied)} stays in force"
        else:
            subject = f"status: observed state for catalog revision {_short(applied)}"
        message = f"{subject}\n\n{STATUS_TRAILER}: {applied or 'none'}\n"
        ident: list[str] = []
        if not git(self.root, "config", "user.email", check=False).stdout.strip():
            ident = ["-c", f"user.name={BOT_NAME}", "-c", f"user.email={BOT_EMAIL}"]
        # `commit -- status` commits only status/, whatever else a person has staged;
        # --no-verify: a catalog's own pre-commit hook is for people's commits, not this one.
        git(self.root, *ident, "commit", "--quiet", "--no-verify", "-m", message, "--", STATUS_DIR)
        commit = self.head()
        if not push:
            return StatusCommit(commit)
        branch = self.branch()
        if branch is None:
            return StatusCommit(commit, False, "not pushed: HEAD is detached")
        proc = git(self.root, "push", "--quiet", check=False, timeout=120)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["push failed"])[-1]
            return StatusCommit(commit, False, f"push failed: {why}")
        return StatusCommit(commit, True)


def _short(rev: str | None) -> str:
    return rev[:12] if rev else "(none)"
