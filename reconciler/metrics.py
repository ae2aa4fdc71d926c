"""Prometheus text exposition, from the standard library.

The daemon exports a handful of series; prometheus_client would be one more
dependency on every management host for what is ~100 lines of formatting.
Exposition format 0.0.4: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable, Mapping

from reconciler.errors import ReconcilerError, UsageError

# Pass durations of a fleet span milliseconds (nothing to do) to minutes (many launches).
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_HELP = {
    "reconciler_pass_duration_seconds": ("histogram", "Duration of reconcile passes."),
    "reconciler_passes_total": ("counter", "Reconcile passes by result (applied, invalid, error, idle)."),
    "reconciler_actions_total": ("counter", "Actions taken, by kind and outcome."),
    "reconciler_replicas": ("gauge", "Replicas by phase after the last pass."),
    "reconciler_nodes": ("gauge", "Nodes by state after the last probe."),
    "reconciler_probe_failures_total": ("counter", "Failed probes, by node."),
    "reconciler_catalog_valid": ("gauge", "1 when the last attempted revision validated."),
    "reconciler_status_commits_total": ("counter", "Commits of status/ made by the daemon."),
}


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) and not v.is_integer() else str(int(v))


class Metrics:
    """Counters, gauges and one histogram; thread-safe; rendered on scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple], float] = {}
        self._gauges: dict[str, dict[tuple, float]] = {}
        self._hist_counts = [0] * len(DURATION_BUCKETS)
        self._hist_sum = 0.0
        self._hist_n = 0

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def set_gauge(self, name: str, values: Mapping[tuple, float] | float, label: str | None = None) -> None:
        """Replace a gauge family whole: `values` maps a label value to a figure (or one figure)."""
        with self._lock:
            if isinstance(values, (int, float)):
                self._gauges[name] = {(): float(values)}
            else:
                self._gauges[name] = {((label, k),): float(v) for k, v in values.items()}

    def observe_pass(self, seconds: float) -> None:
        with self._lock:
            self._hist_sum += seconds
            self._hist_n += 1
            for i, bound in enumerate(DURATION_BUCKETS):
                if seconds <= bound:
                    self._hist_counts[i] += 1

    def counter(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        with self._lock:
            lines: list[str] = []

            def header(name: str) -> None:
                kind, text = _HELP.get(name, ("untyped", name))
                lines.append(f"# HELP {name} {text}")
                lines.append(f"# TYPE {name} {kind}")

            name = "reconciler_pass_duration_seconds"
            header(name)
            for bound, count in zip(DURATION_BUCKETS, self._hist_counts):
                lines.append(f'{name}_bucket{{le="{bound:g}"}} {count}')
            lines.append(f'{name}_bucket{{le="+Inf"}} {self._hist_n}')
            lines.append(f"{name}_sum {self._hist_sum!r}")
            lines.append(f"{name}_count {self._hist_n}")

            by_name: dict[str, list[tuple[tuple, float]]] = {}
            for (n, labels), v in self._counters.items():
                by_name.setdefault(n, []).append((labels, v))
            for n in sorted(by_name):
                header(n)
                for labels, v in sorted(by_name[n]):
                    lines.append(f"{n}{_labels(dict(labels))} {_num(v)}")
            for n in sorted(self._gauges):
                header(n)
                for labels, v in sorted(self._gauges[n].items()):
                    lines.append(f"{n}{_labels(dict(labels))} {_num(v)}")
            return "\n".join(lines) + "\n"


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT (all interfaces) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--metrics-address {text!r}: expected HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


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
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # scrapes are not decisions: keep them out of the log
                pass

        server_cls = ThreadingHTTPServer
        if ":" in host:
            import socket

            class _V6(ThreadingHTTPServer):
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
