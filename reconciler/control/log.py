"""The daemon's log: one line per event, as text or as one JSON object per line."""

from __future__ import annotations

import datetime as _dt
import json
import sys
import threading
import time
from typing import Any, Callable, Mapping, TextIO

from reconciler.decide.outcomes import Decision
from reconciler.act.scaling import METRICS_ACTION


class EventLog:
    """`log(event, **fields)`: a line of text (default) or one JSON object per line.

    Also accepts `log("a sentence")`, so a pass can log free text through it.
    """

    def __init__(self, fmt: str = "text", stream: TextIO | None = None, clock: Callable[[], float] = time.time):
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self._lock = threading.Lock()

    def __call__(self, event: Any = "", /, **fields: Any) -> None:
        if isinstance(event, Decision):  # the pass's log line: replica, node, action, reason, ok
            event = {"event": "decision", **event.as_dict()}
        if isinstance(event, dict):  # a pass may hand over a ready-made record
            fields = {**event, **fields}
            event = fields.pop("event", "")
        ts = _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc).isoformat(timespec="milliseconds")
        ts = ts.replace("+00:00", "Z")
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.fmt == "json":
            line = json.dumps({"ts": ts, "level": event_level(str(event), fields), "event": str(event), **fields},
                              default=str, sort_keys=False)
        else:
            parts = [ts, str(event)]
            message = fields.pop("msg", None)
            for key, value in fields.items():
                parts.append(f"{key}={_text_value(value)}")
            if message:
                parts.append("- " + str(message))
            line = " ".join(parts)
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()


# Events that need a person (error) or may (warning); everything else is info. By event name,
# so a log pipeline can alert on level without knowing the reconciler's vocabulary.
ERROR_EVENTS = frozenset({"pass.error", "pass.failed", "status.error", "git.error", "catalog.invalid"})
WARNING_EVENTS = frozenset({"pass.refused", "node.unreachable", "watcher.failed", "head.moved"})


def event_level(event: str, fields: Mapping[str, Any]) -> str:
    if event in ERROR_EVENTS or event.endswith(".error"):
        return "error"
    if event == "decision" and fields.get("ok") is False:
        return "error"
    if event == "decision" and fields.get("action") == METRICS_ACTION:  # a load that could not be read
        return "warning"
    if event in WARNING_EVENTS or event.endswith(".failed"):
        return "warning"
    return "info"


def _text_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value)
    if not text or any(c.isspace() for c in text) or '"' in text:
        return json.dumps(text)
    return text

