"""Every vLLM/SGLang argv the adapters render, and every flag the fakes accept, against the real
parsers of vLLM 0.33.0 and SGLang 0.5.23 (tests/data/engine_parsers/, dumped from the installed
engines by scripts/dump-engine-parsers.py)."""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from reconciler.engines import ADAPTERS
from reconciler.engines.flags import TABLES, owned_uses, table_for
from reconciler.model import Assignment, Fleet, Gpu, Inventory, Model, NodeSpec, ObservedNode, Placement, Profile
from reconciler.engines.render import render_replica
from tests.engine_parsers import ParseFailure, dest_of, fixture, parse

FAKES = Path(__file__).resolve().parent / "fakes"
ENGINES = ("vllm", "sglang")


def test_fixtures_come_from_the_pinned_engine_versions():
    assert fixture("vllm")["version"] == "0.33.0" and fixture("sglang")["version"] == "0.5.23"
    assert fixture("vllm")["command"] == ["vllm", "serve"] and fixture("sglang")["command"] == ["sglang", "serve"]
    # The rules the matcher relies on, as the dump read them off the parsers.
    assert fixture("vllm")["allow_abbrev"] and fixture("sglang")["allow_abbrev"]
    assert fixture("vllm")["underscores_as_dashes"] and not fixture("sglang")["underscores_as_dashes"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_runtime_table_is_the_fixtures_option_strings(engine):
    runtime = json.loads((TABLES / f"{engine}.json").read_text())
    assert runtime["version"] == fixture(engine)["version"]
    assert runtime["options"] == [o["option_strings"] for o in fixture(engine)["options"]]
    assert runtime["allow_abbrev"] == fixture(engine)["allow_abbrev"]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_owned_flag_is_a_canonical_option_of_the_real_parser(engine):
    table = table_for(engine)
    for flag in ADAPTERS[engine].owned_flags:
        assert table.canonical(flag) == flag, flag


# --------------------------------------------------------------------------
# Rendered argv, parsed by the real option tables
# --------------------------------------------------------------------------

H1 = NodeSpec(id="g1", address="10.0.0.1", data_address="10.1.0.1", fabrics={"ib": ("mlx5_0",)})
H2 = NodeSpec(id="g2", address="10.0.0.2", data_address="10.1.0.2", fabrics={"ib": ("mlx5_0",)})
GPUS = tuple(Gpu(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", gpu_class="H100-80GB", memory_total_mb=81559)
             for i in range(8))
INV = Inventory(nodes=(ObservedNode(id="g1", gpus=GPUS), ObservedNode(id="g2", gpus=GPUS)))

PROFILE_ARGS = {
    "vllm": [(), ("--max-model-len", "8192", "--gpu-memory-utilization", "0.9"), ("-tp", "4"),
             ("--enable-prefix-caching",), ("--chat-template", "t.jinja"), ("--tensor_parallel_size=2",)],
    "sglang": [(), ("--mem-fraction-static", "0.8", "--context-length", "8192"), ("--tp", "4"),
               ("--enable-metrics",), ("--attention-backend", "fa3")],
}


def renders(engine: str):
    for nodes in (1, 2):
        for args in PROFILE_ARGS[engine]:
            prof = Profile(name="p", engine=engine, gpu_class="H100-80GB", gpus_per_node=4, nodes=nodes,
                           port=8000, args=args)
            model = Model(name="m", source="/models/m", profiles=(prof,))
            ranks = tuple(Assignment(node=n.id, rank=i, gpus=(0, 1, 2, 3), port=8000 + i)
                          for i, n in enumerate((H1, H2)[:nodes]))
            placement = Placement(replica="m-0", model="m", profile="p", fabric="ib" if nodes > 1 else None,
                                  pool="ib/H100-80GB", nodes=ranks, dist_port=29500 if nodes > 1 else None)
            yield from render_replica(model, prof, placement, Fleet(nodes=(H1, H2)), INV)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_rendered_argv_parses_with_the_real_parser(engine):
    seen = 0
    for launch in renders(engine):
        ns = parse(engine, launch.argv)  # raises ParseFailure as the engine would exit
        assert getattr(ns, dest_of(engine, "--port")) == str(launch.port)
        if launch.nnodes > 1:
            assert getattr(ns, dest_of(engine, "--nnodes")) == "2"
            assert getattr(ns, dest_of(engine, "--node-rank")) == str(launch.rank)
        seen += 1
    assert seen == 3 * len(PROFILE_ARGS[engine])  # one single-node and two multi-node ranks per args


def test_the_real_parser_refuses_what_the_engines_refuse():
    with pytest.raises(ParseFailure, match="unrecognized arguments: --swap-space"):
        parse("vllm", ["vllm", "serve", "m", "--swap-space", "4"])  # gone from vLLM 0.33.0
    # Split in two in 0.5.23: the old name is now an ambiguous abbreviation.
    with pytest.raises(ParseFailure, match="ambiguous option: --cuda-graph-max-bs could match"):
        parse("sglang", ["sglang", "serve", "--model-path", "m", "--cuda-graph-max-bs", "8"])
    with pytest.raises(ParseFailure, match="unrecognized arguments: --tp_size"):
        parse("sglang", ["sglang", "serve", "--model-path", "m", "--tp_size", "8"])  # no underscores in SGLang


# --------------------------------------------------------------------------
# Owned flags: the runtime matcher agrees with argparse on every spelling
# --------------------------------------------------------------------------

SPELLINGS = {
    "vllm": ["--nnodes", "--nnode", "-n", "-n2", "--nnodes=2", "--node-rank", "--node_rank", "-r", "-r1", "--node-r",
             "--master-addr", "--master-ad", "--master_addr=x", "--master-port", "--headless", "--headl", "--host",
             "--ho", "--port", "--model", "--tensor-p", "-tp", "--po", "--mod", "--max-model-len"],
    "sglang": ["--nnodes", "--nnode", "--node-rank", "--node-r", "--node_rank", "--dist-init-addr", "--nccl-init-addr",
               "--dist-init", "--model-path", "--model", "--model-p", "--host", "--port", "--po", "--tp", "--tp-size",
               "--tp_size", "--mem-fraction-static"],
}


def argparse_dest(engine: str, token: str) -> str | None:
    """Which option argparse, with the real table, sets from `token VALUE` (None: it refuses the token)."""
    base = ["vllm", "serve", "m"] if engine == "vllm" else ["sglang", "serve", "--model-path", "m"]
    defaults = vars(parse(engine, base))
    try:
        ns = vars(parse(engine, base + [token, "7"]))
    except ParseFailure:
        try:  # a flag without a value (--headless), or one whose value is attached (-n2, --x=y)
            ns = vars(parse(engine, base + [token]))
        except ParseFailure:
            return None
    changed = [k for k, v in ns.items() if v != defaults.get(k)]
    return changed[0] if changed else None


@pytest.mark.parametrize("engine", ENGINES)
def test_the_matcher_reads_every_spelling_as_the_real_parser_does(engine):
    table = table_for(engine)
    for token in SPELLINGS[engine]:
        dest = argparse_dest(engine, token)
        resolved = table.resolve(token)
        mine = dest_of(engine, resolved.option) if resolved is not None and resolved.option else None
        assert mine == dest, f"{engine} {token}: matcher {mine}, argparse {dest}"


@pytest.mark.parametrize("engine, args", [
    ("vllm", ["-n", "2"]), ("vllm", ["--nnode", "2"]), ("vllm", ["--master-ad", "10.0.0.9"]), ("vllm", ["-r1"]),
    ("vllm", ["--node_rank", "1"]), ("vllm", ["--headl"]),
    ("sglang", ["--node-r", "1"]), ("sglang", ["--dist-init", "h:1"]), ("sglang", ["--nccl-init-addr", "h:1"]),
    ("sglang", ["--model", "x"]),
])
def test_a_profile_cannot_set_an_owned_flag_under_any_spelling_the_engine_accepts(engine, args):
    assert owned_uses(engine, args, ADAPTERS[engine].owned_flags), args
    assert argparse_dest(engine, args[0]) is not None  # and the engine would indeed take it


def test_spellings_the_engine_refuses_are_not_mistaken_for_owned_flags():
    # SGLang reads no underscores: `--node_rank` is an error there, not a second --node-rank.
    assert not owned_uses("sglang", ["--node_rank", "1"], ADAPTERS["sglang"].owned_flags)
    assert argparse_dest("sglang", "--node_rank") is None


# --------------------------------------------------------------------------
# The fakes accept only what the real engines accept
# --------------------------------------------------------------------------


def _load(path: Path, name: str):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def fake_parser(engine: str) -> argparse.ArgumentParser:
    sys.path.insert(0, str(FAKES / "python"))
    try:
        if engine == "vllm":
            top = _load(FAKES / "bin" / "vllm", "fake_vllm").parser()
            sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
            return sub.choices["serve"]
        return _load(FAKES / "python" / "sglang" / "launch_server.py", "fake_sglang_launch").parser()
    finally:
        sys.path.remove(str(FAKES / "python"))


@pytest.mark.parametrize("engine", ENGINES)
def test_every_flag_a_fake_accepts_is_a_flag_of_the_real_engine_with_the_same_arity(engine):
    real = {s: o for o in fixture(engine)["options"] for s in o["option_strings"]}
    fake = fake_parser(engine)
    assert fake.allow_abbrev == fixture(engine)["allow_abbrev"]
    checked = 0
    for action in fake._actions:
        if not action.option_strings or action.dest == "help":
            continue
        for s in action.option_strings:
            assert s in real, f"fake {engine} accepts {s}, which {engine} {fixture(engine)['version']} does not"
            assert (action.nargs == 0) == (real[s]["nargs"] == 0), f"{engine} {s}: fake and real disagree on taking a value"
        # Same action: every alias of the real option the fake knows belongs to one real option.
        assert len({real[s]["dest"] for s in action.option_strings}) == 1, action.option_strings
        checked += 1
    assert checked >= 10


def test_an_owned_flag_in_a_profile_is_a_validation_error_at_its_position(tmp_path):
    from reconciler.catalog import load_catalog
    from reconciler.errors import CatalogInvalid

    (tmp_path / "models").mkdir()
    (tmp_path / "fleet.yaml").write_text("nodes:\n  - id: g1\n    address: 10.9.0.1\n")
    (tmp_path / "models" / "m.yaml").write_text(
        "name: m\nsource: /models/m\nprofiles:\n  - name: tp8\n    engine: vllm\n    gpu_class: H100-80GB\n"
        "    args: [\"--max-model-len\", \"8192\", \"--node_r\", \"1\"]\n"
        "  - name: sg\n    engine: sglang\n    gpu_class: H100-80GB\n    args: [\"--dist-init\", \"h:1\"]\n")
    with pytest.raises(CatalogInvalid) as info:
        load_catalog(tmp_path, with_revision=False)
    assert [str(p) for p in info.value.problems] == [
        "models/m.yaml:7:39: profile tp8: args[2] --node_r (read by the engine as --node-rank) is set by the "
        "reconciler for each rank; remove it",
        "models/m.yaml:11:12: profile sg: args[0] --dist-init (read by the engine as --dist-init-addr) is set by "
        "the reconciler for each rank; remove it",
    ]
