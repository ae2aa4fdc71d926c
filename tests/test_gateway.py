"""status/gateway/ (SPEC section 10): a LiteLLM config and Prometheus targets, each Ready replica's head
and nothing else, in a fixed order, written atomically, only on change, and over a hand edit."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import yaml

from reconciler.record.gateway import litellm_document, prometheus_targets
from reconciler.record.status.predict import predicted_pass
from reconciler.record.status.gateway_files import write_gateway_files
from reconciler.model import Assignment, Catalog, Fleet, NodeSpec
from reconciler.decide.outcomes import ReplicaState
from reconciler.vocabulary import Phase
from tests.builders import model, profile

def _predicted_replicas(catalog, plan):
    return predicted_pass(catalog, plan).replicas


FLEET = Fleet(nodes=(NodeSpec(id="n1", address="10.9.0.1", data_address="10.9.1.1"),
                     NodeSpec(id="n2", address="10.9.0.2", data_address="fd00::2")))
VLLM = dataclasses.replace(model("llama", profile("h100", "vllm"), replicas=3), served_name="meta/llama-3")
CPP = model("gemma", profile("cpu", "llama.cpp", gpu_class=None), replicas=2)


def cat(tmp_path) -> Catalog:
    return Catalog(root=str(tmp_path), fleet=FLEET, models=(CPP, VLLM))


def state(rid, m, phase, node="n1", port=8000, prof=None):
    nodes = (Assignment(node, 0, (), (), port),)
    return ReplicaState(rid, m.name, prof or m.profiles[0].name, phase, nodes=nodes)


def states():
    return {s.replica: s for s in [
        state("llama-10", VLLM, Phase.READY, "n1", 8010),  # ordinal 10 after 2: numbers, not strings
        state("llama-2", VLLM, Phase.READY, "n2", 8002),
        state("llama-1", VLLM, Phase.DRAINING, "n1", 8001),
        state("llama-0", VLLM, Phase.STARTING, "n1", 8000),
        state("gemma-0", CPP, Phase.READY, "n1", 8080),
        state("gemma-1", CPP, Phase.FAILED, "n2", 8080),
    ]}


def test_litellm_lists_each_ready_head_under_its_served_name_with_the_engines_provider(tmp_path):
    doc = litellm_document(cat(tmp_path), states())
    assert doc == {"model_list": [
        {"model_name": "gemma",
         "litellm_params": {"model": "openai/gemma", "api_base": "http://10.9.1.1:8080/v1", "api_key": "none"},
         "model_info": {"id": "gemma-0"}},
        {"model_name": "meta/llama-3",
         "litellm_params": {"model": "hosted_vllm/meta/llama-3", "api_base": "http://[fd00::2]:8002/v1",
                            "api_key": "none"},
         "model_info": {"id": "llama-2"}},
        {"model_name": "meta/llama-3",
         "litellm_params": {"model": "hosted_vllm/meta/llama-3", "api_base": "http://10.9.1.1:8010/v1",
                            "api_key": "none"},
         "model_info": {"id": "llama-10"}},
    ]}


def test_prometheus_has_one_group_per_ready_head_with_its_labels(tmp_path):
    groups = prometheus_targets(cat(tmp_path), states())
    assert [g["targets"] for g in groups] == [["10.9.1.1:8080"], ["[fd00::2]:8002"], ["10.9.1.1:8010"]]
    assert groups[1]["labels"] == {"model": "llama", "replica": "llama-2", "node": "n2", "engine": "vllm",
                                   "__metrics_path__": "/metrics"}


def test_the_files_are_written_once_and_not_touched_when_nothing_changed(tmp_path):
    c = cat(tmp_path)
    written, warnings = write_gateway_files(tmp_path, c, states())
    names = sorted(p.name for p in written)
    assert names == ["litellm.yaml", "prometheus.json"] and warnings == []
    lite, prom = tmp_path / "status/gateway/litellm.yaml", tmp_path / "status/gateway/prometheus.json"
    assert yaml.safe_load(lite.read_text()) == litellm_document(c, states())
    assert json.loads(prom.read_text()) == prometheus_targets(c, states())
    before = (os.stat(lite).st_ino, os.stat(lite).st_mtime_ns, os.stat(prom).st_ino)
    assert write_gateway_files(tmp_path, c, dict(reversed(list(states().items())))) == ([], [])
    assert (os.stat(lite).st_ino, os.stat(lite).st_mtime_ns, os.stat(prom).st_ino) == before
    # A replica turning Ready rewrites both.
    more = {**states(), "llama-0": state("llama-0", VLLM, Phase.READY, "n1", 8000)}
    written, _ = write_gateway_files(tmp_path, c, more)
    assert sorted(p.name for p in written) == ["litellm.yaml", "prometheus.json"]
    assert "llama-0" in lite.read_text() and "8000" in prom.read_text()
    assert not [p for p in lite.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_hand_edited_file_is_written_over_with_one_warning(tmp_path):
    c = cat(tmp_path)
    write_gateway_files(tmp_path, c, states())
    lite = tmp_path / "status/gateway/litellm.yaml"
    good = lite.read_text()
    lite.write_text(good + "general_settings: {master_key: sk-mine}\n")
    written, warnings = write_gateway_files(tmp_path, c, states())
    assert [p.name for p in written] == ["litellm.yaml"] and lite.read_text() == good
    assert len(warnings) == 1 and "status/gateway/litellm.yaml was edited by hand" in warnings[0]
    assert write_gateway_files(tmp_path, c, states()) == ([], [])  # one warning, not one per pass


def test_a_change_of_content_is_no_hand_edit(tmp_path):
    c = cat(tmp_path)
    write_gateway_files(tmp_path, c, states())
    _, warnings = write_gateway_files(tmp_path, c, {})
    assert warnings == [] and json.loads((tmp_path / "status/gateway/prometheus.json").read_text()) == []


def test_plan_write_status_predicts_the_kept_replicas_as_ready(tmp_path):
    from reconciler.record.memory import PassMemory, plan_remembering
    from reconciler.model import spec_hash
    from tests.builders import catalog, fleet, gpus, inventory, node_spec, observed, rank

    p = profile("p", gpus_per_node=1)
    m = model("m", p, replicas=1)
    c = catalog(fleet(node_spec("a", data_address="10.9.9.9")), m, root=str(tmp_path))
    inv = inventory(observed("a", gpu=gpus(2), replicas=[rank("m-0", "m", "p", gpus=(0,), port=8123,
                                                               spec_hash=spec_hash(m, p)),
                                                          rank("m-1", "m", "p", gpus=(1,), port=8124,
                                                               spec_hash=spec_hash(m, p))]))
    planned = plan_remembering(c, inv, now=1000.0, memory=PassMemory())
    predicted = _predicted_replicas(c, planned)
    assert predicted["m-0"].phase == Phase.READY and predicted["m-1"].phase == Phase.DRAINING
    doc = litellm_document(c, predicted)
    assert [e["litellm_params"]["api_base"] for e in doc["model_list"]] == ["http://10.9.9.9:8123/v1"]


@pytest.mark.process
def test_plan_write_status_writes_the_gateway_files_of_the_example_catalog(tmp_path):
    from tests.conftest import REPO, copy_tracked, run_cli

    root = copy_tracked(REPO / "catalog", tmp_path / "catalog")
    r = run_cli("plan", str(root), "--inventory", str(REPO / "catalog" / "status" / "nodes.yaml"), "--write-status")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load((root / "status/gateway/litellm.yaml").read_text())
    # The one replica the snapshot shows running, predicted Ready; nothing the plan only starts.
    assert [(e["model_name"], e["model_info"]["id"]) for e in doc["model_list"]] == [("llama-3-70b", "llama-3-70b-0")]
    [group] = json.loads((root / "status/gateway/prometheus.json").read_text())
    assert group["labels"]["replica"] == "llama-3-70b-0" and group["labels"]["engine"] == "vllm"
    assert "edited by hand" not in r.stderr
