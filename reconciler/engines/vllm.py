"""vLLM: `vllm serve SOURCE`, multi-node natively (multiprocessing executor, no Ray).

Per vLLM's multi-node MP documentation every node runs the same `vllm serve`
with `--nnodes --node-rank --master-addr --master-port`; ranks above 0 add
`--headless` (no API server, engine workers only). On CUDA with nnodes > 1
vLLM picks the `mp` executor by itself, so we do not force
`--distributed-executor-backend`. Checked against vLLM 0.33.0
(engine/arg_utils.py, config/parallel.py, entrypoints/common/cli_args.py). `--master-addr` defaults to 127.0.0.1 in
vLLM, which is exactly the seed's bug: we always pass the head's data address.
"""

from __future__ import annotations

from reconciler.engines.base import RankContext
from reconciler.engines.flags import sets_option

# Canonical names (the first long spelling of each option in vLLM's parser); the profile's
# args are matched to them as vLLM's parser reads them (`-tp`, `--tensor_parallel_size`, `--tensor-p`).
TP = frozenset({"--tensor-parallel-size"})
PP = frozenset({"--pipeline-parallel-size"})


class VllmAdapter:
    name = "vllm"
    owned_flags = frozenset(
        {"--host", "--port", "--model", "--served-model-name", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"}
    )

    def argv(self, ctx: RankContext) -> list[str]:
        p = ctx.profile
        argv = ["vllm", "serve", ctx.model.source, "--host", ctx.bind_host, "--port", str(ctx.assignment.port)]
        # The name the gateway files route by (SPEC section 10); vLLM's default is the source path.
        # Every rank, as vLLM's multi-node docs run the same command on every node.
        argv += ["--served-model-name", ctx.model.served]
        if p.gpus_per_node:
            # Common practice from vLLM's docs: TP inside a node (NVLink), PP across nodes.
            if not sets_option(self.name, p.args, TP):
                argv += ["--tensor-parallel-size", str(p.gpus_per_node)]
            if not sets_option(self.name, p.args, PP):
                argv += ["--pipeline-parallel-size", str(ctx.nnodes)]
        elif ctx.multi_node and not sets_option(self.name, p.args, PP):
            # CPU-only (vLLM's CPU build): one worker a node, the layers split across the nodes.
            # Without it the world size is 1 and vLLM refuses any --nnodes above 1 ("must evenly
            # divide the total world size (1)", vLLM 0.32.0 engine/arg_utils.py).
            argv += ["--pipeline-parallel-size", str(ctx.nnodes)]
        if ctx.multi_node:
            argv += [
                "--nnodes", str(ctx.nnodes),
                "--node-rank", str(ctx.rank),
                "--master-addr", ctx.head_address.bare,
                "--master-port", str(ctx.dist_port),
            ]
            if not ctx.is_head:
                argv.append("--headless")
        return argv + list(p.args)

    def listen_timeout_s(self, ctx: RankContext) -> float | None:
        return None  # the other ranks connect to the head, which starts last

    def env(self, ctx: RankContext) -> dict[str, str]:
        # The address this rank advertises to the others; without it vLLM guesses
        # from the default route, which on a multi-homed GPU node is often the
        # management network rather than the fabric. Only an IP: vLLM binds ZMQ
        # sockets on it, and a name (or ~/.ssh/config alias) cannot be bound.
        host = ctx.node.data_host
        return {"VLLM_HOST_IP": host.bare} if host.is_ip else {}

