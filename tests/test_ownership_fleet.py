"""Two catalogs share a node (SPEC section 7, Ownership), on the namespaced fleet.

Two git repositories, each its own owner (derived from its first commit), both
place a model named `llm` (so both have a replica `llm-0`) on the same node
over real SSH. Neither stops, adopts or counts the other's rank; the GPU and
the port the other holds are taken, so each lands beside the other.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.act.launcher import SshLauncher
from reconciler.owner import catalog_owner
from reconciler.control.reconcile import apply_pass
from reconciler.observe.ssh import TransportPool
from tests.apply_support.local import is_running
from tests.fleet import fleet  # noqa: F401

pytestmark = [pytest.mark.fleet]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def catalog_repo(root: Path, fleet, records: Path) -> Path:  # noqa: F811
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root, ["shared"])
    model = {
        "name": "llm", "source": "org/llm", "replicas": 1,
        "profiles": [{
            "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "gpus_per_node": 1, "port": 8100,
            "start_timeout_s": 30, "env": {"FAKE_ENGINE_RECORD_DIR": str(records)},
        }],
    }
    (root / "models" / "llm.yaml").write_text(yaml.safe_dump(model, sort_keys=False))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"catalog {root.name}")
    return root


def apply_once(root: Path, pool, history=None):
    cat = load_catalog(root, with_revision=False)
    return apply_pass(cat, transports=pool, history=history, ready_wait_s=30)


@pytest.fixture
def two_catalogs(fleet, tmp_path):  # noqa: F811
    fleet.add_node("shared", gpus=["H100", "H100"], engines=["vllm"])
    records = tmp_path / "engines"
    records.mkdir()
    a = catalog_repo(tmp_path / "team-a", fleet, records)
    b = catalog_repo(tmp_path / "team-b", fleet, records)
    pool = TransportPool()
    yield a, b, pool
    for root in (a, b):  # leave the node as found: each owner stops its own ranks
        cat = load_catalog(root, with_revision=False)
        launcher = SshLauncher.for_fleet(cat.fleet, {n.id: pool.transport_for(n) for n in cat.fleet.nodes},
                                         stop_grace_s=2, owner=catalog_owner(cat))
        for rank in launcher.ranks("shared"):
            launcher.stop("shared", rank.replica)
    pool.close()


def test_two_catalogs_share_a_node_and_never_stop_adopt_or_count_each_others_ranks(two_catalogs):
    a, b, pool = two_catalogs
    owner_a = catalog_owner(load_catalog(a, with_revision=False))
    owner_b = catalog_owner(load_catalog(b, with_revision=False))
    assert owner_a != owner_b and owner_a == git(a, "rev-list", "--max-parents=0", "HEAD")[:len(owner_a)]

    first_a = apply_once(a, pool)
    ra = first_a.replicas["llm-0"]
    assert ra.phase == "Ready", ra.message
    first_b = apply_once(b, pool)
    rb = first_b.replicas["llm-0"]
    assert rb.phase == "Ready", rb.message
    # B saw A's rank as taken, not as its own llm-0: it started its own beside it.
    assert [d.action for d in first_b.decisions if d.replica == "llm-0"][0] == "start"
    (na,), (nb,) = ra.nodes, rb.nodes
    assert na.gpus != nb.gpus and na.port != nb.port
    assert [r.id for r in first_b.inventory.node("shared").replicas] == ["llm-0"]
    assert first_b.inventory.node("shared").replicas[0].port == nb.port

    # Every record left on the node carries its owner.
    t = pool.transport_for(load_catalog(a, with_revision=False).fleet.node("shared"))
    one_per_line = 'for f in "$HOME"/.local/state/llm-reconciler/replicas/*.json; do tr -d "\\n" <"$f"; echo; done'
    out = t.run(["sh", "-c", one_per_line]).stdout.decode()
    assert sorted(json.loads(line)["owner"] for line in out.splitlines()) == sorted([owner_a, owner_b])

    pid_a = next(r.pid for r in first_a.inventory.node("shared").replicas)
    pid_b = next(r.pid for r in first_b.inventory.node("shared").replicas)
    assert is_running(pid_a) and is_running(pid_b) and pid_a != pid_b

    # Passes of each leave the other alone: nothing to do, nothing restarted.
    again_a = apply_once(a, pool, first_a.memory)
    again_b = apply_once(b, pool, first_b.memory)
    assert [d.action for d in again_a.decisions + again_b.decisions if d.action in ("start", "stop", "replace")] == []

    # A removes its model: only A's rank stops; B's runs on, and B does not restart it.
    (a / "models" / "llm.yaml").unlink()
    gone = apply_once(a, pool, again_a.memory)
    assert [(d.replica, d.action) for d in gone.decisions] == [("llm-0", "stop")]
    assert not is_running(pid_a) and is_running(pid_b)
    after_b = apply_once(b, pool, again_b.memory)
    assert after_b.replicas["llm-0"].phase == "Ready"
    assert [r.pid for r in after_b.inventory.node("shared").replicas] == [pid_b]
