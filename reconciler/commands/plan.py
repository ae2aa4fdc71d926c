"""`reconciler plan`: what a reconcile pass would do, and why, without doing it."""

from __future__ import annotations

import gc
import sys
import time

import orjson

from reconciler.commands._observe import catalog_and_snapshot
from reconciler.constants import Exit
from reconciler.record.memory import load_memory, memory_path, plan_remembering
from reconciler.model import Action, Assignment, Placement
from reconciler.decide.placement import summarize
from reconciler.decide.plan_values import Plan
from reconciler.decide.autoscale import with_counts
from reconciler.decide.canary import RolloutView, checks_text
from reconciler.commands.plan_words import same_rejections, span, where_text
from reconciler.record.status.read_back import counts_in_force
from reconciler.record.status.predict import observed_revisions, predicted_pass
from reconciler.record.status.documents import rejection_document
from reconciler.record.status.write import write_pass
from reconciler.vocabulary import ActionKind
from reconciler.teardown import leave_to_exit

# A one-shot command (cli.main): under the console script its values are left to the exit.
ONE_SHOT = True


def _nodes(p: Placement | None) -> tuple[Assignment, ...]:
    # orjson writes a dataclass as the object of its fields in their order: an Assignment is exactly
    # SPEC section 5's {node, rank, gpus, hcas, port}, so 10,000 actions build no dicts for it
    # (0.04 s of a 4,000-node plan; the golden plans pin the bytes).
    return p.nodes if p is not None else ()


def action_document(a: Action) -> dict:
    """One action in the JSON shape of SPEC section 5 (plus `reason` everywhere and the extras noted)."""
    doc: dict = {"action": a.action, "replica": a.replica, "model": a.model}
    if a.action == ActionKind.STOP:
        doc["reason"] = a.reason
        # Extension: which node records the stop applies to.
        doc["nodes"] = [{"node": n.node, "rank": n.rank} for n in a.placement.nodes] if a.placement else []
        return doc
    p = a.placement
    if p is not None:
        doc["profile"] = p.profile
        doc["fabric"] = p.fabric
        doc["pool"] = p.pool
    doc["reason"] = a.reason
    doc["nodes"] = _nodes(p)
    if p is not None and p.dist_port is not None:
        doc["dist_port"] = p.dist_port
    if a.action == ActionKind.REPLACE:
        doc["stop_first"] = a.stop_first
    return doc


def write_bytes(data: bytes) -> None:
    """UTF-8 bytes to stdout as they are: decoding 3 MB of JSON only for the text layer to encode it again
    cost as much as orjson's writing. A stdout with no byte layer (a test's StringIO) gets the text."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(data.decode())
        return
    sys.stdout.flush()
    buffer.write(data)
    buffer.flush()


def plan_document(pl: Plan, show_all: bool = False) -> dict:
    """`plan --format json`'s document, for orjson (its placements' Assignment values included)."""
    unplaced = []
    for o in pl.unplaced:
        entry: dict = {"replica": o.replica, "model": o.model}
        if o.rejections_same_as:
            entry["rejections_same_as"] = o.rejections_same_as
        else:
            entry["rejections"] = [rejection_document(r) for r in o.rejections]
            entry["summary"] = summarize(o.rejections, o.nodes_considered, show_all)
        unplaced.append(entry)
    doc = {
        "revision": pl.revision,
        "actions": [action_document(a) for a in pl.actions],
        "unplaced": unplaced,
        # `kind` (a WaitKind) says why it waits, so a client reads it rather than parsing the reason's words.
        "waiting": [{"replica": w.replica, "model": w.model, "kind": w.kind, "reason": w.reason} for w in pl.waiting],
    }
    if pl.rollouts:  # only with a canary rollout to show: other plans keep their bytes
        doc["rollouts"] = [rollout_document(v) for v in pl.rollouts]
    return doc


def rollout_document(v: RolloutView) -> dict:
    """A canary rollout in `plan --format json` (SPEC section 13): state, weight, each check's figures."""
    return {"model": v.model, "state": str(v.state), "weight": v.weight,
            "checks": [{"name": c.name, "passed": c.passed, "failed": c.failed, "last": c.last} for c in v.checks],
            "reason": v.reason, "next_step": v.next_step}


def rollout_lines(v: RolloutView) -> list[str]:
    """A canary rollout in words: `plan`, `explain`."""
    out = [f"{v.model}: {v.state}, canary weight {v.weight}%" + (f": {v.reason}" if v.reason else "")]
    if v.checks:
        out.append(f"  checks: {checks_text(v.checks)}")
    out.append(f"  next: {v.next_step}")
    return out


def scale_lines(catalog, states) -> list[tuple[str, str, str]]:
    """(model, `min-max (now N)`, why) for every autoscaled model: the range git holds, the count status/ holds."""
    out = []
    for m in catalog.models:
        if m.scale is not None and m.name in states:
            st = states[m.name]
            out.append((m.name, f"{m.scale} (now {st.current})", st.reason))
    return out


