"""Files the reconciler reads and writes, when they are hostile (issue 13).

It never writes outside the catalog through a symlink, never reads a catalog file
that leads out of the repository (and so never prints its content), and refuses
a YAML alias bomb, a huge file or a FIFO with one line each, without reading
them to the end.
"""

from __future__ import annotations

import os
import shutil

import pytest
import yaml

from reconciler.catalog import MAX_FILE_BYTES, load_catalog
from reconciler.errors import CatalogInvalid, StatusWriteError
from reconciler.model import Inventory, ObservedNode
from reconciler.record.status.write import write_nodes_status
from tests.conftest import REPO, run_cli
from tests.catalog_files import FLEET, MODEL, write_catalog

pytestmark = [pytest.mark.process]

SECRET = "hunter2-not-for-your-eyes"


def problems_of(root) -> list[str]:
    with pytest.raises(CatalogInvalid) as info:
        load_catalog(root, with_revision=False)
    return [str(p) for p in info.value.problems]


def test_a_models_directory_linked_out_of_the_repository_is_refused_and_its_files_never_printed(tmp_path):
    outside = tmp_path / "other-repo" / "models"
    outside.mkdir(parents=True)
    (outside / "llama.yaml").write_text(MODEL + f"# {SECRET}\nbroken: [\n")
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET})
    os.symlink(outside, root / "models")
    problems = problems_of(root)
    assert problems == [f"models/llama.yaml:1:1: symbolic link points outside the catalog ({outside / 'llama.yaml'}); "
                        "catalog files must live in the catalog"]
    r = run_cli("validate", str(root))
    assert r.returncode == 1 and SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_a_symlinked_model_file_with_a_secret_is_reported_without_its_content(tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text(f"name: x\nsource: {SECRET}\nprofiles: [{{name: {SECRET}]\n")
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET, "docs/llama.yaml": MODEL})
    (root / "models").mkdir()
    os.symlink(secret, root / "models" / "x.yaml")
    os.symlink(secret, root / "docs" / "stray.yaml")  # outside models/, linked out: not even looked into
    r = run_cli("validate", str(root))
    assert r.returncode == 1 and "models/x.yaml:1:1: symbolic link points outside the catalog" in r.stdout + r.stderr
    assert SECRET not in r.stdout + r.stderr and "docs/stray.yaml" not in r.stdout + r.stderr


def test_a_yaml_alias_bomb_is_refused_in_one_line(tmp_path):
    lines = ["name: bomb", "source: x", 'a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 12):  # 10^12 values once expanded
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    lines.append("profiles: [{name: p, engine: command, command: [echo], port: 9000, args: *a11}]")
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET, "models/bomb.yaml": "\n".join(lines) + "\n"})
    assert problems_of(root) == ["models/bomb.yaml:1:1: expands to more than 1,000,000 values "
                                 "(YAML anchors and aliases repeated into each other); refused"]


def test_a_file_past_the_size_limit_is_refused_without_being_read(tmp_path):
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    big = root / "models" / "huge.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + (1 << 20))  # sparse: its size is what counts
    assert problems_of(root) == [f"models/huge.yaml:1:1: file is {(MAX_FILE_BYTES >> 20) + 1} MiB; "
                                 f"catalog files are refused above {MAX_FILE_BYTES >> 20} MiB"]


def test_a_fifo_among_the_models_is_refused_not_waited_on(tmp_path):
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    os.mkfifo(root / "models" / "pipe.yaml")
    assert problems_of(root) == ["models/pipe.yaml:1:1: not a regular file; catalog files are YAML files"]


def test_a_committed_status_symlink_out_of_the_catalog_is_refused_and_nothing_is_written_there(tmp_path):
    elsewhere = tmp_path / "etc-like"
    elsewhere.mkdir()
    root = write_catalog(tmp_path / "cat", {"fleet.yaml": FLEET, "models/llama.yaml": MODEL})
    os.symlink(elsewhere, root / "status")
    with pytest.raises(StatusWriteError) as caught:
        write_nodes_status(root, Inventory((ObservedNode(id="gpu-1"),)))
    assert "leads outside the catalog (a symbolic link to" in str(caught.value) and str(elsewhere) in str(caught.value)
    assert list(elsewhere.iterdir()) == []


def test_plan_write_status_through_a_status_symlink_says_so_in_one_line(tmp_path):
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "examples" / "single-machine", root)
    fleet = yaml.safe_load((root / "fleet.yaml").read_text())
    fleet["state_dir"] = str(tmp_path / "state")
    (root / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
    shutil.rmtree(root / "status", ignore_errors=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "models").mkdir(parents=True)
    os.symlink(elsewhere, root / "status")
    r = run_cli("plan", str(root), "--write-status", env={"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "leads outside the catalog" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list((elsewhere / "models").iterdir()) == [] and sorted(p.name for p in elsewhere.iterdir()) == ["models"]
