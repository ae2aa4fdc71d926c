"""`reconciler logs REPLICA [CATALOG] [--rank N] [--tail N] [--follow]`: an engine's own log, from its node.

Where the replica runs comes from status/ (what the reconciler last wrote); the
log itself is the node agent's per-rank file on that node (the engine's stdout
and stderr, latest start), read over the same transport as every other action.
`--follow` asks the node for what was appended since the last read, once a
second, until interrupted.
"""

from __future__ import annotations

import sys
import time

from reconciler.catalog import load_catalog
from reconciler.commands._status_files import read_catalog_status
from reconciler.constants import Exit
from reconciler.errors import TransportError, UsageError
from reconciler.launcher import SshLauncher
from reconciler.owner import catalog_owner
from reconciler.ssh import TransportPool

FOLLOW_POLL_S = 1.0
CALL_TIMEOUT_S = 30.0


def _fail(message: str) -> int:
    print(f"reconciler: {message}", file=sys.stderr)
    return Exit.FAILED


def main(args) -> int:
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: give a number of lines, 0 or more")
    status = read_catalog_status(args.catalog)
    replicas = status.replicas()
    if args.replica not in replicas:
        known = ", ".join(sorted(replicas)) or "none (nothing has written status/ yet)"
        return _fail(f"no replica {args.replica!r} in {status.root / 'status'}; replicas: {known}")
    _, replica = replicas[args.replica]
    ranks = {n.get("rank"): n.get("node") for n in replica.get("nodes") or []}
    if not ranks:
        why = " ".join(str(replica.get("message") or "").split())
        return _fail(f"{args.replica} runs on no node ({replica.get('phase') or 'Unknown'}"
                     f"{': ' + why if why else ''}), so it has no log")
    if args.rank not in ranks:
        return _fail(f"{args.replica} has no rank {args.rank}; its ranks: "
                     + ", ".join(f"{r} on {n}" for r, n in sorted(ranks.items())))
    node_id = ranks[args.rank]
    catalog = load_catalog(args.catalog, with_revision=False)
    node = catalog.fleet.node(node_id)
    if node is None:
        return _fail(f"{args.replica} rank {args.rank} runs on node {node_id}, which fleet.yaml no longer has")
    where = f"{args.replica} rank {args.rank} on {node_id}"
    with TransportPool() as pool:
        try:
            # The owner names the rank's files on the node (records and logs of another catalog sharing it differ).
            launcher = SshLauncher({node.id: pool.transport_for(node)}, {node.id: node.state_dir},
                                   timeout_s=CALL_TIMEOUT_S, owner=catalog_owner(catalog))
            chunk = launcher.logs(node.id, args.replica, args.rank, lines=100 if args.tail is None else args.tail)
            if not chunk.exists:
                return _fail(f"{where}: no log yet (that rank has not been started there)")
            _print(chunk.lines)
            offset = chunk.offset
            while args.follow:
                time.sleep(FOLLOW_POLL_S)
                chunk = launcher.logs(node.id, args.replica, args.rank, offset=offset)
                _print(chunk.lines)
                offset = chunk.offset
        except TransportError as exc:
            print(f"reconciler: {where}: node did not answer: {exc.reason}", file=sys.stderr)
            return Exit.UNREACHABLE
    return Exit.OK


def _print(lines) -> None:
    if lines:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
