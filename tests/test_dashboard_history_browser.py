"""The history page in a real browser: Debian's Chromium, headless, through chromedriver, on a day
of samples and events written by the project's own EventJournal and SampleRing (one pass per 30 s).

The charts are inline SVG drawn by the server: the test checks that Chromium lays them out (each
chart and its lines have a size), that the event marks carry what happened, and that the page loads
nothing from elsewhere and breaks no Content-Security-Policy rule. LLMFLEET_SCREENSHOTS=DIR saves
the page as DIR/dashboard-history.png (docs/ has the one made so).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from reconciler.record.eventlog import EventJournal, SampleRing
from reconciler.record.events import Event
from reconciler.record.history import ModelFigures, Sample, fleet_figures
from reconciler.vocabulary import EventKind
from tests.test_dashboard_browser import Dashboard, chromium, csp_violations, resources_same_origin

pytestmark = pytest.mark.external


def a_day(root: Path, now: float) -> None:
    """A day of a small fleet: llama scaled 2 -> 4 with its load, a node cut for 40 minutes (llama-1 moved),
    a GPU that went bad and was quarantined."""
    journal = EventJournal.for_catalog(root)
    ring = SampleRing(journal.directory)
    start = now - 86400
    cut, back, scaled, bad = start + 30000, start + 32400, start + 50000, start + 70000
    for i in range(2880):
        t = start + i * 30
        load = 6 + 5 * math.sin(i / 300) + (8 if t > scaled else 0)
        llama_desired = 4 if t > scaled else 2
        llama_ready = llama_desired - (1 if cut <= t < cut + 600 or scaled < t < scaled + 240 else 0)
        models = {"llama-3-70b": ModelFigures(llama_ready, llama_desired, round(load, 1)),
                  "qwen-2-7b": ModelFigures(2, 2, None)}
        unhealthy = 1 if t > bad else 0
        gpus = {"ok": 24 - unhealthy - (8 if cut <= t < back else 0), "quarantined": 0, "unhealthy": unhealthy, "lost": 0}
        ring.append(Sample(t, models, gpus, fleet_figures(models)))
    journal.append([
        Event(start + 600, EventKind.REVISION_APPLIED, "revision 3c1e0a9b77d2 applied by the daemon", revision="3c1e0a9b77d2"),
        Event(cut, EventKind.NODE_UNREACHABLE, "does not answer: connect timed out", node="h100-b2"),
        Event(cut + 300, EventKind.REPLICA_STARTED, "started", model="llama-3-70b", replica="llama-3-70b-1", node="h100-a1"),
        Event(cut + 600, EventKind.REPLICA_READY, "Ready at http://10.1.0.11:8001", model="llama-3-70b",
              replica="llama-3-70b-1", node="h100-a1"),
        Event(back, EventKind.NODE_BACK, "answers again", node="h100-b2"),
        Event(scaled, EventKind.AUTOSCALE, "2 -> 4 replicas: requests 19 over 2 replicas > target 4", model="llama-3-70b"),
        Event(scaled + 240, EventKind.REPLICA_READY, "Ready at http://10.1.0.12:8000", model="llama-3-70b",
              replica="llama-3-70b-3", node="h100-b2"),
        Event(bad, EventKind.GPU_UNHEALTHY, "unhealthy: uncorrected ECC errors", node="h100-b2", gpu=5),
        Event(bad + 60, EventKind.REPLICA_FAILED, "rank 0 exited with status 1", model="qwen-2-7b",
              replica="qwen-2-7b-0", node="h100-b2", failure="temporary"),
    ])


def test_the_history_page_in_chromium(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))  # the dashboard child reads the same log
    root = tmp_path / "catalog"
    (root / "status").mkdir(parents=True)
    a_day(root, time.time())
    dashboard = Dashboard(root)
    driver = chromium()
    try:
        driver.get(dashboard.url + "/history")
        charts = driver.find_elements("css selector", "figure.history-chart svg")
        assert len(charts) == 3
        for chart in charts:
            assert chart.size["width"] > 300 and chart.size["height"] > 50
        lines = driver.find_elements("css selector", "svg polyline.series")
        assert len(lines) >= 3 and all(line.size["width"] > 100 for line in lines[:3])
        marks = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg line.event title')).map(t => t.textContent)")
        assert any("node.unreachable h100-b2" in m for m in marks)
        assert resources_same_origin(driver, dashboard.url) == []
        assert csp_violations(driver) == []
        if os.environ.get("LLMFLEET_SCREENSHOTS"):
            driver.save_screenshot(str(Path(os.environ["LLMFLEET_SCREENSHOTS"]) / "dashboard-history.png"))
        driver.get(dashboard.url + "/history?model=llama-3-70b")
        assert "Ready vs desired replicas, llama-3-70b" in driver.page_source
        assert "qwen-2-7b-0" not in driver.find_element("css selector", "pre.events").text
        assert csp_violations(driver) == []
    finally:
        driver.quit()
        dashboard.stop()
