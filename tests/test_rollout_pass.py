"""The act stage's part of a rollout, on local processes: the Stopping phase is in status while a stop waits."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.apply_support.local import free_port
from tests.apply_support.seams import SimplePlanner, catalog, tiny_model
from tests.test_apply_pass import env, one_pass  # noqa: F401  (env is a fixture)


class WatchingStops:
    """The real launcher; each stop first reads what status says of the replica at that moment."""

    def __init__(self, launcher, status_file: Path):
        self.launcher, self.status_file, self.seen = launcher, status_file, []

    def start(self, launch):
        return self.launcher.start(launch)

    def ranks(self, *a, **kw):
        return self.launcher.ranks(*a, **kw)

    def stop(self, node, replica, rank=None, **kw):
        doc = yaml.safe_load(self.status_file.read_text()) if self.status_file.exists() else None
        entry = next((r for r in (doc or {}).get("replicas", []) if r["id"] == replica), None)
        self.seen.append((replica, entry["phase"] if entry else None, entry["message"] if entry else None))
        return self.launcher.stop(node, replica, rank, **kw)


def test_a_replace_in_place_reports_stopping_while_the_old_copy_is_stopped(tmp_path, env):  # noqa: F811
    fleet, transports, launcher, records = env
    port = free_port()
    cat = catalog(tmp_path, fleet, tiny_model("m"))
    first = one_pass(cat, transports, launcher, SimplePlanner({"m-0": [("n1", port, ())]}), records)
    assert first.replicas["m-0"].phase == "Ready"
    watching = WatchingStops(launcher, Path(cat.root) / "status" / "models" / "m.yaml")
    changed = catalog(tmp_path, fleet, tiny_model("m", args=["--ready-after", "0.1"]))
    second = one_pass(changed, transports, watching, SimplePlanner({"m-0": [("n1", port, ())]}), records)
    assert second.replicas["m-0"].phase == "Ready"
    replica, phase, message = watching.seen[0]
    assert (replica, phase) == ("m-0", "Stopping") and message.startswith("stopping: replace, old copy first")
    assert yaml.safe_load((Path(cat.root) / "status" / "models" / "m.yaml").read_text())["replicas"][0]["phase"] == "Ready"
