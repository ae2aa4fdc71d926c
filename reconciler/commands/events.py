"""`reconciler events [CATALOG] [--since 1h] [--model M] [--node N] [--kind K] [--follow] [--format text|json]`:
the event log the daemon and `apply` keep (SPEC section 15), one line per event, newest last."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from reconciler.errors import ReconcilerError
from reconciler.record.eventlog import EventJournal
from reconciler.record.events import EventFilter, Skipped, event_line, parse_kind, parse_since, to_document


def event_filter(since: str | None, model: str | None, node: str | None, kind: str | None,
                 now: float) -> EventFilter:
    """The filter a person typed (UsageError, exit 2, for a --since or --kind that does not parse)."""
    return EventFilter(since=parse_since(since, now) if since else None, model=model or None, node=node or None,
                       kind=parse_kind(kind) if kind else None)


def main(args) -> int:
    keep = event_filter(args.since, args.model, args.node, args.kind, time.time())
    if not Path(args.catalog).is_dir():
        raise ReconcilerError(f"{args.catalog}: no such catalog directory")
    journal = EventJournal.for_catalog(args.catalog)
    show = _shower(args.format)
    events, skipped, at = journal.read_from(keep)
    for e in events:
        show(e)
    for s in skipped:
        print(f"reconciler: {s}", file=sys.stderr)
    if not events and not args.follow and args.format == "text":
        where = "" if journal.events.files() else f" (the daemon and apply write them to {journal.events.path})"
        print(f"no events{where}", file=sys.stderr)
    if args.follow:
        # Until Ctrl-C: cli.main turns the KeyboardInterrupt into exit 130, without a traceback.
        for item in journal.follow(keep, at=at):
            if isinstance(item, Skipped):
                print(f"reconciler: {item}", file=sys.stderr, flush=True)
            else:
                show(item)
    return 0


def _shower(fmt: str):
    def show(e) -> None:
        text = json.dumps(to_document(e), ensure_ascii=False) if fmt == "json" else event_line(e)
        print(text, flush=True)

    return show
