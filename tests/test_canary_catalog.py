"""`rollout:` (canary and checks, SPEC section 13) in a model file: built with its defaults, and every
mistake refused at its line and column."""

from __future__ import annotations

import json

import pytest

from reconciler.catalog import load_catalog
from reconciler.model import PrometheusQuery, RolloutPolicy
from tests.test_catalog import FLEET, problems_of, write_catalog

MODEL = """\
name: llama
source: /models/llama
replicas: 3
profiles:
  - name: big
    engine: vllm
    gpu_class: H100-80GB
"""

FULL = """\
rollout:
  canary: {replicas: 1, weight: 20, analysis_s: 60}
  checks:
    interval_s: 5
    failure_limit: 2
    request:
      body: {messages: [{role: user, content: "Reply with the word ready."}], max_tokens: 8}
      expect: {status: 200, matches: "(?i)ready"}
      max_latency_ratio: 1.5
    prometheus:
      address: http://127.0.0.1:9090/
      queries:
        - {name: error-rate, query: 'sum(rate(errors_total{replica=~"$CANARY"}[1m]))', max: 0.01}
"""


def catalog_with(tmp_path, extra: str, replicas: str = "replicas: 3"):
    text = MODEL.replace("replicas: 3", replicas) + extra
    return write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": text})


def test_rollout_builds_every_field_as_written(tmp_path):
    r = load_catalog(catalog_with(tmp_path, FULL), with_revision=False).model("llama").rollout
    assert (r.canary_replicas, r.weight, r.analysis_s, r.interval_s, r.failure_limit) == (1, 20, 60.0, 5.0, 2)
    assert r.request.path == "/v1/chat/completions" and r.request.status == 200
    assert r.request.matches == "(?i)ready" and r.request.contains is None and r.request.max_latency_ratio == 1.5
    assert json.loads(r.request.body_json)["max_tokens"] == 8
    assert r.prometheus.address == "http://127.0.0.1:9090"
    assert r.prometheus.queries == (PrometheusQuery("error-rate", 'sum(rate(errors_total{replica=~"$CANARY"}[1m]))', 0.01, None),)


def test_rollout_with_only_a_canary_takes_the_spec_defaults(tmp_path):
    r = load_catalog(catalog_with(tmp_path, "rollout: {canary: {}}\n"), with_revision=False).model("llama").rollout
    assert r == RolloutPolicy()
    assert (r.canary_replicas, r.weight, r.analysis_s, r.interval_s, r.failure_limit) == (1, 10, 300.0, 10.0, 1)


def test_a_rollout_change_alone_is_no_spec_change(tmp_path):
    from reconciler.model import spec_hash

    a = load_catalog(catalog_with(tmp_path / "a", ""), with_revision=False).model("llama")
    b = load_catalog(catalog_with(tmp_path / "b", FULL), with_revision=False).model("llama")
    assert spec_hash(a, a.profiles[0]) == spec_hash(b, b.profiles[0])


CASES = {
    "weight_zero": ("rollout: {canary: {weight: 0}}\n", "replicas: 3", "models/llama.yaml:8:28", "weight: 0 is out of range"),
    "weight_one_hundred": ("rollout: {canary: {weight: 100}}\n", "replicas: 3", "models/llama.yaml:8:28",
                           "weight: 100 is out of range"),
    "canary_as_many_as_the_model": ("rollout:\n  canary: {replicas: 3}\n", "replicas: 3", "models/llama.yaml:9:22",
                                    "rollout.canary.replicas 3 must be fewer than the model's replicas (3)"),
    "canary_default_on_one_replica": ("rollout: {canary: {}}\n", "replicas: 1", "models/llama.yaml:8:19",
                                      "rollout.canary.replicas 1 must be fewer than the model's replicas (1)"),
    "canary_against_a_range_min": ("rollout:\n  canary: {replicas: 2}\nautoscale: {target: 4}\n",
                                   "replicas: {min: 2, max: 5}", "models/llama.yaml:9:22", "(min 2)"),
    "regex_that_does_not_compile": (
        "rollout:\n  canary: {}\n  checks:\n    request:\n      expect: {matches: 'ready('}\n", "replicas: 3",
        "models/llama.yaml:12:25", "matches 'ready(' is not a regular expression"),
    "contains_and_matches": (
        "rollout:\n  canary: {}\n  checks:\n    request:\n      expect: {contains: a, matches: b}\n", "replicas: 3",
        "models/llama.yaml:12:15", "one of contains"),
    "address_not_a_url": (
        "rollout:\n  canary: {}\n  checks:\n    prometheus:\n      address: prometheus:9090\n"
        "      queries: [{name: a, query: up, max: 1}]\n", "replicas: 3",
        "models/llama.yaml:12:16", "address 'prometheus:9090' is not a URL"),
    "address_with_a_bad_port": (
        "rollout:\n  canary: {}\n  checks:\n    prometheus:\n      address: http://p:99999\n"
        "      queries: [{name: a, query: up, max: 1}]\n", "replicas: 3",
        "models/llama.yaml:12:16", "is not a URL"),
    "query_names_twice": (
        "rollout:\n  canary: {}\n  checks:\n    prometheus:\n      address: http://p:9090\n"
        "      queries:\n        - {name: err, query: up, max: 1}\n        - {name: err, query: down, min: 0}\n",
        "replicas: 3", "models/llama.yaml:15:18", "query name 'err' is used twice"),
    "query_without_a_bound": (
        "rollout:\n  canary: {}\n  checks:\n    prometheus:\n      address: http://p:9090\n"
        "      queries:\n        - {name: err, query: up}\n", "replicas: 3",
        "models/llama.yaml:14:11", "query 'err' needs max or min"),
    "unknown_field_in_canary": ("rollout: {canary: {weigth: 5}}\n", "replicas: 3", "models/llama.yaml:8:20",
                                "unknown field 'weigth' (did you mean 'weight'?)"),
    "failure_limit_negative": ("rollout:\n  canary: {}\n  checks: {failure_limit: -1}\n", "replicas: 3",
                               "models/llama.yaml:10:27", "failure_limit: -1 is out of range"),
    "interval_below_a_second": ("rollout:\n  canary: {}\n  checks: {interval_s: 0.5}\n", "replicas: 3",
                                "models/llama.yaml:10:24", "interval_s"),
    "path_without_a_slash": ("rollout:\n  canary: {}\n  checks:\n    request: {path: v1/chat}\n", "replicas: 3",
                             "models/llama.yaml:11:21", "path"),
    "checks_without_canary": ("rollout:\n  checks: {interval_s: 5}\n", "replicas: 3", "models/llama.yaml:8:1",
                              "missing required field 'canary'"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_canary_mistake_is_reported_at_its_line_and_column(tmp_path, name):
    extra, replicas, where, phrase = CASES[name]
    problems = problems_of(catalog_with(tmp_path, extra, replicas))
    assert any(p.startswith(where) and phrase in p for p in problems), (where, phrase, problems)
