"""SGLang: `sglang serve` (`python3 -m sglang.launch_server` is deprecated in 0.5.23).

Flags checked against SGLang 0.5.23's own parser (tests/data/engine_parsers/sglang.json).
Multi-node per SGLang's docs: every node runs the same command with the TOTAL
tensor-parallel size, `--nnodes`, its `--node-rank`, and `--dist-init-addr
HEAD:PORT` (the torch.distributed rendezvous on the head).
"""

from __future__ import annotations

from reconciler.engines.base import RankContext
from reconciler.engines.flags import sets_option

# Canonical names in SGLang's parser; `--tp` only works there as an abbreviation of --tp-size.
TP = frozenset({"--tp-size"})


class SglangAdapter:
    name = "sglang"
    owned_flags = frozenset(
        {"--model-path", "--served-model-name", "--host", "--port", "--nnodes", "--node-rank", "--dist-init-addr"}
    )

    def argv(self, ctx: RankContext) -> list[str]:
        p = ctx.profile
        argv = [
            "sglang", "serve",
            "--model-path", ctx.model.source,
            "--host", ctx.bind_host,
            "--port", str(ctx.assignment.port),
            # The name the gateway files route by (SPEC section 10); SGLang's default is the source path.
            "--served-model-name", ctx.model.served,
        ]
        if p.gpus_per_node and not sets_option(self.name, p.args, TP):
            argv += ["--tp-size", str(ctx.total_gpus)]
        if ctx.multi_node:
            argv += [
                "--nnodes", str(ctx.nnodes),
                "--node-rank", str(ctx.rank),
                "--dist-init-addr", ctx.head_address.with_port(ctx.dist_port or 0),
            ]
        return argv + list(p.args)

    def listen_timeout_s(self, ctx: RankContext) -> float | None:
        return None  # the other ranks connect to the head, which starts last

    def env(self, ctx: RankContext) -> dict[str, str]:
        return {}

