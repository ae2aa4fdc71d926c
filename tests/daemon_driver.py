"""Runs the real daemon loop with a recording fake pass, for tests (`python tests/daemon_driver.py`).

Usage: daemon_driver.py RECORD_FILE run CATALOG [reconciler run flags...]

The pass appends one JSON line per call to RECORD_FILE ({"event": "begin"|"end",
"revision", "models": {name: replicas}, "pid"}) and writes status/models/<name>.yaml
the way the apply pass does, so the daemon's status handling is exercised for real.
FAKE_PASS_SLEEP=<seconds> makes each pass take that long (a pass to interrupt).
The flags are parsed by the real CLI parser, so the driver accepts exactly what
`reconciler run` accepts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.cli import build_parser  # noqa: E402
from reconciler.commands.run import daemon_from_args  # noqa: E402
from reconciler.errors import ReconcilerError  # noqa: E402
from reconciler.decide.outcomes import Decision, PassResult, ReplicaState  # noqa: E402
from reconciler.record.status.files import write_document  # noqa: E402


def recording_pass(record: Path):
    sleep = float(os.environ.get("FAKE_PASS_SLEEP", "0"))

    def run_pass(catalog, log, *, trigger):
        models = {m.name: m.replicas for m in catalog.models}
        entry = {"revision": catalog.revision, "models": models, "pid": os.getpid(), "trigger": trigger}
        with record.open("a") as f:
            f.write(json.dumps({"event": "begin", **entry}) + "\n")
        for name, replicas in models.items():
            log("replica.desired", model=name, replicas=replicas)
            write_document(Path(catalog.root) / "status" / "models" / f"{name}.yaml", {"desired": replicas})
        if sleep:
            time.sleep(sleep)
        with record.open("a") as f:
            f.write(json.dumps({"event": "end", **entry}) + "\n")
        # A pass result as the real pass types it: one decision, one Ready replica.
        return PassResult(
            revision=catalog.revision, inventory=None, plan=None,
            decisions=[Decision("fake-0", "-", "start", "driver", ok=True)],
            replicas={"fake-0": ReplicaState("fake-0", "fake", None, "Ready")},
        )

    def stand_by(catalog, log):
        # The daemon's standby turn (SPEC 14): recorded, so a test can tell a standby's probe from a pass.
        with record.open("a") as f:
            f.write(json.dumps({"event": "standby", "revision": catalog.revision, "pid": os.getpid()}) + "\n")

    run_pass.stand_by = stand_by
    return run_pass


def main() -> int:
    record = Path(sys.argv[1])
    args = build_parser().parse_args(sys.argv[2:])
    try:
        daemon = daemon_from_args(args, pass_fn=recording_pass(record))
        return daemon.serve()
    except ReconcilerError as exc:
        print(f"reconciler: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
