"""Spec changes rolled out on a fleet that may have no spare room (SPEC section 7, Updates). Pure.

The plan calls `roll_out` after every missing replica of every model has been
placed, with every running copy still holding its GPUs. So whatever room is
left is room that no missing replica needs, and a surge into it can never make
another replica unplaced: that is the whole of the "surge only into room no
missing replica needs" rule. Where no such room is left the replica is replaced
in place: its old copy is released and the new one placed on the same nodes
(the same GPUs where the profile's shape allows), to be stopped
first and started after.

How many replicas of one model change in one pass:
- the default (no `update`): one, by surge when there is room, else in place;
- `update: {max_surge: S, max_unavailable: U}`: up to S surges and up to U
  in-place replaces, U less the replicas of the model that are down already
  (unplaced, or restarting), as Kubernetes counts it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from reconciler.frozen import frozen
from reconciler.model import Model, Placement
from reconciler.decide.placement import Outcome, Placer

SURGE, IN_PLACE, ELSEWHERE, NO_FIT, WAIT = "surge", "in place", "elsewhere", "no fit", "wait"


@frozen
class SpecChange:
    """A running copy whose spec no longer matches the catalog."""

    model: Model
    ordinal: int
    old: Placement
    reason: str  # "spec changed", "profile x is no longer in the catalog"


@frozen
class Step:
    """What happens to one changed replica in this pass."""

    change: SpecChange
    how: str  # SURGE | IN_PLACE | ELSEWHERE | NO_FIT | WAIT
    outcome: Outcome  # the new placement (or, for WAIT, the old copy, kept)
    reason: str

    @property
    def replica(self) -> str:
        return self.change.old.replica

    @property
    def stop_first(self) -> bool:
        return self.how in (IN_PLACE, ELSEWHERE)


def _budget(model: Model, down: int) -> tuple[int, int, int]:
    """(surges, in-place replaces, replicas in all) allowed for this model in this pass."""
    if model.update is None:
        return 1, 1, 1
    unavailable = max(0, model.update.max_unavailable - down)
    return model.update.max_surge, unavailable, model.update.max_surge + unavailable


def roll_out(placer: Placer, changes: Iterable[SpecChange], *, down: Mapping[str, int] | None = None,
             explain: frozenset[str] = frozenset()) -> list[Step]:
    """Decide each spec change: surge, in place, elsewhere (stop first), no fit, or wait for its turn.

    placer  holds every running copy and every replica placed this pass already
    down    per model, its desired replicas that are not serving and will not be after this pass
    """
    down = down or {}
    steps: list[Step] = []
    by_model: dict[str, list[SpecChange]] = {}
    for c in changes:
        by_model.setdefault(c.model.name, []).append(c)
    for name in sorted(by_model):
        todo = sorted(by_model[name], key=lambda c: c.ordinal)
        model = todo[0].model
        surges, in_place, total = _budget(model, down.get(name, 0))
        first: str | None = None
        for c in todo:
            rid = c.old.replica
            if total <= 0:
                steps.append(Step(c, WAIT, Outcome(rid, name, c.old, kept=True), _wait_reason(model, c, first, down.get(name, 0))))
                continue
            if surges > 0:
                out = placer.place(model, rid, exclude=[a.node for a in c.old.nodes], explain=name in explain,
                                   rejections_wanted=False)  # only tried: in place comes next
                if out.placement is not None:
                    surges, total = surges - 1, total - 1
                    first = first or rid
                    # Started beside the old copy, which goes once the new one is Ready (stop_first False says so).
                    steps.append(Step(c, SURGE, out, c.reason))
                    continue
            if in_place <= 0:
                steps.append(Step(c, WAIT, Outcome(rid, name, c.old, kept=True), _wait_reason(model, c, first, down.get(name, 0))))
                continue
            in_place, total = in_place - 1, total - 1
            first = first or rid
            placer.release(c.old)
            out = placer.place_on(model, rid, c.old)
            if out.placement is not None:
                steps.append(Step(c, IN_PLACE, out, f"{c.reason}; replaced in place (no room to surge beside the old "
                                                    "copy), so the old copy is stopped first"))
                continue
            # The new spec does not fit on the old copy's own nodes (another shape): anywhere else, stop first.
            out = placer.place(model, rid, explain=name in explain)
            if out.placement is not None:
                steps.append(Step(c, ELSEWHERE, out, f"{c.reason}; no room beside the old copy, so it is stopped first"))
                continue
            placer.hold(c.old)
            steps.append(Step(c, NO_FIT, out, f"{c.reason}; no placement fits, the old copy keeps running"))
    return steps


def _wait_reason(model: Model, c: SpecChange, first: str | None, down: int) -> str:
    old = f"{c.reason}; runs the old spec"
    if first is not None and model.update is None:
        return f"{old}, waiting for {first} to be replaced first (one at a time per model)"
    if model.update is None:
        return f"{old}, waiting for its turn (one at a time per model)"
    u = model.update
    if first is not None:
        return f"{old}, waiting: {first} is being replaced (max_surge {u.max_surge}, max_unavailable {u.max_unavailable})"
    if u.max_unavailable == 0:
        return f"{old}, waiting: no room to surge and max_unavailable is 0"
    return (f"{old}, waiting: no room to surge and {down} replica{'s' if down != 1 else ''} of {model.name} "
            f"already down (max_unavailable {u.max_unavailable})")
