"""`engine: command`: the profile's own argv, with the SPEC placeholders resolved.

The values are computed here; the substitution itself (and the refusal of
anything left unresolved) is render.py's, shared with every other engine.
"""

from __future__ import annotations

from reconciler.engines.base import RankContext


def placeholder_values(ctx: RankContext) -> dict[str, str | None]:
    """Value of every SPEC placeholder for this rank; None where it has none (a refusal if used)."""
    return {
        "MODEL_SOURCE": ctx.model.source,
        "REPLICA_ID": ctx.replica,
        "NODE_RANK": str(ctx.rank),
        "NNODES": str(ctx.nnodes),
        "HEAD_ADDRESS": ctx.head_address.bare,
        "PORT": str(ctx.assignment.port),
        "DIST_PORT": str(ctx.dist_port) if ctx.dist_port is not None else None,
        "GPUS_PER_NODE": str(ctx.profile.gpus_per_node),
        "CUDA_VISIBLE_DEVICES": ctx.cuda_visible_devices,
    }


class CommandAdapter:
    name = "command"
    owned_flags: frozenset[str] = frozenset()

    def argv(self, ctx: RankContext) -> list[str]:
        # Unresolved here on purpose: render substitutes with placeholder_values().
        # `args` go after the command, as for every other engine (they were once dropped silently).
        return list(ctx.profile.command or ()) + list(ctx.profile.args)

    def listen_timeout_s(self, ctx: RankContext) -> float | None:
        return None  # the other ranks connect to the head, which starts last

    def env(self, ctx: RankContext) -> dict[str, str]:
        return {}

