"""llama.cpp across nodes: every rank does real work, each with the binary its role needs.

Rendering, placement, catalog validation and the probe's view of the binaries; the real
engine end to end is in test_real_llamacpp.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.errors import CatalogInvalid, RenderError
from reconciler.model import (
    Assignment,
    Fleet,
    FetchPolicy,
    Inventory,
    LlamaCppBinaries,
    Model,
    NodeSpec,
    ObservedNode,
    Placement,
    Profile,
)
from reconciler.decide.placement import Placer, place, summarize
from reconciler.observe.probe.facts import llama_cpp_binaries
from reconciler.engines.render import render_replica
from tests import builders as b

pytestmark = [pytest.mark.process, pytest.mark.real_engine]

HEAD = NodeSpec(id="c1", address="10.0.0.1", data_address="10.1.0.1", fabrics={"eth": ("eth0",)})
WORKER = NodeSpec(id="c2", address="10.0.0.2", data_address="10.1.0.2", fabrics={"eth": ("eth0",)})
FLEET = Fleet(nodes=(HEAD, WORKER))
BOTH = LlamaCppBinaries(server=True, rpc_server="ggml-rpc-server")


def cpu_profile(nodes: int = 2, args: tuple[str, ...] = ()) -> Profile:
    return Profile(name="cpu", engine="llama.cpp", gpu_class=None, gpus_per_node=0, nodes=nodes, port=8080, args=args)


def render(prof: Profile, inventory: Inventory, fleet: Fleet = FLEET) -> list:
    model = Model(name="gemma", source="/models/gemma.gguf", profiles=(prof,))
    ranks = tuple(Assignment(node=n.id, rank=i, port=8080 + i) for i, n in enumerate(fleet.nodes[: prof.nodes]))
    placement = Placement(replica="gemma-0", model="gemma", profile=prof.name, fabric="eth", pool="eth/cpu", nodes=ranks)
    return render_replica(model, prof, placement, fleet, inventory)


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


def test_cpu_only_two_node_head_offloads_every_layer_to_the_worker_and_the_worker_uses_every_core():
    inv = Inventory(nodes=(ObservedNode(id="c1", llama_cpp=BOTH, cpu_count=16),
                           ObservedNode(id="c2", llama_cpp=BOTH, cpu_count=32)))
    head, worker = render(cpu_profile(), inv)
    # -ngl 0 here would keep every layer on the head: the RPC device is an offload device.
    assert head.argv == ("llama-server", "-m", "/models/gemma.gguf", "--host", "0.0.0.0", "--port", "8080",
                         "--alias", "gemma", "--metrics", "-ngl", "99", "--rpc", "10.1.0.2:8081")
    assert worker.argv == ("ggml-rpc-server", "-H", "10.1.0.2", "-p", "8081", "-t", "32")


def test_worker_runs_the_rpc_server_under_the_name_its_node_has():
    old = LlamaCppBinaries(server=False, rpc_server="rpc-server")
    inv = Inventory(nodes=(ObservedNode(id="c1", llama_cpp=BOTH), ObservedNode(id="c2", llama_cpp=old)))
    _, worker = render(cpu_profile(), inv)
    assert worker.argv == ("rpc-server", "-H", "10.1.0.2", "-p", "8081")


def test_single_node_cpu_profile_keeps_its_layers_on_the_cpu():
    [launch] = render(cpu_profile(nodes=1), Inventory(nodes=()))
    assert launch.argv[-2:] == ("-ngl", "0")


@pytest.mark.parametrize("args", [("-ngl", "0"), ("--n-gpu-layers", "0"), ("--gpu_layers", "0")])
def test_a_multi_node_profile_that_keeps_every_layer_on_the_head_is_refused(args):
    with pytest.raises(RenderError, match=r"-ngl 0.*hold no part of the model"):
        render(cpu_profile(args=args), Inventory(nodes=()))


def test_a_partial_offload_is_the_profiles_choice():
    head, _ = render(cpu_profile(args=("-ngl", "10")), Inventory(nodes=()))
    assert "99" not in head.argv and head.argv[-2:] == ("-ngl", "10")


def test_an_ipv6_data_address_on_a_multi_node_replica_is_refused_naming_the_node():
    v6 = NodeSpec(id="c2", address="10.0.0.2", data_address="fd00::2", fabrics={"eth": ("eth0",)})
    with pytest.raises(RenderError, match=r"node c2 \(rank 1\) has IPv6 data address fd00::2; llama.cpp's RPC"):
        render(cpu_profile(), Inventory(nodes=()), fleet=Fleet(nodes=(HEAD, v6)))


def test_a_rank_on_a_node_without_its_binary_is_refused():
    inv = Inventory(nodes=(ObservedNode(id="c1", llama_cpp=BOTH),
                           ObservedNode(id="c2", llama_cpp=LlamaCppBinaries(server=True, rpc_server=None))))
    with pytest.raises(RenderError, match=r"node c2 \(rank 1\) has no llama.cpp's RPC server"):
        render(cpu_profile(), inv)


@pytest.mark.parametrize("arg", ["-m", "--model", "--host", "--port", "--rpc", "-hf", "--hf_repo"])
def test_owned_llama_flags_are_recognised_as_llama_cpp_reads_them(arg):
    with pytest.raises(RenderError, match="which the reconciler sets"):
        render(cpu_profile(nodes=1, args=(arg, "x")), Inventory(nodes=()))


def test_llama_cpp_takes_no_abbreviations_so_none_are_refused():
    # llama.cpp matches names exactly: `--mod` is an invalid argument to it, not --model.
    [launch] = render(cpu_profile(nodes=1, args=("--mod", "x")), Inventory(nodes=()))
    assert launch.argv[-2:] == ("--mod", "x")


# --------------------------------------------------------------------------
# Placement: each rank on a node with its binary
# --------------------------------------------------------------------------

def _fabric_nodes(*ids: str) -> list[NodeSpec]:
    return [b.node_spec(i, fabrics={"eth": ["eth0"]}) for i in ids]


def _obs(node_id: str, binaries: LlamaCppBinaries | None, weights=None) -> ObservedNode:
    base = b.observed(node_id, engines=("llama.cpp",), fabrics={"eth": ["eth0"]}, weights=weights)
    return ObservedNode(**{**base.__dict__, "llama_cpp": binaries})


def test_the_head_goes_to_the_node_with_llama_server_and_the_worker_to_one_with_the_rpc_server():
    specs = _fabric_nodes("n1", "n2", "n3")
    inv = b.inventory(
        _obs("n1", LlamaCppBinaries(server=False, rpc_server="ggml-rpc-server")),  # worker only
        _obs("n2", LlamaCppBinaries(server=True, rpc_server=None)),  # head only
        _obs("n3", LlamaCppBinaries(server=False, rpc_server=None)),  # neither (engines says llama.cpp anyway)
    )
    m = b.model("gemma", cpu_profile())
    result = place([m], b.fleet(*specs), inv)
    [placement] = result.placements
    assert [(a.node, a.rank) for a in placement.nodes] == [("n2", 0), ("n1", 1)]


def test_no_node_with_the_rpc_server_leaves_the_replica_unplaced_with_the_reason_per_node():
    specs = _fabric_nodes("n1", "n2")
    inv = b.inventory(_obs("n1", LlamaCppBinaries(server=True, rpc_server=None)),
                      _obs("n2", LlamaCppBinaries(server=True, rpc_server=None)))
    m = b.model("gemma", cpu_profile())
    result = place([m], b.fleet(*specs), inv)
    [outcome] = result.unplaced
    reasons = [r.reason for r in outcome.rejections if not r.node]
    assert any("a head with llama-server and 1 more with the RPC server (ggml-rpc-server or rpc-server); "
               "of the 2 that qualify, 2 have llama-server and 0 the RPC server" in r for r in reasons), reasons


def test_a_single_node_replica_needs_llama_server():
    specs = _fabric_nodes("n1", "n2")
    inv = b.inventory(_obs("n1", LlamaCppBinaries(server=False, rpc_server="rpc-server")),
                      _obs("n2", LlamaCppBinaries(server=True, rpc_server=None)))
    m = b.model("gemma", cpu_profile(nodes=1), replicas=2)
    result = place([m], b.fleet(*specs), inv)
    assert [p.nodes[0].node for p in result.placements] == ["n2"]
    [outcome] = result.unplaced
    by_node = {r.node: r.reason for r in outcome.rejections}
    assert by_node["n1"] == "has no llama-server, which a llama.cpp head (rank 0) runs"
    assert "1 has no llama-server (n1)" in summarize(outcome.rejections, 2)[0]


def test_nodes_never_probed_for_binaries_take_any_rank():
    specs = _fabric_nodes("n1", "n2")
    inv = b.inventory(_obs("n1", None), _obs("n2", None))
    result = place([b.model("gemma", cpu_profile())], b.fleet(*specs), inv)
    assert len(result.placements) == 1


def test_an_ipv6_node_is_excluded_from_multi_node_llama_cpp_with_its_reason():
    specs = _fabric_nodes("n1", "n2") + [b.node_spec("n3", fabrics={"eth": ["eth0"]}, data_address="fd00::3")]
    inv = b.inventory(*(_obs(i, BOTH) for i in ("n1", "n2", "n3")))
    m = b.model("gemma", Profile(**{**cpu_profile(nodes=3).__dict__}))
    [outcome] = place([m], b.fleet(*specs), inv).unplaced
    by_node = {r.node: r.reason for r in outcome.rejections}
    assert by_node["n3"] == "has an IPv6 data address, and llama.cpp's RPC between ranks speaks IPv4 only"


# Weights (SPEC section 7): a path source without fetch is needed where it is read. A llama.cpp
# worker never reads it (the head loads the GGUF and ships tensors over RPC), so only rank 0 needs it.
GGUF = "/models/gemma"  # b.model's source for "gemma"
RPC_ONLY = LlamaCppBinaries(server=False, rpc_server="ggml-rpc-server")


def test_only_the_head_of_a_multi_node_llama_replica_needs_the_weights():
    specs = _fabric_nodes("n1", "n2")
    inv = b.inventory(_obs("n1", BOTH, weights=[GGUF]), _obs("n2", RPC_ONLY, weights=[]))
    [placement] = place([b.model("gemma", cpu_profile())], b.fleet(*specs), inv).placements
    assert [(a.node, a.rank) for a in placement.nodes] == [("n1", 0), ("n2", 1)]


def test_the_head_goes_to_the_node_that_holds_the_weights_when_either_could_lead():
    specs = _fabric_nodes("n1", "n2")
    inv = b.inventory(_obs("n1", BOTH, weights=[]), _obs("n2", BOTH, weights=[GGUF]))
    [placement] = place([b.model("gemma", cpu_profile())], b.fleet(*specs), inv).placements
    assert [(a.node, a.rank) for a in placement.nodes] == [("n2", 0), ("n1", 1)]


def test_a_multi_node_vllm_replica_still_needs_the_weights_on_every_node():
    gpu = b.profile("tp", engine="vllm", gpus_per_node=8, nodes=2)
    specs = [b.node_spec(i, fabrics={"ib": ["mlx5_0"]}) for i in ("n1", "n2")]
    inv = b.inventory(b.observed("n1", gpu=b.gpus(8), fabrics={"ib": ["mlx5_0"]}, weights=[GGUF]),
                      b.observed("n2", gpu=b.gpus(8), fabrics={"ib": ["mlx5_0"]}, weights=[]))
    [outcome] = place([b.model("gemma", gpu)], b.fleet(*specs), inv).unplaced
    by_node = {r.node: r.reason for r in outcome.rejections}
    assert by_node["n2"] == f"does not hold the weights at {GGUF} (the model sets no fetch to copy them)"


def test_no_node_that_could_lead_holding_the_weights_says_so_and_blames_no_worker():
    specs = _fabric_nodes("n1", "n2", "n3")
    inv = b.inventory(_obs("n1", BOTH, weights=[]), _obs("n2", RPC_ONLY, weights=[GGUF]),
                      _obs("n3", RPC_ONLY, weights=[]))
    [outcome] = place([b.model("gemma", cpu_profile())], b.fleet(*specs), inv).unplaced
    assert not [r for r in outcome.rejections if r.node], outcome.rejections  # every node qualifies on its own
    [pool] = [r.reason for r in outcome.rejections if not r.node]
    assert pool == (f"needs a head (rank 0) on eth that holds the weights at {GGUF} (the model sets no fetch "
                    "to copy them; only the head reads them): none of the 1 qualifying nodes with llama-server does")
    assert summarize(outcome.rejections, 3) == [f"3/3 nodes fit profile cpu: {pool}"]


def test_an_in_place_replace_asks_the_weights_of_the_head_only():
    specs = _fabric_nodes("n1", "n2")
    m = b.model("gemma", cpu_profile())
    old = Placement(replica="gemma-0", model="gemma", profile="cpu", fabric="eth", pool="eth/cpu",
                    nodes=(Assignment(node="n1", rank=0, port=8080), Assignment(node="n2", rank=1, port=8080)),
                    dist_port=29500)
    placer = Placer(b.fleet(*specs), b.inventory(_obs("n1", BOTH, weights=[GGUF]), _obs("n2", RPC_ONLY, weights=[])), [m])
    again = placer.place_on(m, "gemma-0", old)
    assert [(a.node, a.rank) for a in again.placement.nodes] == [("n1", 0), ("n2", 1)]
    # The head lost its weights: the in-place start is refused on it, with the reason.
    placer = Placer(b.fleet(*specs), b.inventory(_obs("n1", BOTH, weights=[]), _obs("n2", RPC_ONLY, weights=[])), [m])
    refused = placer.place_on(m, "gemma-0", old)
    assert refused.placement is None
    assert [(r.node, r.reason) for r in refused.rejections] == [
        ("n1", f"does not hold the weights at {GGUF} (the model sets no fetch to copy them)")]


# Disk: the weights are stored where they are read, so only a llama.cpp head needs room for them.
def _disk_obs(node_id: str, binaries: LlamaCppBinaries, disk_free_gib: float) -> ObservedNode:
    base = b.observed(node_id, engines=("llama.cpp",), fabrics={"eth": ["eth0"]}, weights=[],
                      disk_free_gib=disk_free_gib)
    return ObservedNode(**{**base.__dict__, "llama_cpp": binaries})


def _needs_disk(gb: float) -> Profile:
    return Profile(**{**cpu_profile().__dict__, "min_disk_gb": gb})


def test_a_llama_worker_with_too_little_disk_for_the_weights_still_serves_as_a_worker():
    specs = _fabric_nodes("n1", "n2")
    inv = b.inventory(_disk_obs("n1", BOTH, 100), _disk_obs("n2", RPC_ONLY, 1))
    m = b.model("gemma", _needs_disk(50), fetch=FetchPolicy(from_node=True))
    [placement] = place([m], b.fleet(*specs), inv).placements
    assert [(a.node, a.rank) for a in placement.nodes] == [("n1", 0), ("n2", 1)]


def test_the_head_is_the_node_with_room_for_the_weights_and_without_one_the_pool_says_so():
    specs = _fabric_nodes("n1", "n2")
    m = b.model("gemma", _needs_disk(50), fetch=FetchPolicy(from_node=True))
    roomy = b.inventory(_disk_obs("n1", BOTH, 1), _disk_obs("n2", BOTH, 100))
    [placement] = place([m], b.fleet(*specs), roomy).placements
    assert [(a.node, a.rank) for a in placement.nodes] == [("n2", 0), ("n1", 1)]

    cramped = b.inventory(_disk_obs("n1", BOTH, 1), _disk_obs("n2", RPC_ONLY, 100))
    [outcome] = place([m], b.fleet(*specs), cramped).unplaced
    assert not [r for r in outcome.rejections if r.node], outcome.rejections  # each node qualifies on its own
    [pool] = [r.reason for r in outcome.rejections if not r.node]
    assert pool == ("needs a head (rank 0) on eth with 50 GiB free for the weights (only the head stores them): "
                    "none of the 1 qualifying nodes with llama-server has")


def test_a_multi_node_vllm_replica_still_needs_disk_on_every_node():
    gpu = Profile(**{**b.profile("tp", engine="vllm", gpus_per_node=8, nodes=2).__dict__, "min_disk_gb": 50})
    specs = [b.node_spec(i, fabrics={"ib": ["mlx5_0"]}) for i in ("n1", "n2")]
    inv = b.inventory(b.observed("n1", gpu=b.gpus(8), fabrics={"ib": ["mlx5_0"]}, disk_free_gib=100),
                      b.observed("n2", gpu=b.gpus(8), fabrics={"ib": ["mlx5_0"]}, disk_free_gib=1))
    [outcome] = place([b.model("gemma", gpu, fetch=FetchPolicy(from_node=True))], b.fleet(*specs), inv).unplaced
    by_node = {r.node: r.reason for r in outcome.rejections}
    assert by_node["n2"].startswith("has 1 GiB free on /models for weights it does not hold, needs 50"), by_node


@pytest.mark.parametrize("engine, fetched_to", [("llama.cpp", ["n1"]), ("vllm", ["n1", "n2"])])
def test_a_fetch_copies_the_weights_only_to_the_ranks_that_read_them(engine, fetched_to):
    from dataclasses import replace as with_fields

    from reconciler.act.actor.dispatch import Actor
    from reconciler.model import Action, Catalog, FetchPolicy

    prof = with_fields(cpu_profile(), engine=engine)
    m = with_fields(b.model("gemma", prof), fetch=FetchPolicy(from_node=True))
    inv = b.inventory(_obs("n1", BOTH, weights=[]), _obs("n2", BOTH, weights=[]), _obs("n3", BOTH, weights=[GGUF]))
    placement = Placement(replica="gemma-0", model="gemma", profile="cpu", fabric="eth", pool="eth/cpu",
                          nodes=(Assignment(node="n1", rank=0, port=8080), Assignment(node="n2", rank=1, port=8080)))
    actor = Actor(Catalog(root=".", fleet=b.fleet(*_fabric_nodes("n1", "n2", "n3")), models=(m,)), inv,
                  launcher=None, render=None, log=lambda *a, **k: None)
    needed = actor.weights_needed([Action("start", "gemma-0", "gemma", placement=placement)])
    assert [node for _, _, node in needed] == fetched_to


LLAMA_FLEET_YAML = """\
nodes:
  - id: c1
    address: 10.9.0.1
    model_dirs: [/models]
    fabrics: {eth: [eth0]}
  - id: c2
    address: 10.9.0.2
    model_dirs: [/models]
    fabrics: {eth: [eth0]}
