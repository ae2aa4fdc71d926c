"""Secrets in env (SPEC section 7): references in the catalog, values only in the engine's environment.

The end-to-end proof on real nodes (process lists, every file) is in test_operate_fleet.py;
these are the pieces: what the catalog accepts, what is hashed, what render hands the launcher.
"""

from __future__ import annotations

import pytest

from reconciler.catalog import load_catalog
from reconciler.errors import RenderError
from reconciler.act.launcher import SshLauncher
from reconciler.act.launcher.ssh_launcher import request_of
from reconciler.model import Assignment, SecretRef, spec_hash
from reconciler.observe.transport import CommandResult
from tests.catalog_files import FLEET, write_catalog
from tests.test_render import profile, render

MODEL = """\
name: llama
source: /models/llama
profiles:
  - name: cpu
    engine: llama.cpp
    env:
      PLAIN: "x"
      HF_TOKEN: {from_file: /etc/llm-secrets/hf_token}
      GATEWAY_KEY: {from_env: GATEWAY_KEY}
"""


def catalog(tmp_path, model: str = MODEL):
    return write_catalog(tmp_path, {"fleet.yaml": FLEET, "models/llama.yaml": model})




def test_the_catalog_keeps_references_not_values(tmp_path):
    [model] = load_catalog(catalog(tmp_path), with_revision=False).models
    env = model.profiles[0].env
    assert env["PLAIN"] == "x"
    assert env["HF_TOKEN"] == SecretRef("from_file", "/etc/llm-secrets/hf_token")
    assert env["GATEWAY_KEY"] == SecretRef("from_env", "GATEWAY_KEY")


BAD = [
    ("relative path", "{from_file: secrets/hf_token}",
     "models/llama.yaml:8:29: env HF_TOKEN: from_file 'secrets/hf_token' must be an absolute path"),
    ("invalid variable name", "{from_env: 2-KEY}",
     "models/llama.yaml:8:28: env HF_TOKEN: from_env '2-KEY' is not a valid environment variable name"),
    ("two kinds at once", "{from_env: A, from_file: /a}",
     "models/llama.yaml:8:17: env HF_TOKEN: a secret reference names exactly one of from_file or from_env"),
    ("unknown kind", "{from_vault: a}", "models/llama.yaml:8:18: unknown field 'from_vault'"),
]


@pytest.mark.parametrize("name,value,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_reference_is_one_problem_at_its_position(tmp_path, cli, name, value, message):
    root = catalog(tmp_path, MODEL.replace("{from_file: /etc/llm-secrets/hf_token}", value))
    r = cli("validate", str(root))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0].startswith(message), r.stderr
    assert r.stderr.splitlines()[1:] == ["1 problem found"] and "Traceback" not in r.stderr


def test_spec_hash_covers_the_reference_not_the_value(tmp_path, monkeypatch):
    [model] = load_catalog(catalog(tmp_path), with_revision=False).models
    prof = model.profiles[0]
    before = spec_hash(model, prof)
    monkeypatch.setenv("GATEWAY_KEY", "rotated")  # a new value: same spec, nothing replaced
    assert spec_hash(model, prof) == before
    moved = catalog(tmp_path / "moved", MODEL.replace("/etc/llm-secrets/hf_token", "/etc/llm-secrets/hf_token_v2"))
    [model2] = load_catalog(moved, with_revision=False).models
    assert spec_hash(model2, model2.profiles[0]) != before


def test_render_hands_the_launcher_references_and_never_a_value():
    ref = SecretRef("from_file", "/run/secrets/key")
    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000, command=("/bin/engine",),
                   env={"API_KEY": ref, "PLAIN": "${REPLICA_ID}"})
    [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(), port=9000))
    assert dict(launch.secret_env) == {"API_KEY": ref}
    assert "API_KEY" not in launch.env and launch.env["PLAIN"] == "llama-0"


def test_a_reference_for_a_variable_the_reconciler_sets_is_refused():
    prof = profile("vllm", env={"CUDA_VISIBLE_DEVICES": SecretRef("from_env", "X")})
    with pytest.raises(RenderError, match=r"sets env CUDA_VISIBLE_DEVICES to \{from_env: X\}"):
        render(prof, Assignment(node="a1", rank=0, gpus=(0, 1), port=8000))


class RecordingTransport:
    """A node that answers the agent's start: what reached it is what a real node would read on stdin."""

    node_id = "a1"
    command_timeout_s = 30.0

    def __init__(self):
        self.requests = []
        self.argvs = []

    def run(self, argv, *, stdin=None, timeout=60.0):
        self.argvs.append(list(argv))
        self.requests.append(request_of(stdin))
        return CommandResult(0, b'{"ok": true, "pid": 1, "log": "/x"}', b"")

    def close(self):
        pass


def test_from_env_is_read_at_launch_and_travels_on_stdin_only(monkeypatch):
    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000, command=("/bin/engine",),
                   env={"GATEWAY_KEY": SecretRef("from_env", "OPS_TEST_GATEWAY_KEY"),
                        "HF_TOKEN": SecretRef("from_file", "/run/secrets/hf")})
    [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(), port=9000))
    node = RecordingTransport()
    launcher = SshLauncher({"a1": node})

    monkeypatch.delenv("OPS_TEST_GATEWAY_KEY", raising=False)
    missing = launcher.start(launch)
    assert not missing.ok and node.requests == []
    assert missing.reason == "env GATEWAY_KEY: {from_env: OPS_TEST_GATEWAY_KEY} is not set in the reconciler's environment"

    monkeypatch.setenv("OPS_TEST_GATEWAY_KEY", "s3cr3t-value")
    assert launcher.start(launch).ok
    [request] = node.requests
    assert request["env"]["GATEWAY_KEY"] == "s3cr3t-value"
    assert request["env_files"] == {"HF_TOKEN": "/run/secrets/hf"}  # the node reads it; its value never travels
    assert all("s3cr3t" not in a for argv in node.argvs for a in argv)


def test_command_profiles_append_their_args_instead_of_dropping_them():
    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000, command=("/bin/engine", "--port", "${PORT}"),
                   args=("--threads", "8"))
    [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(), port=9000))
    assert launch.argv == ("/bin/engine", "--port", "9000", "--threads", "8")


class NoSlurm:
    """A Slurm client that must not be asked: the launch is refused before any job is submitted."""

    def __getattr__(self, name):
        raise AssertionError(f"Slurm was asked ({name}) for a launch that carries a secret reference")


def test_a_slurm_launch_with_a_secret_reference_is_refused_not_silently_dropped():
    from reconciler.act.launcher.slurm_launcher import SlurmLauncher
    from tests.test_render import FLEET

    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000, command=("/bin/engine",),
                   env={"HF_TOKEN": SecretRef("from_file", "/run/secrets/hf")})
    [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(), port=9000))
    outcome = SlurmLauncher(FLEET, NoSlurm(), "owner").start(launch)
    assert not outcome.ok
    assert outcome.reason == ("env HF_TOKEN {from_file: /run/secrets/hf}: secret references are not supported "
                              "on launcher: slurm nodes yet")
