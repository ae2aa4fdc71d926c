"""Who acts (SPEC section 14): one leader among the daemons of every clone of a catalog, elected in etcd.

The election is etcd's own recipe (clientv3/concurrency.Election), over the JSON gateway (etcd.py):
each daemon holds a lease and a campaign key under the owner's prefix, created with a transaction
that succeeds only if the key does not exist yet (create_revision == 0), attached to the lease. The
key with the lowest create_revision leads; that revision is the epoch, the fencing token every action
on a node carries. A later leader's key was created after every earlier leader's, so epochs only grow.

A leader renews its lease every retry period and stops acting once it has not renewed for the renew
deadline, two thirds of the lease (Kubernetes: 10 s of 15, Flux: 30 s of 35): the lease, renewed last
when the request was sent, cannot have expired yet, so no standby acts while it still does.

The decisions are pure (judge); the thread that talks to etcd only feeds them.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from reconciler.control.etcd import EtcdClient, EtcdUnavailable, KeyValue
from reconciler.vocabulary import Role
from reconciler.errors import parse_json

PREFIX = "/llm-reconciler/"


def election_prefix(owner: str) -> str:
    return f"{PREFIX}{owner}/election/"


def state_key(owner: str, name: str) -> str:
    return f"{PREFIX}{owner}/state/{name}"


def renew_deadline_s(lease_s: float) -> float:
    return lease_s * 2.0 / 3.0


def retry_period_s(lease_s: float) -> float:
    """How often the lease is renewed and the leader looked up (Kubernetes: 2 s of 15)."""
    return max(0.5, lease_s / 7.5)


@dataclass(frozen=True)
class Candidate:
    """A campaign key as its daemon wrote it."""

    host: str
    pid: int
    since: float  # wall time its campaign began
    create_revision: int

    @classmethod
    def of(cls, kv: KeyValue) -> "Candidate":
        try:
            doc = parse_json(kv.value)
            return cls(str(doc.get("host", "?")), int(doc.get("pid", 0)), float(doc.get("since", 0.0)),
                       kv.create_revision)
        except (ValueError, TypeError, AttributeError):
            return cls("?", 0, 0.0, kv.create_revision)


@dataclass(frozen=True)
class View:
    """What this daemon knows of the election now."""

    role: Role
    leader: Candidate | None = None  # who leads, as last seen (None: nobody, or never seen)
    epoch: int = 0  # the leader's epoch (its key's create_revision); 0 when none is known
    why: str = ""  # for NO_ETCD and a lost lease: the reason

    @property
    def leading(self) -> bool:
        return self.role is Role.LEADER

    def describe(self) -> str:
        if self.leader is None:
            return "no leader"
        return f"{self.leader.host} (pid {self.leader.pid}, epoch {self.leader.create_revision})"


def judge(*, now: float, lease_s: float, renewed_at: float | None, mine: int | None, leader: Candidate | None,
          etcd_error: str | None) -> View:
    """The role, from what was last heard from etcd (pure).

    mine: the create_revision of this daemon's campaign key (None: it has none); renewed_at: when the
    last successful renewal of its lease was sent, on the `now` clock."""
    deadline = renew_deadline_s(lease_s)
    if mine is not None and leader is not None and leader.create_revision == mine:
        if renewed_at is not None and now - renewed_at < deadline:
            return View(Role.LEADER, leader, mine)
        since = "never" if renewed_at is None else f"for {now - renewed_at:.1f}s"
        return View(Role.NO_ETCD, leader, mine,
                    f"the lease could not be renewed {since} (renew deadline {deadline:.3g}s of a {lease_s:g}s lease)"
                    + (f": {etcd_error}" if etcd_error else ""))
    if etcd_error is not None:
        return View(Role.NO_ETCD, leader, leader.create_revision if leader else 0, etcd_error)
    return View(Role.STANDBY, leader, leader.create_revision if leader else 0)


def current_leader(client: EtcdClient, owner: str) -> Candidate | None:
    """Who holds the lease for `owner` now (None: nobody); raises EtcdUnavailable."""
    first = client.range(election_prefix(owner), prefix=True, sort_by_create=True, limit=1)
    return Candidate.of(first[0]) if first else None


LogFn = Callable[..., None]


class Election:
    """Campaigns on a thread for as long as the daemon runs; `view()` says the role now."""

    def __init__(self, client: EtcdClient, owner: str, lease_s: int, *, log: LogFn,
                 on_change: Callable[[View], None] = lambda v: None, host: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.client, self.owner, self.lease_s = client, owner, int(lease_s)
        self.prefix = election_prefix(owner)
        self.log, self.on_change, self.clock = log, on_change, clock
        self.host = host or socket.gethostname()
        self._lock = threading.Lock()
        self._lease: int | None = None
        self._mine: int | None = None  # create_revision of our campaign key
        self._renewed_at: float | None = None
        self._leader: Candidate | None = None
        self._error: str | None = None
        self._heard = threading.Event()  # etcd answered (or failed) at least once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: View | None = None
        self._said = threading.Lock()
        self.became_leader_at: float | None = None  # wall time this daemon last became leader

    # ------------------------------------------------------------ the daemon's side

    def start(self, wait_s: float = 0.0) -> None:
        self._thread = threading.Thread(target=self._run, name="election", daemon=True)
        self._thread.start()
        if wait_s:
            self._heard.wait(wait_s)

    def stop(self) -> None:
        """Hand the lease back at once (a standby takes over without waiting out its TTL)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout_s * len(self.client.endpoints) + 1)
        with self._lock:
            lease, self._lease, self._mine = self._lease, None, None
        if lease is not None:
            self.client.revoke(lease)

    def view(self) -> View:
        with self._lock:
            view = judge(now=self.clock(), lease_s=self.lease_s, renewed_at=self._renewed_at, mine=self._mine,
                         leader=self._leader, etcd_error=self._error)
        self._changed(view)
        return view

    def epoch(self) -> int | None:
        """The epoch to act with, or None when this daemon may not act now."""
        view = self.view()
        return view.epoch if view.leading else None

    # ------------------------------------------------------------ state that outlives a leader

    def load_state(self, name: str) -> bytes | None:
        """What the leaders keep under `name` (the pass memory); raises EtcdUnavailable."""
        kv = self.client.get(state_key(self.owner, name))
        return kv.value if kv is not None else None

    def save_state(self, name: str, value: bytes) -> bool:
        """Written only while this daemon's campaign key is the one it created (a transaction on its
        create_revision): a deposed leader's write is refused by etcd. Raises EtcdUnavailable."""
        with self._lock:
            lease, mine = self._lease, self._mine
        if lease is None or mine is None:
            return False
        return self.client.put_if(state_key(self.owner, name), value, guard_key=f"{self.prefix}{lease:x}",
                                  guard_create_revision=mine)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self.view()  # says so the moment a renew deadline passes, not at the next pass
            self._stop.wait(retry_period_s(self.lease_s))

    def tick(self) -> None:
        """One round with etcd: renew (or take) the lease, campaign if not yet, look up the leader."""
        sent = self.clock()
        try:
            lease = self._lease
            if lease is None:
                lease = self.client.grant(self.lease_s)
                with self._lock:
                    self._lease, self._mine, self._renewed_at = lease, None, sent
            elif self.client.keepalive(lease) > 0:
                with self._lock:
                    self._renewed_at = sent
            else:  # expired while we could not reach etcd: our key went with it; campaign anew
                with self._lock:
                    self._lease = self._mine = self._renewed_at = None
                self.log("leader.lease-expired", msg="this daemon's lease expired; it campaigns again")
                return self.tick()
            if self._mine is None:
                value = json.dumps({"host": self.host, "pid": os.getpid(), "since": time.time()}).encode()
                _, kv = self.client.create(f"{self.prefix}{lease:x}", value, lease)
                with self._lock:
                    self._mine = kv.create_revision if kv is not None else None
            first = self.client.range(self.prefix, prefix=True, sort_by_create=True, limit=1)
            with self._lock:
                self._leader = Candidate.of(first[0]) if first else None
                self._error = None
        except EtcdUnavailable as exc:
            with self._lock:
                self._error = str(exc)
        finally:
            self._heard.set()

    def _changed(self, view: View) -> None:
        with self._said:  # the loop and the thread both ask: each change said once
            last, self._last = self._last, view
            if last is not None and (last.role, last.epoch) == (view.role, view.epoch):
                return
            self._say(view, last)
        self.on_change(view)

    def _say(self, view: View, last: View | None) -> None:
        if view.leading:
            self.became_leader_at = time.time()
            self.log("leader.elected", epoch=view.epoch, host=self.host,
                     msg=f"this daemon leads the catalog's fleet (epoch {view.epoch}); it acts")
        elif last is not None and last.leading:
            self.log("leader.lost", epoch=last.epoch, role=view.role.value,
                     msg=f"stopped acting: {view.why or 'another daemon leads'}; engines keep serving")
        elif view.role is Role.STANDBY:
            self.log("leader.standby", leader=view.describe(), epoch=view.epoch,
                     msg=f"{view.describe()} leads; this daemon stands by (pulls, acts on nothing)")
        else:
            self.log("leader.no-etcd", error=view.why,
                     msg="etcd cannot be reached: this daemon waits as a standby and acts on nothing; "
                         "engines keep serving")
