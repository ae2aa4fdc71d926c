"""Watching the catalog: a thread that says whether git refs or working-tree files changed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterable

from reconciler.constants import STATUS_DIR
from reconciler.control.lock import LOCK_NAME

GIT_CHANGE, FILE_CHANGE = "git", "files"
_EDITOR_JUNK = (".swp", ".swx", "~", ".tmp")


class Watcher:
    """A thread that reports which kind of thing changed: git refs, or working-tree files.

    status/ is ignored, so writing status never wakes the loop; inside git's
    directories only HEAD and refs count (a commit, a checkout, a fetch that
    moved a branch), never objects, the index or our own snapshots.
    """

    def __init__(self, root: Path, git_dirs: Iterable[Path], notify: Callable[[set[str]], None], step_ms: int = 50):
        self.root = root
        self.git_dirs = tuple(dict.fromkeys(Path(d) for d in git_dirs))
        self.notify = notify
        self.step_ms = step_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)
        self._ready = threading.Event()
        self.error: str | None = None

    def classify(self, path: str) -> str | None:
        p = Path(path)
        for gd in self.git_dirs:
            if p == gd or gd in p.parents:
                rel = p.relative_to(gd).parts
                if not rel or rel[-1].endswith(".lock"):
                    return None
                if rel in (("HEAD",), ("packed-refs",)) or rel[0] == "refs":
                    return GIT_CHANGE
                return None
        try:
            rel = p.relative_to(self.root).parts
        except ValueError:
            return None
        if not rel or rel[0] in (STATUS_DIR, ".git", LOCK_NAME) or rel[-1] == LOCK_NAME:
            return None
        if any(part.startswith(".#") for part in rel) or rel[-1].endswith(_EDITOR_JUNK):
            return None
        return FILE_CHANGE

    def _run(self) -> None:
        import watchfiles

        paths = [self.root] + [d for d in self.git_dirs if not (d == self.root or self.root in d.parents)]
        try:
            for changes in watchfiles.watch(
                *paths,
                watch_filter=lambda _c, path: self.classify(path) is not None,
                step=self.step_ms,
                debounce=1600,
                stop_event=self._stop,
                rust_timeout=200,
                # The first (empty) yield says the watches are in place; see start().
                yield_on_timeout=True,
                raise_interrupt=False,
            ):
                self._ready.set()
                kinds = {k for _c, path in changes if (k := self.classify(path))}
                if kinds:
                    self.notify(kinds)
        except Exception as exc:  # the interval resync still works without a watcher; say so
            self.error = str(exc)
            self.notify({"watcher-failed"})
        finally:
            self._ready.set()

    def start(self, ready_timeout_s: float = 5.0) -> None:
        """Start watching, and return once the watches are in place (or after ready_timeout_s).

        Without the wait, an edit made right after the first pass could land before the
        watcher thread has set up its watches, and be seen only at the next resync.
        """
        self._thread.start()
        self._ready.wait(ready_timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