"""


def _llama_snapshot(head_weights: list[str]) -> str:
    def node(nid: str, server: bool, weights: list[str]) -> dict:
        return {"id": nid, "state": "ready", "memory_total_mb": 65536, "engines": {"llama.cpp": ""},
                "llama_cpp": {"server": server, "rpc_server": "ggml-rpc-server"},
                "fabrics": [{"name": "eth", "hcas": ["eth0"]}],
                "disks": [{"path": "/models", "free_bytes": 1 << 40, "total_bytes": 1 << 41}],
                "weights": weights, "replicas": []}
    return yaml.safe_dump({"nodes": [node("c1", True, head_weights), node("c2", False, [])]})


@pytest.mark.parametrize("head_weights", [["/models/m.gguf"], []])
def test_plan_and_explain_place_a_llama_pair_whose_worker_lacks_the_weights_or_name_the_head(
        cli, tmp_path, head_weights):
    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text(LLAMA_FLEET_YAML)
    (tmp_path / "models" / "m.yaml").write_text(
        "name: m\nsource: /models/m.gguf\nprofiles:\n  - name: cpu2\n    engine: llama.cpp\n    nodes: 2\n")
    snap = tmp_path / "nodes.yaml"
    snap.write_text(_llama_snapshot(head_weights))
    plan = cli("plan", str(tmp_path), "--inventory", str(snap), "--format", "json")
    assert plan.returncode == 0, plan.stderr
    actions = json.loads(plan.stdout)["actions"]
    explain = cli("explain", "m", str(tmp_path), "--inventory", str(snap))
    assert explain.returncode == 0, explain.stderr
    if head_weights:
        [start] = [a for a in actions if a["action"] == "start"]
        assert [(n["node"], n["rank"]) for n in start["nodes"]] == [("c1", 0), ("c2", 1)]
        assert "m-0: would start on c1" in explain.stdout
        assert "does not hold the weights" not in explain.stdout
    else:
        assert not [a for a in actions if a["action"] == "start"]
        assert ("needs a head (rank 0) on eth that holds the weights at /models/m.gguf (the model sets no fetch to "
                "copy them; only the head reads them): none of the 1 qualifying nodes with llama-server does"
                in explain.stdout)
        assert "c2: does not hold the weights" not in explain.stdout


# --------------------------------------------------------------------------
# Catalog validation: at the position of the mistake
# --------------------------------------------------------------------------

FLEET_YAML = """\
nodes:
  - id: c1
    address: 10.9.0.1
    fabrics: {eth: [eth0]}
  - id: c2
    address: 10.9.0.2
    data_address: fd00::2
    fabrics: {eth: [eth0]}
    labels: {family: v6}
