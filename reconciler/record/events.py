"""What happened, as events (SPEC section 15): derived from what a pass decided and found, pure.

A pass's events come from its PassResult compared with what the last pass left (`Seen`): a change
is what an operator asks about ("when did n3 stop answering?"), not a state repeated every pass.
Writing them is eventlog.py's (the daemon and `apply` call it at the edge); reading them back,
filtering them and putting them in words is here, so `reconciler events` and the dashboard's
/api/events say the same thing.

Nothing here reads a message's wording: started and stopped come from a Decision's action and
outcome, failed/Ready/draining from a replica's Phase, nodes from NodeState, GPUs from GpuHealth and
the crash-loop breaker's quarantines.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import field
from typing import Any, Iterable, Mapping

from reconciler.errors import UsageError, parse_json
from reconciler.frozen import frozen
from reconciler.decide.outcomes import PassResult
from reconciler.vocabulary import DecisionAction, EventKind, GpuHealth, NodeState, Phase, RolloutPhase


@frozen
class Event:
    """One event: when, what kind, what it is about (where that applies), and in words."""

    time: float  # epoch seconds
    kind: EventKind
    message: str
    model: str | None = None
    replica: str | None = None
    node: str | None = None
    gpu: int | None = None
    failure: str | None = None  # replica.failed: the FailureKind (temporary, permanent, bug)
    errors: tuple[str, ...] = ()  # revision.refused: each validation error, `path:line:column: message`
    revision: str | None = None


def utc(t: float) -> str:
    text = _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def to_document(e: Event) -> dict[str, Any]:
    """An event as one JSON object (the log's line and /api/events' entry): absent fields left out."""
    doc: dict[str, Any] = {"time": utc(e.time), "kind": str(e.kind)}
    for name in ("model", "replica", "node", "gpu", "failure", "revision"):
        value = getattr(e, name)
        if value is not None:
            doc[name] = value
    if e.errors:
        doc["errors"] = list(e.errors)
    doc["message"] = e.message
    return doc


def from_document(doc: Any) -> Event:
    """The inverse of to_document; ValueError for anything that is not an event (a corrupt line)."""
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    try:
        when = _dt.datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00")).timestamp()
        kind = EventKind(doc["kind"])
        gpu = doc.get("gpu")
        return Event(
            when, kind, str(doc.get("message", "")),
            model=_text(doc.get("model")), replica=_text(doc.get("replica")), node=_text(doc.get("node")),
            gpu=None if gpu is None else int(gpu), failure=_text(doc.get("failure")),
            errors=tuple(str(x) for x in doc.get("errors") or ()), revision=_text(doc.get("revision")),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(str(exc)) from exc


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def event_line(e: Event) -> str:
    """One line of `reconciler events`: time, kind, what it is about, the message."""
    about = [f"{name}={getattr(e, name)}" for name in ("model", "replica", "node", "gpu", "failure")
             if getattr(e, name) is not None]
    line = f"{utc(e.time)}  {e.kind:<18} {' '.join(about)}".rstrip() + f"  {e.message}"
    for error in e.errors:
        line += f"\n    {error}"
    return line


# ------------------------------------------------------------------ what the last pass left


@frozen
class Seen:
    """What the last pass left, as far as events need it; the next pass's events are the changes."""

    phases: Mapping[str, Phase] = field(default_factory=dict)  # replica -> phase
    down: frozenset[str] = frozenset()  # nodes that did not answer
    bad_gpus: frozenset[tuple[str, int]] = frozenset()  # (node, index) not ok
    quarantined: frozenset[tuple[str, int]] = frozenset()
    counts: Mapping[str, int] = field(default_factory=dict)  # autoscaled model -> count in force
    revision: str | None = None  # the revision applied
    rollouts: Mapping[str, "RolloutSeen"] = field(default_factory=dict)  # model -> its canary rollout (SPEC 13)


