"""`reconciler status` piped: rows a script can read (no colour, no trailing spaces)."""

from __future__ import annotations

from pathlib import Path

from reconciler.record.status_view import StatusReport
from reconciler.commands.status import print_text


def test_piped_rows_carry_no_trailing_spaces_and_the_message_ends_its_row(capsys):
    replicas = [
        {"id": "m-0", "phase": "Ready", "nodes": [{"rank": 0, "node": "a", "port": 8000, "endpoint": "http://a:8000"}]},
        {"id": "m-1", "phase": "Failed", "nodes": [], "message": "rank 0 on a is dead"},
    ]
    print_text(StatusReport(Path("."), "abc123", "", (), ({"name": "m", "replicas": replicas},), True))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "revision abc123" and lines[-1] == "1 model, 1 of 2 replicas Ready"
    assert [line for line in lines if line != line.rstrip()] == []
    assert lines[1].split() == ["MODEL", "REPLICA", "PHASE", "NODES", "ENDPOINT", "RESTARTS", "MESSAGE"]
    assert lines[2].split() == ["m", "m-0", "Ready", "a:8000", "http://a:8000", "0"]
    assert lines[3].endswith("0         rank 0 on a is dead")
    assert "\x1b" not in "".join(lines)
