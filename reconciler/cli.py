"""Argument parsing and wiring. Each command's work lives in reconciler/commands/<name>.py.

Exit codes (SPEC section 5): 0 success; 1 invalid catalog or, for `plan
--fail-on-unplaced`, an unplaced replica; 2 usage error; 3 the fleet could not
be reached at all. Anything a user typed that is wrong ends in a message, not
a traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import NoReturn

from reconciler import teardown
from reconciler.constants import Exit
from reconciler.errors import CatalogInvalid, FleetUnreachable, ReconcilerError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors; keep that, with our prefix
        self.print_usage(sys.stderr)
        print(f"reconciler: error: {message}", file=sys.stderr)
        sys.exit(Exit.USAGE)


def _catalog_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("catalog", nargs="?", default=".", metavar="CATALOG", help="catalog directory (default: .)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="reconciler", description="GitOps reconciler for LLM serving fleets")
    from reconciler import __version__

    parser.add_argument("--version", action="version", version=f"reconciler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("validate", help="check the catalog: schema, references, loopback, YAML syntax")
    _catalog_arg(p)
    p.add_argument("--inventory", metavar="FILE", help="also report models that no profile can ever fit on this snapshot")

    p = sub.add_parser("plan", help="compute what a reconcile would do")
    _catalog_arg(p)
    p.add_argument("--inventory", metavar="FILE", help="plan from this snapshot (YAML or JSON): no SSH at all")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="markdown: the plan as a pull-request comment")
    p.add_argument("--write-status", action="store_true", help="write the predicted status files into CATALOG/status")
    p.add_argument("--fail-on-unplaced", action="store_true", help="exit 1 when a replica could not be placed")
    p.add_argument("--all", action="store_true", help="name every node in rejection summaries")

    p = sub.add_parser("apply", help="one reconcile pass: probe, plan, act, write status")
    _catalog_arg(p)
    p.add_argument("--dry-run", action="store_true", help="probe and plan, change nothing")
    p.add_argument("--force", action="store_true",
                   help="apply even while a daemon leads this fleet through etcd (fleet.yaml `leader:`)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")

    p = sub.add_parser("run", help="the daemon: watch the catalog, resync, reconcile")
    _catalog_arg(p)
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS", help="resync interval (default 60)")
    p.add_argument("--git-pull", action="store_true", help="fetch and fast-forward from upstream on each interval")
    p.add_argument("--commit-status", action="store_true", help="commit changes under status/ to the catalog repository")
    p.add_argument("--push", action="store_true", help="with --commit-status, push the status commits")
    p.add_argument("--metrics-address", metavar="HOST:PORT", help="serve Prometheus metrics here")
    p.add_argument("--dashboard-address", metavar="HOST:PORT", help="serve the dashboard's pages here (read-only)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--max-passes", type=int, default=None, help=argparse.SUPPRESS)

    p = sub.add_parser("nodes", help="probe the fleet, show it, write status/nodes.yaml")
    _catalog_arg(p)
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("status", help="what runs now, from status/ (no SSH): one row per replica")
    _catalog_arg(p)
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("dashboard", help="status/ as web pages (read-only, no SSH), on loopback by default")
    _catalog_arg(p)
    p.add_argument("--address", default="127.0.0.1:8765", metavar="HOST:PORT",
                   help="where to serve the pages (default 127.0.0.1:8765)")

    p = sub.add_parser("gateway", help="run the LiteLLM proxy on status/gateway/litellm.yaml, following it live")
    _catalog_arg(p)
    p.add_argument("--address", default="127.0.0.1:4000", metavar="HOST:PORT",
                   help="where clients connect (default 127.0.0.1:4000); arguments after -- go to litellm")

    p = sub.add_parser("logs", help="an engine's own log (stdout and stderr), from the node it runs on")
    p.add_argument("replica", metavar="REPLICA")
    _catalog_arg(p)
    p.add_argument("--rank", type=int, default=0, metavar="N", help="which rank's log (default 0, the head)")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="the last N lines (default 100)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing what the engine writes, until Ctrl-C")

    p = sub.add_parser("events", help="what happened: the event log the daemon and apply keep, newest last")
    _catalog_arg(p)
    p.add_argument("--since", metavar="WHEN", help="only events since then: 30m, 1h, 2d, or a time (2026-01-31T03:00Z)")
    p.add_argument("--model", metavar="M", help="only events about model M")
    p.add_argument("--node", metavar="N", help="only events about node N")
    p.add_argument("--kind", metavar="K", help="only events of kind K (replica.ready, node.unreachable, ...)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events, until Ctrl-C")
    p.add_argument("--format", choices=("text", "json"), default="text", help="json: one object per line")

    p = sub.add_parser("alert-rules", help="print the Prometheus alerting rules for the daemon's metrics")
    p.add_argument("--for", dest="for_", metavar="DURATION",
                   help="use this `for:` in every rule instead of each rule's own (for tests of the rules)")

    p = sub.add_parser("explain", help="where each replica of MODEL went, or why it could not go anywhere")
    p.add_argument("model", metavar="MODEL")
    _catalog_arg(p)
    p.add_argument("--inventory", metavar="FILE", help="explain against this snapshot instead of probing")
    p.add_argument("--all", action="store_true", help="name every node")

    p = sub.add_parser("engine-check", help="run ENGINE --version on NODE, on purpose")
    p.add_argument("node", metavar="NODE")
    p.add_argument("engine", metavar="ENGINE")
    _catalog_arg(p)
    return parser


def run() -> NoReturn:
    """The `reconciler` console script and `python -m reconciler`: main, then the exit.

    A one-shot command may leave its values to the exit (reconciler/teardown.py): the streams are
    flushed and the process ends with os._exit, the OS freeing the rest at once."""
    code = main(own_process=True)
    if teardown.left_to_exit():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:  # the reader left (`| head`): nothing more to say, as main has it
            code = Exit.BROKEN_PIPE
        os._exit(code)
    sys.exit(code)


def _import_command(name: str, freeze: bool):
    """The command's module, imported without the cyclic collector: an import builds tens of thousands
    of objects (modules, classes, functions) and no garbage, so a collection would only walk them,
    several times over. With `freeze` (the process's own command) they are never walked again: the
    daemon lives for months."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module("reconciler.commands." + name.replace("-", "_"))
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """Run one command; its exit code. `own_process`: this process exists for this command alone (the
    console script): its imports are frozen, and a command that declares itself one-shot (ONE_SHOT)
    leaves its values to the exit. Never for the daemon, apply or a test: a pass's values would be
    kept for the life of the process."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # `reconciler gateway [CATALOG] -- EXTRA LITELLM ARGS`: what follows -- is litellm's, never ours.
    passed: list[str] = []
    if "--" in argv and "gateway" in argv[:argv.index("--")]:
        argv, passed = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    args.litellm_args = passed
    module = _import_command(args.command, own_process)
    if own_process and getattr(module, "ONE_SHOT", False):
        teardown.exit_without_teardown()
    try:
        return module.main(args)
    except CatalogInvalid as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        n = len(exc.problems)
        print(f"{n} problem{'s' if n != 1 else ''} found", file=sys.stderr)
        return Exit.FAILED
    except FleetUnreachable as exc:
        print(f"reconciler: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    except UsageError as exc:
        print(f"reconciler: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except ReconcilerError as exc:
        print(f"reconciler: {exc}", file=sys.stderr)
        return Exit.FAILED
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:
        # `reconciler nodes --format json | head`: the reader left; say nothing more, and keep
        # the interpreter from complaining while it flushes stdout on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.BROKEN_PIPE
