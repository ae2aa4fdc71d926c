"""Weights fetch throughput between two namespaced nodes, beside plain rsync over ssh of the same files.

    sudo python bench/fetch.py [--mib 256] [--files 4]

Builds a two-node fleet (tests/fleet.py: network namespaces, real sshd), writes
--mib MiB of random files in --files files on node `src`, and copies them to node
`dst` four ways, each into an empty directory, printing MiB/s:

- reconciler fetch, node to node (dst has a key src accepts: `ssh src tar -c | tar -x` on dst);
- reconciler fetch, through the management host (no trust between the nodes: chunks of
  fetch.CHUNK_BYTES, each a command over the reconciler's SSH transports);
- rsync -a over ssh, run on dst (the node-to-node baseline);
- ssh src tar -c | ssh dst tar -x from the management host (the relay baseline).

Figures are for this machine's veth bridge and CPUs (every byte is encrypted by ssh on
one host), so what matters is each route beside its baseline, not the absolute rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reconciler.act.fetch import CHUNK_BYTES, Fetcher  # noqa: E402
from reconciler.model import FetchPolicy, Model  # noqa: E402
from reconciler.observe.ssh import TransportPool  # noqa: E402
from tests.fleet import TestFleet  # noqa: E402


class Transports:
    def __init__(self, spec, pool):
        self.spec, self.pool = spec, pool

    def get(self, node_id):
        return self.pool.transport_for(self.spec.node(node_id))


def empty(fleet, node):
    for entry in (fleet.node(node).dir / "models").iterdir():  # the directory itself is the node's bind mount
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def trust(fleet, node, on: bool):
    ssh = fleet.node(node).dir / "home" / ".ssh"
    shutil.rmtree(ssh, ignore_errors=True)
    if on:
        ssh.mkdir(parents=True)
        shutil.copy(fleet.key, ssh / "id_ed25519")
        os.chmod(ssh / "id_ed25519", 0o600)
        shutil.copy(fleet.known_hosts, ssh / "known_hosts")


def size_of(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--files", type=int, default=4)
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        print("rsync is not installed (apt-get install rsync): the baseline needs it", file=sys.stderr)
        return 2
    total = args.mib << 20
    with TestFleet() as fleet:
        fleet.add_node("src", models=["weights"])
        fleet.add_node("dst")
        src_dir = fleet.node("src").dir / "models" / "weights"
        per = total // args.files
        for i in range(args.files):
            with open(src_dir / f"model-{i:05d}.safetensors", "wb") as f:
                for _ in range(per >> 20):
                    f.write(os.urandom(1 << 20))
        source = f"{fleet.models_dir}/weights"
        model = replace(Model(name="weights", source=source), fetch=FetchPolicy(from_node=True))
        spec = fleet.fleet_spec()
        rows = []
        with TransportPool() as pool:
            for route, trusted in (("node to node", True), ("through the management host", False)):
                empty(fleet, "dst")
                trust(fleet, "dst", trusted)
                t0 = time.perf_counter()
                out = Fetcher(spec, Transports(spec, pool)).fetch(model, "dst", "src")
                dt = time.perf_counter() - t0
                assert out.ok and out.route == route, out
                assert size_of(fleet.node("dst").dir / "models" / "weights") == size_of(src_dir)
                rows.append((f"reconciler fetch, {route}", dt))
        empty(fleet, "dst")
        trust(fleet, "dst", True)
        home_ssh = fleet.node("dst").dir / "home" / ".ssh"
        rsh = f"ssh -i {home_ssh}/id_ed25519 -o UserKnownHostsFile={home_ssh}/known_hosts -o BatchMode=yes"
        t0 = time.perf_counter()
        fleet.exec("dst", ["rsync", "-a", "-e", rsh, f"root@{fleet.node('src').address}:{source}/",
                           f"{fleet.models_dir}/rsync-copy/"], timeout=3600)
        rows.append(("rsync -a over ssh, on dst", time.perf_counter() - t0))
        assert size_of(fleet.node("dst").dir / "models" / "rsync-copy") == size_of(src_dir)
        empty(fleet, "dst")
        t0 = time.perf_counter()
        tar_c = subprocess.Popen(fleet.ssh_argv("src") + [f"tar -C {fleet.models_dir} -cf - weights"], stdout=subprocess.PIPE)
        subprocess.run(fleet.ssh_argv("dst") + [f"tar -C {fleet.models_dir} -xf -"], stdin=tar_c.stdout, check=True)
        tar_c.wait()
        rows.append(("ssh tar | ssh tar, through the management host", time.perf_counter() - t0))
    mib = total / (1 << 20)
    print(f"{mib:.0f} MiB in {args.files} files, src -> dst (two network namespaces, real sshd); "
          f"relay chunk {CHUNK_BYTES >> 20} MiB")
    for name, dt in rows:
        print(f"  {name:<48} {dt:7.2f} s  {mib / dt:8.1f} MiB/s")
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