def seen_to_document(s: Seen) -> dict[str, Any]:
    return {"phases": dict(sorted(s.phases.items())), "down": sorted(s.down),
            "bad_gpus": sorted([n, i] for n, i in s.bad_gpus), "quarantined": sorted([n, i] for n, i in s.quarantined),
            "counts": dict(sorted(s.counts.items())), "revision": s.revision,
            "rollouts": {m: {"state": str(r.state), "revision": r.revision, "weight": r.weight, "reason": r.reason}
                         for m, r in sorted(s.rollouts.items())}}


def seen_from_document(doc: Any) -> Seen | None:
    """None for anything unreadable: the next pass then says what it finds as new."""
    try:
        return Seen({str(r): Phase(p) for r, p in doc["phases"].items()}, frozenset(map(str, doc["down"])),
                    frozenset((str(n), int(i)) for n, i in doc["bad_gpus"]),
                    frozenset((str(n), int(i)) for n, i in doc["quarantined"]),
                    {str(m): int(c) for m, c in doc["counts"].items()}, _text(doc.get("revision")),
                    {str(m): RolloutSeen(RolloutPhase(r["state"]), _text(r.get("revision")),
                                         None if r.get("weight") is None else int(r["weight"]), str(r.get("reason") or ""))
                     for m, r in (doc.get("rollouts") or {}).items()})
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def seen_after(result: PassResult, before: Seen | None) -> Seen:
    """What this pass leaves for the next one's comparison. A node that did not answer keeps what was
    last seen of its GPUs: it coming back with the same broken GPU is not news."""
    before = before or Seen()
    nodes = result.inventory.nodes if result.inventory is not None else ()
    down = frozenset(n.id for n in nodes if n.state == NodeState.UNREACHABLE)
    ok = GpuHealth.OK  # `is` first: tens of thousands of GPUs a pass, and a StrEnum's == is a Python call
    bad = {(n.id, g.index) for n in nodes if n.state != NodeState.UNREACHABLE for g in n.gpus
           if g.health is not ok and g.health != ok}
    bad |= {(n, i) for n, i in before.bad_gpus if n in down}
    quarantined = frozenset(result.memory.quarantines) if result.memory is not None else before.quarantined
    return Seen({rid: st.phase for rid, st in result.replicas.items()}, down, frozenset(bad), quarantined,
                {m: st.current for m, st in result.autoscale.items()}, result.revision, rollouts_seen(result))


def rollouts_seen(result: PassResult) -> dict[str, "RolloutSeen"]:
    """Each model's canary rollout as the pass left it (reconciler/decide/canary.py's Rollout), as events see it."""
    return {model: RolloutSeen(r.state, r.revision, r.weight, r.reason) for model, r in result.rollouts.items()}


# ------------------------------------------------------------------ deriving a pass's events


def pass_events(before: Seen | None, result: PassResult, now: float) -> list[Event]:
    """The events of one pass (pure): the nodes, the GPUs, then each replica's starts, stops and
    changes of phase, then autoscaling. `before` None: a first pass, everything found is news."""
    if result.dry_run:
        return []
    before = before or Seen()
    out: list[Event] = []
    out += _node_events(before, result, now)
    out += _gpu_events(before, result, now)
    out += _replica_events(before, result, now)
    out += _autoscale_events(before, result, now)
    out += rollout_events(before.rollouts, rollouts_seen(result), now)
    return out


def _node_events(before: Seen, result: PassResult, now: float) -> list[Event]:
    out = []
    nodes = result.inventory.nodes if result.inventory is not None else ()
    for n in nodes:
        if n.state == NodeState.UNREACHABLE and n.id not in before.down:
            out.append(Event(now, EventKind.NODE_UNREACHABLE, f"does not answer: {n.reason}", node=n.id))
        elif n.state != NodeState.UNREACHABLE and n.id in before.down:
            out.append(Event(now, EventKind.NODE_BACK, "answers again", node=n.id))
    return out


