"""The canary's checks judged (SPEC section 13), through the request and query seams: each answer, or
the lack of one, is a measurement that says why in words. No sockets (the fast tier); the same code
against a real Prometheus and real llama.cpp is in tests/test_canary_prometheus.py and tests/test_canary_fleet.py."""

from __future__ import annotations

import json

from reconciler.act.canary_checks import (
    Answer, Target, generated_text, judge, measure, p95, query_value, replica_regex, substitute,
)
from reconciler.model import Model, Profile, PrometheusCheck, PrometheusQuery, RequestCheck, RolloutPolicy

CANARY = [Target("chat-0", "127.0.0.1", 1)]
STABLE = [Target("chat-1", "127.0.0.1", 2), Target("chat-2", "127.0.0.1", 3)]


def chat(text: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


def model(**request) -> Model:
    return Model("chat", "/m", replicas=3, profiles=(Profile("cpu", "llama.cpp"),),
                 rollout=RolloutPolicy(request=RequestCheck(**request)))


def by_port(answers: dict[int, Answer]):
    return lambda target, path, body, timeout: answers[target.port]


def test_canary_answering_500_fails_the_request_measurement_with_the_count_and_the_status():
    m = model(contains="ready")
    [req] = measure(m, CANARY, STABLE, post=by_port({1: Answer(500, b"oops", 0.1), 2: Answer(200, chat("ready"), 0.1),
                                                     3: Answer(200, chat("ready"), 0.1)}))
    assert not req.ok and req.said == "request: 2 of 2 failed: HTTP 500"


def test_wrong_text_and_a_timeout_are_said_in_words():
    check = RequestCheck(contains="ready")
    assert judge(check, Answer(200, chat("nope"), 0.1)) == "answer 'nope' lacks 'ready'"
    assert judge(RequestCheck(matches=r"^re"), Answer(200, chat("nope"), 0.1)) == "answer 'nope' does not match '^re'"
    assert judge(check, Answer(failed="no answer within 30s")) == "no answer within 30s"
    assert judge(check, Answer(200, chat("I am ready."), 0.1)) == ""


def test_good_canary_passes_and_latency_compares_p95_with_the_stable_copies():
    m = model(contains="ready", max_latency_ratio=1.5)
    good = measure(m, CANARY, STABLE, post=by_port({1: Answer(200, chat("ready"), 0.2), 2: Answer(200, chat("ready"), 0.2),
                                                    3: Answer(200, chat("ready"), 0.2)}))
    assert [(x.check, x.ok) for x in good] == [("request", True), ("latency", True)]
    assert good[0].said == "request: 2 of 2 answered as expected"
    slow = measure(m, CANARY, STABLE, post=by_port({1: Answer(200, chat("ready"), 2.9), 2: Answer(200, chat("ready"), 1.2),
                                                    3: Answer(200, chat("ready"), 1.2)}))
    assert not slow[1].ok and slow[1].said == "latency: p95 2.9 s = 2.4x stable 1.2 s (max 1.5x)"


def test_no_latency_figure_without_a_good_answer_on_both_sides():
    m = model(max_latency_ratio=1.5)
    out = measure(m, CANARY, STABLE, post=by_port({1: Answer(failed="connection refused"), 2: Answer(200, b"{}", 1),
                                                   3: Answer(200, b"{}", 1)}))
    assert [x.check for x in out] == ["request"] and out[0].said == "request: 2 of 2 failed: connection refused"


def test_generated_text_reads_chat_and_completion_answers():
    assert generated_text(chat("hi")) == "hi"
    assert generated_text(json.dumps({"choices": [{"text": "yo"}]}).encode()) == "yo"
    assert generated_text(b"plain") == "plain"
    assert p95([1, 2, 3, 4, 100]) == 100 and p95([1.0]) == 1.0


def test_query_placeholders_become_the_model_and_regexes_of_replica_ids():
    m = model()
    q = 'sum(rate(x{model="$MODEL", replica=~"$CANARY"}[1m])) / sum(rate(x{replica=~"$STABLE"}[1m]))'
    assert substitute(q, m, CANARY, STABLE) == ('sum(rate(x{model="chat", replica=~"chat-0"}[1m])) / '
                                                'sum(rate(x{replica=~"chat-1|chat-2"}[1m]))')
    assert replica_regex([Target("m.v2-0", "h", 1)]) == "m[.]v2-0"


def test_every_prometheus_answer_that_is_no_single_number_is_a_reason():
    ok = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "0.5"]}]}})
    assert query_value((200, ok.encode()), "http://p") == 0.5
    scalar = json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}})
    assert query_value((200, scalar.encode()), "http://p") == 3.0
    err = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 5"})
    assert query_value((400, err.encode()), "http://p") == "PromQL error (bad_data): parse error at char 5"
    empty = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
    assert query_value((200, empty.encode()), "http://p") == "the query returned no samples"
    assert query_value("connection refused", "http://p") == "Prometheus at http://p did not answer: connection refused"
    assert "no JSON" in query_value((502, b"<html>"), "http://p")


def test_a_prometheus_query_is_judged_against_its_bounds():
    answers = {"up": 2.0, "down": 0.1}

    def get(url, timeout):
        name = "up" if "up" in url else "down"
        return 200, json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [0, str(answers[name])]}}).encode()

    m = Model("chat", "/m", replicas=3, rollout=RolloutPolicy(prometheus=PrometheusCheck(
        "http://p", (PrometheusQuery("errors", "up", max=1.0), PrometheusQuery("rate", "down", min=0.05)))))
    out = measure(m, CANARY, STABLE, get=get)
    assert [(x.check, x.ok, x.said) for x in out] == [("errors", False, "errors: 2 is above max 1"),
                                                      ("rate", True, "rate: 0.1 within min 0.05")]
