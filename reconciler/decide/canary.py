"""Canary rollouts (SPEC section 13): a model's rollout state, and how one pass moves it. Pure.

A model with `rollout:` whose spec changes does not roll out as section 7 alone says:

    Progressing  its first `canary.replicas` replicas (the lowest ordinals) are replaced by copies of
                 the new spec (surge or in place, section 7); the others keep the old spec, and a
                 surge keeps its replica's old copy serving beside the canary (plan_values.Plan.beside). Once
                 every canary copy is Ready the checks measure, one measurement per check per
                 `interval_s`, and the canary copies take `weight` percent of the gateway's requests.
    Promoting    the checks held for `analysis_s`: the rest is replaced as section 7 says.
    Complete     no copy of the old spec is left.
    Aborted      a check failed more than `failure_limit` times, or a canary copy failed to start,
                 never became Ready or crashed: the canary copies drain and stop, the old copies keep
                 serving, and this spec is not tried again until the spec changes. The canary
                 replicas start again on the old spec (OldSpec, the model at `from_revision`).

The state lives in the pass memory (memory.py), not in git: the daemon carries it across passes
and restarts, and a one-shot `apply` across runs. The plan reads it (`phase_for_plan`); after the
pass's actions, `advance` moves it from what the pass saw: the canary copies' phases and the
checks' measurements (taken at the edge, reconciler/act/canary_checks.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from reconciler.frozen import frozen
from reconciler.model import Model, replica_id, spec_hash
from reconciler.vocabulary import Phase, RolloutPhase

REQUEST, LATENCY = "request", "latency"  # the request check's two measurements


@frozen
class CheckTally:
    """One check's measurements so far in this rollout; `last` is the latest in words."""

    name: str
    passed: int = 0
    failed: int = 0
    last: str = ""


@frozen
class Measurement:
    """One measurement of one check; `said` names the check and its figures
    ("request: 1 of 2 failed: HTTP 500"), so an abort's reason is this text."""

    check: str
    ok: bool
    said: str


@frozen
class CanaryCopy:
    """A canary replica as the pass left it. phase: its phase when it runs the new spec; STARTING
    while it is still to be replaced or is coming up; FAILED for a failed start or replace, a start
    timeout or a crash of the new copy."""

    replica: str
    phase: Phase
    message: str = ""


@frozen
class Rollout:
    """A model's rollout (status/models `rollout:`). `target` is the new spec (spec_key), so an
    aborted spec is known again and a changed one begins a new rollout."""

    model: str
    state: RolloutPhase
    target: str
    since: float
    weight: int
    revision: str | None = None
    from_revision: str | None = None
    checks: tuple[CheckTally, ...] = ()
    reason: str = ""
    ready_since: float | None = None  # every canary copy Ready since: analysis_s counts from here
    next_check_at: float | None = None  # when the checks measure next (the daemon wakes for it)

    def tally(self, name: str) -> CheckTally | None:
        return next((c for c in self.checks if c.name == name), None)


@frozen
class OldSpec:
    """The model as it was at an aborted rollout's `from_revision` (read from git at the edge): what its
    canary replicas start on again, so the model serves its full count on the old spec. `model` None
    when it could not be had; `why` says so in words (not a git repository, the revision unreadable)."""

    model: Model | None
    revision: str | None = None
    why: str = ""


def spec_key(model: Model) -> str:
    """The model's spec as a rollout knows it: every profile's spec_hash (any of them may be the one placed)."""
    raw = ",".join(sorted(spec_hash(model, p) for p in model.profiles)).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


def check_names(model: Model) -> tuple[str, ...]:
    """The checks of a model's rollout, in the order status lists them."""
    policy = model.rollout
    if policy is None:
        return ()
    names: list[str] = []
    if policy.request is not None:
        names.append(REQUEST)
        if policy.request.max_latency_ratio is not None:
            names.append(LATENCY)
    if policy.prometheus is not None:
        names += [q.name for q in policy.prometheus.queries]
    return tuple(names)


def canary_ids(model: Model) -> list[str]:
    """The replicas the new spec reaches first: the lowest ordinals."""
    k = model.rollout.canary_replicas if model.rollout is not None else 0
    return [replica_id(model.name, i) for i in range(min(k, model.replicas))]


def current(model: Model, rollout: Rollout | None) -> Rollout | None:
    """The rollout of the model's spec as it is now; None when the memory holds one of another spec."""
    if model.rollout is None or rollout is None or rollout.target != spec_key(model):
        return None
    return rollout


def phase_for_plan(model: Model, rollout: Rollout | None) -> RolloutPhase | None:
    """How the plan treats the model's spec changes: None without `rollout:` (section 7 alone); a change
    not begun yet begins as Progressing (its canary is what the plan starts first)."""
    if model.rollout is None:
        return None
    now = current(model, rollout)
    return now.state if now is not None else RolloutPhase.PROGRESSING


