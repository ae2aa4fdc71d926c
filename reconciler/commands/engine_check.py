"""`reconciler engine-check NODE ENGINE [CATALOG]`: run the engine's --version on that node, on purpose.

The probe never runs an engine (a wrapper script named `vllm` may start a
server when handed flags it does not expect). This command does, because
whoever types it means to run the engine there.
"""

from __future__ import annotations

import sys

from reconciler.catalog import load_catalog
from reconciler.constants import Exit
from reconciler.errors import TransportError, UsageError
from reconciler.observe.ssh import TransportPool
from reconciler.vocabulary import TransportKind

# The argv that asks each engine for its version: fixed strings, nothing from the catalog.
VERSION_ARGV = {
    "vllm": ["vllm", "--version"],
    "llama.cpp": ["llama-server", "--version"],
    "sglang": ["python3", "-c", "import sglang; print(sglang.__version__)"],
}
TIMEOUT_S = 120.0


def main(args) -> int:
    catalog = load_catalog(args.catalog, with_revision=False)
    node = catalog.fleet.node(args.node)
    if node is None:
        known = ", ".join(n.id for n in catalog.fleet.nodes) or "none"
        raise UsageError(f"no node {args.node!r} in {catalog.root}/fleet.yaml (nodes: {known})")
    argv = VERSION_ARGV.get(args.engine)
    if argv is None:
        if args.engine == "command":
            raise UsageError("engine 'command' runs the profile's own command; there is no version to check")
        raise UsageError(f"unknown engine {args.engine!r}; one of: {', '.join(sorted(VERSION_ARGV))}")
    with TransportPool() as pool:
        try:
            result = pool.transport_for(node).run(argv, timeout=TIMEOUT_S)
        except TransportError as exc:
            if node.transport == TransportKind.LOCAL:  # this machine is always reached: the engine could not run here
                print(f"{node.id}: {args.engine}: {exc.reason}", file=sys.stderr)
                return Exit.FAILED
            print(f"reconciler: {exc}", file=sys.stderr)
            return Exit.UNREACHABLE
    out = result.stdout.decode(errors="replace").strip()
    err = result.stderr.decode(errors="replace").strip()
    shown = " ".join(argv)
    if result.rc != 0:
        print(f"{node.id}: {args.engine}: `{shown}` exited {result.rc}", file=sys.stderr)
        if err or out:
            print(err or out, file=sys.stderr)
        return Exit.FAILED
    print(f"{node.id}: {args.engine}: {out or err or '(printed nothing)'}")
    return Exit.OK
