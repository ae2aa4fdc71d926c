"""Values that were bare strings are typed with the vocabulary's StrEnums, spelled in files exactly as before."""

from __future__ import annotations

import json

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.errors import CommandTimeout, RenderError, kind_of
from reconciler.model import NodeSpec, SecretRef
from reconciler.decide.outcomes import Decision
from reconciler.vocabulary import DecisionAction, FailureKind, LauncherKind, PullState, SecretKind, TransportKind
from tests.catalog_files import FLEET, MODEL, write_catalog
from tests.conftest import REPO


def test_the_catalog_types_transport_launcher_and_secret_references(tmp_path):
    fleet = FLEET.replace("    labels: {zone: a}\n", "    labels: {zone: a}\n    transport: local\n")
    model = MODEL.replace("    args: [\"--threads\", \"8\"]\n",
                          "    args: [\"--threads\", \"8\"]\n    env: {HF_TOKEN: {from_file: /run/secrets/hf}}\n")
    cat = load_catalog(write_catalog(tmp_path, {"fleet.yaml": fleet, "models/llama.yaml": model}), with_revision=False)
    local, remote = cat.fleet.node("gpu-1"), cat.fleet.node("gpu-2")
    assert local.transport is TransportKind.LOCAL and remote.transport is TransportKind.SSH
    assert remote.launcher is LauncherKind.SSH
    ref = cat.model("llama").profile("cpu").env["HF_TOKEN"]
    assert ref.kind is SecretKind.FROM_FILE and ref.document() == {"from_file": "/run/secrets/hf"}
    assert type(next(iter(ref.document()))) is str  # the spec hash and any YAML dumper see a plain key


def test_the_slurm_example_types_its_launcher():
    cat = load_catalog(REPO / "examples" / "slurm", with_revision=False)
    assert LauncherKind.SLURM in {n.launcher for n in cat.fleet.nodes}


def test_a_word_outside_the_vocabulary_is_refused_where_the_value_is_made():
    with pytest.raises(ValueError):
        NodeSpec(id="a", address="10.0.0.1", data_address="10.0.0.1", transport="telnet")
    with pytest.raises(ValueError):
        SecretRef("from_vault", "x")


def test_failure_kinds_and_decision_actions_are_typed_and_written_as_before():
    assert kind_of(CommandTimeout("n1", "slow")) is FailureKind.TEMPORARY
    assert kind_of(RenderError("m-0", "placeholder left")) is FailureKind.PERMANENT
    assert kind_of(KeyError("x")) is FailureKind.BUG
    d = Decision("-", "-", DecisionAction.WARN, "gateway file edited by hand")
    assert json.dumps(d.as_dict()) == '{"replica": "-", "node": "-", "action": "warn", "reason": ' \
                                      '"gateway file edited by hand", "ok": true}'
    assert str(d) == "-  -  warn  gateway file edited by hand"


def test_the_pull_states_are_the_eight_the_status_schema_and_the_daemon_name():
    schema = json.loads((REPO / "reconciler" / "schema" / "status-catalog.schema.json").read_text())
    written = set(schema["properties"]["upstream"]["properties"]["state"]["enum"])
    # fast-forwarded is written as up-to-date (daemon/revisions.py): every other state is written as is.
    assert {s.value for s in PullState} - {PullState.FAST_FORWARDED} == written
    assert yaml.safe_load(yaml.safe_dump({"state": str(PullState.FETCH_FAILED)})) == {"state": "fetch-failed"}
