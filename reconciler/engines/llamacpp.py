"""llama.cpp: `llama-server`, multi-node through ggml's RPC backend.

Ranks above 0 run `rpc-server --host H --port P`, which exposes their local
devices; the head runs `llama-server ... --rpc host:port,...` and connects OUT
to every rpc-server, so here the rendezvous runs the other way round from
vLLM/SGLang: the head needs the workers' addresses, not the reverse.

Profile args are llama-server's; rpc-server takes none of them.
"""

from __future__ import annotations

from reconciler.engines.base import RankContext, has_flag

NGL_FLAGS = frozenset({"-ngl", "--n-gpu-layers", "--gpu-layers"})
# Offload every layer: llama.cpp clamps to the model's layer count.
ALL_LAYERS = "99"


def rpc_bind_host(ctx: RankContext) -> str:
    """rpc-server has no authentication and hands out raw device memory, so it
    binds only the address the head reaches it on when that is an IP; a name
    may not be bindable on the node, and then it falls back to the common bind."""
    host = ctx.node.data_host
    return host.bare if host.is_ip else ctx.bind_host


class LlamaCppAdapter:
    name = "llama.cpp"
    owned_flags = frozenset({"-m", "--model", "--host", "--port", "--rpc"})

    def argv(self, ctx: RankContext) -> list[str]:
        p = ctx.profile
        if not ctx.is_head:
            return ["rpc-server", "--host", rpc_bind_host(ctx), "--port", str(ctx.assignment.port)]
        argv = ["llama-server", "-m", ctx.model.source, "--host", ctx.bind_host, "--port", str(ctx.assignment.port)]
        if not has_flag(p.args, NGL_FLAGS):
            argv += ["-ngl", ALL_LAYERS if p.gpus_per_node else "0"]
        if ctx.multi_node:
            argv += ["--rpc", ",".join(peer.address.with_port(peer.port) for peer in ctx.peers[1:])]
        return argv + list(p.args)

    def env(self, ctx: RankContext) -> dict[str, str]:
        return {}

