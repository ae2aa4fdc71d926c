"""`reconciler run`: the daemon. Wiring only; the loop lives in reconciler/daemon.py."""

from __future__ import annotations

import sys
from pathlib import Path

from reconciler.daemon import Daemon, DaemonOptions, EventLog, PassFn
from reconciler.errors import ReconcilerError, UsageError


def daemon_from_args(args, *, pass_fn: PassFn | None = None, load=None, stream=None) -> Daemon:
    if args.push and not args.commit_status:
        raise UsageError("--push pushes status commits: it needs --commit-status")
    if args.interval <= 0:
        raise UsageError(f"--interval must be above 0 seconds, not {args.interval:g}")
    if args.max_passes is not None and args.max_passes < 1:
        raise UsageError("--max-passes must be at least 1")
    if not Path(args.catalog).is_dir():
        raise ReconcilerError(f"{args.catalog}: no such catalog directory")
    log = EventLog(args.log_format, stream if stream is not None else sys.stderr)
    options = DaemonOptions(
        interval=args.interval,
        git_pull=args.git_pull,
        commit_status=args.commit_status,
        push=args.push,
        metrics_address=args.metrics_address,
        max_passes=args.max_passes,
    )
    if options.metrics_address:  # a bad address is a usage error before anything starts
        from reconciler.metrics import parse_address

        parse_address(options.metrics_address)
    return Daemon(args.catalog, pass_fn=pass_fn or apply_pass(), load=load, options=options, log=log)


def apply_pass() -> PassFn:
    """The real pass: reconciler.apply.run_pass with transports kept open across passes."""
    try:
        from reconciler.apply import run_pass
    except ImportError as exc:
        raise ReconcilerError(f"the apply pass is not available in this build ({exc})") from exc

    def one_pass(catalog, log):
        return run_pass(catalog, transports=None, log=log)

    return one_pass


def main(args) -> int:
    return daemon_from_args(args).serve()