def _gpu_events(before: Seen, result: PassResult, now: float) -> list[Event]:
    out = []
    ok = GpuHealth.OK
    nodes = result.inventory.nodes if result.inventory is not None else ()
    for n in nodes:
        if n.state == NodeState.UNREACHABLE:
            continue
        for g in n.gpus:
            if g.health is not ok and g.health != ok and (n.id, g.index) not in before.bad_gpus:
                out.append(Event(now, EventKind.GPU_UNHEALTHY, f"{g.health}: {g.health_reason}".rstrip(": "),
                                 node=n.id, gpu=g.index))
    if result.memory is not None:
        for (node, index), q in sorted(result.memory.quarantines.items()):
            if (node, index) not in before.quarantined:
                out.append(Event(now, EventKind.GPU_QUARANTINED, f"until {utc(q.until)}: {q.reason}",
                                 node=node, gpu=index))
    return out


def _replica_events(before: Seen, result: PassResult, now: float) -> list[Event]:
    models = {a.replica: a.model for a in (result.plan.actions if result.plan is not None else ())}
    models.update({rid: st.model for rid, st in result.replicas.items()})
    started, stopped = _first_nodes(result.decisions, DecisionAction.START), _first_nodes(result.decisions, DecisionAction.STOP)
    out = [Event(now, EventKind.REPLICA_STOPPED, "stopped", model=models.get(rid), replica=rid, node=node)
           for rid, node in stopped.items()]
    out += [Event(now, EventKind.REPLICA_STARTED, "started", model=models.get(rid), replica=rid, node=node)
            for rid, node in started.items()]
    for rid, st in result.replicas.items():
        if st.phase != before.phases.get(rid):
            event = _phase_event(rid, st, now)
            if event is not None:
                out.append(event)
    return out


def _first_nodes(decisions, action: DecisionAction) -> dict[str, str]:
    """Decisions are per rank: one started (or stopped) per replica, naming its first node."""
    first: dict[str, str] = {}
    for d in decisions:
        if d.ok and d.node != "-" and d.action == action:
            first.setdefault(d.replica, d.node)
    return first


def _phase_event(rid: str, st, now: float) -> Event | None:
    """The event of a replica whose phase changed this pass: Ready, Failed (with its kind) or Draining."""
    node = st.nodes[0].node if st.nodes else None
    if st.phase == Phase.READY:
        return Event(now, EventKind.REPLICA_READY, f"Ready at {st.endpoint}" if st.endpoint else "Ready",
                     model=st.model, replica=rid, node=node)
    if st.phase == Phase.FAILED:
        return Event(now, EventKind.REPLICA_FAILED, st.message or "failed", model=st.model, replica=rid,
                     node=node, failure=str(st.failure) if st.failure else None)
    if st.phase == Phase.DRAINING:
        return Event(now, EventKind.REPLICA_DRAINING, st.message or "draining", model=st.model, replica=rid, node=node)
    return None


def _autoscale_events(before: Seen, result: PassResult, now: float) -> list[Event]:
    out = []
    for model, st in sorted(result.autoscale.items()):
        was = before.counts.get(model)
        if was is not None and was != st.current:
            out.append(Event(now, EventKind.AUTOSCALE, f"{was} -> {st.current} replicas: {st.reason}".rstrip(": "),
                             model=model))
    return out


def revision_applied(revision: str | None, now: float, by: str = "the daemon") -> Event:
    return Event(now, EventKind.REVISION_APPLIED, f"revision {(revision or 'working tree')[:12]} applied by {by}",
                 revision=revision)


def revision_refused(revision: str | None, errors: Iterable[str], now: float) -> Event:
    errors = tuple(str(e) for e in errors)
    return Event(now, EventKind.REVISION_REFUSED,
                 f"revision {(revision or 'working tree')[:12]} does not validate ({len(errors)} "
                 f"error{'s' * (len(errors) != 1)}): the last good revision stays in force",
                 errors=errors, revision=revision)


