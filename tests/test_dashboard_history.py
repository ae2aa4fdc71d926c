"""History on the dashboard (SPEC section 15): the charts' data (pure), the /history page as inline
SVG under the CSP, and /api/events with the same filters as `reconciler events` (fast tier)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from reconciler.dashboard.app import create_app  # noqa: E402
from reconciler.dashboard.charts import DAY_S, HEIGHT, LEFT, WIDTH, history_charts, line_chart, svg  # noqa: E402
from reconciler.record.eventlog import EventJournal, SampleRing  # noqa: E402
from reconciler.record.events import Event  # noqa: E402
from reconciler.record.history import ModelFigures, Sample, fleet_figures, read_samples, sample_to_document  # noqa: E402
from reconciler.vocabulary import EventKind  # noqa: E402

import time  # noqa: E402


def sample(t, ready, desired=4, flight=None, gpus=None):
    models = {"llama": ModelFigures(ready, desired, flight), "qwen": ModelFigures(1, 1)}
    return Sample(t, models, gpus or {"ok": 8, "quarantined": 0, "unhealthy": 0, "lost": 0}, fleet_figures(models))


def test_a_chart_keeps_one_point_per_pixel_column_and_leaves_gaps_for_unknown_figures():
    end = 1_800_000_000.0
    start = end - DAY_S
    samples = [sample(start + i * 5, ready=i % 5, flight=None if 100 <= i < 200 else float(i)) for i in range(17280)]
    chart = line_chart("t", samples, start, end, [("ready", lambda s: s.models["llama"].ready),
                                                  ("in flight", lambda s: s.models["llama"].in_flight)])
    ready, flight = chart.series
    assert len(ready.runs) == 1 and len(ready.runs[0]) <= WIDTH - LEFT + 1
    assert len(flight.runs) == 2  # the minutes without a figure are a gap
    assert all(LEFT <= x <= WIDTH and 0 <= y <= HEIGHT for run in ready.runs for x, y in run)
    assert chart.top == 20000.0  # one scale for the chart: rounded up from its largest value (17,279)


def test_events_in_one_pixel_column_share_one_mark():
    end = 1_800_000_000.0
    many = [Event(end - 3600, EventKind.REPLICA_READY, "Ready", replica=f"r-{i}") for i in range(10000)]
    chart = line_chart("t", [], end - DAY_S, end, [], many + [Event(end - 60, EventKind.NODE_BACK, "back", node="n1")])
    assert len(chart.ticks) == 2
    assert chart.ticks[0][2].endswith("and 9995 more") and "r-0" in chart.ticks[0][2]


def test_the_charts_of_the_fleet_and_of_a_model():
    now = 1_800_000_000.0
    samples = [sample(now - 3600, 2, flight=3.0), sample(now - 1800, 4, flight=5.0,
                                                       gpus={"ok": 7, "quarantined": 0, "unhealthy": 1, "lost": 0})]
    events = [Event(now - 1800, EventKind.GPU_UNHEALTHY, "uncorrected ECC <errors>", node="n1", gpu=3),
              Event(now - 2 * DAY_S, EventKind.REPLICA_READY, "too old", replica="llama-0")]
    fleet = history_charts(samples, events, now)
    assert [c.title for c in fleet] == ["Ready vs desired replicas, the fleet", "Requests in flight, the fleet",
                                        "GPUs by health, the fleet"]
    desired, ready = fleet[0].series
    assert [y for _, y in ready.runs[0]] != [y for _, y in desired.runs[0]]
    assert len(fleet[0].ticks) == 1  # the day-old event is outside the axis
    one = history_charts(samples, events, now, "qwen")
    assert one[0].title.endswith("qwen") and one[0].top == 1.0
    text = svg(fleet[2])
    assert text.startswith("<svg") and "&lt;errors&gt;" in text and "<errors>" not in text
    assert text.count("<polyline") == 4 or text.count("<polyline") + text.count("<circle") >= 4


def test_samples_are_written_as_changes_and_read_back_whole(tmp_path):
    ring = SampleRing(tmp_path)
    for i in range(5):
        ring.append(sample(1000.0 + i, ready=1 if i < 3 else 2))
    lines = ring.lines.path.read_text().splitlines()
    assert json.loads(lines[0]).get("k") == 1
    assert json.loads(lines[1])["m"] == {} and "llama" in json.loads(lines[3])["m"]
    back = ring.read()
    assert [s.models["llama"].ready for s in back] == [1, 1, 1, 2, 2]
    assert all(s.models["qwen"] == ModelFigures(1, 1) for s in back)
    assert read_samples([b"junk", json.dumps(sample_to_document(sample(1.0, 3))).encode()])[0].models["llama"].ready == 3
    # Python's json reads Infinity; int() of it overflowed out of the reader (the history page's 500).
    infinite = dict(sample_to_document(sample(2.0, 4)), g=[float("inf")])
    assert [s.models["llama"].ready for s in read_samples([json.dumps(sample_to_document(sample(1.0, 3))),
                                                           json.dumps(infinite)])] == [3]


@pytest.fixture
def logged(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "catalog"
    (root / "status").mkdir(parents=True)
    now = time.time()
    journal = EventJournal.for_catalog(root)
    journal.append([Event(now - 7200, EventKind.REPLICA_READY, "Ready", model="llama", replica="llama-0", node="n1"),
                    Event(now - 600, EventKind.NODE_UNREACHABLE, "does not answer", node="n2")])
    ring = SampleRing(journal.directory)
    for i in range(50):
        ring.append(sample(now - 3600 + i * 60, ready=i % 4, flight=float(i)))
    return root


def test_history_page_is_inline_svg_under_the_csp(logged):
    client = TestClient(create_app(logged))
    page = client.get("/history")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.text.count("<svg") == 3 and "<polyline" in page.text
    assert "node.unreachable" in page.text and 'href="/history?model=llama"' in page.text
    one = client.get("/history?model=llama")
    assert "Ready vs desired replicas, llama" in one.text
    assert "node.unreachable" not in one.text  # events about the model only
    assert not re.search(r"<script(?! src=\"/static/)", page.text)


def test_api_events_filters_like_the_command(logged):
    client = TestClient(create_app(logged))
    doc = client.get("/api/events").json()
    assert [e["kind"] for e in doc["events"]] == ["replica.ready", "node.unreachable"] and doc["skipped"] == []
    assert [e["kind"] for e in client.get("/api/events?since=1h").json()["events"]] == ["node.unreachable"]
    assert [e["node"] for e in client.get("/api/events?kind=replica.ready").json()["events"]] == ["n1"]
    assert client.get("/api/events?model=llama&node=n2").json()["events"] == []
    bad = client.get("/api/events?since=yesterday")
    assert bad.status_code == 400 and "since 'yesterday': expected a duration" in bad.text
    bad = client.get("/api/events?kind=nope")
    assert bad.status_code == 400 and "replica.ready" in bad.text


def test_history_without_a_log_says_where_events_come_from(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "c" / "status").mkdir(parents=True)
    page = TestClient(create_app(tmp_path / "c")).get("/history")
    assert page.status_code == 200 and "No events in the last 24 hours" in page.text
