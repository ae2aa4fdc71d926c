"""One daemon per catalog: an flock on a file in the catalog's private git directory."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from reconciler.daemon.events import EventLog
from reconciler.errors import ReconcilerError

LOCK_NAME = ".llm-reconciler.lock"  # for a catalog that is not a git repository


class DaemonLocked(ReconcilerError):
    pass


class CatalogLock:
    """An exclusive flock on a file; the holder's pid is written in it.

    flock belongs to the open file, so the kernel releases it when the holder
    exits however it exits (SIGKILL included): a lock file left by a crashed
    daemon is just a file, and the next daemon takes it.
    """

    def __init__(self, path: Path, what: str):
        self.path, self.what = path, what
        self._fd: int | None = None

    def acquire(self, log: EventLog) -> int | None:
        """Take the lock or raise DaemonLocked naming the holder. Returns the pid of a daemon that
        died holding it (its pid was still in the file: a clean exit empties the file), else None."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # a catalog this user cannot write, a directory in the lock's place
            raise ReconcilerError(f"cannot create the daemon's lock {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                who = f"pid {holder}" if holder else "another process"
                raise DaemonLocked(
                    f"another reconciler daemon ({who}) is already running on {self.what} (lock {self.path}); exiting"
                ) from None
            raise ReconcilerError(f"cannot lock {self.path}: {exc.strerror}") from exc
        previous = _read_pid(fd)
        if previous == os.getpid():
            previous = None
        if previous:
            log("lock.taken-over", previous_pid=previous, lock=str(self.path),
                msg="the previous daemon ended without stopping cleanly (the kernel released its lock); taking over, "
                    "its engines are adopted from their records")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return previous

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
