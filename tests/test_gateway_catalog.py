"""served_name and drain_s in the catalog (SPEC section 10): checked at their line, passed to every engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.catalog import load_catalog
from reconciler.errors import CatalogInvalid
from reconciler.model import Assignment, Fleet, Inventory, NodeSpec, Placement, spec_hash
from reconciler.engines.render import render_replica

FLEET = """\
nodes:
  - id: n1
    address: 10.9.0.1
    model_dirs: [/models]
"""


def model_yaml(name: str, extra: str = "", engine: str = "llama.cpp") -> str:
    return f"""\
name: {name}
source: /models/{name}.gguf
{extra}profiles:
  - name: cpu
    engine: {engine}
"""


def write(root: Path, models: dict[str, str]) -> Path:
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(FLEET)
    for name, text in models.items():
        (root / "models" / f"{name}.yaml").write_text(text)
    return root


def problems(root: Path) -> list[str]:
    with pytest.raises(CatalogInvalid) as info:
        load_catalog(root, with_revision=False)
    return [str(p) for p in info.value.problems]


def test_served_name_and_drain_s_are_read_and_default_to_the_name_and_10_s(tmp_path):
    cat = load_catalog(write(tmp_path, {
        "a": model_yaml("a", "served_name: meta-llama/Llama-3.1-8B-Instruct:q4\ndrain_s: 0\n"),
        "b": model_yaml("b"),
    }), with_revision=False)
    a, b = cat.model("a"), cat.model("b")
    assert (a.served, a.drain_s) == ("meta-llama/Llama-3.1-8B-Instruct:q4", 0.0)
    assert (b.served, b.served_name, b.drain_s) == ("b", None, 10.0)


@pytest.mark.parametrize("bad", ["has space", "semi;colon", "comma,split", "-leading-dash", '"tab\\tname"',
                                 '"ends in newline\\n"', "x" * 129, "'ünïcode'"])
def test_a_served_name_an_engine_or_litellm_would_refuse_is_reported_at_its_line(tmp_path, bad):
    found = problems(write(tmp_path, {"a": model_yaml("a", f"served_name: {bad}\n")}))
    assert any(p.startswith("models/a.yaml:3:") and "served_name" in p for p in found), found


def test_two_models_with_one_served_name_is_an_error_naming_both_files(tmp_path):
    found = problems(write(tmp_path, {
        "a": model_yaml("a", "served_name: shared\n"),
        "b": model_yaml("b", "served_name: shared\n"),
    }))
    assert len(found) == 1, found
    assert found[0].startswith("models/b.yaml:3:") and "models/a.yaml:3:" in found[0] and "'shared'" in found[0]


def test_a_served_name_equal_to_another_models_name_is_the_same_clash(tmp_path):
    found = problems(write(tmp_path, {"a": model_yaml("a"), "b": model_yaml("b", "served_name: a\n")}))
    assert len(found) == 1 and found[0].startswith("models/b.yaml:3:") and "models/a.yaml:1:" in found[0], found


@pytest.mark.parametrize("engine,flag", [("llama.cpp", "--alias"), ("llama.cpp", "-a"), ("llama.cpp", "--metrics"),
                                         ("vllm", "--served-model-name"), ("sglang", "--served-model-name")])
def test_profile_args_may_not_set_the_served_name_or_metrics_the_reconciler_sets(tmp_path, engine, flag):
    text = model_yaml("a", engine=engine).replace("    engine:", "    gpu_class: H100-80GB\n    engine:") \
        if engine != "llama.cpp" else model_yaml("a")
    text += f'    args: ["{flag}", "x"]\n' if flag != "--metrics" else '    args: ["--metrics"]\n'
    found = problems(write(tmp_path, {"a": text}))
    assert any("is set by the reconciler for each rank" in p and p.startswith("models/a.yaml:") for p in found), found


def _render(model, prof_name="cpu"):
    fleet = Fleet(nodes=(NodeSpec(id="n1", address="10.9.0.1", data_address="10.9.0.1"),))
    prof = model.profile(prof_name)
    placement = Placement(replica=f"{model.name}-0", model=model.name, profile=prof.name, fabric=None, pool="none/cpu",
                          nodes=(Assignment(node="n1", rank=0, gpus=tuple(range(prof.gpus_per_node)), port=8080),))
    return render_replica(model, prof, placement, fleet, Inventory(nodes=()))


def test_every_engine_is_told_the_served_name_and_llama_cpp_serves_metrics(tmp_path):
    cat = load_catalog(write(tmp_path, {
        "a": model_yaml("a", "served_name: org/a-instruct\n"),
        "v": model_yaml("v", "served_name: org/v\n", engine="vllm").replace(
            "    engine:", "    gpu_class: H100-80GB\n    engine:"),
        "s": model_yaml("s", engine="sglang").replace("    engine:", "    gpu_class: H100-80GB\n    engine:"),
    }), with_revision=False)
    [llama] = _render(cat.model("a"))
    assert llama.argv[llama.argv.index("--alias") + 1] == "org/a-instruct" and "--metrics" in llama.argv
    [vllm] = _render(cat.model("v"))
    assert vllm.argv[vllm.argv.index("--served-model-name") + 1] == "org/v"
    [sglang] = _render(cat.model("s"))
    assert sglang.argv[sglang.argv.index("--served-model-name") + 1] == "s"  # the default: the catalog name


def test_a_changed_served_name_changes_the_spec_hash_and_drain_s_does_not(tmp_path):
    def hash_of(extra: str, sub: str) -> str:
        root = tmp_path / sub
        m = load_catalog(write(root, {"a": model_yaml("a", extra)}), with_revision=False).model("a")
        return spec_hash(m, m.profiles[0])

    base = hash_of("", "base")
    assert hash_of("served_name: a\n", "same") == base  # the default spelled out is the same name
    assert hash_of("served_name: other\n", "renamed") != base  # a new argv: the replica is replaced
    assert hash_of("drain_s: 30\n", "drain") == base  # how long a stop waits shapes no process
