"""Engine load from /metrics: real exposition text of each engine, parsed by prometheus_client."""

import http.server
import threading

import pytest

from reconciler.act.engine_metrics import (
    ENGINE_SERIES, EngineLoad, LoadSeries, LoadTarget, LoadUnknown, parse_load, read_loads,
)

# Shapes as the engines print them (vLLM's /metrics with a model_name label, SGLang's, and llama.cpp's
# llama-server --metrics, whose gauges carry no labels).
VLLM = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 5.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="llama"} 1234.0
"""
SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 0.0
"""
LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 42
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


@pytest.mark.parametrize("engine,text,running,waiting", [
    ("vllm", VLLM, 3, 5), ("sglang", SGLANG, 2, 0), ("llama.cpp", LLAMACPP, 1, 3),
])
def test_each_engine_reports_running_and_waiting_in_its_own_series(engine, text, running, waiting):
    load = parse_load(text, ENGINE_SERIES[engine])
    assert load == EngineLoad(running=running, waiting=waiting)
    assert load.in_flight == running + waiting


def test_samples_of_one_series_are_summed_over_labels():
    text = VLLM + 'vllm:num_requests_running{model_name="other"} 2.0\n'
    assert parse_load(text, ENGINE_SERIES["vllm"]).running == 5


@pytest.mark.parametrize("text,why", [
    ("", "have no"),
    ("llamacpp:requests_processing 1\n", "llamacpp:requests_deferred"),
    ("llamacpp:requests_processing -1\nllamacpp:requests_deferred 0\n", "not a count"),
    ("llamacpp:requests_processing NaN\nllamacpp:requests_deferred 0\n", "not a count"),
    ("<html>\x00 not metrics {{{\n", ""),
])
def test_an_answer_that_cannot_be_trusted_is_unknown_with_a_reason(text, why):
    load = parse_load(text, ENGINE_SERIES["llama.cpp"])
    assert isinstance(load, LoadUnknown)
    assert why in load.reason


def test_a_command_profile_names_its_own_series():
    series = LoadSeries(waiting="queue_depth", running="active", path="/stats")
    assert parse_load("active 2\nqueue_depth 7\n", series) == EngineLoad(2, 7)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/hang":
            threading.Event().wait(3)
        body = LLAMACPP.encode() if self.path == "/metrics" else b"nope"
        self.send_response(200 if self.path in ("/metrics", "/hang") else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_read_loads_asks_real_servers_and_a_slow_one_delays_only_itself():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        good = ENGINE_SERIES["llama.cpp"]
        answers = read_loads([
            LoadTarget("a-0", "127.0.0.1", port, good),
            LoadTarget("a-1", "127.0.0.1", port, LoadSeries(good.waiting, good.running, "/hang")),
            LoadTarget("a-2", "127.0.0.1", port, LoadSeries(good.waiting, good.running, "/missing")),
        ], timeout_s=0.5)
    finally:
        server.shutdown()
        server.server_close()
    assert answers["a-0"] == EngineLoad(1, 3)
    assert isinstance(answers["a-1"], LoadUnknown) and "within 0.5 s" in answers["a-1"].reason
    assert isinstance(answers["a-2"], LoadUnknown) and "404" in answers["a-2"].reason
