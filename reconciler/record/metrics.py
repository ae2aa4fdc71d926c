"""The daemon's Prometheus metrics, through prometheus_client.

prometheus_client keeps the exposition format, escaping, histogram buckets and
the `_total`/`_created` conventions right, which the hand-written renderer this
replaces had to re-derive; every management host already runs Python, and the
library is pure Python with no dependencies of its own.

Two kinds of series: events counted as they happen (passes, actions, probe
failures, status commits, the pass duration histogram), and the state the last
pass left (replicas per model and phase, nodes, reachability), which a collector
yields whole on each scrape, so a model or node that is gone stops being reported
instead of lingering at its last value.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from reconciler.errors import ReconcilerError, UsageError

# `_created` series (when each counter was made) say nothing an operator asks about.
disable_created_metrics()

# Pass durations of a fleet span milliseconds (nothing to do) to minutes (many launches).
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class FleetFigures:
    """What the last pass saw, as numbers: the state half of the metrics."""

    phases: Mapping[str, int] = field(default_factory=dict)  # phase -> replicas
    desired: Mapping[str, int] = field(default_factory=dict)  # model -> replicas the catalog asks for
    ready: Mapping[str, int] = field(default_factory=dict)  # model -> Ready replicas
    unplaced: Mapping[str, int] = field(default_factory=dict)  # model -> replicas no node can take
    restarts: Mapping[str, int] = field(default_factory=dict)  # model -> restarts of its replicas so far
    node_states: Mapping[str, int] = field(default_factory=dict)  # state -> nodes
    node_up: Mapping[str, bool] = field(default_factory=dict)  # node -> answered the last probe
    # node -> seconds its last probe took; None: this pass probed nothing, the last figures stand
    probe_seconds: Mapping[str, float] | None = None
    autoscale_current: Mapping[str, int] = field(default_factory=dict)  # autoscaled model -> count in force
    autoscale_wanted: Mapping[str, int] = field(default_factory=dict)  # autoscaled model -> what the load wants
    # What the shipped alert rules (reconciler/record/alerts.py) fire on; each holds only what is wrong, so a
    # 4,000-node fleet exports a series per broken thing, not one per GPU.
    crash_streaks: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, replica) -> failures in a row
    bad_gpus: Mapping[tuple[str, int], str] = field(default_factory=dict)  # (node, index) -> its GpuHealth
    quarantined_gpus: frozenset[tuple[str, int]] = frozenset()  # (node, index) the crash-loop breaker keeps out
    unreachable_since: Mapping[str, float] = field(default_factory=dict)  # node -> epoch s it stopped answering
    unreachable_grace_s: float | None = None  # fleet.yaml unreachable_grace_s
    rollout_aborted: Mapping[str, int] = field(default_factory=dict)  # model -> 1 while its rollout is Aborted


class _FleetCollector:
    def __init__(self) -> None:
        self.figures = FleetFigures()

    def collect(self):
        f = self.figures  # one reference read: a scrape sees one pass, never half of two
        phases = GaugeMetricFamily("reconciler_replicas", "Replicas by phase after the last pass.", labels=["phase"])
        for phase, n in sorted(f.phases.items()):
            phases.add_metric([phase], n)
        yield phases
        for name, text, values in (
            ("reconciler_model_replicas_desired", "Replicas the catalog asks for, per model.", f.desired),
            ("reconciler_model_replicas_ready", "Ready replicas, per model.", f.ready),
            ("reconciler_model_replicas_unplaced", "Replicas no node can take, per model.", f.unplaced),
            ("reconciler_model_autoscale_current_replicas",
             "Replicas autoscaling has in force, per autoscaled model.", f.autoscale_current),
            ("reconciler_model_autoscale_wanted_replicas",
             "Replicas the load asks for (clamped to the range), per autoscaled model.", f.autoscale_wanted),
        ):
            family = GaugeMetricFamily(name, text, labels=["model"])
            for model, n in sorted(values.items()):
                family.add_metric([model], n)
            yield family
        restarts = CounterMetricFamily("reconciler_model_replica_restarts", "Restarts of a model's replicas after a crash.",
                                       labels=["model"])
        for model, n in sorted(f.restarts.items()):
            restarts.add_metric([model], n)
        yield restarts
        nodes = GaugeMetricFamily("reconciler_nodes", "Nodes by state after the last probe.", labels=["state"])
        for state, n in sorted(f.node_states.items()):
            nodes.add_metric([state], n)
        yield nodes
        up = GaugeMetricFamily("reconciler_node_up", "1 when the node answered the last probe.", labels=["node"])
        for node, ok in sorted(f.node_up.items()):
            up.add_metric([node], 1.0 if ok else 0.0)
        yield up
        yield from _alert_families(f)
        # A gauge, not a histogram: one series per node (buckets times thousands of nodes would be
        # most of a scrape), and a slow node is found by its latest figure, not by a distribution.
        took = GaugeMetricFamily("reconciler_node_probe_duration_seconds",
                                 "Seconds the node's last probe took, answered or failed.", labels=["node"])
        for node, seconds in sorted((f.probe_seconds or {}).items()):
            took.add_metric([node], seconds)
        yield took


def _alert_families(f: FleetFigures):
    """The series the shipped alert rules read (reconciler/record/alerts.py)."""
    streak = GaugeMetricFamily("reconciler_replica_failures_in_a_row",
                               "Crashes (or failed starts) in a row of a replica; 0 once it runs.", labels=["model", "replica"])
    for (model, replica), n in sorted(f.crash_streaks.items()):
        streak.add_metric([model, replica], n)
    yield streak
    bad = GaugeMetricFamily("reconciler_gpu_unhealthy", "1 for each GPU the probe found unhealthy or lost.",
                            labels=["node", "gpu", "health"])
    for (node, index), health in sorted(f.bad_gpus.items()):
        bad.add_metric([node, str(index), health], 1.0)
    yield bad
    quarantined = GaugeMetricFamily("reconciler_gpu_quarantined", "1 for each GPU the crash-loop breaker keeps out.",
                                    labels=["node", "gpu"])
    for node, index in sorted(f.quarantined_gpus):
        quarantined.add_metric([node, str(index)], 1.0)
    yield quarantined
    since = GaugeMetricFamily("reconciler_node_unreachable_since_timestamp_seconds",
                              "When a node that does not answer stopped answering (Unix time).", labels=["node"])
    for node, t in sorted(f.unreachable_since.items()):
        since.add_metric([node], t)
    yield since
    if f.unreachable_grace_s is not None:
        yield GaugeMetricFamily("reconciler_node_unreachable_grace_seconds",
                                "fleet.yaml unreachable_grace_s: how long replicas wait for a node to answer.",
                                value=f.unreachable_grace_s)
    aborted = GaugeMetricFamily("reconciler_model_rollout_aborted", "1 while the model's rollout is Aborted.",
                                labels=["model"])
    for model, n in sorted(f.rollout_aborted.items()):
        aborted.add_metric([model], n)
    yield aborted


class Metrics:
    """Every series the daemon exports, in a registry of its own (several daemons may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.pass_duration = Histogram("reconciler_pass_duration_seconds", "Duration of reconcile passes.",
                                       buckets=DURATION_BUCKETS, registry=r)
        self.passes = Counter("reconciler_passes", "Reconcile passes by result (applied, invalid, error, idle).",
                              ["result"], registry=r)
        self.actions = Counter("reconciler_actions", "Actions taken, by kind and outcome.", ["action", "outcome"],
                               registry=r)
        self.probe_failures = Counter("reconciler_probe_failures", "Probes of a node that found it unreachable.",
                                      ["node"], registry=r)
        self.status_commits = Counter("reconciler_status_commits", "Commits of status/ made by the daemon.", registry=r)
        self.catalog_valid = Gauge("reconciler_catalog_valid", "1 when the last attempted revision validated.",
                                   registry=r)
        self.last_success = Gauge("reconciler_last_successful_pass_timestamp_seconds",
                                  "When the last pass that applied a revision ended (Unix time).", registry=r)
        self.leader = Gauge("reconciler_leader", "1 while this daemon leads and acts (always, without `leader:` in "
                            "fleet.yaml), 0 while it stands by.", registry=r)
        self.last_pass = Gauge("reconciler_last_pass_timestamp_seconds",
                               "When the last pass ended, whatever its result (Unix time).", registry=r)
        self.pass_started = Gauge("reconciler_pass_started_timestamp_seconds",
                                  "When the last pass began (Unix time).", registry=r)
        self.pass_in_progress = Gauge("reconciler_pass_in_progress", "1 while a pass runs.", registry=r)
        self.resync_interval = Gauge("reconciler_resync_interval_seconds", "The daemon's --interval.", registry=r)
        self.head_applied = Gauge("reconciler_catalog_head_applied",
                                  "1 when the revision in force is the catalog's HEAD (0: HEAD is invalid or not yet applied).",
                                  registry=r)
        self.applied_revision = Info("reconciler_applied_revision", "The catalog revision in force.", registry=r)
        self._fleet = _FleetCollector()
        r.register(self._fleet)
        self._lock = threading.Lock()

    def pass_began(self, *, wall: float | None = None) -> None:
        self.pass_started.set(time.time() if wall is None else wall)
        self.pass_in_progress.set(1)

    def pass_ended(self, result: str, seconds: float, *, wall: float | None = None) -> None:
        self.pass_duration.observe(seconds)
        self.passes.labels(result=result).inc()
        self.pass_in_progress.set(0)
        self.last_pass.set(time.time() if wall is None else wall)
        if result == "applied":
            self.last_success.set(time.time() if wall is None else wall)

    def action(self, action: str, ok: bool) -> None:
        self.actions.labels(action=action, outcome="ok" if ok else "failed").inc()

    def fleet(self, figures: FleetFigures) -> None:
        for node, up in figures.node_up.items():
            if not up:
                self.probe_failures.labels(node=node).inc()
        if figures.probe_seconds is None:
            # A pass that reused the last inventory timed no probe: the last timings stand, for
            # the nodes still in the fleet.
            last = self._fleet.figures.probe_seconds or {}
            figures = replace(figures, probe_seconds={n: s for n, s in last.items() if n in figures.node_up})
        self._fleet.figures = figures

    def revision(self, revision: str | None) -> None:
        self.applied_revision.info({"revision": revision or ""})

    def render(self) -> str:
        return generate_latest(self.registry).decode()


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT (all interfaces) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--metrics-address {text!r}: expected HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _ScrapeServer(ThreadingHTTPServer):
    """A scraper that hangs up mid-request (a scrape timeout, a reset) is passed over: socketserver
    would print a traceback on the daemon's stderr for each one. Anything else is still printed."""

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class MetricsServer:
    """GET /metrics on a daemon thread; any other path is 404."""

    def __init__(self, metrics: Metrics, address: str):
        host, port = parse_address(address)
        registry = metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = registry.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # scrapes are not decisions: keep them out of the log
                pass

        server_cls = _ScrapeServer
        if ":" in host:
            import socket

            class _V6(_ScrapeServer):
                address_family = socket.AF_INET6

            server_cls = _V6
        try:
            self._server = server_cls((host, port), Handler)
        except OSError as exc:
            raise ReconcilerError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def count_by(items: Iterable[str], known: Iterable[str] = ()) -> dict[str, int]:
    """Tally, with every known value present (a phase that drops to zero must read 0, not vanish)."""
    out = {k: 0 for k in known}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out
