"""status/models/<name>.yaml and status/endpoints.yaml built from one PassResult: predicted from a plan,
or with the phases a pass observed."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import yaml

from reconciler.decide.backoff import Backoff
from reconciler.model import spec_hash
from reconciler.decide.plan import plan
from reconciler.record.status.documents import endpoints_document, model_status_document
from reconciler.record.status.predict import predicted_pass, predicted_phases
from reconciler.record.status.write import write_pass
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank
from tests.conftest import REPO
import pytest

pytestmark = [pytest.mark.process]

MODEL_SCHEMA = jsonschema.Draft202012Validator(json.loads((REPO / "schema" / "status-model.schema.json").read_text()))
ENDPOINTS_SCHEMA = jsonschema.Draft202012Validator(json.loads((REPO / "schema" / "status-endpoints.schema.json").read_text()))

P = profile("p", gpus_per_node=8)
M = model("m", P, replicas=3)
H = spec_hash(M, P)


def setup():
    f = fleet(node_spec("a", data_address="10.1.0.1"), node_spec("b", data_address="fd00::2"))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=range(8), port=8000, spec_hash=H)]),
                    observed("b", gpu=gpus(8)))
    c = catalog(f, M)
    return c, plan(c, inv, backoff={"m-0": Backoff(restarts=2, streak=0, last_restart=1)})


def test_predicted_status_marks_running_ready_new_pending_and_unplaced_with_reasons():
    c, p = setup()
    doc = model_status_document(M, predicted_pass(c, p), c.fleet)
    MODEL_SCHEMA.validate(doc)
    assert (doc["name"], doc["desired"], doc["ready"]) == ("m", 3, 1)
    r0, r1, r2 = doc["replicas"]
    assert r0 == {"id": "m-0", "profile": "p", "phase": "Ready", "message": "", "restarts": 2,
                  "nodes": [{"node": "a", "rank": 0, "gpus": list(range(8)), "port": 8000, "endpoint": "http://10.1.0.1:8000"}]}
    assert r1["phase"] == "Pending" and r1["message"] == "start: not running"
    assert r1["nodes"][0]["endpoint"] == "http://[fd00::2]:8000"
    assert r2["phase"] == "Pending" and r2["nodes"] == [] and r2["profile"] is None
    assert r2["message"].startswith("cannot be placed: 0/2 nodes fit profile p")
    assert {"profile": "p", "pool": "none/H100-80GB", "node": "a", "reason": "already hosts m-0 of this model"} in r2["rejections"]


def test_observed_phases_override_the_prediction_and_drive_endpoints():
    c, p = setup()
    def seen(**phases):
        result = predicted_pass(c, p)
        result.replicas.update({rid.replace("_", "-"): dataclasses.replace(result.replicas[rid.replace("_", "-")], phase=ph)
                                for rid, ph in phases.items()})
        return result

    doc = endpoints_document(c, seen(m_0="Ready", m_1="Ready", m_2="Pending"))
    ENDPOINTS_SCHEMA.validate(doc)
    assert doc == {"models": {"m": ["http://10.1.0.1:8000", "http://[fd00::2]:8000"]}}
    assert endpoints_document(c, seen(m_0="Failed", m_1="Pending")) == {"models": {"m": []}}


def test_endpoint_urls_bracket_ipv6_only():
    from reconciler.host import Host  # every endpoint in status/ is Fleet.endpoint's, which is Host.url

    assert Host("10.0.0.1").url(80) == "http://10.0.0.1:80"
    assert Host("fd00::1").url(80) == "http://[fd00::1]:80"
    assert Host("gpu-1.example").url(80) == "http://gpu-1.example:80"


def test_backoff_waiting_replica_is_failed_in_prediction():
    f = fleet(node_spec("a"))
    inv = inventory(observed("a", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=range(8), spec_hash=H, alive=False)]))
    c = catalog(f, model("m", P))
    p = plan(c, inv, now=5, backoff={"m-0": Backoff(restarts=1, streak=1, last_restart=0)})
    assert predicted_phases(p) == {"m-0": "Failed"}
    doc = model_status_document(c.models[0], predicted_pass(c, p), f)
    assert "waiting for backoff until" in doc["replicas"][0]["message"] and doc["replicas"][0]["restarts"] == 1


def test_write_pass_writes_once_and_removes_status_of_removed_models(tmp_path):
    c, p = setup()
    c = dataclasses.replace(c, root=str(tmp_path))
    (tmp_path / "status" / "models").mkdir(parents=True)
    (tmp_path / "status" / "models" / "gone.yaml").write_text("name: gone\n")
    changed = write_pass(c, predicted_pass(c, p), nodes=False).paths
    assert sorted(x.name for x in changed) == ["endpoints.yaml", "gone.yaml", "litellm.yaml", "m.yaml",
                                               "prometheus.json"]
    assert not (tmp_path / "status" / "models" / "gone.yaml").exists()
    assert yaml.safe_load((tmp_path / "status" / "models" / "m.yaml").read_text())["name"] == "m"
    assert write_pass(c, predicted_pass(c, p), nodes=False).paths == ()


class _CountingHistory(dict):
    """A plan history that counts how often it is walked."""

    walks = 0

    def items(self):
        self.walks += 1
        return super().items()


def test_status_of_a_plan_walks_its_restart_history_once_not_once_per_replica(tmp_path):
    c, p = setup()
    c = dataclasses.replace(c, root=str(tmp_path))
    history = _CountingHistory(p.backoff)
    counted = dataclasses.replace(p, backoff=history)
    write_pass(c, predicted_pass(c, counted), nodes=False)
    doc = yaml.safe_load((tmp_path / "status" / "models" / "m.yaml").read_text())
    assert [r["restarts"] for r in doc["replicas"]] == [2, 0, 0]
    assert history.walks == 1


LOCAL_CATALOG = {
    "fleet.yaml": "state_dir: {state}\nnodes:\n  - id: here\n    address: 127.0.0.1\n    transport: local\n",
    "models/echo.yaml": "name: echo\nsource: /models/echo\nprofiles:\n  - name: cpu\n    engine: command\n"
                        "    port: 18999\n    command: [/bin/true]\n",
}


def blocked_status_catalog(tmp_path):
    """A catalog whose `status` is a plain file, so nothing under status/ can be written."""
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    for name, text in LOCAL_CATALOG.items():
        (root / name).write_text(text.format(state=tmp_path / "state"))
    (root / "status").write_text("not a directory\n")
    snapshot = tmp_path / "nodes.yaml"
    snapshot.write_text("nodes:\n  - id: here\n    state: ready\n")
    return root, snapshot


def test_a_status_file_that_cannot_be_written_raises_status_write_error_naming_it(tmp_path):
    from reconciler.errors import StatusWriteError
    from reconciler.record.status.files import write_document

    (tmp_path / "status").write_text("a file")
    try:
        write_document(tmp_path / "status" / "nodes.yaml", {"nodes": []})
    except StatusWriteError as exc:
        assert exc.path == str(tmp_path / "status" / "nodes.yaml") and "Not a directory" in str(exc)
    else:
        raise AssertionError("no StatusWriteError")


def test_plan_write_status_into_an_unwritable_status_is_a_message_not_a_traceback(tmp_path, cli):
    root, snapshot = blocked_status_catalog(tmp_path)
    r = cli("plan", str(root), "--inventory", str(snapshot), "--write-status")
    assert r.returncode == 1
    assert f"cannot write {root}/status/models/echo.yaml: Not a directory" in r.stderr and "Traceback" not in r.stderr


def test_nodes_into_an_unwritable_status_is_a_message_not_a_traceback(tmp_path, cli):
    root, _ = blocked_status_catalog(tmp_path)
    r = cli("nodes", str(root))
    assert r.returncode == 1
    assert f"cannot write {root}/status/nodes.yaml: Not a directory" in r.stderr and "Traceback" not in r.stderr


def test_nodes_status_keeps_only_ports_placement_could_hand_out_so_stray_listeners_do_not_rewrite_it(tmp_path):
    from reconciler.model import Inventory, Model, ObservedNode, Profile
    from reconciler.decide.placement import DIST_PORT_BASE
    from reconciler.record.status.write import write_nodes_status

    models = [Model("m", "/w", profiles=(Profile("p", "vllm", gpu_class="H100-80GB", gpus_per_node=1, port=8000),))]

    def snapshot(*ports):
        return Inventory((ObservedNode("n1", ports_in_use=ports),))

    written = write_nodes_status(tmp_path, snapshot(22, 8000, 8001, DIST_PORT_BASE, 21480, 45000), models)
    doc = yaml.safe_load(written[0].read_text())
    assert doc["nodes"][0]["ports_in_use"] == [8000, 8001, DIST_PORT_BASE]
    # A listener outside every window comes and goes: the file stays as it was.
    assert write_nodes_status(tmp_path, snapshot(22, 8000, 8001, DIST_PORT_BASE, 21491), models) == []
    # One inside a window is a fact placement needs: the file changes.
    assert write_nodes_status(tmp_path, snapshot(8000, 8001, 8002, DIST_PORT_BASE), models) != []
