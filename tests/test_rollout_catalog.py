"""`update` and `fetch` in a model file, and the daemon's --interval floor: bad values are refused where they are."""

from __future__ import annotations

import pytest

from reconciler.catalog import load_catalog
from reconciler.model import FetchPolicy, UpdatePolicy
from tests.catalog_files import FLEET, ONE_PROFILE_MODEL, problems_of, write_catalog

MODEL = ONE_PROFILE_MODEL


def catalog_with(tmp_path, extra: str, source: str = "/models/llama"):
    text = MODEL.replace("source: /models/llama", f"source: {source}").replace("replicas: 2\n", "replicas: 2\n" + extra)
    return write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": text})


def test_update_and_fetch_build_their_policies(tmp_path):
    extra = "update: {max_surge: 2}\nfetch: {from_node: true, max_parallel: 3}\n"
    model = load_catalog(catalog_with(tmp_path, extra)).model("llama")
    assert model.update == UpdatePolicy(max_surge=2, max_unavailable=0)
    assert model.fetch == FetchPolicy(from_node=True, command=None, max_parallel=3)
    assert not model.needs_weights_on_node


def test_without_fetch_a_path_source_is_needed_on_the_node_and_a_hub_id_is_not(tmp_path):
    assert load_catalog(catalog_with(tmp_path / "a", "")).model("llama").needs_weights_on_node
    hub = load_catalog(catalog_with(tmp_path / "b", "", source="org/llama")).model("llama")
    assert hub.update is None and hub.fetch is None and not hub.needs_weights_on_node


def test_fetch_command_keeps_its_argv_with_the_source_placeholder(tmp_path):
    extra = 'fetch:\n  command: [hf, download, org/llama, --local-dir, "${MODEL_SOURCE}"]\n'
    fetch = load_catalog(catalog_with(tmp_path, extra)).model("llama").fetch
    assert fetch.command == ("hf", "download", "org/llama", "--local-dir", "${MODEL_SOURCE}")
    assert fetch.max_parallel == 2 and not fetch.from_node


CASES = {
    "surge_and_unavailable_both_zero": (
        "update: {max_surge: 0, max_unavailable: 0}\n", "/models/llama",
        "models/llama.yaml:4:9", "max_surge and max_unavailable are both 0",
    ),
    "update_with_neither_field_is_both_zero": (
        "update: {}\n", "/models/llama", "models/llama.yaml:4:9", "max_surge and max_unavailable are both 0",
    ),
    "unknown_placeholder_in_fetch_command": (
        'fetch:\n  command: [get, "${MODEL_SOURCE}", "${NODE_RANK}"]\n', "/models/llama",
        "models/llama.yaml:5:37", "unknown placeholder ${NODE_RANK} in fetch.command; known: ${MODEL_SOURCE}",
    ),
    "fetch_on_a_hub_id": (
        "fetch: {from_node: true}\n", "org/llama", "models/llama.yaml:4:8", "fetch needs a path source; 'org/llama' is a hub id",
    ),
    "fetch_with_neither_way": (
        "fetch: {max_parallel: 1}\n", "/models/llama", "models/llama.yaml:4:8", "fetch needs exactly one of from_node",
    ),
    "fetch_with_both_ways": (
        "fetch: {from_node: true, command: [x]}\n", "/models/llama", "models/llama.yaml:4:8", "fetch needs exactly one of",
    ),
    "from_node_false": (
        "fetch: {from_node: false}\n", "/models/llama", "models/llama.yaml:4:20", "from_node",
    ),
    "max_parallel_zero": (
        "fetch: {from_node: true, max_parallel: 0}\n", "/models/llama", "models/llama.yaml:4:40",
        "max_parallel: 0 is out of range; must be at least 1",
    ),
    "negative_surge": (
        "update: {max_surge: -1}\n", "/models/llama", "models/llama.yaml:4:21", "max_surge: -1 is out of range",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rollout_mistake_is_reported_at_its_position(tmp_path, name):
    extra, source, where, phrase = CASES[name]
    problems = problems_of(catalog_with(tmp_path, extra, source))
    assert any(p.startswith(where) and phrase in p for p in problems), (where, phrase, problems)


@pytest.mark.parametrize("interval", ["0.5", "0", "nan", "inf"])
def test_run_with_an_interval_below_one_second_is_a_usage_error(cli, tmp_path, interval):
    catalog = write_catalog(tmp_path, {"fleet.yaml": "nodes:\n  - id: here\n    address: 127.0.0.1\n    transport: local\n"})
    (catalog / "models").mkdir()
    r = cli("run", str(catalog), "--interval", interval, "--max-passes", "1", timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--interval must be at least 1 second" in r.stderr and "Traceback" not in r.stderr
    assert not (catalog / "status").exists()
