"""`reconciler status [CATALOG] [--format text|json]`: what runs now, from status/ alone (no SSH).

One row per replica: MODEL REPLICA PHASE NODES ENDPOINT RESTARTS MESSAGE. The
phase is coloured on a terminal and plain when piped, so `| grep Failed` works;
a Failed replica's MESSAGE ends with its failure kind, (temporary) or (permanent).
"""

from __future__ import annotations

import json
import sys

from reconciler.commands._status_files import read_catalog_status
from reconciler.record.status_view import StatusReport, endpoint_text, json_document, message_text, nodes_text
from reconciler.constants import Exit
from reconciler.vocabulary import Phase

HEADERS = ["MODEL", "REPLICA", "PHASE", "NODES", "ENDPOINT", "RESTARTS", "MESSAGE"]
PHASE_STYLE = {Phase.READY: "green", Phase.FAILED: "red", Phase.UNKNOWN: "magenta"}  # the rest (in progress): yellow


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def rows(status: StatusReport) -> list[tuple[str, dict, list[str]]]:
    out = []
    for model in status.models:
        for r in model["replicas"]:
            out.append((model["name"], r, [
                model["name"], r["id"], str(r.get("phase") or Phase.UNKNOWN), nodes_text(r), endpoint_text(r),
                str(r.get("restarts") or 0), message_text(r),
            ]))
    return out


def summary(status: StatusReport) -> str:
    replicas = [r for m in status.models for r in m["replicas"]]
    ready = sum(1 for r in replicas if r.get("phase") == Phase.READY)
    return (f"{_plural(len(status.models), 'model')}, {ready} of {_plural(len(replicas), 'replica')} Ready"
            if replicas else f"{_plural(len(status.models), 'model')}, no replicas")


def autoscale_lines(status: StatusReport) -> list[str]:
    """One line per autoscaled model: `llama: replicas 1-4 (now 2, wants 4): requests 13 over 2 replicas > target 4`."""
    out = []
    for model in status.models:
        a = model.get("autoscale")
        if not isinstance(a, dict):
            continue
        wants = f", wants {a.get('wanted')}" if a.get("wanted") != a.get("current") else ""
        reason = " ".join(str(a.get("reason") or "").split())
        out.append(f"{model['name']}: replicas {a.get('min')}-{a.get('max')} (now {a.get('current')}{wants})"
                   + (f": {reason}" if reason else ""))
    return out


def rollout_lines(status: StatusReport) -> list[str]:
    """Per model with a canary rollout: `chat: rollout Progressing (canary weight 10%): ...`, then its checks."""
    out = []
    for model in status.models:
        r = model.get("rollout")
        if not isinstance(r, dict):
            continue
        reason = " ".join(str(r.get("reason") or "").split())
        out.append(f"{model['name']}: rollout {r.get('state')} (canary weight {r.get('weight')}%)"
                   + (f": {reason}" if reason else ""))
        for c in r.get("checks") or []:
            if isinstance(c, dict):
                out.append(f"  {c.get('name')}: {c.get('passed')} passed, {c.get('failed')} failed"
                           + (f"; last: {c.get('last')}" if c.get("last") else ""))
    return out


def print_text(status: StatusReport) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    tty = sys.stdout.isatty()
    console = Console(file=sys.stdout, width=None if tty else 100_000, no_color=not tty, highlight=False,
                      markup=False, emoji=False)
    if status.revision:
        console.print(f"revision {status.revision}")
    elif status.message:
        console.print(status.message)
    for warning in status.warnings:
        console.print(f"warning: {warning}")
    table_rows = rows(status)
    if not table_rows:
        console.print("no replicas")
        return
    table = Table(box=box.SIMPLE_HEAD if tty else None, show_edge=False, pad_edge=False)
    for i, h in enumerate(HEADERS):
        if h == "MESSAGE":  # free text takes what the terminal has left and folds; the rest stays whole
            table.add_column(h, overflow="fold", ratio=1)
        else:
            table.add_column(h, no_wrap=True, min_width=max([len(h)] + [len(c[i]) for _, _, c in table_rows]))
    for _, replica, cells in table_rows:
        phase = cells[2]
        styled = Text(phase, style=PHASE_STYLE.get(phase, "yellow"))
        table.add_row(*cells[:2], styled, *cells[3:])
    if tty:
        console.print(table)
    else:
        # rich pads every cell to its column's width, the last one too: piped rows end in spaces
        # that `grep 'Failed$'` or a diff would trip on.
        with console.capture() as captured:
            console.print(table)
        sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    console.print(summary(status))
    for line in autoscale_lines(status) + rollout_lines(status):
        console.print(line)


def main(args) -> int:
    status = read_catalog_status(args.catalog)
    if args.format == "json":
        sys.stdout.write(json.dumps(json_document(status), indent=2) + "\n")
        return Exit.OK
    if not status.written:
        print(f"no status yet under {status.root / 'status'}: run `reconciler apply` (or the daemon, "
              "`reconciler run`) on this catalog first")
        return Exit.OK
    print_text(status)
    return Exit.OK
