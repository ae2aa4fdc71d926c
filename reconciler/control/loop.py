"""`reconciler run`: the loop that watches the catalog, resyncs on an interval, and reconciles.

One loop on the main thread does every pass, so passes never overlap and a
signal is only ever a flag: SIGHUP asks for a pass now, SIGTERM/SIGINT ask the
loop to stop after the step in progress (engines are left running; the next
daemon adopts them). Everything that wakes the loop (the file watcher thread,
the interval, a signal) only adds a reason and sets an event.

Which revision is in force is revisions.py's; the log is log.py's, the
lock lock.py's, the watcher watch.py's, metrics from a pass pass_metrics.py's, and the garbage
collection between passes collector.py's.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reconciler.record.status.write import write_catalog_status
from reconciler.decide.autoscale import look_every
from reconciler.decide.canary import out_of_sync
from reconciler.constants import Exit
from reconciler.control.collector import BetweenPasses
from reconciler.control.election import Election, View
from reconciler.control.etcd import EtcdClient, EtcdConfigError
from reconciler.control.log import EventLog
from reconciler.control.lock import DAEMON, CatalogLock, lock_path
from reconciler.control.pass_metrics import node_events, observe_pass
from reconciler.control.revisions import DaemonState, LoadFn, Revisions, short as _short
from reconciler.control.watch import FILE_CHANGE, GIT_CHANGE, Watcher
from reconciler.errors import ReconcilerError
from reconciler.record.eventlog import EventJournal, SampleRing
from reconciler.record.events import pass_events, revision_applied, revision_refused, seen_after
from reconciler.catalog.gitrev import GitCatalog, GitError
from reconciler.record.history import sample_of
from reconciler.record.metrics import Metrics, MetricsServer
from reconciler.model import Catalog
from reconciler.decide.outcomes import PassResult
from reconciler.owner import catalog_owner
from reconciler.record.status.documents import LeaderStatus
from reconciler.vocabulary import Role

LEADER_CHANGE = "leader"  # the election's thread: this daemon became (or stopped being) the leader
PassFn = Callable[..., "PassResult | None"]  # (catalog, log, *, trigger: str) -> the pass result


@dataclass
class DaemonOptions:
    interval: float = 60.0
    git_pull: bool = False
    commit_status: bool = False
    push: bool = False
    metrics_address: str | None = None
    max_passes: int | None = None
    watch: bool = True


class Daemon:
    """Owns the loop. `pass_fn(catalog, log, trigger=...)` does one reconcile of a valid catalog.

    trigger: "start", "commit", "files", "SIGHUP", "interval" or "wake" (the time the last pass asked
    for came): why this pass runs.
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
        journal: EventJournal | None = None,
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
        self.state = DaemonState()
        self.revisions = Revisions(self.root, self.git, self.load, self.log, self.state, self.options.git_pull)
        self.passes = 0
        self._reasons: set[str] = set()
        self._reasons_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping: str | None = None
        self._asked_at: float | None = None  # wall time the last pass asked to pass again (reconcile.next_pass_wanted)
        self._look_at: float | None = None  # when the loop next reads the loads between passes (_load_rose)
        self.lock = CatalogLock(lock_path(self.root, self.git), str(self.root), DAEMON)
        # Under fleet.yaml `leader:` (SPEC 14): the election, for the settings it was started with.
        self.election: Election | None = None
        self._election_for: tuple | None = None
        self._standby = False  # this pass found another daemon leading (or etcd gone): it acts on nothing
        # The event log and history samples (SPEC section 15), out of git beside the pass memory.
        self.journal = journal or EventJournal.for_catalog(self.root)
        self.samples = SampleRing(self.journal.directory)
        self._seen = self.journal.load_seen()
        self._refused_said: str | None = None  # the refused revision already in the event log

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
        died_holding = self.lock.acquire()
        if died_holding is not None:
            self.log("lock.taken-over", previous_pid=died_holding.pid, previous_role=died_holding.role,
                     lock=str(self.lock.path),
                     msg=f"the previous holder, {died_holding}, ended without releasing the lock (the kernel "
                         "released it); taking over, its engines are adopted from their records")
            self.state.took_over_from = died_holding.pid
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        for s in previous:
            signal.signal(s, self._on_signal)
        watcher = server = None
        try:
            self.revisions.restore_from_status()
            self.metrics.resync_interval.set(self.options.interval)
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
            with BetweenPasses() as collector:
                self._run_until_stopped(watcher, collector)
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
            if self.election is not None:
                self.election.stop()  # the lease handed back: a standby takes over at once
            self.lock.release()

    def _run_until_stopped(self, watcher: Watcher | None, collector: BetweenPasses) -> None:
        """The loop: wait for a reason (the resync interval, or the time the last pass asked for), then
        pass or only refresh status. A pass the last one asked for ("wake") neither pulls nor moves the
        resync, so a long drain or start, looked at every few seconds, never postpones the next pull."""
        self.request("start")
        next_resync = self.clock() + self.options.interval
        while self._stopping is None:
            reasons = self._take()
            now = self.clock()
            wake_at = self._wake_at(now)
            if not reasons and now >= next_resync:
                reasons = {"interval"}
            elif not reasons and wake_at is not None and now >= wake_at:
                reasons = {"wake"}
            if not reasons and self._load_rose(now):
                reasons = {"wake"}
            if not reasons:
                until = min(t for t in (next_resync, wake_at, self._look_at) if t is not None)
                self._wake.wait(timeout=max(0.0, until - now))
                continue
            if "watcher-failed" in reasons and watcher is not None:
                self.state.watcher_error = watcher.error
                self.log("watcher.failed", msg=f"{watcher.error}; changes are seen on the resync interval only")
            if self._wants_pass(reasons):
                self.reconcile(trigger=_trigger_name(reasons), pull=bool(reasons & {"start", "interval", "SIGHUP"}))
                collector.after_pass()  # after the pass's clock stopped, before the wait for the next
                self._look_at = None  # the pass has just read the loads: the next look is a period from now
                if reasons != {"wake"}:
                    next_resync = self.clock() + self.options.interval
                if self.options.max_passes is not None and self.passes >= self.options.max_passes:
                    self.stop("max-passes")
            else:
                self.refresh_status()

    def _wake_at(self, now: float) -> float | None:
        """The time the last pass asked for the next one (PassResult.next_pass_at: a start to judge, a
        drain, a wait that ends, an autoscaling move) on the loop's clock, where it reads `now`; None
        when it asked for none. Once that time has come this is `now` itself."""
        if self._asked_at is None:
            return None
        return now + max(0.0, self._asked_at - time.time())

    def _load_rose(self, now: float) -> bool:
        """Between passes, every autoscale.look_every(interval): whether the loads of what the last pass
        left Ready want more replicas than it saw (the pass function's load_rose, where it has one). If
        so the loop passes now, as for a wake-up: a step of load waits for no resync to be seen."""
        look = getattr(self.pass_fn, "load_rose", None)
        if look is None:
            return False
        if self._look_at is None or now < self._look_at:
            if self._look_at is None:
                self._look_at = now + look_every(self.options.interval)
            return False
        try:
            rose = look()
        except Exception as exc:  # a bug: said, and the loop goes on to its resync
            self.log("autoscale.look-failed", error=f"{type(exc).__name__}: {exc}", msg="".join(traceback.format_exc()))
            rose = []
        self._look_at = self.clock() + look_every(self.options.interval)
        if rose:
            self.log("autoscale.load-rose", models=rose,
                     msg="a look between passes found more load than the last pass read: passing now")
        return bool(rose)

    def _wants_pass(self, reasons: set[str]) -> bool:
        """A full pass, or only a status refresh? Status commits and editor saves need no pass."""
        if reasons & {"start", "interval", "SIGHUP", "wake", LEADER_CHANGE}:
            return True
        if self.git is None:
            return FILE_CHANGE in reasons
        return GIT_CHANGE in reasons and self.revisions.revision_moved()

    # ------------------------------------------------------------ one pass

    def reconcile(self, trigger: str = "manual", pull: bool = False) -> None:
        """One cycle: pull, read the revision, load it, run the pass, write status (always)."""
        started = self.clock()
        result_kind = "error"
        self._asked_at = None
        self._standby = False
        self.passes += 1
        self.metrics.pass_began()
        try:
            if pull and self.options.git_pull and self.git is not None:
                self.revisions.pull()
            refused = self.revisions.load_revision()
            catalog = self.state.in_force
            if refused:
                result_kind = "invalid"
                self._say_refused()
                self.log("pass.refused", revision=_short(self.state.attempted), errors=len(self.state.errors),
                         applied=_short(self.state.applied),
                         msg="the revision does not validate: nothing applied, the last good revision stays in force")
            elif catalog is None:
                result_kind = "invalid"
                self.log("pass.skipped", msg="no valid revision has ever been applied: nothing to do")
            elif not self._leads(catalog):
                result_kind = "standby"
                self._standby = True
                self._stand_by(catalog)
            else:
                self.log("pass.start", trigger=trigger, revision=_short(catalog.revision))
                result = self.pass_fn(catalog, self.log, trigger=trigger)
                self._asked_at = getattr(result, "next_pass_at", None)
                self._observe(result, catalog)
                self._record(result, catalog)
                result_kind = "applied"
        except ReconcilerError as exc:  # a known failure (the fleet, git): a message, and retry next pass
            self.log("pass.failed", error=str(exc))
        except Exception as exc:  # a bug: log it whole, keep the daemon alive
            self.log("pass.error", error=f"{type(exc).__name__}: {exc}", msg="".join(traceback.format_exc()))
        finally:
            if self._writes_status():
                self._write_status()
            elapsed = self.clock() - started
            self.metrics.pass_ended(result_kind, elapsed)
            self.metrics.revision(self.state.applied)
            # HEAD in force: an invalid HEAD, or one no pass has applied yet, reads 0 (the alert's 10 minutes).
            self.metrics.head_applied.set(1.0 if not self.state.errors and self.state.applied == self.state.attempted
                                          else 0.0)
            self.log("pass.end", trigger=trigger, result=result_kind, seconds=round(elapsed, 3))

    # ------------------------------------------------------------ who acts (SPEC 14)

    def _leads(self, catalog: Catalog) -> bool:
        """Whether this daemon acts on this pass: always without `leader:` in fleet.yaml; under it, only
        while the election says it leads. Hands the pass its epoch (pass_fn.leadership)."""
        settings = catalog.fleet.leader
        if settings is None:
            self._end_election()
            self.state.leader = None
            self.metrics.leader.set(1.0)
            return True
        wanted = (settings, catalog_owner(catalog))
        if self.election is None or self._election_for != wanted:
            self._end_election()
            try:
                self._start_election(catalog)
            except EtcdConfigError as exc:
                self.log("leader.config", error=str(exc), msg="this daemon cannot talk to etcd and acts on nothing "
                         "until fleet.yaml or the files change; engines keep serving")
                self.metrics.leader.set(0.0)
                return False
            self._election_for = wanted
        view = self.election.view()
        self.metrics.leader.set(1.0 if view.leading else 0.0)
        if hasattr(self.pass_fn, "leadership"):
            self.pass_fn.leadership = self.election
        if view.leading:
            since = self.election.became_leader_at or time.time()
            self.state.leader = LeaderStatus(self.election.host, _iso(since), view.epoch)
            return True
        self.log("pass.standby", role=view.role.value, leader=view.describe(),
                 msg=(f"{view.describe()} leads: this daemon stands by (its clone pulled, nothing acted on)"
                      if view.leader is not None and view.role is Role.STANDBY else
                      f"not acting: {view.why or 'no leader yet'}"))
        return False

    def _stand_by(self, catalog: Catalog) -> None:
        """A standby keeps its view of the fleet warm (SPEC 14: it may probe, read-only): the pass's
        stand_by, where it has one, probes every node and acts on nothing, so that a takeover's first
        pass finds its connections open instead of opening a fleet's worth."""
        stand_by = getattr(self.pass_fn, "stand_by", None)
        if stand_by is not None:
            stand_by(catalog, self.log)

    def _writes_status(self) -> bool:
        """Status is the leader's to write and commit (SPEC 14): not a standby's, nor a leader's that lost
        its lease during the pass."""
        if self._standby:
            return False
        return self.election is None or self.election.epoch() is not None

    def _start_election(self, catalog: Catalog) -> None:
        settings = catalog.fleet.leader

        def path(name: str | None) -> str | None:  # a relative TLS file is the catalog's
            return None if name is None else os.path.join(catalog.root, os.path.expanduser(name))

        client = EtcdClient(settings.endpoints, ca_file=path(settings.ca_file), cert_file=path(settings.cert_file),
                            key_file=path(settings.key_file))
        self.election = Election(client, catalog_owner(catalog), settings.lease_s, log=self.log,
                                 on_change=self._on_leadership)
        self.election.start(wait_s=client.timeout_s * len(settings.endpoints) + 1.0)

    def _on_leadership(self, view: View) -> None:
        """From the election's thread: a new leader passes at once, a deposed one says so at once."""
        self.metrics.leader.set(1.0 if view.leading else 0.0)
        self.request(LEADER_CHANGE)

    def _end_election(self) -> None:
        if self.election is not None:
            self.election.stop()
            self.election = None
            self._election_for = None

    def refresh_status(self) -> None:
        """No pass: only bring the git facts in status up to date (uncommitted edits, branch)."""
        if not self._writes_status():
            return
        try:
            self.revisions.read_worktree_facts()
        except GitError as exc:
            self.log("git.error", error=str(exc))
        self._write_status()

    def status_document(self) -> dict:
        return self.revisions.status_document()

    def _write_status(self) -> None:
        try:
            write_catalog_status(self.root, self.revisions.catalog_status())
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
        observe_pass(self.metrics, result, catalog)
        self.state.out_of_sync = tuple(out_of_sync(catalog.models, getattr(result, "rollouts", {})))
        nodes = result.inventory.nodes if result.inventory is not None else ()
        self.state.unreachable = node_events(self.log, nodes, self.state.unreachable)


    def _say_refused(self) -> None:
        """A refused revision is one event with its errors, not one per pass that keeps refusing it."""
        attempted = self.state.attempted or ""
        if attempted == self._refused_said:
            return
        self._refused_said = attempted
        self._append([revision_refused(self.state.attempted, [str(p) for p in self.state.errors], time.time())])

    def _record(self, result: PassResult | None, catalog: Catalog) -> None:
        """The pass's events and its history sample, at the edge: derived (pure), then appended."""
        if result is None or not hasattr(result, "replicas"):
            return
        now = time.time()
        events = []
        if self._seen is None or self._seen.revision != catalog.revision:
            events.append(revision_applied(catalog.revision, now))
        events += pass_events(self._seen, result, now)
        self._seen = seen_after(result, self._seen)
        self._append(events)
        try:
            self.samples.append(sample_of(result, catalog, now))
            self.journal.save_seen(self._seen)
        except OSError as exc:  # the history is worth a log line, never a pass
            self.log("events.error", error=str(exc))

    def _append(self, events) -> None:
        try:
            self.journal.append(events)
        except OSError as exc:
            self.log("events.error", error=str(exc))


def _trigger_name(reasons: set[str]) -> str:
    for name in ("SIGHUP", "start", LEADER_CHANGE, GIT_CHANGE, FILE_CHANGE, "interval", "wake"):
        if name in reasons:
            return {"git": "commit"}.get(name, name)
    return ",".join(sorted(reasons))


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _default_load(path: str) -> Catalog:
    from reconciler.catalog import load_catalog

    return load_catalog(path)
