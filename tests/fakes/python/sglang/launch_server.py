"""Fake SGLang server with SGLang 0.5.23's real flags, run by `sglang serve` (tests/fakes/bin/sglang)
or by the deprecated `python3 -m sglang.launch_server`. Its parser is plain argparse, as SGLang's:
abbreviations work (`--tp` is `--tp-size` only that way), underscores do not (`--tp_size` is an error).

Multi-node as SGLang: every rank gets the total --tp-size, --nnodes, --node-rank and
--dist-init-addr HEAD:PORT; ranks above 0 connect to the head there and serve only a
health endpoint. See fakeengine.py for the record and the environment it reads.
"""
import argparse
import sys

# _fakeengine.py is a symlink to ../fakeengine.py, so the package also works when a
# test fleet copies just this directory (shutil.copytree copies the file behind it).
from sglang import _fakeengine as fe


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr")
    p.add_argument("--dist-timeout", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--dtype")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--quantization")
    p.add_argument("--log-level")
    p.add_argument("--api-key")
    p.add_argument("--random-seed", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--attention-backend")
    p.add_argument("--schedule-policy")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-torch-compile", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.nnodes > 1 and not args.dist_init_addr:
        fe.die("--dist-init-addr is required when --nnodes > 1")
    if not 0 <= args.node_rank < args.nnodes:
        fe.die(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1}")
    world = args.tp_size * args.pp_size
    if world % args.nnodes:
        fe.die(f"tp_size * pp_size = {world} is not divisible by nnodes {args.nnodes}")
    fe.check_gpus(world // args.nnodes, "sglang")
    master = None
    if args.dist_init_addr:
        try:
            master = fe.split_host_port(args.dist_init_addr)
        except ValueError as exc:
            fe.die(str(exc))
    role = "single" if args.nnodes == 1 else ("head" if args.node_rank == 0 else "worker")
    engine = fe.Engine(
        "sglang", role=role, host=args.host, port=args.port, model=args.served_model_name or args.model_path,
        nnodes=args.nnodes, node_rank=args.node_rank,
        hello={"model": args.model_path, "tp_size": args.tp_size, "nnodes": args.nnodes,
               "dist_init_addr": args.dist_init_addr, "rendezvous_host": master[0] if master else ""},
    )
    # SGLang's ranks above 0 run a dummy health server on --host/--port.
    return fe.run_rendezvous_engine(engine, master=master, worker_serves_http=True)


if __name__ == "__main__":
    print("UserWarning: 'python -m sglang.launch_server' is still supported, but 'sglang serve' is the "
          "recommended entrypoint.", file=sys.stderr)
    sys.exit(main())
