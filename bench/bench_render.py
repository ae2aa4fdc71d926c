"""How fast the renderer turns placements into launches (prints figures; not a test).

    python bench/bench_render.py [REPLICAS]

Renders REPLICAS two-node vLLM replicas and REPLICAS single-node command replicas
(placeholders resolved) against a fleet of 2*REPLICAS nodes with UUID-known GPUs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.model import (  # noqa: E402
    Assignment, Fleet, Gpu, Inventory, Model, NodeSpec, ObservedNode, Placement, Profile,
)
from reconciler.engines.render import render_replica  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    nodes = tuple(NodeSpec(id=f"n{i}", address=f"10.0.{i // 250}.{i % 250}", data_address=f"10.1.{i // 250}.{i % 250}",
                           fabrics={"ib": ("mlx5_0", "mlx5_1")}) for i in range(2 * n))
    fleet = Fleet(nodes=nodes)
    inventory = Inventory(nodes=tuple(
        ObservedNode(id=s.id, gpus=tuple(Gpu(index=g, uuid=f"GPU-{s.id}-{g}", name="H100", gpu_class="H100-80GB",
                                             memory_total_mb=81559) for g in range(8)))
        for s in nodes))
    vllm = Profile(name="tp8x2", engine="vllm", gpu_class="H100-80GB", gpus_per_node=8, nodes=2,
                   args=("--max-model-len", "8192"), env={"VLLM_LOGGING_LEVEL": "INFO"})
    cmd = Profile(name="cmd", engine="command", gpu_class="H100-80GB", gpus_per_node=1, port=9000,
                  command=("serve", "--model", "${MODEL_SOURCE}", "--port", "${PORT}", "--id", "${REPLICA_ID}"),
                  env={"DEV": "${CUDA_VISIBLE_DEVICES}"})
    big = Model(name="big", source="/models/big", profiles=(vllm,))
    small = Model(name="small", source="/models/small", profiles=(cmd,))

    jobs = []
    for i in range(n):
        a, b = nodes[2 * i].id, nodes[2 * i + 1].id
        jobs.append((big, vllm, Placement(replica=f"big-{i}", model="big", profile="tp8x2", fabric="ib", pool="ib/H100-80GB",
                                          nodes=(Assignment(a, 0, tuple(range(8)), ("mlx5_0", "mlx5_1"), 8000),
                                                 Assignment(b, 1, tuple(range(8)), ("mlx5_0", "mlx5_1"), 8000)),
                                          dist_port=29500)))
        jobs.append((small, cmd, Placement(replica=f"small-{i}", model="small", profile="cmd", fabric=None,
                                           pool="none/H100-80GB", nodes=(Assignment(a, 0, (0,), (), 9000),))))
    t0 = time.perf_counter()
    launches = sum(len(render_replica(m, p, pl, fleet, inventory)) for m, p, pl in jobs)
    dt = time.perf_counter() - t0
    print(f"rendered {len(jobs)} replicas ({launches} rank launches) on {len(nodes)} nodes in {dt * 1000:.0f} ms "
          f"= {dt / launches * 1e6:.1f} us per rank launch")


if __name__ == "__main__":
    main()
