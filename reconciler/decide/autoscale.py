"""Autoscaling inside the range git holds (SPEC section 11): how many replicas the load wants (pure).

Git holds the range and the policy (`replicas: {min, max}`, `autoscale:`); the count in force
and why live in status/models/<name>.yaml (`autoscale: {current, wanted, metric_sum, reason,
since}`); this module turns one pass's loads into the next count:

    wanted = ceil(sum of requests in flight over Ready replicas / target), clamped to [min, max]
    up     to `wanted` once it has been above the current count for up_delay_s
    down   by one once it has been below for down_delay_s (again for each further step)

A replica whose load is unknown (its /metrics missing, slow, garbage, negative, NaN) counts as at
target: it neither raises nor lowers the count. With no Ready replica there is no load to read,
and the count holds. Lowering the count is all a scale-down is: the plan stops the highest
ordinal, and that stop drains first (SPEC section 10).

`decide` is pure: (policy, range, current count, loads, now, previous state) -> the new state.
The documents here are the status file's `autoscale` block and its reading back.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from reconciler.model import AutoscalePolicy, Catalog, Model, ReplicaRange, figure

# Relation of wanted to current; `since` is when the present one began.
UP, DOWN, HOLD = "up", "down", "hold"


@dataclass(frozen=True)
class AutoscaleState:
    """One model's count and why, after a pass (status/models/<name>.yaml `autoscale:`).

    current     replicas to run (always inside the range)
    wanted      what the load asks for, clamped to the range
    metric_sum  requests in flight over the Ready replicas (an unknown one counted as at target)
    reason      in words: "requests 13 over 2 replicas > target 4"
    since       epoch seconds the present relation of wanted to current began (None: never decided)
    unknown     replica -> why its load is not known this pass (counted as at target)
    """

    current: int
    wanted: int
    metric_sum: float = 0.0
    reason: str = ""
    since: float | None = None
    unknown: Mapping[str, str] = field(default_factory=dict)

    @property
    def direction(self) -> str:
        return UP if self.wanted > self.current else DOWN if self.wanted < self.current else HOLD


def initial_state(model: Model) -> AutoscaleState:
    """Without a status file: the range's min (SPEC section 11)."""
    rng = model.replica_range
    return AutoscaleState(current=rng.min, wanted=rng.min, reason=f"no load read yet: min {rng.min}")


def wanted_count(metric_sum: float, target: float, rng: ReplicaRange) -> int:
    return rng.clamp(math.ceil(metric_sum / target - 1e-9))


def decide(policy: AutoscalePolicy, rng: ReplicaRange, current: int, loads: Mapping[str, float | None],
           now: float, previous: AutoscaleState | None = None,
           unknown: Mapping[str, str] | None = None) -> AutoscaleState:
    """The count after this pass, and why (pure).

    current   the count in force (the previous state's, else min); clamped to the range first,
              so a range changed in git takes effect at once
    loads     Ready replica -> requests in flight, or None where its load is unknown
    unknown   replica -> why its load is unknown, for the state (and the pass's one warning)
    """
    current = rng.clamp(current)
    unknown = dict(sorted((unknown or {}).items()))
    if not loads:
        # No Ready replica: no engine to ask. Hold, rather than read "no load" as "scale down".
        since = previous.since if previous is not None and previous.direction == HOLD else now
        return AutoscaleState(current, current, 0.0, f"no Ready replica to read requests from: holding {current}",
                              since, unknown)
    target = policy.target
    metric_sum = sum(target if v is None else v for v in loads.values())
    wanted = wanted_count(metric_sum, target, rng)
    said = _load_words(metric_sum, len(loads), target, len(unknown))
    direction = UP if wanted > current else DOWN if wanted < current else HOLD
    # The relation holds since the previous pass's `since` if it is the same one, else since now.
    since = previous.since if (previous is not None and previous.since is not None
                               and previous.direction == direction and previous.current == current) else now
    if direction == HOLD:
        return AutoscaleState(current, wanted, metric_sum, f"{said}: {current} {_replicas(current)}", since, unknown)
    delay = policy.up_delay_s if direction == UP else policy.down_delay_s
    held = now - since
    if held < delay:
        waits = f"{said}: wants {wanted}, {'up' if direction == UP else 'down'} after {figure(delay)} s " \
                f"({figure(max(0.0, held))} s so far)"
        return AutoscaleState(current, wanted, metric_sum, waits, since, unknown)
    new = wanted if direction == UP else current - 1  # down: one replica per down_delay_s
    moved = f"{said}: {current} -> {new} after {figure(held)} s {'above' if direction == UP else 'below'}"
    return AutoscaleState(new, wanted, metric_sum, moved, now, unknown)


