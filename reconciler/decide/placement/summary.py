"""Summaries of rejections in the style of the Kubernetes scheduler, with nodes named.

`0/12 nodes fit profile h100-tp8: 8 have too few free H100-80GB GPUs (a1: 4 free, needs 8; ...)`:
one line per profile, the nodes grouped by the kind of their reason (never by its wording),
the nearest misses first.
"""

from __future__ import annotations

from typing import Sequence

from reconciler.model import Reason, RejectKind, Rejection, figure

# Nodes named per group in a summary line unless --all is given.
SUMMARY_NAMES = 3


def reason_groups(rejections) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Per profile (in the order tried), its rejections grouped by their words, most nodes first: the
    pull-request comment's and the dashboard's grouping. `rejections`: anything with .profile, .reason
    (text) and .node (None for a pool's), so written rejections read back group as the plan's do."""
    by_profile: dict[str, dict[str, list[str]]] = {}
    for r in rejections:
        by_profile.setdefault(r.profile, {}).setdefault(r.reason, [])
        if r.node and r.node not in by_profile[r.profile][r.reason]:
            by_profile[r.profile][r.reason].append(r.node)
    return [(profile, sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))
            for profile, groups in by_profile.items()]

# --------------------------------------------------------------------------

def _group(why: Reason) -> tuple[str, str] | None:
    """The group a node's reason joins in a summary line: (said of one node, said of several)."""
    key = (why.kind, why.resource, why.requested)
    label = _GROUP_CACHE.get(key)
    if label is None:
        label = _GROUP_CACHE[key] = _group_label(why)
    return label or None


def _group_label(why: Reason) -> tuple[str, str] | tuple[()]:
    k = why.kind
    if k is RejectKind.NODE_STATE:
        return f"is {why.resource}", f"are {why.resource}"
    if k is RejectKind.LABEL:
        return f"lacks label {why.resource}={why.requested}", f"lack label {why.resource}={why.requested}"
    if k is RejectKind.ENGINE:
        return f"lacks engine {why.resource}", f"lack engine {why.resource}"
    if k is RejectKind.LLAMA_BINARY:
        what = "llama-server" if why.requested == "head" else "llama.cpp RPC server"
        return f"has no {what}", f"have no {what}"
    if k is RejectKind.GPUS:
        return f"has too few free {why.resource} GPUs", f"have too few free {why.resource} GPUs"
    if k is RejectKind.GPU_UNHEALTHY:
        return f"has too few free healthy {why.resource} GPUs", f"have too few free healthy {why.resource} GPUs"
    if k is RejectKind.WEIGHTS:
        return f"lacks the weights {why.resource} (no fetch)", f"lack the weights {why.resource} (no fetch)"
    return _GROUPS.get(k, ())


# (kind, resource, requested) -> group label; a few dozen distinct ones per pass, asked 100,000 times.
_GROUP_CACHE: dict[tuple, tuple[str, str] | tuple[()]] = {}
_GROUPS = {
    RejectKind.MEMORY: ("has too little memory", "have too little memory"),
    RejectKind.DISK: ("has too little disk for the weights", "have too little disk for the weights"),
    RejectKind.HOSTS_MODEL: ("already hosts this model", "already host this model"),
    RejectKind.REPLACED_COPY: ("runs the copy being replaced", "run the copy being replaced"),
    RejectKind.NO_FABRIC: ("is on no fabric", "are on no fabric"),
    RejectKind.NO_ADAPTERS: ("has no adapters on the fabric", "have no adapters on the fabric"),
    RejectKind.IPV6_RPC: ("has an IPv6 data address (llama.cpp RPC is IPv4 only)",
                          "have an IPv6 data address (llama.cpp RPC is IPv4 only)"),
}
# The figures a summary shows beside each node's name, for the kinds that have them.
_DETAIL = {
    RejectKind.MEMORY: lambda r: f"{figure(r.available)} GiB, needs {figure(r.requested)}",
    RejectKind.DISK: lambda r: f"{figure(r.available)} GiB free, needs {figure(r.requested)}",
    RejectKind.GPUS: lambda r: f"{r.available} free, needs {r.requested}",
    RejectKind.GPU_UNHEALTHY: lambda r: f"{r.available} free, needs {r.requested} ({r.unhealthy})",
}


def _summary_entry(node: str, why: Reason) -> tuple[tuple, str]:
    """(sort key, text) of one node in its group: the nearest misses first ("h100-a3: 7 free, needs 8"
    before "l40s-c1: 0 free, needs 8"), then by name."""
    detail = _DETAIL.get(why.kind)
    if detail is None:
        return (0.0, node), node
    text = f"{node}: {detail(why)}"
    return (-float(why.available), text), text


def summarize(rejections: Sequence[Rejection], total_nodes: int, show_all: bool = False) -> list[str]:
    """One line per profile: `0/12 nodes fit profile h100-tp8: 8 have too few free H100-80GB GPUs (a1: 4 free, needs 8; ...), 4 lack label zone=a (...)`."""
    by_profile: dict[str, list[Rejection]] = {}
    for r in rejections:
        by_profile.setdefault(r.profile, []).append(r)
    lines = []
    for profile, rejs in by_profile.items():
        groups: dict[tuple[str, str], list[tuple[tuple, str]]] = {}
        pool_lines: list[str] = []
        rejected_nodes: set[str] = set()
        for r in rejs:
            if not r.node:
                pool_lines.append(r.reason)
                continue
            if r.node in rejected_nodes:
                continue
            rejected_nodes.add(r.node)
            label = _group(r.why) or (r.reason, r.reason)
            groups.setdefault(label, []).append(_summary_entry(r.node, r.why))
        parts = []
        for label, entries in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            names = [text for _, text in sorted(entries)]
            shown = names if show_all or len(names) <= SUMMARY_NAMES else names[:SUMMARY_NAMES]
            sep = "; " if any(":" in s for s in shown) else ", "
            more = "" if len(shown) == len(names) else f"{sep}... {len(names) - len(shown)} more"
            parts.append(f"{len(names)} {label[0] if len(names) == 1 else label[1]} ({sep.join(shown)}{more})")
        fit = max(total_nodes - len(rejected_nodes), 0)
        head = f"{fit}/{total_nodes} nodes fit profile {profile}"
        body = ", ".join(parts)
        tail = "; ".join(pool_lines)
        line = head + (": " + body if body else "")
        if tail:
            line += ("; " if body else ": ") + tail
        lines.append(line)
    return lines