"""


def _catalog(tmp_path: Path, model: str, fleet: str = FLEET_YAML) -> list[str]:
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "fleet.yaml").write_text(fleet)
    (tmp_path / "models" / "m.yaml").write_text(model)
    with pytest.raises(CatalogInvalid) as info:
        load_catalog(tmp_path, with_revision=False)
    return [str(p) for p in info.value.problems]


def test_an_ipv6_data_address_is_a_validation_error_at_the_node_when_a_multi_node_llama_profile_may_use_it(tmp_path):
    model = "name: m\nsource: /m.gguf\nprofiles:\n  - name: cpu2\n    engine: llama.cpp\n    nodes: 2\n"
    assert _catalog(tmp_path, model) == [
        "fleet.yaml:7:19: node c2: data_address fd00::2 is IPv6, and model m profile cpu2 (llama.cpp on 2 nodes) "
        "may place a rank here; llama.cpp's RPC speaks IPv4 only: give the node an IPv4 data_address, or the "
        "profile a node_selector that leaves it out"
    ]
    # A selector that leaves the node out, or a single-node profile, is fine.
    (tmp_path / "models" / "m.yaml").write_text(model + "    node_selector: {family: v4}\n")
    load_catalog(tmp_path, with_revision=False)
    (tmp_path / "models" / "m.yaml").write_text(model.replace("nodes: 2", "nodes: 1"))
    load_catalog(tmp_path, with_revision=False)


def test_ngl_zero_on_a_multi_node_profile_is_a_validation_error_at_its_position(tmp_path):
    model = ("name: m\nsource: /m.gguf\nprofiles:\n  - name: cpu2\n    engine: llama.cpp\n    nodes: 2\n"
             "    node_selector: {family: v4}\n    args: [\"-c\", \"512\", \"-ngl\", \"0\"]\n")
    assert _catalog(tmp_path, model) == [
        "models/m.yaml:8:25: profile cpu2: args[2] -ngl 0 keeps every layer on the head, so the other 1 rank(s) "
        "would hold no part of the model; leave -ngl out or give a count above 0"
    ]


def test_an_owned_llama_flag_is_a_validation_error_at_its_position(tmp_path):
    model = "name: m\nsource: /m.gguf\nprofiles:\n  - name: cpu\n    engine: llama.cpp\n    args: [\"-c\", \"512\", \"--port\", \"1\"]\n"
    assert _catalog(tmp_path, model) == [
        "models/m.yaml:6:25: profile cpu: args[2] --port is set by the reconciler for each rank; remove it"
    ]


# --------------------------------------------------------------------------
# The probe: binaries found on the PATH, never run
# --------------------------------------------------------------------------


def _exe(d: Path, name: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\necho ran >> \"$0.ran\"\n")
    p.chmod(0o755)


@pytest.mark.parametrize("names, expected", [
    (["llama-server", "ggml-rpc-server"], {"server": True, "rpc_server": "ggml-rpc-server"}),
    (["llama-server", "rpc-server"], {"server": True, "rpc_server": "rpc-server"}),
    (["rpc-server"], {"server": False, "rpc_server": "rpc-server"}),
    (["llama-server"], {"server": True, "rpc_server": None}),
    ([], {"server": False, "rpc_server": None}),
])
def test_probe_reports_which_llama_roles_a_node_can_run(tmp_path, names, expected):
    for n in names:
        _exe(tmp_path / "bin", n)
    (tmp_path / "bin").mkdir(exist_ok=True)
    assert llama_cpp_binaries(str(tmp_path / "bin") + os.pathsep + "/nonexistent") == expected
    assert not list((tmp_path / "bin").glob("*.ran"))  # looked up, never executed


def test_the_current_name_wins_when_a_node_has_both_in_different_path_dirs(tmp_path):
    _exe(tmp_path / "old", "rpc-server")
    _exe(tmp_path / "new", "ggml-rpc-server")
    path = os.pathsep.join([str(tmp_path / "old"), str(tmp_path / "new")])
    assert llama_cpp_binaries(path)["rpc_server"] == "ggml-rpc-server"
