"""`plan --format markdown`: the plan as a pull-request comment (GitHub-flavoured Markdown).

A summary line; a table of actions; each unplaced replica's rejections grouped
by reason inside a <details> block (a 4,000-node fleet's rejections would
otherwise bury the comment). The first line is an HTML comment the CI example
finds the comment by, so a push updates it instead of adding another.

Everything from the catalog or a node is escaped for a table cell and stripped
of control characters: no terminal escapes, no HTML that a catalog value could
smuggle into a reviewer's page.
"""

from __future__ import annotations

import re

from reconciler.commands.plan_words import same_rejections, span, where_text
from reconciler.decide.canary import checks_text
from reconciler.decide.placement import Outcome, reason_groups
from reconciler.decide.plan_values import Plan

MARKER = "<!-- llm-reconciler plan -->"
MAX_NAMES = 20  # nodes named per reason; --all names every one
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ACTION_KINDS = ("start", "stop", "replace", "restart")


def cell(text: object) -> str:
    """Text safe inside a GFM table cell (and anywhere in the comment)."""
    s = _CONTROL.sub(" ", str(text))
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def code(text: object) -> str:
    """An inline code span; a value holding a backquote falls back to escaped text."""
    s = _CONTROL.sub(" ", str(text))
    return f"`{s}`" if "`" not in s and "|" not in s else cell(s)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def summary_line(pl: Plan) -> str:
    counts = {k: 0 for k in ACTION_KINDS}
    for a in pl.actions:
        counts[a.action] = counts.get(a.action, 0) + 1
    revision = f"revision {code(pl.revision[:12])}" if pl.revision else "the working tree (no git revision)"
    parts = ", ".join(f"{counts[k]} to {k}" for k in ACTION_KINDS)
    unplaced = f"**{_plural(len(pl.unplaced), 'replica')} cannot be placed**" if pl.unplaced else "every replica placed"
    waiting = f"; {len(pl.waiting)} waiting" if pl.waiting else ""
    return f"**reconciler plan** for {revision}: {parts}; {unplaced}{waiting}"


def render_markdown(pl: Plan, show_all: bool = False, scaling=()) -> str:
    """scaling: (model, `min-max (now N)`, why) per autoscaled model (plan.scale_lines)."""
    out = [MARKER, summary_line(pl), ""]
    out += _scaling_table(scaling)
    out += _rollouts_table(pl)
    out += _actions_table(pl)
    out += _unplaced_section(pl, show_all)
    out += _waiting_list(pl)
    return "\n".join(out).rstrip("\n") + "\n"


def _scaling_table(scaling) -> list[str]:
    if not scaling:
        return []
    return ["| Autoscaled model | Replicas | Why |", "|---|---|---|",
            *(f"| {code(name)} | {cell(counts)} | {cell(why)} |" for name, counts, why in scaling), ""]


def _rollouts_table(pl: Plan) -> list[str]:
    """Each canary rollout (SPEC section 13): its state, weight, check figures and next step."""
    if not pl.rollouts:
        return []
    return ["| Canary rollout | State | Weight | Checks | Next step |", "|---|---|---|---|---|",
            *(f"| {code(v.model)} | {cell(v.state)}{cell(': ' + v.reason) if v.reason else ''} | {v.weight}% | "
              f"{cell(checks_text(v.checks) or '-')} | {cell(v.next_step)} |" for v in pl.rollouts), ""]


def _actions_table(pl: Plan) -> list[str]:
    """The actions, one row each; without any, a line that says why nothing is done."""
    if not pl.actions:
        return ["No action to take." if pl.unplaced or pl.waiting else "Nothing to do: every replica runs where it should.", ""]
    out = ["| Action | Replica | Profile | Nodes | Reason |", "|---|---|---|---|---|"]
    for a in pl.actions:
        profile = a.placement.profile if a.placement is not None else "-"
        out.append(f"| {a.action} | {code(a.replica)} | {cell(profile)} | {cell(where_text(a.placement))} | {cell(a.reason)} |")
    out.append("")
    return out


def _unplaced_section(pl: Plan, show_all: bool) -> list[str]:
    """A <details> block per unplaced replica; replicas rejected the same way are named in the first one's."""
    if not pl.unplaced:
        return []
    out = ["### Unplaced", ""]
    same = same_rejections(pl)
    for o in pl.unplaced:
        if not o.rejections_same_as:
            out += _unplaced_details(o, same.get(o.replica, []), show_all)
    return out


def _unplaced_details(o: Outcome, others: list[str], show_all: bool) -> list[str]:
    """One unplaced replica: how many nodes fit each profile, then each profile's reasons table."""
    groups_by_profile = reason_groups(o.rejections)
    fits = "; ".join(
        f"{max(o.nodes_considered - len({n for _, nodes in groups for n in nodes}), 0)}/{o.nodes_considered} "
        f"nodes fit profile {cell(profile)}" for profile, groups in groups_by_profile)
    out = [f"<details><summary><code>{cell(o.replica)}</code> cannot be placed: {fits}</summary>", ""]
    if others:
        out += [f"The same rejections hold for {_plural(len(others), 'more replica')} of "
                f"{code(o.model)}: {cell(span(others))}.", ""]
    for profile, groups in groups_by_profile:
        out += [f"**profile {cell(profile)}**", "", "| Reason | Nodes |", "|---|---|"]
        out += [_reason_row(reason, nodes, show_all) for reason, nodes in groups]
        out.append("")
    return out + ["</details>", ""]


def _reason_row(reason: str, nodes: list[str], show_all: bool) -> str:
    """A reason and the nodes it rejected, at most MAX_NAMES of them named unless show_all."""
    shown = nodes if show_all or len(nodes) <= MAX_NAMES else nodes[:MAX_NAMES] + [f"... {len(nodes) - MAX_NAMES} more"]
    who = ", ".join(shown) if nodes else "(the pool as a whole)"
    count = f" ({len(nodes)})" if len(nodes) > 1 else ""
    return f"| {cell(reason)}{count} | {cell(who)} |"


def _waiting_list(pl: Plan) -> list[str]:
    if not pl.waiting:
        return []
    return ["### Waiting", "", *(f"- {code(w.replica)}: {cell(w.reason)}" for w in pl.waiting), ""]
