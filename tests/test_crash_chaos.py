"""The reconciler SIGKILLed at random points of a pass converges (issue 13, crash safety).

`reconciler apply` runs against the namespaced fleet (a 2-node replica and two
single-node ones, over real SSH, fake engines that really rendezvous) and is
SIGKILLed at a random moment of its pass, again and again, with the catalog
changed between some of the kills (a spec change forces replaces and stops).
After every kill, every status file parses. Then plain passes run until one has
nothing to do, and the fleet must hold exactly one engine per (replica, rank),
no engine of a replica the catalog does not want, and no GPU used twice.

The seed is random per run and printed on failure; CHAOS_SEED=<n> replays one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from reconciler.catalog import load_catalog
from reconciler.act.launcher import SshLauncher
from reconciler.owner import catalog_owner
from reconciler.observe.ssh import TransportPool
from tests.conftest import REPO
from tests.fleet import TestFleet

pytestmark = [pytest.mark.fleet]

KILLS = 8


@pytest.fixture(scope="module")
def fleet():
    f = TestFleet()
    try:
        for node_id in ("a", "b"):
            f.add_node(node_id, gpus=["H100", "H100"], engines=["vllm"], fabrics={"ib-x": ["mlx5_0"]})
        f.add_node("c", gpus=["H100"], engines=["vllm"])
        yield f
    finally:
        f.close()


def write_models(root: Path, records: Path, generation: int) -> None:
    args = ["--max-model-len", str(4096 + generation)]
    def model(name: str, nodes: int) -> dict:
        return {"name": name, "source": f"org/{name}", "replicas": 1, "profiles": [{
            "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "gpus_per_node": 1, "nodes": nodes,
            "port": 8200, "start_timeout_s": 30, "args": args, "env": {"FAKE_ENGINE_RECORD_DIR": str(records)}}]}
    for name, nodes in (("pair", 2), ("one", 1), ("two", 1)):
        (root / "models" / f"{name}.yaml").write_text(yaml.safe_dump(model(name, nodes), sort_keys=False))


def environ(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def live(pid: str) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] not in ("Z", "X")


def engines(records: Path) -> dict[str, list[str]]:
    """Every live engine this test's catalog started, by the rank name the node agent gave it."""
    found: dict[str, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = environ(entry)
        if env.get("FAKE_ENGINE_RECORD_DIR") == str(records) and "LLM_RECONCILER_REPLICA" in env and live(entry):
            found.setdefault(env["LLM_RECONCILER_REPLICA"], []).append(entry)
    # The engine's own children (none here) would share the variable: count process-group leaders.
    return {name: [p for p in pids if group_leader(p)] for name, pids in found.items()}


def group_leader(pid: str) -> bool:
    try:
        return os.getpgid(int(pid)) == int(pid)
    except ProcessLookupError:  # ended since it was listed
        return False


def status_files_parse(root: Path) -> None:
    for path in sorted((root / "status").rglob("*.yaml")):
        yaml.safe_load(path.read_text())  # raises on a half-written file


def test_apply_sigkilled_at_random_points_converges_without_duplicates_or_orphans(fleet, tmp_path):
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    rng = random.Random(seed)
    where = f"(CHAOS_SEED={seed})"
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    fleet.fleet_yaml(root)
    records = tmp_path / "engines"
    records.mkdir()
    generation = 0
    write_models(root, records, generation)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "xdg")}

    def apply(timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "reconciler", "apply", str(root)], env=env,
                              capture_output=True, text=True, timeout=timeout)

    try:
        started = time.monotonic()
        first = apply()
        assert first.returncode == 0, f"{where} {first.stdout}{first.stderr}"
        pass_s = time.monotonic() - started
        kills = []
        for i in range(KILLS):
            if rng.random() < 0.5:  # a spec change: this pass replaces (stops and starts) every replica
                generation += 1
                write_models(root, records, generation)
            delay = rng.uniform(0.0, pass_s)
            proc = subprocess.Popen([sys.executable, "-m", "reconciler", "apply", str(root)], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(round(delay, 2))
            status_files_parse(root)

        # Quiet: nothing done and nothing held. A rank the kills left dead is restarted with backoff
        # (10 s, doubling), and a pass inside that backoff only says it waits: that is no convergence.
        converged = None
        deadline = time.monotonic() + 330  # the backoff's cap, and the passes around it
        while converged is None and time.monotonic() < deadline:
            out = apply()
            busy = [line for line in out.stdout.splitlines()
                    if any(f"  {a}  " in line for a in ("start", "stop", "replace", "restart", "waiting", "unknown"))]
            if out.returncode == 0 and not busy:
                converged = out
            else:
                time.sleep(3)
        assert converged is not None, f"{where} kills at {kills}: no quiet pass: {out.stdout}{out.stderr}"
        status_files_parse(root)

        cat = load_catalog(root, with_revision=False)
        owner = catalog_owner(cat)
        running = engines(records)
        wanted = {f"{owner}.pair-0.rank0", f"{owner}.pair-0.rank1", f"{owner}.one-0.rank0", f"{owner}.two-0.rank0"}
        assert {n: len(p) for n, p in running.items()} == {n: 1 for n in wanted}, \
            f"{where} kills at {kills}: {running}; the quiet pass said:\n{converged.stdout}"

        with TransportPool() as pool:
            launcher = SshLauncher.for_fleet(cat.fleet, {n.id: pool.transport_for(n) for n in cat.fleet.nodes}, owner=owner)
            ranks = [r for node in ("a", "b", "c") for r in launcher.ranks(node)]
        held = [(r.node, g) for r in ranks if r.alive for g in r.gpus]
        assert len(held) == len(set(held)) == 4, f"{where} kills at {kills}: GPUs {held}"
        assert sorted((r.replica, r.rank) for r in ranks if r.alive) == [("one-0", 0), ("pair-0", 0), ("pair-0", 1), ("two-0", 0)]
        for r in ranks:
            assert r.spec_hash == ranks[0].spec_hash or r.replica != ranks[0].replica  # one spec per replica
        assert "Ready" in (root / "status" / "models" / "pair.yaml").read_text(), where
    finally:
        cat = load_catalog(root, with_revision=False)
        with TransportPool() as pool:
            launcher = SshLauncher.for_fleet(cat.fleet, {n.id: pool.transport_for(n) for n in cat.fleet.nodes},
                                             stop_grace_s=2, owner=catalog_owner(cat))
            for node in ("a", "b", "c"):
                for rank in launcher.ranks(node):
                    launcher.stop(node, rank.replica)
        for pids in engines(records).values():  # anything the agents did not know of (an orphan)
            for pid in pids:
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
