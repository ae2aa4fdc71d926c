"""The dashboard through Starlette's TestClient, on status trees the project writes itself (fast tier).

The tree: the bundled ten-node catalog planned offline with `plan --write-status` (in-process, the
same code the command runs), with the GPU health fields of SPEC section 9 added to its snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
import yaml

pytest.importorskip("starlette")
pytest.importorskip("httpx")  # Starlette's TestClient
with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx serves every version we allow
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

from reconciler.cli import main as cli_main  # noqa: E402
from reconciler.commands._status_files import read_catalog_status  # noqa: E402
from reconciler.record.status_view import json_document  # noqa: E402
from reconciler.dashboard.app import create_app  # noqa: E402
from reconciler.dashboard.server import DashboardServer, parse_address  # noqa: E402
from reconciler.dashboard.cells import GpuUse, gpu_cell  # noqa: E402
from reconciler.errors import UsageError  # noqa: E402
from reconciler.record.status.files import dump_yaml  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SECRET_VALUE = "hunter2-do-not-show"


def planned_catalog(tmp: Path) -> Path:
    """catalog/ with status/ written by `reconciler plan --inventory status/nodes.yaml --write-status`."""
    root = tmp / "catalog"  # copied in-process (the fast tier starts no git): the catalog and its snapshot
    shutil.copytree(REPO / "catalog", root, ignore=lambda d, names: [n for n in names if Path(d).name == "status"
                                                                     and n != "nodes.yaml"])
    model = root / "models" / "qwen2.5-7b.yaml"
    doc = yaml.safe_load(model.read_text())
    for profile in doc["profiles"]:  # a secret reference: its value must never reach a page
        profile.setdefault("env", {})["HF_TOKEN"] = {"from_env": "DASHBOARD_TEST_SECRET"}
    model.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.environ["DASHBOARD_TEST_SECRET"] = SECRET_VALUE
    snapshot = root / "status" / "nodes.yaml"
    assert cli_main(["plan", str(root), "--inventory", str(snapshot), "--write-status"]) == 0
    return root


def add_gpu_health(root: Path) -> None:
    """The fields SPEC section 9 adds to the snapshot: health, health_reason, quarantined, allocated_mb."""
    path = root / "status" / "nodes.yaml"
    doc = yaml.safe_load(path.read_text())
    nodes = {n["id"]: n for n in doc["nodes"]}
    gpus = nodes["a100-b3"]["gpus"]
    gpus[0].update(health="unhealthy", health_reason="Xid 79 at 2026-11-30T10:02:11Z: GPU has fallen off the bus")
    gpus[1].update(health="ok", quarantined={"reason": "3 failed starts of embedder-0", "until": "2026-12-01T23:00:00Z"})
    gpus[2].update(health="ok", health_reason="cordoned in fleet.yaml")
    gpus[3].update(health="ok", allocated_mb=40000, memory_used_mb=39000)
    gpus[4]["processes"] = [{"pid": 4242, "name": "rogue-trainer", "used_mb": 2048}]
    path.write_text(dump_yaml(doc))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = planned_catalog(tmp_path_factory.mktemp("dash"))
    add_gpu_health(root)
    (root / "status" / "catalog.yaml").write_text(dump_yaml({
        "last_attempted_revision": "b" * 40, "last_applied_revision": "a" * 40, "message": "revision aaaa applied",
        "errors": [{"file": "models/broken.yaml", "line": 3, "column": 7, "message": "replicas: -1 is less than 0"}],
        "warnings": []}))
    return root


@pytest.fixture
def client(tree):
    return TestClient(create_app(tree))


def test_overview_shows_the_counts_the_files_hold(client, tree):
    page = client.get("/")
    assert page.status_code == 200
    html = page.text
    status = read_catalog_status(str(tree))
    desired = sum(m["desired"] for m in status.models)
    assert f'<span id="desired-count">{desired}</span>' in html
    assert "Failed" in html and "replicas: -1 is less than 0" in html and "models/broken.yaml:3:7" in html
    assert "a" * 40 in html and "b" * 40 in html
    assert '<span class="n" id="gpus-unhealthy">1</span>' in html
    assert '<span class="n" id="gpus-quarantined">1</span>' in html
    assert '<span class="n" id="gpus-cordoned">1</span>' in html
    assert "cordoned 1" in html  # h100-a4, a cordoned node


def test_api_status_is_the_json_of_reconciler_status(client, tree, capsys):
    assert cli_main(["status", str(tree), "--format", "json"]) == 0
    assert client.get("/api/status").json() == json.loads(capsys.readouterr().out)
    assert client.get("/api/status").json() == json_document(read_catalog_status(str(tree)))


def test_api_nodes_is_the_snapshot(client, tree):
    assert client.get("/api/nodes").json() == yaml.safe_load((tree / "status" / "nodes.yaml").read_text())


def test_fleet_grid_colours_each_gpu_by_what_it_is_doing(client):
    html = client.get("/fleet?node=a100-b3").text
    assert 'id="node-a100-b3"' in html and 'id="node-a100-b1"' not in html
    cells = html.split('class="gpu use-')[1:]
    uses = [c.split('"')[0] for c in cells]
    assert uses == ["unhealthy", "quarantined", "cordoned", "free", "foreign", "free", "free", "free"]
    assert "Xid 79" in cells[0] and "3 failed starts of embedder-0" in cells[1] and "cordoned in fleet.yaml" in cells[2]
    assert "allocated 40000 MiB" in cells[3] and "rogue-trainer" in cells[4]


def test_a_held_gpu_names_its_replica_as_text_and_on_hover(client, tree):
    doc = yaml.safe_load((tree / "status" / "models" / "llama-3-70b.yaml").read_text())
    placed = next(r for r in doc["replicas"] if r["nodes"])
    node = placed["nodes"][0]
    html = client.get(f"/fleet?node={node['node']}").text
    cell = html.split(f'data-index="{node["gpus"][0]}"')[0].rsplit('<div class="gpu', 1)[1]
    assert "use-held" in cell and f"held by {placed['id']}" in cell
    after = html.split(f'data-index="{node["gpus"][0]}"', 1)[1].split("</div>", 1)[0]
    assert f'<span class="gt">{placed["id"]}</span>' in after


def test_filters_narrow_the_fleet_and_the_models(client, tree):
    everything = client.get("/fleet").text
    assert everything.count('class="node"') == 10
    zone_a = client.get("/fleet?label=zone%3Da").text
    labels = {n["id"]: n.get("labels", {}) for n in yaml.safe_load((tree / "status/nodes.yaml").read_text())["nodes"]}
    expected = sorted(n for n, lab in labels.items() if lab.get("zone") == "a")
    assert 0 < len(expected) < 10
    assert sorted(s.split('"')[0] for s in zone_a.split('data-node="')[1:]) == expected
    model = client.get("/fleet?model=llama-3-70b").text
    assert 0 < model.count('class="node"') < 10
    assert client.get("/fleet?state=cordoned").text.count('class="node"') == 1
    models = client.get("/models?model=embedder").text
    assert 'data-model="embedder"' in models and 'data-model="qwen2.5-7b"' not in models
    pending = client.get("/models?phase=Pending").text
    assert 'data-phase="Pending"' in pending and 'data-phase="Ready"' not in pending


def test_unplaced_replicas_show_their_rejections_grouped_by_reason_with_nodes_named(client, tree):
    doc = yaml.safe_load((tree / "status" / "models" / "deepseek-v3.yaml").read_text())
    first = doc["replicas"][0]
    assert first["rejections"], "the bundled catalog's deepseek-v3 fits nowhere"
    html = client.get("/models?model=deepseek-v3").text
    assert f'id="unplaced-{first["id"]}"' in html
    for rejection in first["rejections"]:
        if rejection.get("node"):
            assert f'/fleet?node={rejection["node"]}"' in html
    reasons = {r["reason"] for r in first["rejections"]}
    assert html.count('class="rejection"') == len({(r["profile"], r["reason"]) for r in first["rejections"]})
    assert all(reason.replace("'", "&#39;") in html for reason in reasons)
    replica = client.get(f"/replicas/{first['id']}").text
    assert "Why it cannot be placed" in replica


def test_replica_page_has_its_entry_nodes_and_message(client, tree):
    doc = yaml.safe_load((tree / "status" / "models" / "llama-3-70b.yaml").read_text())
    placed = next(r for r in doc["replicas"] if r["nodes"])
    html = client.get(f"/replicas/{placed['id']}").text
    assert f"Replica {placed['id']}" in html and placed["nodes"][0]["node"] in html
    assert (placed["message"] or "-").replace("'", "&#39;") in html
    assert client.get("/replicas/no-such-0").status_code == 404


def test_read_only_methods_urls_and_headers(client):
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        answer = client.request(method, "/")
        assert answer.status_code == 405 and answer.headers["allow"] == "GET, HEAD"
        assert "Traceback" not in answer.text
    assert client.head("/fleet").status_code == 200
    assert client.get("/no/such/page").status_code == 404
    huge = client.get("/fleet?node=" + "x" * 5000)
    assert huge.status_code == 414 and "Traceback" not in huge.text
    for url in ("/", "/models", "/fleet", "/api/status", "/static/dashboard.css", "/nope"):
        csp = client.get(url).headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    for url in ("/", "/models", "/fleet"):
        html = client.get(url).text
        assert "<form" not in html and "<button" not in html and "style=" not in html
        assert "<script>" not in html and "http://" not in html.split("<main")[0]  # nothing from elsewhere


def test_path_traversal_serves_nothing_outside(client):
    for url in ("/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static/%2e%2e/%2e%2e/status.py",
                "/static//etc/passwd", "/replicas/..%2f..%2fetc%2fpasswd", "/static/../../../../etc/passwd"):
        answer = client.get(url)
        assert answer.status_code == 404, url
        assert "root:" not in answer.text and "import" not in answer.text


def test_a_secret_value_never_appears(client, tree):
    assert SECRET_VALUE not in "".join(p.read_text() for p in (tree / "status").rglob("*.yaml"))
    for url in ("/", "/models", "/fleet", "/api/status", "/api/nodes", "/replicas/qwen2.5-7b-0",
                "/models?model=qwen2.5-7b"):
        assert SECRET_VALUE not in client.get(url).text


def test_a_status_file_of_the_wrong_shape_keeps_the_last_good_data_and_says_which_field(tmp_path):
    # It parses, it is a mapping with `replicas`, but a rank is a string: once a 500 from /api/status.
    root = planned_catalog(tmp_path)
    client = TestClient(create_app(root))
    assert 'data-model="embedder"' in client.get("/models?model=embedder").text
    path = root / "status" / "models" / "embedder.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["replicas"][0]["nodes"] = ["gpu-1"]
    path.write_text(dump_yaml(doc))
    for url in ("/models?model=embedder", "/api/status", "/"):
        assert client.get(url).status_code == 200, url
    page = client.get("/models?model=embedder").text
    assert 'data-model="embedder"' in page  # the last good copy
    assert "status/models/embedder.yaml: not a model status document" in page
    assert "replicas[0].nodes[0]: &#39;gpu-1&#39; is not of type &#39;object&#39;" in page
    assert any("replicas[0].nodes[0]" in p for p in client.get("/api/version").json()["problems"])


def test_a_bad_status_file_keeps_the_last_good_data_and_is_named(tmp_path):
    root = planned_catalog(tmp_path)
    client = TestClient(create_app(root))
    before = client.get("/models?model=embedder").text
    assert 'data-model="embedder"' in before
    path = root / "status" / "models" / "embedder.yaml"
    good = path.read_text()
    path.write_text(good[: len(good) // 2] + "\n  - [unclosed: {\n")  # half-written, then garbage
    after = client.get("/models?model=embedder")
    assert after.status_code == 200
    assert 'data-model="embedder"' in after.text  # the last good copy
    assert "status/models/embedder.yaml" in after.text and "not valid YAML" in after.text
    assert "Traceback" not in after.text
    nodes = root / "status" / "nodes.yaml"
    nodes.write_text("nodes: [1, 2")
    fleet = client.get("/fleet").text
    assert fleet.count('class="node"') == 10 and "status/nodes.yaml" in fleet
    nodes.unlink()
    assert "status/nodes.yaml: missing" in client.get("/fleet").text
    assert client.get("/api/version").json()["problems"]
    path.write_text(good)
    assert "status/models/embedder.yaml" not in client.get("/models").text


def test_the_version_changes_when_a_file_does(tmp_path):
    root = planned_catalog(tmp_path)
    client = TestClient(create_app(root))
    first = client.get("/api/version").json()
    assert client.get("/api/version").json()["version"] == first["version"]
    path = root / "status" / "models" / "embedder.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["replicas"][0]["phase"] = "Ready"
    path.write_text(dump_yaml(doc))
    os.utime(path, (time.time() + 5, time.time() + 5))
    second = client.get("/api/version").json()
    assert second["version"] != first["version"] and second["updated"] > first["updated"]
    fragment = client.get("/models?model=embedder", headers={"X-Dashboard-Fragment": "1"})
    assert fragment.headers["x-dashboard-version"] == second["version"]
    assert "<html" not in fragment.text and 'data-phase="Ready"' in fragment.text


def test_an_empty_catalog_says_nothing_was_written(tmp_path):
    (tmp_path / "models").mkdir()
    client = TestClient(create_app(tmp_path))
    assert "No status yet" in client.get("/").text
    assert client.get("/fleet").status_code == 200 and client.get("/models").status_code == 200
    assert client.get("/api/status").json() == {"revision": None, "models": []}


def test_gpu_cell_without_the_health_fields_is_free_held_or_foreign():
    assert gpu_cell({"index": 0}, None, {}).use is GpuUse.FREE
    assert gpu_cell({"index": 0, "processes": [{"pid": 1}]}, None, {}).use is GpuUse.FOREIGN
    assert gpu_cell({"index": 0}, ("m-0", 0), {}).use is GpuUse.HELD
    assert gpu_cell({"index": 0, "health": "lost"}, ("m-0", 0), {}).use is GpuUse.UNHEALTHY


def test_addresses_default_to_loopback_and_a_bad_one_is_a_usage_error():
    assert parse_address(":8765") == ("127.0.0.1", 8765)
    assert parse_address("[::1]:9") == ("::1", 9)
    with pytest.raises(UsageError):
        parse_address("localhost")


def test_the_server_thread_serves_and_stops(tree):
    import urllib.request

    server = DashboardServer(tree, "127.0.0.1:0")
    server.start()
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(server.url + "api/version", timeout=5) as answer:
                    assert json.load(answer)["version"]
                break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail("the dashboard never answered")
    finally:
        server.stop()


def test_unplaced_and_model_with_phase_filters_and_pages(client, tree):
    unplaced = client.get("/models?unplaced=1").text
    assert 'data-model="deepseek-v3"' in unplaced and 'data-model="embedder"' not in unplaced
    docs = [yaml.safe_load(p.read_text()) for p in sorted((tree / "status" / "models").glob("*.yaml"))]
    ready_nodes = sorted({n["node"] for d in docs if d["name"] == "llama-3-70b" for r in d["replicas"]
                          if r["phase"] == "Ready" for n in r["nodes"]})
    pending_nodes = sorted({n["node"] for d in docs if d["name"] == "llama-3-70b" for r in d["replicas"]
                            if r["phase"] == "Pending" for n in r["nodes"]})
    assert ready_nodes and pending_nodes and ready_nodes != pending_nodes
    html = client.get("/fleet?model=llama-3-70b&phase=Ready").text
    assert sorted(s.split('"')[0] for s in html.split('data-node="')[1:]) == ready_nodes
    first = client.get("/models?per=2").text
    assert first.count('class="model"') == 2 and "page 1 of 3" in first and "page=2" in first
    last = client.get("/models?per=2&page=3").text
    assert last.count('class="model"') == 1 and "page 3 of 3" in last
    fleet = client.get("/fleet?per=4&page=2").text
    assert fleet.count('class="node"') == 4 and "Nodes 5–8 of 10" in fleet


def test_on_loopback_it_answers_only_to_loopback_names(tree):
    from reconciler.dashboard.app import loopback_hosts

    client = TestClient(create_app(tree, hosts=loopback_hosts(8765)), base_url="http://127.0.0.1:8765")
    assert client.get("/").status_code == 200
    assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    rebound = client.get("/api/nodes", headers={"Host": "attacker.example:8765"})
    assert rebound.status_code == 421 and "nodes" not in rebound.text


def test_autoscale_and_gateway_files_show_when_the_status_has_them(tmp_path):
    root = planned_catalog(tmp_path)
    path = root / "status" / "models" / "qwen2.5-7b.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["autoscale"] = {"current": 2, "wanted": 3, "metric_sum": 13, "reason": "requests 13 over 2 replicas > target 4",
                        "since": "2026-12-01T20:00:00Z"}
    path.write_text(dump_yaml(doc))
    (root / "status" / "gateway").mkdir(exist_ok=True)  # plan --write-status writes it now
    (root / "status" / "gateway" / "litellm.yaml").write_text("model_list: []\n")
    client = TestClient(create_app(root))
    models = client.get("/models?model=qwen2.5-7b").text
    assert "autoscale: current 2, wanted 3: requests 13 over 2 replicas &gt; target 4" in models
    assert "status/gateway/litellm.yaml" in client.get("/").text
    assert client.get("/api/status").json()["models"][-1]["name"] == "qwen2.5-7b"


def test_nodes_yaml_parsed_again_only_where_it_changed_reads_as_the_whole_file():
    from reconciler.dashboard.files import NodeByNodeSnapshot

    def whole(data: bytes):
        return yaml.load(data, Loader=yaml.CSafeLoader)

    parse = NodeByNodeSnapshot()
    data = (REPO / "catalog" / "status" / "nodes.yaml").read_bytes()
    assert parse(data) == whole(data)
    first = parse(data)["nodes"]
    changed = data.replace(b"state: cordoned", b"state: drained", 1)
    again = parse(changed)
    assert again == whole(changed) and again["nodes"] != first
    assert again["nodes"][0] is first[0]  # an unchanged node's document is reused, not parsed again
    odd = {
        "an alias into another block": b"nodes:\n- id: a\n  labels: &l {zone: a}\n- id: b\n  labels: *l\n",
        "a key after the list": b"nodes:\n- id: a\n- id: b\nextra: 1\n",
        "JSON": b'{"nodes": [{"id": "a"}]}',
        "flow style": b"nodes: [{id: a}, {id: b}]\n",
        "a scalar holding a line that starts a block": b'nodes:\n- id: a\n  reason: "one\n\n- id: x"\n- id: b\n',
    }
    for what, text in odd.items():
        assert parse(text) == whole(text), what


def test_an_error_inside_is_a_plain_500_never_a_traceback(tmp_path, caplog):
    from reconciler.dashboard.files import StatusFiles

    class Broken(StatusFiles):
        def snapshot(self):
            raise RuntimeError("a bug, with a secret in its message: " + SECRET_VALUE)

    client = TestClient(create_app(tmp_path, files=Broken(tmp_path)), raise_server_exceptions=False)
    answer = client.get("/fleet")
    assert answer.status_code == 500 and answer.text.rstrip("\n").endswith("Internal Server Error")
    assert "Traceback" not in answer.text and SECRET_VALUE not in answer.text
    assert "content-security-policy" in answer.headers
    assert any("RuntimeError" in (r.exc_text or "") for r in caplog.records)  # the log has it, the page not


def test_a_pass_that_changed_one_node_rebuilds_that_row_only(tmp_path):
    from reconciler.dashboard.app import Reader
    from reconciler.dashboard.files import StatusFiles

    root = planned_catalog(tmp_path)
    reader = Reader(StatusFiles(root), live=True)
    _, before = reader.refresh()
    path = root / "status" / "nodes.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["nodes"][0]["reason"] = "answered late"
    path.write_text(dump_yaml(doc))
    os.utime(path, (time.time() + 3, time.time() + 3))
    _, after = reader.refresh()
    assert after.nodes[0] is not before.nodes[0] and after.nodes[0].reason == "answered late"
    assert all(a is b for a, b in zip(after.nodes[1:], before.nodes[1:]))
    # A replica's phase is in the cells of the node holding it: that row is rebuilt too.
    model = root / "status" / "models" / "llama-3-70b.yaml"
    mdoc = yaml.safe_load(model.read_text())
    placed = next(r for r in mdoc["replicas"] if r["nodes"])
    placed["phase"] = "Failed"
    model.write_text(dump_yaml(mdoc))
    os.utime(model, (time.time() + 6, time.time() + 6))
    _, third = reader.refresh()
    node = placed["nodes"][0]["node"]
    row = next(n for n in third.nodes if n.id == node)
    assert row is not next(n for n in after.nodes if n.id == node)
    assert {c.holder_phase for c in row.gpus if c.holder == placed["id"]} == {"Failed"}


def test_the_leader_its_status_names_is_on_the_overview_and_absent_without_one(tmp_path):
    root = planned_catalog(tmp_path)
    catalog = {"last_attempted_revision": "a" * 40, "last_applied_revision": "a" * 40, "message": "applied",
               "errors": [], "warnings": []}
    (root / "status" / "catalog.yaml").write_text(dump_yaml(catalog))
    assert 'id="leader"' not in TestClient(create_app(root)).get("/").text
    catalog["leader"] = {"host": "mgmt-b", "since": "2026-12-05T07:00:00Z", "epoch": 42}
    (root / "status" / "catalog.yaml").write_text(dump_yaml(catalog))
    html = TestClient(create_app(root)).get("/").text
    assert 'id="leader"' in html and "mgmt-b" in html and "epoch 42" in html
