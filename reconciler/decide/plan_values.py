"""What a plan is, as values: the Plan (actions, outcomes, what waits, what drains), a replica that
waits and why (Waiting), and a serving copy draining before it stops (Drain, keyed by drain_key).

reconciler/decide/plan.py computes a Plan; the pass memory, the actor, status and the commands read it.
"""

from __future__ import annotations

from dataclasses import field
from functools import cached_property
from typing import Iterable, Mapping

from reconciler.decide.backoff import Backoff
from reconciler.decide.canary import RolloutView
from reconciler.frozen import frozen
from reconciler.model import Action, Placement
from reconciler.decide.placement import Outcome
from reconciler.vocabulary import WaitKind


@frozen
class Waiting:
    """A replica that needs something done but not in this pass, and why."""

    replica: str
    model: str
    reason: str
    until: float | None = None  # backoff: the earliest time the restart is allowed; grace: when it ends
    kind: WaitKind | None = None
    nodes: tuple[str, ...] = ()  # the nodes that do not answer, for the unreachable kinds
    # What the plan does about it, without what is wrong ("waiting for backoff until ..."): for a
    # message that already says what is wrong (an observed crash names its dead ranks itself).
    next_step: str = ""


@frozen
class Drain:
    """A serving copy the reconciler chose to stop, waiting for its requests to end (SPEC section 10).

    Kept in the pass memory from the pass that began it to the pass that stops it; `running` is what
    its engine said just before the current pass (None: not asked yet, or no answer to trust).
    """

    replica: str
    model: str
    nodes: tuple[str, ...]  # rank order; nodes[0] is the head
    port: int  # the head's serving port, where its metrics are asked
    engine: str  # "" when unknown (its model was removed): then only drain_s ends it
    started: float
    until: float  # started + drain_s: stopped then whatever its engine says
    running: float | None = None
    note: str = ""  # why `running` is None, in words
    profile: str = ""  # its profile, for the series a command profile declares (`metrics:`)
    # SPEC 13's hand-off: when the status files without it were written (None: not yet; the pass that
    # began the drain stamps it once they are on disk), and whether the gateway serves without it now
    # (asked before the current pass, like `running`), with why not in words.
    out_at: float | None = None
    handed_off: bool = False
    handoff_note: str = ""

    @property
    def key(self) -> str:
        return drain_key(self.replica, self.nodes)


def drain_key(replica: str, nodes: Iterable[str]) -> str:
    """One copy of a replica: a replace's old copy drains beside the new one, under the same id."""
    return f"{replica}@{','.join(nodes)}"


@frozen
class Plan:
    actions: tuple[Action, ...]
    # Every desired replica: where it is (kept), goes (start/replace/restart) or why it cannot go anywhere.
    outcomes: Mapping[str, Outcome]
    # Desired replicas with no placement this pass (never started, or a replace that found no room).
    unplaced: tuple[Outcome, ...]
    waiting: tuple[Waiting, ...]
    # The currently running copy of each replica found in node records (desired or not).
    observed: Mapping[str, Placement]
    # The backoff to keep for the next pass: restart counts updated, a fresh copy's crashes forgotten,
    # removed replicas dropped; a failed start carried over untouched (memory.remember updates it).
    backoff: Mapping[str, Backoff]
    revision: str | None = None
    # Copies draining after this plan (memory.hold_drains), by drain_key: the pass memory keeps them.
    draining: Mapping[str, Drain] = field(default_factory=dict)
    # Each canary rollout under way or remembered, and the plan's next step for it (SPEC section 13).
    rollouts: tuple[RolloutView, ...] = ()
    # Per canary replica that surged, its old copy, serving beside the canary copy as a stable one
    # while the rollout is Progressing (and in the pass that stops an aborted canary).
    beside: Mapping[str, Placement] = field(default_factory=dict)

    @property
    def placed_on(self) -> dict[str, tuple[str, ...]]:
        """Per desired replica, the nodes it is on or goes to: the `placed_on` input of the next pass."""
        return {rid: tuple(a.node for a in o.placement.nodes) for rid, o in self.outcomes.items() if o.placement is not None}

    @cached_property  # status asks once per replica; the backoff holds every replica
    def restarts(self) -> dict[str, int]:
        """Per replica, how many times the reconciler restarted it (for status)."""
        return {rid: b.restarts for rid, b in self.backoff.items() if b.restarts}
