"""`reconciler run`: watch the catalog, resync on an interval, reconcile.

One loop on the main thread does every pass, so passes never overlap and a
signal is only ever a flag: SIGHUP asks for a pass now, SIGTERM/SIGINT ask the
loop to stop after the step in progress (engines are left running; the next
daemon adopts them). Everything that wakes the loop (the file watcher thread,
the interval, a signal) only adds a reason and sets an event.

What is applied is what is committed (see gitrev.py). A revision that does not
validate applies nothing; the last good revision stays in force, and
status/catalog.yaml says what was attempted, what is applied and every error.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import fcntl
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TextIO

from reconciler import status as status_files
from reconciler.errors import CatalogInvalid, Problem, ReconcilerError
from reconciler.constants import STATUS_DIR, Exit
from reconciler.gitrev import GitCatalog, GitError, PullOutcome
from reconciler.metrics import FleetFigures, Metrics, MetricsServer, count_by
from reconciler.model import OBSERVED_STATES, PHASES, Catalog
from reconciler.outcomes import Decision, PassResult

LOCK_NAME = ".llm-reconciler.lock"  # for a catalog that is not a git repository
DETACHED = "HEAD is detached: the commit checked out is applied; --git-pull has no branch to follow"


class DaemonLocked(ReconcilerError):
    pass


# --------------------------------------------------------------------------
# Logs: one line per decision
# --------------------------------------------------------------------------


class EventLog:
    """`log(event, **fields)`: a line of text (default) or one JSON object per line.

    Also accepts `log("a sentence")`, so a pass can log free text through it.
    """

    def __init__(self, fmt: str = "text", stream: TextIO | None = None, clock: Callable[[], float] = time.time):
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self._lock = threading.Lock()

    def __call__(self, event: Any = "", /, **fields: Any) -> None:
        if isinstance(event, Decision):  # the pass's log line: replica, node, action, reason, ok
            event = {"event": "decision", **event.as_dict()}
        if isinstance(event, dict):  # a pass may hand over a ready-made record
            fields = {**event, **fields}
            event = fields.pop("event", "")
        ts = _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc).isoformat(timespec="milliseconds")
        ts = ts.replace("+00:00", "Z")
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.fmt == "json":
            line = json.dumps({"ts": ts, "level": event_level(str(event), fields), "event": str(event), **fields},
                              default=str, sort_keys=False)
        else:
            parts = [ts, str(event)]
            message = fields.pop("msg", None)
            for key, value in fields.items():
                parts.append(f"{key}={_text_value(value)}")
            if message:
                parts.append("- " + str(message))
            line = " ".join(parts)
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()


# Events that need a person (error) or may (warning); everything else is info. By event name,
# so a log pipeline can alert on level without knowing the reconciler's vocabulary.
ERROR_EVENTS = frozenset({"pass.error", "pass.failed", "status.error", "git.error", "catalog.invalid"})
WARNING_EVENTS = frozenset({"pass.refused", "node.unreachable", "watcher.failed", "head.moved"})


def event_level(event: str, fields: Mapping[str, Any]) -> str:
    if event in ERROR_EVENTS or event.endswith(".error"):
        return "error"
    if event == "decision" and fields.get("ok") is False:
        return "error"
    if event in WARNING_EVENTS or event.endswith(".failed"):
        return "warning"
    return "info"


def _text_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value)
    if not text or any(c.isspace() for c in text) or '"' in text:
        return json.dumps(text)
    return text


# --------------------------------------------------------------------------
# One daemon per catalog
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Watching the catalog
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------

PassFn = Callable[..., "PassResult | None"]  # (catalog, log, *, trigger: str) -> the pass result
LoadFn = Callable[[str], Catalog]


@dataclass
class DaemonOptions:
    interval: float = 60.0
    git_pull: bool = False
    commit_status: bool = False
    push: bool = False
    metrics_address: str | None = None
    max_passes: int | None = None
    watch: bool = True


@dataclass
class _State:
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


class Daemon:
    """Owns the loop. `pass_fn(catalog, log, trigger=...)` does one reconcile of a valid catalog.

    trigger: "start", "commit", "files", "SIGHUP" or "interval": why this pass runs.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        pass_fn: PassFn,
        load: LoadFn | None = None,
        options: DaemonOptions | None = None,
        log: EventLog | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ReconcilerError(f"{root}: no such catalog directory")
        self.pass_fn = pass_fn
        if hasattr(pass_fn, "pending"):
            # A pass may ask whether work waits (a commit during a slow probe) and stop waiting early.
            pass_fn.pending = self._pending
        self.load = load or _default_load
        self.options = options or DaemonOptions()
        self.log = log or EventLog()
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.git = GitCatalog.open(self.root)
        self.state = _State()
        self.passes = 0
        self._reasons: set[str] = set()
        self._reasons_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping: str | None = None
        lock_path = self.git.private_dir / "daemon.lock" if self.git else self.root / LOCK_NAME
        self.lock = CatalogLock(lock_path, str(self.root))

    # ------------------------------------------------------------ waking

    def request(self, *reasons: str) -> None:
        with self._reasons_lock:
            self._reasons.update(reasons)
        self._wake.set()

    def _pending(self) -> bool:
        return self._wake.is_set()

    def stop(self, why: str) -> None:
        self._stopping = why
        self._wake.set()

    def _take(self) -> set[str]:
        with self._reasons_lock:
            reasons, self._reasons = self._reasons, set()
            self._wake.clear()
        return reasons

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            self.request("SIGHUP")
        elif self._stopping is not None and self._stopping != "max-passes":
            # Asked twice: the operator does not want to wait for the step in progress.
            self.log("daemon.interrupted", signal=name, msg="second stop signal: exiting now, engines left running")
            raise SystemExit(128 + signum)
        else:
            self.log("daemon.stopping", signal=name, msg="finishing the step in progress, then exiting")
            self.stop(name)

    # ------------------------------------------------------------ the loop

    def serve(self) -> int:
        """Run until a stop signal (or --max-passes). Must be called on the main thread."""
        self.state.took_over_from = self.lock.acquire(self.log)
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        for s in previous:
            signal.signal(s, self._on_signal)
        watcher = server = None
        try:
            self._restore_from_status()
            if self.options.metrics_address:
                server = MetricsServer(self.metrics, self.options.metrics_address)
                server.start()
                host, port = server.address
                self.log("metrics.serving", address=f"{host}:{port}", msg="Prometheus metrics at /metrics")
            if self.options.watch:
                git_dirs = [self.git.git_dir, self.git.common_dir] if self.git else []
                watcher = Watcher(self.root, git_dirs, lambda kinds: self.request(*kinds))
                watcher.start()
            self.log("daemon.started", catalog=str(self.root), pid=os.getpid(), interval=self.options.interval,
                     git=("yes" if self.git else "no: the working tree is applied as it is"))
            self.request("start")
            next_resync = self.clock() + self.options.interval
            while self._stopping is None:
                reasons = self._take()
                now = self.clock()
                if not reasons and now >= next_resync:
                    reasons = {"interval"}
                if not reasons:
                    self._wake.wait(timeout=max(0.0, next_resync - now))
                    continue
                if "watcher-failed" in reasons and watcher is not None:
                    self.state.watcher_error = watcher.error
                    self.log("watcher.failed", msg=f"{watcher.error}; changes are seen on the resync interval only")
                if self._wants_pass(reasons):
                    self.reconcile(trigger=_trigger_name(reasons), pull=bool(reasons & {"start", "interval", "SIGHUP"}))
                    next_resync = self.clock() + self.options.interval
                    if self.options.max_passes is not None and self.passes >= self.options.max_passes:
                        self.stop("max-passes")
                else:
                    self.refresh_status()
            self.log("daemon.stopped", reason=self._stopping, msg="engines left running")
            return Exit.OK
        finally:
            if watcher is not None:
                watcher.stop()
            if server is not None:
                server.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
            close = getattr(self.pass_fn, "close", None)
            if callable(close):
                close()  # connections only: engines keep running
            self.lock.release()

    def _wants_pass(self, reasons: set[str]) -> bool:
        """A full pass, or only a status refresh? Status commits and editor saves need no pass."""
        if reasons & {"start", "interval", "SIGHUP"}:
            return True
        if self.git is None:
            return FILE_CHANGE in reasons
        if GIT_CHANGE in reasons:
            try:
                revision = self.git.catalog_revision()
            except GitError:
                return True
            if revision != self.state.attempted:
                return True
            self.log("head.moved", revision=_short(revision), msg="git refs moved but the catalog revision did not "
                     "(a status commit, a fetch, or a commit outside the catalog): no pass")
        return False

    # ------------------------------------------------------------ one pass

    def reconcile(self, trigger: str = "manual", pull: bool = False) -> None:
        """One cycle: pull, read the revision, load it, run the pass, write status (always)."""
        started = self.clock()
        result_kind = "error"
        self.passes += 1
        try:
            if pull and self.options.git_pull and self.git is not None:
                self._pull()
            refused = self._load_revision()
            catalog = self.state.in_force
            if refused:
                result_kind = "invalid"
                self.log("pass.refused", revision=_short(self.state.attempted), errors=len(self.state.errors),
                         applied=_short(self.state.applied),
                         msg="the revision does not validate: nothing applied, the last good revision stays in force")
            elif catalog is None:
                result_kind = "invalid"
                self.log("pass.skipped", msg="no valid revision has ever been applied: nothing to do")
            else:
                self.log("pass.start", trigger=trigger, revision=_short(catalog.revision))
                result = self.pass_fn(catalog, self.log, trigger=trigger)
                self._observe(result, catalog)
                result_kind = "applied"
        except ReconcilerError as exc:  # a known failure (the fleet, git): a message, and retry next pass
            self.log("pass.failed", error=str(exc))
        except Exception as exc:  # a bug: log it whole, keep the daemon alive
            self.log("pass.error", error=f"{type(exc).__name__}: {exc}", msg="".join(traceback.format_exc()))
        finally:
            self._write_status()
            elapsed = self.clock() - started
            self.metrics.pass_ended(result_kind, elapsed)
            self.metrics.revision(self.state.applied)
            self.log("pass.end", trigger=trigger, result=result_kind, seconds=round(elapsed, 3))

    def refresh_status(self) -> None:
        """No pass: only bring the git facts in status up to date (uncommitted edits, branch)."""
        try:
            self._read_worktree_facts()
        except GitError as exc:
            self.log("git.error", error=str(exc))
        self._write_status()

    def _pull(self) -> None:
        try:
            outcome = self.git.pull()
        except GitError as exc:
            outcome = PullOutcome("fetch-failed", None, str(exc))
        previous, self.state.pull = self.state.pull, outcome
        if outcome.state in ("fast-forwarded", "followed-rewrite"):
            self.log("git.pull", state=outcome.state, upstream=outcome.upstream, msg=outcome.message)
        elif outcome.problem and (previous is None or previous.message != outcome.message):  # once, not per interval
            self.log("git.pull.refused", state=outcome.state, upstream=outcome.upstream, msg=outcome.message)

    def _read_worktree_facts(self) -> None:
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

    def _load_revision(self) -> bool:
        """Load the committed revision if it is new. True when it was refused (invalid)."""
        st = self.state
        if self.git is None:
            # Not a git repository: the directory is the revision (said once at start-up).
            return self._load_tree(self.root, None, first=not st.attempted_any)
        self._read_worktree_facts()
        revision = self.git.catalog_revision()
        if st.attempted_any and revision == st.attempted:
            return False
        st.no_commit = revision is None
        if revision is None:
            st.attempted, st.attempted_any, st.errors = None, True, []
            return True
        tree = self.git.export(revision)
        try:
            refused = self._load_tree(tree, revision, first=True)
        finally:
            self.git.prune_trees({st.applied, revision})
        return refused

    def _load_tree(self, tree: Path, revision: str | None, first: bool) -> bool:
        st = self.state
        st.attempted, st.attempted_any = revision, True
        try:
            catalog = self.load(str(tree))
        except CatalogInvalid as exc:
            st.errors = sorted(_relative_problem(p, tree) for p in exc.problems)
            for problem in st.errors:
                self.log("catalog.invalid", revision=_short(revision), file=problem.file, line=problem.line,
                         column=problem.column, msg=problem.message)
            return True
        # Status and relative paths belong to the real catalog directory, not the snapshot.
        st.in_force = dataclasses.replace(catalog, root=str(self.root), revision=revision)
        st.applied, st.errors = revision, []
        if first and revision:
            self.log("catalog.loaded", revision=_short(revision), models=len(catalog.models),
                     nodes=len(catalog.fleet.nodes))
        return False

    def _restore_from_status(self) -> None:
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

    # ------------------------------------------------------------ status, metrics

    def status_document(self) -> dict:
        st = self.state
        doc: dict[str, Any] = {
            "last_attempted_revision": st.attempted,
            "last_applied_revision": st.applied,
            "message": self._message(),
            "errors": [
                {"file": p.file, "line": p.line, "column": p.column, "message": p.message} for p in st.errors
            ],
        }
        if self.git is not None:
            # Never HEAD's own id here: a status commit moves HEAD, and status naming it would
            # change with every status commit, which would then need another status commit.
            doc["branch"] = st.branch
            doc["uncommitted_changes"] = list(st.uncommitted)
            if self.options.git_pull and st.pull is not None:
                doc["upstream"] = {
                    "ref": st.pull.upstream,
                    "state": "up-to-date" if st.pull.state == "fast-forwarded" else st.pull.state,
                    "message": st.pull.message if st.pull.problem else "",
                }
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
        doc["warnings"] = warnings
        return doc

    def _message(self) -> str:
        """One line on the last attempt; no clock and no counters, so it changes only when the facts do."""
        st = self.state
        if self.git is None:
            head = "not a git repository: the directory is applied as it is"
            return head if not st.errors else f"{head}; it does not validate ({_errors(st.errors)}): nothing applied"
        if st.no_commit:
            return "the catalog has no commit yet: nothing is applied until fleet.yaml and models/ are committed"
        if st.errors:
            kept = f"{st.applied[:12]} stays in force" if st.applied else "no revision has been applied yet"
            return f"revision {_short(st.attempted)} refused ({_errors(st.errors)}); {kept}"
        if st.applied:
            return f"revision {st.applied[:12]} applied"
        return "waiting for the first pass"

    def _write_status(self) -> None:
        try:
            status_files.write_document(status_files.status_dir(self.root) / "catalog.yaml", self.status_document())
            self.metrics.catalog_valid.set(0.0 if self.state.errors else 1.0)
            if self.options.commit_status and self.git is not None:
                commit = self.git.commit_status(self.state.applied, self.state.attempted, push=self.options.push)
                if commit.commit:
                    self.metrics.status_commits.inc()
                    self.log("status.committed", commit=_short(commit.commit),
                             revision=_short(self.state.applied),
                             pushed=("yes" if commit.pushed else "no"), msg=commit.message or None)
        except (OSError, ReconcilerError) as exc:
            self.log("status.error", error=str(exc))

    def _observe(self, result: PassResult | None, catalog: Catalog) -> None:
        """Metrics and node events from a pass result."""
        if result is None:
            return
        for decision in result.decisions:
            self.metrics.action(decision.action, decision.ok)
        states = list(result.replicas.values())
        unplaced = [o.model for o in result.plan.unplaced] if result.plan is not None else []
        restarts = result.plan.restarts if result.plan is not None else {}
        nodes = result.inventory.nodes if result.inventory is not None else ()
        self.metrics.fleet(FleetFigures(
            phases=count_by((s.phase for s in states), PHASES),
            desired={m.name: m.replicas for m in catalog.models},
            ready={m.name: sum(1 for s in states if s.model == m.name and s.phase == "Ready") for m in catalog.models},
            unplaced={m.name: unplaced.count(m.name) for m in catalog.models},
            restarts={m.name: sum(restarts.get(rid, 0) for rid in m.replica_ids()) for m in catalog.models},
            node_states=count_by((n.state for n in nodes), OBSERVED_STATES) if nodes else {},
            node_up={n.id: n.state != "unreachable" for n in nodes},
            probe_seconds=result.probe_seconds,
        ))
        self._node_events(nodes)

    def _node_events(self, nodes) -> None:
        """One log line when a node stops answering and one when it answers again, not one per pass."""
        down = {n.id: n.reason for n in nodes if n.state == "unreachable"}
        for node, reason in sorted(down.items()):
            if node not in self.state.unreachable:
                self.log("node.unreachable", node=node, reason=reason)
        for node in sorted(self.state.unreachable):
            if node not in down and any(n.id == node for n in nodes):
                self.log("node.reachable", node=node, msg="answers again")
        self.state.unreachable = set(down)


def _trigger_name(reasons: set[str]) -> str:
    for name in ("SIGHUP", "start", GIT_CHANGE, FILE_CHANGE, "interval"):
        if name in reasons:
            return {"git": "commit"}.get(name, name)
    return ",".join(sorted(reasons))


def _errors(errors) -> str:
    return f"{len(errors)} error{'s' if len(errors) != 1 else ''}"


def _short(revision: str | None) -> str | None:
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

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _default_load(path: str) -> Catalog:
    from reconciler.catalog import load_catalog

    return load_catalog(path)