def _replicas(n: int) -> str:
    return f"replica{'s' * (n != 1)}"


def _load_words(metric_sum: float, ready: int, target: float, unknown: int) -> str:
    per = metric_sum / ready
    rel = ">" if per > target else "<" if per < target else "="
    unknown_words = f" ({unknown} unknown, counted at target)" if unknown else ""
    return f"requests {figure(metric_sum)} over {ready} {_replicas(ready)}{unknown_words} {rel} target {figure(target)}"


def new_unknowns(before: AutoscaleState | None, after: AutoscaleState) -> dict[str, str]:
    """The replicas whose load became unknown (or unknown for another reason) in this pass: one
    warning line each, not one every pass while it lasts."""
    was = before.unknown if before is not None else {}
    return {rid: why for rid, why in after.unknown.items() if was.get(rid) != why}


def with_counts(catalog: Catalog, states: Mapping[str, AutoscaleState]) -> Catalog:
    """The catalog with each autoscaled model's `replicas` the count in force (clamped to its range,
    so a range narrowed in git applies at once); min where no state is known. Models with a fixed
    count are left as they are. The catalog on disk is never touched."""
    models = []
    changed = False
    for m in catalog.models:
        if m.scale is not None:
            state = states.get(m.name)
            count = m.scale.clamp(state.current) if state is not None else m.scale.min
            if count != m.replicas:
                m = replace(m, replicas=count)
                changed = True
        models.append(m)
    return replace(catalog, models=tuple(models)) if changed else catalog


def kept_states(catalog: Catalog, states: Mapping[str, AutoscaleState]) -> dict[str, AutoscaleState]:
    """The state in force of every autoscaled model, without reading any load: what `apply`, `plan`
    and a pass that broke half-way write back, so none of them moves the count. A count outside a
    range changed in git is clamped into it (and said so)."""
    kept = {}
    for m in catalog.models:
        if m.scale is None:
            continue
        state = states.get(m.name)
        if state is None:
            kept[m.name] = initial_state(m)
            continue
        current = m.scale.clamp(state.current)
        if current != state.current:
            state = replace(state, current=current, reason=f"the range is now {m.scale}: {state.current} clamped "
                                                           f"to {current}")
        kept[m.name] = replace(state, wanted=m.scale.clamp(state.wanted))
    return kept


def due_at(policy: AutoscalePolicy, state: AutoscaleState) -> float | None:
    """When this state's pending move would be made (epoch seconds, `since` as written back),
    so the daemon can pass then instead of at its next resync; None when nothing is pending."""
    if state.since is None or state.direction == HOLD:
        return None
    since = math.ceil(round(state.since * 1000, 3)) / 1000  # as written back
    return since + (policy.up_delay_s if state.direction == UP else policy.down_delay_s)


def next_pass_at(catalog: Catalog, states: Mapping[str, AutoscaleState]) -> float | None:
    """When the daemon should pass again for autoscaling's sake: when the first pending move falls
    due (not at the next resync, which may be a minute later); None: nothing pending."""
    due = []
    for m in catalog.models:
        state = states.get(m.name)
        if state is None or m.autoscale is None:
            continue
        when = due_at(m.autoscale, state)
        if when is not None:
            due.append(when)
    return min(due) if due else None


# How often, at most, the daemon reads the loads between passes: a step of load is seen within this
# rather than at the next resync (SPEC section 11). A second keeps each engine asked once a second.
LOAD_LOOK_S = 1.0


