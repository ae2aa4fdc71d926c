"""An unplaced replica's rejections grouped as `plan --format markdown` groups them (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from reconciler.decide.placement import reason_groups

NODES_NAMED = 20  # nodes named per rejection reason before "... N more", as the pull-request comment does


@dataclass(frozen=True)
class RejectionGroups:
    """An unplaced replica's rejections as `plan --format markdown` groups them: per profile, per reason."""

    profiles: list[tuple[str, list[tuple[str, list[str], int]]]]  # (profile, [(reason, nodes named, count)])
    nodes_rejected: int


def rejection_groups(doc: dict, show_all: bool = False) -> RejectionGroups | None:
    """doc: the replica's entry in status/models/<model>.yaml; None when it has no rejections.
    show_all: every node of a reason named, not the first NODES_NAMED."""
    rejections = [r for r in doc.get("rejections") or [] if isinstance(r, dict)]
    if not rejections:
        return None
    out, rejected = [], set()
    for profile, groups in reason_groups(_rejection_objects(rejections)):
        rows = []
        for reason, nodes in groups:
            rejected.update(nodes)
            rows.append((reason, nodes if show_all else nodes[:NODES_NAMED], len(nodes)))
        out.append((profile, rows))
    return RejectionGroups(out, len(rejected))


def _rejection_objects(rejections: list[dict]) -> list[SimpleNamespace]:
    """The written rejections as the objects plan_markdown groups (profile, reason, node)."""
    return [SimpleNamespace(profile=str(r.get("profile") or "-"), reason=str(r.get("reason") or ""),
                            node=str(r["node"]) if r.get("node") else None) for r in rejections]