def begin(model: Model, now: float, revision: str | None, from_revision: str | None) -> Rollout:
    return Rollout(model.name, RolloutPhase.PROGRESSING, spec_key(model), now, model.rollout.weight,
                   revision=revision, from_revision=from_revision,
                   checks=tuple(CheckTally(n) for n in check_names(model)))


def advance(model: Model, rollout: Rollout | None, *, old_copies: int, canaries: Sequence[CanaryCopy],
            measurements: Iterable[Measurement] = (), now: float, revision: str | None = None,
            from_revision: str | None = None) -> Rollout | None:
    """The model's rollout after a pass (pure).

    rollout       what the memory held before the pass (of any spec)
    old_copies    running copies of the model on another spec than the catalog's
    canaries      the canary replicas (canary_ids) as the pass left them
    measurements  the checks measured in this pass (none when they were not due)
    """
    if model.rollout is None:
        return None
    ongoing = current(model, rollout)
    if ongoing is None:
        if old_copies == 0:
            # Nothing runs the old spec (a first start, or a spec changed back to what runs): nothing to
            # roll out. A finished rollout of this spec is kept, so status still says how it went.
            return rollout if rollout is not None and rollout.target == spec_key(model) else None
        # Rolled away from what the old copies run (their records say it); without that, a previous
        # rollout that completed names it. An aborted one never ran anywhere but on its canary.
        if from_revision is None and rollout is not None and rollout.state == RolloutPhase.COMPLETE:
            from_revision = rollout.revision
        ongoing = begin(model, now, revision, from_revision)
    if ongoing.state == RolloutPhase.PROGRESSING:
        return _progress(model, ongoing, canaries, measurements, now)
    if ongoing.state == RolloutPhase.PROMOTING and old_copies == 0:
        return replace(ongoing, state=RolloutPhase.COMPLETE, since=now, next_check_at=None,
                       reason="every copy runs the new spec")
    return ongoing


def _progress(model: Model, r: Rollout, canaries: Sequence[CanaryCopy], measurements: Iterable[Measurement],
              now: float) -> Rollout:
    """A Progressing rollout after the pass: aborted by a failed canary copy or a check past its
    failure_limit; waiting while a canary copy is not Ready; promoted once the checks held for
    analysis_s; else still analysing, with when the checks measure next."""
    policy = model.rollout
    failed = _canary_failures(canaries)
    if failed:
        return _aborted(r, now, failed)
    measurements = list(measurements)
    r = replace(r, checks=_tallied(model, r.checks, measurements))
    over = _over_limit(r.checks, policy.failure_limit)
    if over:
        return _aborted(r, now, over)
    if not _all_ready(model, canaries):
        waiting = [c.replica for c in canaries if c.phase != Phase.READY]
        return replace(r, ready_since=None, next_check_at=None,
                       reason=f"canary {', '.join(waiting) or 'copies'} not Ready yet")
    ready_since = r.ready_since if r.ready_since is not None else now
    # With checks, at least one measurement of each before promotion, whatever analysis_s says.
    measured_all = all(t.passed for t in r.checks)
    if now - ready_since >= policy.analysis_s and measured_all:
        return replace(r, state=RolloutPhase.PROMOTING, since=now, ready_since=ready_since, next_check_at=None,
                       reason=f"checks held for analysis_s {policy.analysis_s:g} s: the rest is replaced")
    left = max(0.0, policy.analysis_s - (now - ready_since))
    return replace(r, ready_since=ready_since, next_check_at=_next_check(r, bool(measurements), now, policy.interval_s),
                   reason=f"canary serving {r.weight}% of requests; checks must hold {left:g} s more")


def _canary_failures(canaries: Sequence[CanaryCopy]) -> str:
    """The canary copies that failed, in words ("" when none did)."""
    return "; ".join(f"canary {c.replica} failed" + (f": {c.message}" if c.message else "")
                     for c in canaries if c.phase == Phase.FAILED)


def _tallied(model: Model, checks: Sequence[CheckTally], measurements: Sequence[Measurement]) -> tuple[CheckTally, ...]:
    """Each check's tally with this pass's measurements counted, in check_names' order (then any other)."""
    tallies = {c.name: c for c in checks}
    for m in measurements:
        t = tallies.get(m.check, CheckTally(m.check))
        t = replace(t, passed=t.passed + m.ok, failed=t.failed + (not m.ok), last=m.said)
        tallies[m.check] = t
    return tuple(tallies[n] for n in list(dict.fromkeys([*check_names(model), *tallies])))


def _over_limit(checks: Sequence[CheckTally], failure_limit: int) -> str:
    """Why the rollout aborts: the first check failed more than failure_limit times, in words ("" when none)."""
    over = [t for t in checks if t.failed > failure_limit]
    if not over:
        return ""
    t = over[0]
    return f"{t.last} ({t.failed} failed measurement{'s' * (t.failed != 1)}, failure_limit {failure_limit})"


