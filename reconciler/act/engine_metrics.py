"""How busy an engine is, in its own words: requests running and waiting, from its /metrics.

Draining (SPEC section 10) waits for `running` to reach 0; autoscaling (SPEC section 11) counts
`running + waiting` per replica. Both read the same numbers through this module, so an engine
reports its load one way to the whole reconciler.

The exposition text is parsed by prometheus_client's parser (the reference implementation of the
format: escaping, labels, comments, `_total` suffixes), never by hand. `parse_load` is pure;
`read_load` is the one HTTP request, with a deadline and a cap on what is read.

An answer that cannot be trusted (no such series, a negative or NaN value, garbage, a timeout) is
a `LoadUnknown` with a reason, never a number made up from it: draining then waits for `drain_s`
and autoscaling counts that replica as at target.
"""

from __future__ import annotations

import http.client
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from reconciler.frozen import frozen
from reconciler.host import parse_host
from reconciler.act.readiness import why_no_answer

METRICS_TIMEOUT_S = 2.0
# An engine's /metrics is tens of KiB; more than this is not an engine's metrics.
MAX_METRICS_BYTES = 4 * 1024 * 1024


@frozen
class LoadSeries:
    """Where an engine says how many requests it runs and how many wait (SPEC section 11)."""

    waiting: str
    running: str
    path: str = "/metrics"


# The series each engine exports, from their documentation (vLLM's production metrics, SGLang's
# server metrics, llama.cpp's server README with --metrics).
ENGINE_SERIES: Mapping[str, LoadSeries] = {
    "vllm": LoadSeries(waiting="vllm:num_requests_waiting", running="vllm:num_requests_running"),
    "sglang": LoadSeries(waiting="sglang:num_queue_reqs", running="sglang:num_running_reqs"),
    "llama.cpp": LoadSeries(waiting="llamacpp:requests_deferred", running="llamacpp:requests_processing"),
}


@frozen
class EngineLoad:
    running: float
    waiting: float

    @property
    def in_flight(self) -> float:
        return self.running + self.waiting


@frozen
class LoadUnknown:
    """The engine's load could not be read or trusted; `reason` says why, in words."""

    reason: str


LoadAnswer = EngineLoad | LoadUnknown


def series_for(engine: str, declared: LoadSeries | None = None) -> LoadSeries | None:
    """The series to read for an engine: what a `command` profile declares, else the engine's own."""
    return declared if declared is not None else ENGINE_SERIES.get(engine)


def profile_series(profile) -> LoadSeries | None:
    """The series to read for a profile (model.Profile): its declared `metrics:` (a command profile),
    else its engine's own; None when neither says."""
    metrics = getattr(profile, "metrics", None)
    declared = None if metrics is None else LoadSeries(waiting=metrics.waiting, running=metrics.running,
                                                       path=metrics.path)
    return series_for(profile.engine, declared)


def parse_load(text: str, series: LoadSeries) -> LoadAnswer:
    """Requests running and waiting from exposition text (pure). Samples of one series are summed
    over their labels (an engine serving two model names reports one line per name)."""
    wanted = {series.running: 0.0, series.waiting: 0.0}
    seen: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    value = float(sample.value)
                    if math.isnan(value) or value < 0 or math.isinf(value):
                        return LoadUnknown(f"{sample.name} reads {sample.value}, not a count of requests")
                    wanted[sample.name] += value
                    seen.add(sample.name)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        return LoadUnknown(f"its metrics are not Prometheus exposition text ({type(exc).__name__})")
    missing = [name for name in (series.running, series.waiting) if name not in seen]
    if missing:
        return LoadUnknown(f"its metrics have no {' or '.join(missing)}")
    return EngineLoad(running=wanted[series.running], waiting=wanted[series.waiting])


def read_load(address: str, port: int, series: LoadSeries, timeout_s: float = METRICS_TIMEOUT_S) -> LoadAnswer:
    """GET http://address:port<series.path> and parse it; every failure is a LoadUnknown with a reason."""
    host = parse_host(address).bare
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request("GET", series.path, headers={"Connection": "close", "Accept": "text/plain"})
        resp = conn.getresponse()
        body = resp.read(MAX_METRICS_BYTES + 1)
        if resp.status != 200:
            return LoadUnknown(f"{series.path} answered {resp.status}")
        if len(body) > MAX_METRICS_BYTES:
            return LoadUnknown(f"{series.path} sent more than {MAX_METRICS_BYTES // (1024 * 1024)} MiB")
        return parse_load(body.decode("utf-8", errors="replace"), series)
    except TimeoutError:
        return LoadUnknown(f"{series.path} did not answer within {timeout_s:g} s")
    except (OSError, http.client.HTTPException, UnicodeError) as exc:
        return LoadUnknown(f"{series.path} did not answer: {why_no_answer(exc, timeout_s)}")
    finally:
        conn.close()


@frozen
class LoadTarget:
    """One replica's head, where its load is asked."""

    replica: str
    address: str
    port: int
    series: LoadSeries


def read_loads(targets: Sequence[LoadTarget], timeout_s: float = METRICS_TIMEOUT_S,
               max_workers: int = 32) -> dict[str, LoadAnswer]:
    """Every target's load at once, each under its own deadline: a slow engine delays only itself."""
    if not targets:
        return {}

    def one(t: LoadTarget) -> tuple[str, LoadAnswer]:
        return t.replica, read_load(t.address, t.port, t.series, timeout_s)

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(targets)))) as pool:
        return dict(pool.map(one, targets))
