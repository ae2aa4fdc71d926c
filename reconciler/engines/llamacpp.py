"""llama.cpp: `llama-server`, multi-node through ggml's RPC backend.

Ranks above 0 run llama.cpp's RPC server (`ggml-rpc-server`; `rpc-server` in older
builds: whichever the node has, as the probe found it) with `-H H -p P -t N`; it
exposes the node's devices (its CPU on a CPU-only node). The head runs
`llama-server ... --rpc host:port,...` and connects OUT to every RPC server, so
the rendezvous runs the other way round from vLLM/SGLang: the head needs the
workers' addresses, not the reverse.

Every rank does a share of the work: the RPC devices count as offload devices,
so a multi-node head always gets `-ngl` high enough to offload every layer
(llama.cpp clamps it to the model's layer count) and splits them across the
workers by their memory. `-ngl 0` there would leave all the work on the head
while the workers idle (the seed's bug); a profile asking for it is refused.

Profile args are llama-server's; the RPC server takes none of them and computes
with every core its node has (`-t`, from the probe). Flags read from
llama.cpp 0.3.36's vendored common/arg.cpp and tools/rpc/rpc-server.cpp.
ggml's RPC speaks IPv4 only (`--rpc [v6]:port` aborts the head, the RPC server
exits 0 without serving on a v6 host), so an IPv6 data address is refused.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from reconciler.engines.base import RankContext
from reconciler.engines.flags import option_uses
from reconciler.model import Inventory, NodeSpec, Profile

NGL = "--gpu-layers"
# Offload every layer: llama.cpp clamps to the model's layer count.
ALL_LAYERS = "99"
# The head dials every RPC server once at start and aborts if one does not answer, so a worker
# must listen before the head starts; an RPC server listens within a second (a GPU node's
# device set-up takes a few more).
RPC_LISTEN_TIMEOUT_S = 30.0
# What a rank above 0 runs when the node's binaries were never probed: the current name.
DEFAULT_RPC_SERVER = "ggml-rpc-server"


def rpc_bind_host(ctx: RankContext) -> str:
    """The RPC server has no authentication and hands out raw device memory, so it
    binds only the address the head reaches it on when that is an IP; a name
    may not be bindable on the node, and then it falls back to the common bind."""
    host = ctx.node.data_host
    return host.bare if host.is_ip else ctx.bind_host


def offloads_nothing(value: str | None) -> bool:
    """`-ngl 0` (or a negative count llama.cpp reads as 0 layers): no layer leaves the head."""
    if value is None:
        return False
    try:
        return int(value.strip()) == 0
    except ValueError:
        return False  # auto, all


def zero_offload_arg(profile: Profile) -> int | None:
    """Index in a multi-node profile's args of a `-ngl 0` (the token naming the flag), else None."""
    if profile.nodes <= 1:
        return None
    for use in option_uses("llama.cpp", profile.args, frozenset({NGL})):
        if use.option == NGL and offloads_nothing(use.value):
            return use.index
    return None


def llama_cpp_problems(profile: Profile, nodes: Sequence[NodeSpec], inventory: Inventory) -> Iterator[str]:
    """Why these nodes, in rank order, cannot run this llama.cpp profile (render's last check)."""
    multi = len(nodes) > 1
    if zero_offload_arg(profile) is not None:
        yield (f"profile {profile.name}: args keep every layer on the head (-ngl 0), so the other ranks "
               "would hold no part of the model; leave -ngl out or give a count above 0")
    for rank, spec in enumerate(nodes):
        if multi and spec.data_host.is_ipv6:
            yield (f"node {spec.id} (rank {rank}) has IPv6 data address {spec.data_address}; llama.cpp's RPC "
                   "between ranks speaks IPv4 only")
        observed = inventory.node(spec.id)
        binaries = observed.llama_cpp if observed is not None else None
        if binaries is not None and not binaries.can_run_rank(rank):
            need = "llama-server" if rank == 0 else "llama.cpp's RPC server (ggml-rpc-server or rpc-server)"
            yield f"node {spec.id} (rank {rank}) has no {need} on its PATH"


class LlamaCppAdapter:
    name = "llama.cpp"
    owned_flags = frozenset({"--model", "--model-url", "--hf-repo", "--docker-repo", "--host", "--port", "--rpc"})

    def argv(self, ctx: RankContext) -> list[str]:
        p = ctx.profile
        if not ctx.is_head:
            argv = [ctx.rpc_server or DEFAULT_RPC_SERVER, "-H", rpc_bind_host(ctx), "-p", str(ctx.assignment.port)]
            # Every core the node has: the RPC server alone would use half of them.
            return argv + (["-t", str(ctx.cpu_count)] if ctx.cpu_count else [])
        uses = {u.option for u in option_uses(self.name, p.args)}
        argv = ["llama-server", "-m", ctx.model.source, "--host", ctx.bind_host, "--port", str(ctx.assignment.port)]
        if NGL not in uses:
            argv += ["-ngl", ALL_LAYERS if (p.gpus_per_node or ctx.multi_node) else "0"]
        if ctx.multi_node:
            argv += ["--rpc", ",".join(peer.address.with_port(peer.port) for peer in ctx.peers[1:])]
        return argv + list(p.args)

    def listen_timeout_s(self, ctx: RankContext) -> float | None:
        return None if ctx.is_head else min(RPC_LISTEN_TIMEOUT_S, ctx.profile.start_timeout_s)

    def env(self, ctx: RankContext) -> dict[str, str]:
        return {}