def _all_ready(model: Model, canaries: Sequence[CanaryCopy]) -> bool:
    """Every canary replica is there, and Ready."""
    return len(canaries) == len(canary_ids(model)) and all(c.phase == Phase.READY for c in canaries)


def _next_check(r: Rollout, measured: bool, now: float, interval_s: float) -> float:
    """When the checks measure next: an interval after this pass's measurement; without checks nothing is
    measured, so the next look is an interval on, never `now` (the daemon would spin); else when it was due."""
    if measured or not r.checks:
        return now + interval_s
    return r.next_check_at if r.next_check_at is not None else now


def _aborted(r: Rollout, now: float, reason: str) -> Rollout:
    return replace(r, state=RolloutPhase.ABORTED, since=now, reason=reason, next_check_at=None)


def checks_due(model: Model, rollout: Rollout | None, canaries: Sequence[CanaryCopy], now: float) -> bool:
    """Whether the checks measure in this pass: Progressing (or about to begin), every canary copy
    Ready as the pass left it, and the interval since the last measurement up."""
    if model.rollout is None or phase_for_plan(model, rollout) != RolloutPhase.PROGRESSING:
        return False
    if len(canaries) != len(canary_ids(model)) or any(c.phase != Phase.READY for c in canaries):
        return False
    r = current(model, rollout)
    return r is None or r.next_check_at is None or r.next_check_at <= now


def next_wake(model: Model, rollout: Rollout | None) -> float | None:
    """When the daemon should pass again for this rollout: the next measurement, or the end of analysis_s."""
    r = current(model, rollout)
    if r is None or r.state != RolloutPhase.PROGRESSING or r.ready_since is None:
        return None
    ends = r.ready_since + model.rollout.analysis_s
    return min(t for t in (r.next_check_at, ends) if t is not None)


def canary_weights(weight: int, canaries: int, stable: int) -> tuple[int, int]:
    """LiteLLM weights (per canary entry, per stable entry) that send `weight` percent of a model's
    requests to its canary copies together: LiteLLM picks an entry in proportion to its weight, so
    canary entries get weight*stable and stable ones (100-weight)*canaries, divided by their gcd."""
    if canaries <= 0 or stable <= 0:
        return 1, 1
    import math

    c, s = weight * stable, (100 - weight) * canaries
    g = math.gcd(c, s)
    return c // g, s // g


def out_of_sync(models: Iterable[Model], rollouts: Mapping[str, Rollout]) -> list[str]:
    """The models whose spec at HEAD was aborted, in words: the fleet is not in sync with HEAD for them."""
    said = []
    for m in models:
        r = current(m, rollouts.get(m.name))
        if r is not None and r.state == RolloutPhase.ABORTED:
            said.append(f"{m.name}: rollout of revision {r.revision or 'HEAD'} aborted: {r.reason}")
    return said


@frozen
class RolloutView:
    """A model's rollout as a plan shows it (`plan`, the PR comment, `explain`): its state, weight and
    check figures, and what the next pass does about it, in words."""

    model: str
    state: RolloutPhase
    weight: int
    checks: tuple[CheckTally, ...]
    next_step: str
    reason: str = ""


def view(model: Model, rollout: Rollout | None, changing: bool) -> RolloutView | None:
    """What the plan says of the model's rollout (pure); None when there is nothing to say: no
    `rollout:`, or no change under way and no rollout of this spec remembered."""
    policy = model.rollout
    if policy is None:
        return None
    r = current(model, rollout)
    canaries = ", ".join(canary_ids(model))
    if r is None:
        if not changing:
            return None
        return RolloutView(model.name, RolloutPhase.PROGRESSING, policy.weight, (),
                           f"a new spec: start the canary {canaries} with {policy.weight}% of the requests, then "
                           f"check it every {policy.interval_s:g} s for {policy.analysis_s:g} s before the rest")
    if r.state == RolloutPhase.PROGRESSING:
        if r.ready_since is None:
            step = f"wait for the canary {canaries} to be Ready, then check it every {policy.interval_s:g} s"
        else:
            step = (f"check the canary {canaries} every {policy.interval_s:g} s; promoted once the checks hold "
                    f"for {policy.analysis_s:g} s, aborted past {policy.failure_limit} failed measurement"
                    f"{'s' * (policy.failure_limit != 1)} of a check")
    elif r.state == RolloutPhase.PROMOTING:
        step = "replace the remaining old copies as section 7 says (each drained)"
    elif r.state == RolloutPhase.ABORTED:
        step = "stop the canary copies (drained); the old spec serves on, and this spec is not tried again until it changes"
    else:
        step = "nothing: every copy runs the new spec"
    return RolloutView(model.name, r.state, r.weight, r.checks, step, r.reason)


def checks_text(checks: Iterable[CheckTally]) -> str:
    """`request 3 passed, 1 failed (request: 1 of 2 failed: HTTP 500)`, each check, for one line."""
    return "; ".join(f"{c.name} {c.passed} passed, {c.failed} failed" + (f" ({c.last})" if c.last else "")
                     for c in checks)
