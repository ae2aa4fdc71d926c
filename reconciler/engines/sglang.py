"""SGLang: `python3 -m sglang.launch_server`.

Flags checked against SGLang 0.5.23 (sglang/srt/arg_groups/fields/parallel.py).
Multi-node per SGLang's docs: every node runs the same command with the TOTAL
tensor-parallel size, `--nnodes`, its `--node-rank`, and `--dist-init-addr
HEAD:PORT` (the torch.distributed rendezvous on the head).
"""

from __future__ import annotations

from reconciler.engines.base import RankContext, has_flag

TP_FLAGS = frozenset({"--tp-size", "--tp", "--tensor-parallel-size"})


class SglangAdapter:
    name = "sglang"
    owned_flags = frozenset(
        {"--model-path", "--model", "--host", "--port", "--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"}
    )

    def argv(self, ctx: RankContext) -> list[str]:
        p = ctx.profile
        argv = [
            "python3", "-m", "sglang.launch_server",
            "--model-path", ctx.model.source,
            "--host", ctx.bind_host,
            "--port", str(ctx.assignment.port),
        ]
        if p.gpus_per_node and not has_flag(p.args, TP_FLAGS):
            argv += ["--tp-size", str(ctx.total_gpus)]
        if ctx.multi_node:
            argv += [
                "--nnodes", str(ctx.nnodes),
                "--node-rank", str(ctx.rank),
                "--dist-init-addr", ctx.head_address.with_port(ctx.dist_port or 0),
            ]
        return argv + list(p.args)

    def env(self, ctx: RankContext) -> dict[str, str]:
        return {}