def render_text(pl: Plan, show_all: bool = False, scaling=()) -> str:
    out = []
    if pl.revision:
        out.append(f"revision {pl.revision}")
    out += _actions_text(pl)
    if pl.unplaced:
        out += _unplaced_text(pl, show_all)
    if pl.waiting:
        out.append("")
        out.append("waiting:")
        for w in pl.waiting:
            out.append(f"  {w.replica}: {w.reason}")
    if pl.rollouts:
        out.append("")
        out.append("canary rollouts:")
        out += ["  " + line for v in pl.rollouts for line in rollout_lines(v)]
    if scaling:
        out.append("")
        out.append("autoscaled (replicas min-max, the count in force from status/):")
        for name, counts_text, why in scaling:
            out.append(f"  {name}: {counts_text}: {why}")
    out.append("")
    out.append(_totals_text(pl))
    return "\n".join(out) + "\n"


def _actions_text(pl: Plan) -> list[str]:
    """The actions as a table, or one line saying why there is none."""
    rows = [("ACTION", "REPLICA", "PROFILE", "NODES", "REASON")]
    for a in pl.actions:
        profile = a.placement.profile if a.placement is not None else "-"
        rows.append((a.action, a.replica, profile, where_text(a.placement), a.reason))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:4])) + "  " + r[4] for r in rows]
    if pl.unplaced or pl.waiting:  # no action, yet not every replica runs where it should
        held = [f"{len(pl.unplaced)} replica{'s' * (len(pl.unplaced) != 1)} cannot be placed"] if pl.unplaced else []
        held += [f"{len(pl.waiting)} waiting"] if pl.waiting else []
        return [f"no action to take: {', '.join(held)} (below)"]
    return ["nothing to do: every replica runs where it should"]


def _unplaced_text(pl: Plan, show_all: bool) -> list[str]:
    """Each unplaced replica's rejections, summarized; replicas rejected alike said once."""
    out = ["", "unplaced:"]
    same = same_rejections(pl)
    for o in pl.unplaced:
        if o.rejections_same_as:
            continue
        others = same.get(o.replica, [])
        more = f" (and {len(others)} more replica{'s' if len(others) != 1 else ''} of {o.model}: " \
               f"{span(others)}, same rejections)" if others else ""
        out.append(f"  {o.replica}{more}:")
        for line in summarize(o.rejections, o.nodes_considered, show_all):
            out.append(f"    {line}")
    return out


def _totals_text(pl: Plan) -> str:
    counts = {}
    for a in pl.actions:
        counts[a.action] = counts.get(a.action, 0) + 1
    summary = ", ".join(f"{counts.get(k, 0)} to {k}" for k in ("start", "stop", "replace", "restart"))
    return f"{summary}; {len(pl.unplaced)} unplaced"


def planned(catalog, inventory, *, now: float, explain=()) -> Plan:
    """The plan `apply` would make now: against the memory it keeps for this catalog on this host.
    `catalog` has its autoscaled counts in force already (scaled_catalog)."""
    return plan_remembering(catalog, inventory, now=now, memory=load_memory(memory_path(catalog.root)), explain=explain)


def scaled_catalog(catalog):
    """(the catalog at the counts in force, model -> autoscale state): a range's count is the one
    status/ holds, as `apply` and the daemon take it (SPEC section 11), min without it."""
    states = counts_in_force(catalog)
    return with_counts(catalog, states), states


def main(args) -> int:
    # A one-shot process that builds millions of long-lived objects (catalog, snapshot) and
    # frees them at exit: cyclic collection only re-walks them. Measured at 4,000 nodes it
    # costs a third of the run.
    gc.disable()
    catalog, inventory = catalog_and_snapshot(args.catalog, args.inventory)
    catalog, scaling = scaled_catalog(catalog)
    # The same memory `apply` keeps on this host (when each node went unreachable, what it ran,
    # restart backoff), so `plan` predicts what `apply` does, grace periods included.
    pl = planned(catalog, inventory, now=time.time())
    if args.format == "json":
        doc = plan_document(pl, args.all)
        write_bytes(orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE))
        leave_to_exit(doc)
    elif args.format == "markdown":
        from reconciler.commands.plan_markdown import render_markdown  # only when asked for: plan starts fast

        sys.stdout.write(render_markdown(pl, args.all, scaling=scale_lines(catalog, scaling)))
    else:
        sys.stdout.write(render_text(pl, args.all, scaling=scale_lines(catalog, scaling)))
    if args.write_status:
        predicted = predicted_pass(catalog, pl, observed_revisions(inventory))
        predicted.autoscale = scaling  # the count in force, kept: a plan never moves it
        predicted.rollouts = dict(load_memory(memory_path(catalog.root)).rollouts)  # kept as well
        write_pass(catalog, predicted, nodes=False)
        for warning in predicted.decisions:  # a gateway file edited by hand
            print(f"reconciler: warning: {warning.reason}", file=sys.stderr)
    leave_to_exit(catalog, inventory, pl)
    if args.fail_on_unplaced and pl.unplaced:
        n = len(pl.unplaced)
        print(f"reconciler: {n} replica{'s' if n != 1 else ''} could not be placed", file=sys.stderr)
        return Exit.FAILED
    return Exit.OK
