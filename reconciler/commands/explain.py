"""`reconciler explain MODEL`: where each replica went, or why it could not go anywhere, profile by profile."""

from __future__ import annotations

import gc
import sys
import time

from reconciler.commands._observe import catalog_and_snapshot
from reconciler.commands.plan import planned, rollout_lines, scaled_catalog
from reconciler.commands.plan_words import where_text
from reconciler.constants import Exit
from reconciler.errors import UsageError
from reconciler.model import Action
from reconciler.decide.placement import Outcome, summarize
from reconciler.decide.plan_values import Waiting
from reconciler.teardown import leave_to_exit

# A one-shot command (cli.main): under the console script its values are left to the exit.
ONE_SHOT = True


def main(args) -> int:
    # A one-shot process that builds millions of long-lived objects (catalog, snapshot) and
    # frees them at exit: cyclic collection only re-walks them. Measured at 4,000 nodes it
    # costs a third of the run.
    gc.disable()

    def model_in(catalog) -> None:
        if catalog.model(args.model) is None:
            names = ", ".join(m.name for m in catalog.models) or "none"
            raise UsageError(f"model {args.model} is not in the catalog (models: {names})")

    catalog, inventory = catalog_and_snapshot(args.catalog, args.inventory, check=model_in)
    catalog, scaling = scaled_catalog(catalog)
    model = catalog.model(args.model)
    pl = planned(catalog, inventory, now=time.time(), explain=[model.name])
    actions = {a.replica: a for a in pl.actions if a.model == model.name}
    waiting = {w.replica: w for w in pl.waiting if w.model == model.name}
    count = f"{model.scale} replicas (now {model.replicas}: {scaling[model.name].reason})" \
        if model.name in scaling else f"{model.replicas} replica{'s' if model.replicas != 1 else ''}"
    out = [f"{model.name}: {count}, "
           f"profiles in order: {', '.join(f'{p.name} (priority {p.priority})' for p in model.profiles)}"]
    # A canary rollout under way (SPEC section 13): its state, weight, check figures and next step.
    out += [("rollout " if i == 0 else "  ") + line for v in pl.rollouts if v.model == model.name
            for i, line in enumerate(rollout_lines(v))]
    for rid in model.replica_ids():
        o = pl.outcomes.get(rid)
        if o is None:
            continue
        a = actions.get(rid)
        if o.placement is not None:
            out += _placed_lines(rid, o, a, waiting.get(rid), len(catalog.fleet.nodes), args.all)
        else:
            out += _unplaced_lines(rid, o, a, args.all)
    sys.stdout.write("\n".join(out) + "\n")
    leave_to_exit(catalog, inventory, pl)
    return Exit.OK


def _placed_lines(rid: str, o: Outcome, a: Action | None, waiting: Waiting | None, fleet_size: int,
                  show_all: bool) -> list[str]:
    p = o.placement
    verb = "runs on" if o.kept else {"start": "would start on", "replace": "would move to",
                                      "restart": "would restart on"}.get(a.action if a else "", "goes to")
    out = [f"{rid}: {verb} {where_text(p)} (profile {p.profile}, pool {p.pool}"
           + (f", rendezvous port {p.dist_port}" if p.dist_port else "") + ")"]
    if a is not None:
        out.append(f"  {a.action}: {a.reason}")
    if waiting is not None:
        out.append(f"  waiting: {waiting.reason}")
    if o.rejections:
        out.append("  profiles that did not fit first:")
        out += [f"    {line}" for line in summarize(o.rejections, fleet_size, show_all)]
    return out


def _unplaced_lines(rid: str, o: Outcome, a: Action | None, show_all: bool) -> list[str]:
    if o.rejections_same_as:
        return [f"{rid}: cannot be placed; same rejections as {o.rejections_same_as}"]
    out = [f"{rid}: cannot be placed"]
    if a is not None:
        out.append(f"  {a.action}: {a.reason}")
    out += [f"  {line}" for line in summarize(o.rejections, o.nodes_considered, show_all)]
    out.append("  every node:" if show_all else "  node by node (first 20; --all for every node):")
    shown = o.rejections if show_all else o.rejections[:20]
    out += [f"    {r.profile} @ {r.pool}{'/' + r.node if r.node else ''}: {r.reason}" for r in shown]
    if len(shown) < len(o.rejections):
        out.append(f"    ... {len(o.rejections) - len(shown)} more")
    return out
