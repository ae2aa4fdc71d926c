"""One backoff: per replica, how its tries went and when it may be tried next (pure).

A try is a start or a restart. It goes wrong in one of two ways, and each has its own wait:

crash          the replica ran and a rank died (or went missing): restarted after a capped exponential
               backoff, BACKOFF_BASE_S doubling up to BACKOFF_CAP_S (a kubelet's CrashLoopBackOff, so
               operators read it the same way); WaitKind.BACKOFF. A quiet BACKOFF_RESET_S after the last
               restart starts the streak from the bottom again; the restart count status shows stays.
failed start   a start that failed and left nothing running, so the plan would start it again on every
               pass. Its failure's kind decides (ARCHITECTURE: three outcomes): temporary (a timeout, a
               taken port) is retried after the same curve, shortened at random by up to JITTER_FRACTION
               so that replicas that failed together do not come back in lockstep; WaitKind.START_BACKOFF.
               Permanent (the engine's binary is not on the node, a launch that cannot be rendered)
               stalls until what is tried changes (attempt_key: the catalog, the node), checked again
               every PERMANENT_RECHECK_S in case the change is one the probe cannot see (a secret file
               put in place); WaitKind.STALLED.

Who writes what: the plan orders restarts, so it counts crashes (Backoff.restarted, calmed, anew); only
the act stage sees how a start went, so memory.remember records it (Backoff.start_failed, start_took).
Backoff.held_until is the one decision of whether a try due now waits: the plan asks it before every
restart and every start.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Callable

from reconciler.frozen import frozen
from reconciler.model import Action, Catalog, Inventory, spec_hash
from reconciler.vocabulary import FailureKind

# The one delay curve: first try at once, then 10 s, 20 s, 40 s ... capped at 5 minutes.
BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 300.0
# A replica that has run without a crash this long starts its crash backoff from the bottom again.
BACKOFF_RESET_S = 600.0
# A permanent failure is tried again this often even when nothing the probe sees has changed
# (the same period as a node stalled on a refused host key).
PERMANENT_RECHECK_S = 300.0
# Each backoff of a failed start is shortened by up to this fraction at random (as the SSH
# transport's per-node backoff is).
JITTER_FRACTION = 0.25


def backoff_delay(streak: int) -> float:
    """Seconds to wait before the try that follows `streak` failed ones in a row."""
    if streak <= 0:
        return 0.0
    return min(BACKOFF_BASE_S * (2 ** (streak - 1)), BACKOFF_CAP_S)


@frozen
class Backoff:
    """How one replica's tries went, and when it may be tried next; the pass memory keeps one per
    replica (PassMemory.backoff), the plan hands on what it leaves (Plan.backoff)."""

    # Crashes, counted by the plan as it orders restarts:
    restarts: int = 0  # restarts ordered, in all: shown in status, never reset
    streak: int = 0  # crashes in a row: the restart delay's exponent; 0 again after a quiet BACKOFF_RESET_S
    last_restart: float | None = None  # epoch seconds of the last restart ordered
    # The last start, when it failed and left nothing running (memory.remember's); forgotten once a start takes:
    failure: FailureKind | None = None  # TEMPORARY or PERMANENT, from the typed outcome (never from the message)
    failed_starts: int = 0  # failed starts in a row
    retry_at: float | None = None  # epoch seconds: the earliest next start (temporary), the recheck (permanent)
    key: str = ""  # attempt_key of what was tried: a change of it (the catalog, the node) retries at once
    message: str = ""  # why it failed, for status while it waits
    nodes: tuple[str, ...] = ()  # the nodes it was tried on

    def held_until(self, now: float, start: Callable[[], str] | None = None) -> float | None:
        """Until when the try due now waits; None: it goes now. The one place that decides it.

        No `start`: a restart after a crash, held while the crash backoff runs. `start`: a start, and
        the attempt_key of what it would try (asked only when a start failed before and its wait has
        not run out): held until retry_at, unless what it tries is not what failed."""
        if start is None:
            if self.last_restart is None:
                return None
            until = self.last_restart + backoff_delay(self.streak)
            return until if now < until else None
        if self.failure is None or self.retry_at is None or now >= self.retry_at or start() != self.key:
            return None
        return self.retry_at

    @property
    def stalled(self) -> bool:
        """The last start failed for good: waiting for a change, not for time (WaitKind.STALLED)."""
        return self.failure == FailureKind.PERMANENT

    def restarted(self, now: float) -> Backoff:
        """One more restart after a crash, ordered now."""
        return replace(self, restarts=self.restarts + 1, streak=self.streak + 1, last_restart=now)

    def calmed(self, now: float) -> Backoff:
        """Running with no crash: after a quiet BACKOFF_RESET_S the streak starts again from the bottom
        (not the count shown in status)."""
        if self.streak and self.last_restart is not None and now - self.last_restart >= BACKOFF_RESET_S:
            return replace(self, streak=0)
        return self

    def anew(self) -> Backoff:
        """A fresh copy (a start, a replace, or none running): its crashes are forgotten; a failed start
        is not, it holds the next start."""
        if not self.restarts and not self.streak and self.last_restart is None:
            return self
        return replace(self, restarts=0, streak=0, last_restart=None)

    def start_failed(self, failure: FailureKind, now: float, key: str, message: str, nodes: tuple[str, ...],
                     jitter: Callable[[], float]) -> Backoff:
        """A start that failed now and left nothing running, with when the next may go."""
        failed = self.failed_starts + 1 if self.failure is not None else 1
        if failure == FailureKind.PERMANENT:
            retry_at = now + PERMANENT_RECHECK_S
        else:
            retry_at = now + backoff_delay(failed) * (1.0 - JITTER_FRACTION * jitter())
        return replace(self, failure=failure, failed_starts=failed, retry_at=retry_at, key=key, message=message,
                       nodes=nodes)

    def start_took(self) -> Backoff:
        """A start that took (or the replica is otherwise not failed): a failed start before it is forgotten."""
        if self.failure is None:
            return self
        return replace(self, failure=None, failed_starts=0, retry_at=None, key="", message="", nodes=())


def attempt_key(catalog: Catalog, inventory: Inventory, action: Action) -> str:
    """A digest of what a start depends on: the spec, where it goes, and those nodes as probed (engines,
    llama.cpp binaries, weights, state). Equal keys: trying again would meet the same failure."""
    model = action.spec if action.spec is not None else catalog.model(action.model)
    placement = action.placement
    if model is None or placement is None:
        return ""
    profile = model.profile(placement.profile)
    nodes = []
    for a in placement.nodes:
        n = inventory.node(a.node)
        facts = None if n is None else [n.state, sorted((n.engines or {}).items()), repr(n.llama_cpp),
                                         sorted(n.weights or ())]
        nodes.append([a.node, a.rank, list(a.gpus), a.port, facts])
    shape = [spec_hash(model, profile) if profile is not None else placement.profile, nodes]
    return hashlib.sha256(json.dumps(shape, default=str).encode()).hexdigest()[:16]
