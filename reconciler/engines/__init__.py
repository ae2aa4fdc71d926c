"""One adapter per engine: the argv and environment of one rank of one replica.

    adapter_for("vllm").argv(ctx) -> ["vllm", "serve", ...]

Adapters are pure. Everything they produce goes through render.render_replica,
which resolves placeholders and refuses unsafe launches.
"""

from __future__ import annotations

from reconciler.engines.base import EngineAdapter, Peer, RankContext
from reconciler.engines.command import CommandAdapter
from reconciler.engines.llamacpp import LlamaCppAdapter
from reconciler.engines.sglang import SglangAdapter
from reconciler.engines.vllm import VllmAdapter

ADAPTERS: dict[str, EngineAdapter] = {
    a.name: a for a in (VllmAdapter(), SglangAdapter(), LlamaCppAdapter(), CommandAdapter())
}


def adapter_for(engine: str) -> EngineAdapter:
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise KeyError(f"unknown engine {engine!r}; known: {', '.join(sorted(ADAPTERS))}") from None


def version_argv(engine: str) -> list[str]:
    """The command that prints an engine's version on a node (for `engine-check`); [] for `command`."""
    return adapter_for(engine).version_argv()


__all__ = ["ADAPTERS", "EngineAdapter", "Peer", "RankContext", "adapter_for", "version_argv"]
