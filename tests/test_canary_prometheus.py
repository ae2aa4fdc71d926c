"""The canary's prometheus check against a REAL Prometheus (Debian's package, as tests/test_gateway_real.py
runs it): a query within its bound, one past it, $CANARY and $STABLE substituted into label regexes,
a PromQL error, an unreachable address, and a request or query that times out against a real socket
that never answers: each a measurement that says why, never a traceback."""

from __future__ import annotations

import pytest

from reconciler.act.canary_checks import Target, measure
from reconciler.model import Model, PrometheusCheck, PrometheusQuery, RolloutPolicy
from tests.test_gateway_real import Child, free_loopback_port, get_json, program, wait_until

pytestmark = [pytest.mark.external, pytest.mark.process]

CANARY = [Target("chat-0", "127.0.0.1", 1)]
STABLE = [Target("chat-1", "127.0.0.1", 2)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = program("LLMFLEET_PROMETHEUS", "prometheus", "/usr/bin/prometheus")
    tmp = tmp_path_factory.mktemp("prom")
    port = free_loopback_port()
    # Prometheus scrapes itself under the job name of a canary replica: `up{job="chat-0"}` is a series
    # a $CANARY regex finds and a $STABLE one does not.
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: chat-0\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    child = Child([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{port}"], tmp / "prometheus.log")
    try:
        address = f"http://127.0.0.1:{port}"
        wait_until("Prometheus to scrape itself", lambda: get_json(
            f"{address}/api/v1/query?query=up")["data"]["result"], timeout=60, every=0.5)
        yield address
    finally:
        child.stop()


def checked(address: str, *queries: PrometheusQuery) -> list:
    model = Model("chat", "/m", replicas=2, rollout=RolloutPolicy(prometheus=PrometheusCheck(address, queries, 5.0)))
    return [(m.check, m.ok, m.said) for m in measure(model, CANARY, STABLE)]


def test_queries_within_and_past_their_bounds(prometheus):
    assert checked(prometheus, PrometheusQuery("low", "vector(0.005)", max=0.01),
                   PrometheusQuery("high", "scalar(vector(2))", max=1)) == [
        ("low", True, "low: 0.005 within max 0.01"), ("high", False, "high: 2 is above max 1")]


def test_canary_and_stable_placeholders_reach_prometheus_as_label_regexes(prometheus):
    out = checked(prometheus, PrometheusQuery("canary-up", 'sum(up{job=~"$CANARY"})', min=1),
                  PrometheusQuery("stable-up", 'sum(up{job=~"$STABLE"})', min=1))
    assert out == [("canary-up", True, "canary-up: 1 within min 1"),
                   ("stable-up", False, "stable-up: the query returned no samples")]


def test_a_promql_error_is_a_failed_measurement_with_prometheus_own_words(prometheus):
    [(name, ok, said)] = checked(prometheus, PrometheusQuery("broken", "sum(rate(up[1m]", max=1))
    assert name == "broken" and not ok and said.startswith("broken: PromQL error (bad_data): ")


def test_an_unreachable_prometheus_is_a_failed_measurement_that_says_so():
    address = f"http://127.0.0.1:{free_loopback_port()}"  # nothing listens there
    [(name, ok, said)] = checked(address, PrometheusQuery("errors", "up", max=1))
    assert not ok and said == f"errors: Prometheus at {address} did not answer: connection refused (nothing listens on that port)"


def test_a_check_request_that_times_out_is_a_failed_measurement_that_says_so():
    import socket

    from reconciler.model import RequestCheck

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        model = Model("chat", "/m", replicas=2, rollout=RolloutPolicy(
            request=RequestCheck(timeout_s=0.5),
            prometheus=PrometheusCheck(f"http://127.0.0.1:{port}", (PrometheusQuery("errors", "up", max=1),), 0.5)))
        out = {m.check: (m.ok, m.said) for m in measure(model, [Target("chat-0", "127.0.0.1", port)], [])}
    assert out["request"] == (False, "request: 2 of 2 failed: no answer within 0.5s")
    assert out["errors"] == (False, f"errors: Prometheus at http://127.0.0.1:{port} did not answer: no answer within 0.5s")
