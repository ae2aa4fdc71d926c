"""The history charts (SPEC section 15), drawn by the server as inline SVG: no script, no CDN, nothing
the Content-Security-Policy has to allow (presentation attributes, not style attributes).

Pure: samples and events in, the chart's data (`Chart`) out, then its SVG text. A day of passes every
few seconds is tens of thousands of samples; a chart is some 900 pixels wide, so each series keeps
one point per pixel column (the last sample in it), and a run without a figure (a model whose load
was not read) is a gap, not a zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Callable, Iterable, Sequence

from reconciler.record.events import Event, utc
from reconciler.record.history import GPU_KINDS, ModelFigures, Sample

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 900, 160, 44, 18, 8
DAY_S = 86400.0

COLORS = {"ready": "#2e7d32", "desired": "#ef6c00", "in flight": "#1565c0", "ok": "#2e7d32",
          "quarantined": "#f9a825", "unhealthy": "#c62828", "lost": "#6a1b9a"}
DASHED = frozenset({"desired"})
EVENT_COLORS = {"replica": "#1565c0", "node": "#ef6c00", "gpu": "#c62828", "autoscale": "#00838f",
                "rollout": "#6a1b9a", "revision": "#546e7a"}


@dataclass
class Series:
    label: str
    color: str
    runs: list[list[tuple[float, float]]]  # (x, y) pixel points; a gap between runs


@dataclass
class Chart:
    title: str
    start: float
    end: float
    top: float  # the value at the top of the plot
    series: list[Series] = field(default_factory=list)
    ticks: list[tuple[float, str, str]] = field(default_factory=list)  # events: (x, color, what)


def x_of(t: float, start: float, end: float) -> float:
    return LEFT + (WIDTH - LEFT) * (t - start) / (end - start) if end > start else LEFT


def y_of(v: float, top: float) -> float:
    plot = HEIGHT - BOTTOM - TOP
    return TOP + plot - plot * (v / top if top > 0 else 0.0)


def _nice_top(values: Iterable[float]) -> float:
    m = max(values, default=0.0)
    if m <= 0:
        return 1.0
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000, 100000):
        if m <= step:
            return float(step)
    return float(m)


def line_chart(title: str, samples: Sequence[Sample], start: float, end: float,
               lines: Sequence[tuple[str, Callable[[Sample], float | None]]], events: Sequence[Event] = ()) -> Chart:
    """A chart of `lines` (label, value of a sample or None) over [start, end], one point per pixel column."""
    raw = {label: [(s.time, value(s)) for s in samples if start <= s.time <= end] for label, value in lines}
    top = _nice_top(v for points in raw.values() for _, v in points if v is not None)
    chart = Chart(title, start, end, top, ticks=event_ticks(events, start, end))
    for label, points in raw.items():
        runs: list[list[tuple[float, float]]] = []
        last_column, run = None, None
        for t, v in points:
            if v is None:
                run = None
                continue
            x, y = round(x_of(t, start, end), 1), round(y_of(v, top), 1)
            if run is None:
                run = []
                runs.append(run)
            if last_column == int(x) and run:
                run[-1] = (x, y)  # the last sample of a pixel column stands for it
            else:
                run.append((x, y))
            last_column = int(x)
        chart.series.append(Series(label, COLORS.get(label, "#455a64"), runs))
    return chart


# Events said in one pixel column share one mark: a first pass of a 10,000-replica fleet is 10,000
# Ready events at one instant, which as one mark each made the page 10 MB.
TICK_LINES = 5


def event_ticks(events: Sequence[Event], start: float, end: float) -> list[tuple[float, str, str]]:
    """One mark per pixel column that has events: its colour the first event's, its title the first
    TICK_LINES events said and how many more."""
    columns: dict[int, list[Event]] = {}
    for e in events:
        if start <= e.time <= end:
            columns.setdefault(int(x_of(e.time, start, end)), []).append(e)
    ticks = []
    for column, said in sorted(columns.items()):
        first = said[0]
        lines = [f"{utc(e.time)} {e.kind} {e.replica or e.node or e.model or ''}: {e.message}" for e in said[:TICK_LINES]]
        if len(said) > TICK_LINES:
            lines.append(f"and {len(said) - TICK_LINES} more")
        ticks.append((round(x_of(first.time, start, end), 1),
                      EVENT_COLORS.get(str(first.kind).split(".")[0], "#455a64"), "\n".join(lines)))
    return ticks


def history_charts(samples: Sequence[Sample], events: Sequence[Event], now: float,
                   model: str | None = None) -> list[Chart]:
    """The history page's charts, for the fleet or one model: Ready vs desired, requests in flight,
    GPUs by health (the fleet's, on both), and the events on the same time axis."""
    start = now - DAY_S

    def figures(s: Sample) -> ModelFigures | None:
        return s.fleet() if model is None else s.models.get(model)

    def pick(attr: str):
        return lambda s: getattr(f, attr) if (f := figures(s)) is not None else None

    name = "the fleet" if model is None else model
    return [
        line_chart(f"Ready vs desired replicas, {name}", samples, start, now,
                   [("desired", pick("desired")), ("ready", pick("ready"))], events),
        line_chart(f"Requests in flight, {name}", samples, start, now, [("in flight", pick("in_flight"))], events),
        line_chart("GPUs by health, the fleet", samples, start, now,
                   [(k, (lambda kind: lambda s: s.gpus.get(kind))(k)) for k in GPU_KINDS], events),
    ]


def svg(chart: Chart) -> str:
    """The chart as inline SVG text (escaped: titles and event messages come from machines and people)."""
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="{escape(chart.title)}">', f"<title>{escape(chart.title)}</title>"]
    base = HEIGHT - BOTTOM
    parts.append(f'<text x="{LEFT + 6}" y="{TOP + 10}" font-size="11" font-weight="bold" fill="#263238">'
                 f"{escape(chart.title)}</text>")
    parts.append(f'<line x1="{LEFT}" y1="{base}" x2="{WIDTH}" y2="{base}" stroke="#90a4ae" stroke-width="1"/>')
    parts.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}" stroke="#90a4ae" stroke-width="1"/>')
    parts.append(f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end" font-size="10" fill="#455a64">{chart.top:g}</text>')
    parts.append(f'<text x="{LEFT - 4}" y="{base}" text-anchor="end" font-size="10" fill="#455a64">0</text>')
    for hours in range(0, 25, 6):
        t = chart.start + hours * 3600
        x = x_of(t, chart.start, chart.end)
        label = utc(t)[11:16] + (" UTC" if hours == 24 else "")
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="middle" font-size="10" fill="#455a64">'
                     f"{label}</text>")
    for x, color, what in chart.ticks:
        parts.append(f'<line class="event" x1="{x}" y1="{TOP}" x2="{x}" y2="{base}" stroke="{color}" '
                     f'stroke-width="1" stroke-opacity="0.5"><title>{escape(what)}</title></line>')
    for s in chart.series:
        for run in s.runs:
            points = " ".join(f"{x},{y}" for x, y in run)
            if len(run) == 1:
                x, y = run[0]
                parts.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{s.color}"><title>{escape(s.label)}</title></circle>')
            else:
                dashed = ' stroke-dasharray="5 3"' if s.label in DASHED else ""  # desired under ready stays seen
                parts.append(f'<polyline class="series" points="{points}" fill="none" stroke="{s.color}" '
                             f'stroke-width="1.5"{dashed}><title>{escape(s.label)}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)