@frozen
class RolloutSeen:
    """What events need of a model's rollout (SPEC section 13's status `rollout:` block)."""

    state: RolloutPhase
    revision: str | None = None
    weight: int | None = None
    reason: str = ""


def rollout_events(before: Mapping[str, RolloutSeen], after: Mapping[str, RolloutSeen], now: float) -> list[Event]:
    """A rollout's step (a new state or weight), promotion and abort, as events (pure): the model's
    rollout block before and after a pass. Aborted and Promoting are said once, when they begin."""
    out = []
    for model, r in sorted(after.items()):
        was = before.get(model)
        if was == r:
            continue
        rev = f" of {r.revision[:12]}" if r.revision else ""
        if r.state == RolloutPhase.ABORTED:
            if was is None or was.state != RolloutPhase.ABORTED:
                out.append(Event(now, EventKind.ROLLOUT_ABORTED, f"rollout{rev} aborted: {r.reason}".rstrip(": "),
                                 model=model, revision=r.revision))
        elif r.state == RolloutPhase.PROMOTING:
            if was is None or was.state != RolloutPhase.PROMOTING:
                out.append(Event(now, EventKind.ROLLOUT_PROMOTED, f"rollout{rev} promoted: {r.reason}".rstrip(": "),
                                 model=model, revision=r.revision))
        else:
            weight = f" at weight {r.weight}%" if r.weight is not None else ""
            out.append(Event(now, EventKind.ROLLOUT_STEP, f"rollout{rev}: {r.state}{weight}"
                             + (f": {r.reason}" if r.reason else ""), model=model, revision=r.revision))
    return out


# ------------------------------------------------------------------ reading them back


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, option: str = "--since") -> float:
    """'90s', '15m', '1h30m', '2d' -> seconds; UsageError saying what is expected."""
    t = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not t or pos != len(t):
        raise UsageError(f"{option} {text!r}: expected a duration such as 30s, 15m, 1h, 2d or 1h30m, "
                         "or a time such as 2026-01-31T03:00:00Z")
    return total


def parse_since(text: str, now: float) -> float:
    """--since: a duration back from now, or an ISO 8601 time (UTC unless it says otherwise) -> epoch s."""
    t = text.strip()
    if t[:1].isdigit() and ("-" in t or "T" in t):
        try:
            when = _dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if when.tzinfo is None:
                when = when.replace(tzinfo=_dt.timezone.utc)
            return when.timestamp()
    return now - parse_duration(text)


def parse_kind(text: str) -> EventKind:
    try:
        return EventKind(text)
    except ValueError:
        raise UsageError(f"--kind {text!r} is not an event kind; the kinds are: "
                         + ", ".join(k.value for k in EventKind)) from None


@frozen
class EventFilter:
    """What `reconciler events` and /api/events narrow the log to; None: anything."""

    since: float | None = None
    model: str | None = None
    node: str | None = None
    kind: EventKind | None = None

    def __call__(self, e: Event) -> bool:
        return ((self.since is None or e.time >= self.since) and (self.model is None or e.model == self.model)
                and (self.node is None or e.node == self.node) and (self.kind is None or e.kind == self.kind))


@frozen
class Skipped:
    """Lines of a log file that hold no event (a torn last write, a corrupt file): how many, where first."""

    path: str
    count: int
    first_line: int

    def __str__(self) -> str:
        return (f"{self.path}: skipped {self.count} unreadable line{'s' * (self.count != 1)} "
                f"(the first at line {self.first_line}); the events around them are shown")


def read_events(path: str, lines: Iterable[bytes | str], keep=lambda e: True) -> tuple[list[Event], Skipped | None]:
    """The events of one log file's lines that `keep` accepts, and what could not be read (pure)."""
    events, bad, first = [], 0, 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            e = from_document(parse_json(line))
        except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            bad += 1
            first = first or number
            continue
        if keep(e):
            events.append(e)
    return events, (Skipped(path, bad, first) if bad else None)
