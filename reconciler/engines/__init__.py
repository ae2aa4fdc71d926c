"""One adapter per engine: the argv and environment of one rank of one replica.

    ADAPTERS["vllm"].argv(ctx) -> ["vllm", "serve", ...]

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


__all__ = ["ADAPTERS", "EngineAdapter", "Peer", "RankContext"]
