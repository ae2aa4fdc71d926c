"""One reconciler acting on a catalog at a time: an flock on a file in the catalog's private git
directory, taken by the daemon for its life and by `reconciler apply` for its pass."""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from reconciler.errors import ReconcilerError

LOCK_NAME = ".llm-reconciler.lock"  # for a catalog that is not a git repository

DAEMON = "daemon"  # the roles a holder writes beside its pid
APPLY = "apply"


class DaemonLocked(ReconcilerError):
    """Another reconciler holds the catalog's lock."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) the lock: the pid and role written in the lock file."""

    pid: int
    role: str

    def __str__(self) -> str:
        return f"reconciler {self.role} (pid {self.pid})"


def lock_path(root: Path, git) -> Path:
    """Inside the git directory (never the working tree, where a `git add -A` would take it);
    in the catalog directory for a catalog that is not a git repository."""
    return git.private_dir / "daemon.lock" if git is not None else root / LOCK_NAME


class CatalogLock:
    """An exclusive flock on a file; the holder's pid and role are written in it.

    flock belongs to the open file, so the kernel releases it when the holder
    exits however it exits (SIGKILL included): a lock file left by a crashed
    holder is just a file, and the next one takes it.
    """

    def __init__(self, path: Path, what: str, role: str = DAEMON):
        self.path, self.what, self.role = path, what, role
        self._fd: int | None = None

    def acquire(self) -> Holder | None:
        """Take the lock or raise DaemonLocked naming the holder. Returns the holder that died holding
        it (its pid was still in the file: a clean release empties the file), else None."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # a catalog this user cannot write, a directory in the lock's place
            whose = "the daemon's lock" if self.role == DAEMON else "the catalog's lock"
            raise ReconcilerError(f"cannot create {whose} {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise DaemonLocked(self._refusal(holder)) from None
            raise ReconcilerError(f"cannot lock {self.path}: {exc.strerror}") from exc
        previous = _read_holder(fd)
        if previous is not None and previous.pid == os.getpid():
            previous = None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.role}\n".encode(), 0)
        self._fd = fd
        return previous

    def _refusal(self, holder: Holder | None) -> str:
        # After the command line's own "reconciler: " prefix, "a reconciler daemon (pid N) ..."
        who = f"a {holder}" if holder is not None else "another reconciler process"
        if self.role == APPLY:
            if holder is not None and holder.role == DAEMON:
                then = (f"the daemon applies what is committed (`kill -HUP {holder.pid}` asks it for a pass now), "
                        "or stop it to apply by hand")
            else:
                then = "run it again once that one is done"
            return f"{who} is already acting on {self.what} (lock {self.path}); nothing was applied: {then}"
        if holder is not None and holder.role == APPLY:
            return f"{who} is acting on {self.what} (lock {self.path}); exiting: start the daemon once it is done"
        who = f"another {holder}" if holder is not None else who
        return f"{who} is already running on {self.what} (lock {self.path}); exiting"

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def _read_holder(fd: int) -> Holder | None:
    """The `pid role` line a holder wrote; a bare pid (written before roles) is a daemon's."""
    try:
        words = os.pread(fd, 64, 0).decode(errors="replace").split()
    except OSError:
        return None
    if not words or not words[0].isdigit():
        return None
    return Holder(int(words[0]), words[1] if len(words) > 1 and words[1] in (DAEMON, APPLY) else DAEMON)