def look_every(interval: float) -> float:
    """Seconds from one look at the loads between passes to the next (pure): LOAD_LOOK_S, or half the
    resync interval where that is shorter, so a look always comes well within one interval."""
    return min(LOAD_LOOK_S, interval / 2)


def rising(policy: AutoscalePolicy, rng: ReplicaRange, state: AutoscaleState, loads: Mapping[str, float | None]) -> bool:
    """Whether loads read between passes want more replicas than the last pass saw (pure): the daemon
    then passes at once, and that pass starts up_delay_s's clock (decide) where the next resync would
    have started it up to an interval later. A rise only: a fall waits down_delay_s anyway, and a rise
    already pending has its pass asked for (next_pass_at). An unknown load counts as at target, as in decide."""
    if not loads or state.direction == UP:
        return False
    metric_sum = sum(policy.target if v is None else v for v in loads.values())
    return wanted_count(metric_sum, policy.target, rng) > rng.clamp(state.current)


def rising_models(catalog: Catalog, states: Mapping[str, AutoscaleState],
                  loads: Mapping[str, tuple[Mapping[str, float | None], Any]]) -> list[str]:
    """The autoscaled models whose loads (model -> (replica -> in flight or None, ...)) are rising (pure)."""
    return [m.name for m in catalog.models
            if m.autoscale is not None and m.scale is not None and m.name in loads
            and rising(m.autoscale, m.scale, states.get(m.name) or initial_state(m), loads[m.name][0])]


# --------------------------------------------------------------------------
# The status file's `autoscale:` block
# --------------------------------------------------------------------------


def iso_time(ts: float) -> str:
    # Milliseconds, rounded up: a delay read back from the file is never shortened, nor lengthened by
    # a whole second (the daemon passes again when a move falls due).
    ms = math.ceil(round(ts * 1000, 3))
    when = _dt.datetime.fromtimestamp(ms // 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{when}.{ms % 1000:03d}Z"


def state_document(model: Model, state: AutoscaleState) -> dict:
    """status/models/<name>.yaml `autoscale:`: the range, the count and why (no clock but `since`,
    which changes only when the relation of wanted to current does)."""
    rng = model.replica_range
    doc: dict[str, Any] = {
        "min": rng.min,
        "max": rng.max,
        "current": state.current,
        "wanted": state.wanted,
        "metric_sum": int(state.metric_sum) if float(state.metric_sum).is_integer() else round(state.metric_sum, 3),
        "reason": state.reason,
        "since": iso_time(state.since) if state.since is not None else None,
    }
    if state.unknown:
        doc["metrics_unknown"] = dict(state.unknown)
    return doc


def state_from_document(doc: Any) -> AutoscaleState | None:
    """The inverse of state_document; None for anything that is not one (a missing block, a hand edit):
    the count then starts at min, never at a number made up from junk."""
    if not isinstance(doc, dict):
        return None
    current, wanted = doc.get("current"), doc.get("wanted", doc.get("current"))
    if not _count(current) or not _count(wanted):
        return None
    metric_sum = doc.get("metric_sum", 0)
    if isinstance(metric_sum, bool) or not isinstance(metric_sum, (int, float)) or not math.isfinite(metric_sum):
        metric_sum = 0.0
    unknown = doc.get("metrics_unknown") or {}
    return AutoscaleState(
        current=current, wanted=wanted, metric_sum=float(metric_sum), reason=str(doc.get("reason") or ""),
        since=_parse_time(doc.get("since")),
        unknown={str(k): str(v) for k, v in unknown.items()} if isinstance(unknown, dict) else {},
    )


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 100000


def _parse_time(v: Any) -> float | None:
    if isinstance(v, _dt.datetime):  # a YAML loader may read the timestamp itself
        return v.replace(tzinfo=v.tzinfo or _dt.timezone.utc).timestamp()
    if not isinstance(v, str):
        return None
    for form in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return _dt.datetime.strptime(v, form).replace(tzinfo=_dt.timezone.utc).timestamp()
        except ValueError:
            continue
    return None
