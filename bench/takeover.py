"""How long a fleet goes without a leader, and what leading costs (SPEC section 14).

    python bench/takeover.py [--trials 20] [--lease 5] [--nodes 3]      (root: the namespaced fleet)

Two real daemons (`python -m reconciler run --interval 1`) on two clones of one catalog elect their
leader in a real 3-member etcd cluster on loopback, each reaching etcd through a TCP proxy of its
own, and drive the namespaced test fleet (tests/fleet.py) over SSH: one `command` engine per node.
Each trial takes the leader away, in turn by kill -9 (then a new daemon is started on its clone),
by SIGSTOP for lease + 2 s (then SIGCONT), and by cutting its link to etcd (then mending it), and
prints:

- takeover: from the moment the leader was taken away to the new leader's first action on the nodes
  (its epoch recorded on every node, `leader.fenced`, which comes before anything else it does);
  goal: at most lease_s plus one pass;
- engine starts during the trial (the fleet is steady: every one would be a duplicate; goal 0) and
  engines per rank afterwards (goal: exactly one each);
- actions refused for an old epoch (`fenced` decisions of the deposed leader);
and then the idle pass of a leader against the same pass without `leader:` in fleet.yaml.

Figures on the 2-core development machine, shared with other work (2026-12-05):

    python bench/takeover.py --trials 20 --idle-passes 20
        takeover: median 5.63 s, worst 6.02 s (lease 5 s + a 1 s pass interval): kill median 5.68 s,
        pause 5.15 s, cut 5.63 s; duplicate engine starts 0, ranks with two engines 0, actions refused
        for an old epoch 0 (the fleet is steady: nothing was in flight); idle pass 46 ms with the
        lease, 46 ms without leader:
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.etcd_cluster import EtcdCluster  # noqa: E402
from tests.fleet import TestFleet  # noqa: E402
from tests.gitcatalog import REPO, CatalogRepo, DaemonProcess, git, marked_pids, stop_all, wait_for  # noqa: E402
from tests.tcp_proxy import TcpProxy  # noqa: E402


def ts(event: dict) -> float:
    return dt.datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def model_doc(replicas: int, marker: str) -> str:
    return yaml.safe_dump({
        "name": "echo", "source": "echo-weights", "replicas": replicas,
        "profiles": [{"name": "cpu", "engine": "command", "port": 8330,
                      "command": ["python3", "-m", "reconciler.tiny_server", "--host", "0.0.0.0", "--port", "${PORT}",
                                  "--model", "${MODEL_SOURCE}"],
                      "env": {"E2E_MARKER": marker, "PYTHONPATH": str(REPO)}, "start_timeout_s": 30}],
    }, sort_keys=False)


class Bench:
    def __init__(self, tmp: Path, fleet: TestFleet, cluster: EtcdCluster, nodes: list[str], lease_s: int):
        self.tmp, self.fleet, self.cluster, self.nodes, self.lease_s = tmp, fleet, cluster, nodes, lease_s
        self.marker = f"bench-takeover-{os.getpid()}"
        self.proxies = {h: [TcpProxy(p) for p in cluster.client_ports] for h in ("a", "b")}
        origin = CatalogRepo(tmp / "origin")
        doc = fleet.fleet_document(nodes)
        doc["leader"] = {"etcd": {"endpoints": cluster.endpoints}, "lease_s": lease_s}
        origin.write("fleet.yaml", yaml.safe_dump(doc, sort_keys=False))
        origin.write("models/echo.yaml", model_doc(len(nodes), self.marker))
        origin.commit("echo on every node", "fleet.yaml", "models/echo.yaml")
        self.repos = {}
        for h in ("a", "b"):  # each host its own clone, reaching etcd through its own link
            path = tmp / f"host-{h}"
            git(tmp, "clone", "-q", str(origin.path), str(path))
            git(path, "config", "user.email", "b@example.com")
            git(path, "config", "user.name", "Bench")
            repo = CatalogRepo(path, init=False)
            doc["leader"]["etcd"]["endpoints"] = [p.url for p in self.proxies[h]]
            repo.write("fleet.yaml", yaml.safe_dump(doc, sort_keys=False))
            repo.commit(f"host {h}'s link to etcd", "fleet.yaml")
            self.repos[h] = repo
        self.daemons: dict[str, DaemonProcess] = {}
        self.all: list[DaemonProcess] = []
        self.generation = {"a": 0, "b": 0}

    def start(self, h: str) -> DaemonProcess:
        self.generation[h] += 1
        d = DaemonProcess(self.repos[h].path, "--interval", "1", workdir=self.tmp, name=f"{h}{self.generation[h]}",
                          real=True, env={"XDG_STATE_HOME": str(self.tmp / "xdg"), "E2E_MARKER": self.marker})
        self.daemons[h] = d
        self.all.append(d)
        return d

    def leader(self) -> str:
        def leading(h):
            d = self.daemons[h]
            return d.proc.poll() is None and len(d.events("leader.elected")) > len(d.events("leader.lost"))
        return wait_for(lambda: (ls := [h for h in self.daemons if leading(h)]) and len(ls) == 1 and ls[0], 60,
                        "one leader")

    def engines(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for pid in marked_pids(self.marker):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if os.getpgid(pid) != pid:
                    continue
            except OSError:
                continue
            for e in env:
                if e.startswith(b"LLM_RECONCILER_REPLICA="):
                    name = e.split(b"=", 1)[1].decode()
                    found[name] = found.get(name, 0) + 1
        return found

    def decisions(self, action: str) -> int:
        return sum(1 for d in self.all for e in d.events("decision") if e.get("action") == action and
                   (action != "start" or e.get("ok")))

    def trial(self, how: str) -> dict:
        old = self.leader()
        new = "b" if old == "a" else "a"
        d_old, d_new = self.daemons[old], self.daemons[new]
        fenced_before = len(d_new.events("leader.fenced"))
        starts, refused = self.decisions("start"), self.decisions("fenced")
        gone = time.time()
        if how == "kill":
            d_old.proc.send_signal(signal.SIGKILL)
            d_old.proc.wait(10)
        elif how == "pause":
            d_old.signal(signal.SIGSTOP)
        else:
            for p in self.proxies[old]:
                p.cut()
        first = wait_for(lambda: (e := d_new.events("leader.fenced")) and len(e) > fenced_before and e[-1],
                         20 * self.lease_s, f"{new} taking over")
        took = ts(first) - gone
        if how == "pause":
            time.sleep(max(0.0, gone + self.lease_s + 2 - time.time()))
            d_old.signal(signal.SIGCONT)
            wait_for(lambda: d_old.events("leader.lost"), 30, "the paused leader saying it lost")
        elif how == "cut":
            wait_for(lambda: d_old.events("leader.lost"), 30, "the cut leader saying it lost")
            for p in self.proxies[old]:
                p.mend()
        else:
            self.start(old)
        wait_for(lambda: self.daemons[old].events("leader.standby"), 60, f"{old} standing by again")
        time.sleep(2)  # a couple of passes of the new leader on the steady fleet
        engines = self.engines()
        return {"how": how, "takeover_s": took, "starts": self.decisions("start") - starts,
                "refused": self.decisions("fenced") - refused, "engines": engines}

    def close(self) -> None:
        stop_all(self.all, self.marker)
        for ps in self.proxies.values():
            for p in ps:
                p.close()


def idle_pass_s(d: DaemonProcess, since: int, n: int) -> list[float]:
    ends = wait_for(lambda: (e := [x for x in d.events("pass.end") if x.get("result") == "applied"][since:])
                    and len(e) >= n and e, 30 + 5 * n, "idle passes")
    return [e["seconds"] for e in ends[:n]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--lease", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--idle-passes", type=int, default=20)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/takeover.py needs root (the namespaced test fleet)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    fleet = TestFleet()
    cluster = EtcdCluster(tmp / "etcd")
    bench = None
    try:
        nodes = [f"t{i}" for i in range(args.nodes)]
        for n in nodes:
            fleet.add_node(n)
        cluster.start()
        bench = Bench(tmp, fleet, cluster, nodes, args.lease)
        bench.start("a")
        bench.leader()
        bench.start("b")
        wait_for(lambda: bench.daemons["b"].events("leader.standby"), 60, "b standing by")
        wait_for(lambda: sum(bench.engines().values()) == args.nodes, 120, "every engine up")
        ways = ("kill", "pause", "cut")
        results = []
        print(f"lease_s {args.lease}, renew deadline {args.lease * 2 / 3:.2f}s, {args.nodes} nodes, interval 1s")
        for i in range(args.trials):
            r = bench.trial(ways[i % 3])
            dup = {k: v for k, v in r["engines"].items() if v > 1}
            print(f"trial {i + 1:2d} {r['how']:5s}: takeover {r['takeover_s']:5.2f}s, engine starts "
                  f"{r['starts']}, refused for an old epoch {r['refused']}, engines {sum(r['engines'].values())}"
                  f"/{args.nodes}{', DUPLICATES ' + str(dup) if dup else ''}")
            results.append(r)
        took = [r["takeover_s"] for r in results]
        print(f"takeover: median {statistics.median(took):.2f}s, worst {max(took):.2f}s "
              f"(goal <= lease {args.lease}s + one pass); by kind: "
              + ", ".join(f"{w} median {statistics.median([r['takeover_s'] for r in results if r['how'] == w]):.2f}s"
                          for w in ways if any(r["how"] == w for r in results)))
        print(f"duplicate engine starts: {sum(r['starts'] for r in results)}; ranks with two engines: "
              f"{sum(1 for r in results for v in r['engines'].values() if v > 1)}; "
              f"actions refused for an old epoch: {sum(r['refused'] for r in results)}")

        # The idle pass with a lease against the same fleet without `leader:`.
        leader = bench.daemons[bench.leader()]
        with_lease = idle_pass_s(leader, len([x for x in leader.events("pass.end") if x.get("result") == "applied"]),
                                 args.idle_passes)
        stop_all(bench.all, "none")
        plain = bench.repos["a"]
        doc = yaml.safe_load((plain.path / "fleet.yaml").read_text())
        del doc["leader"]
        plain.write("fleet.yaml", yaml.safe_dump(doc, sort_keys=False))
        plain.commit("no leader", "fleet.yaml")
        solo = bench.start("a")
        wait_for(lambda: [x for x in solo.events("pass.end") if x.get("result") == "applied"], 60, "a plain pass")
        without = idle_pass_s(solo, 2, args.idle_passes)
        print(f"idle pass: median {statistics.median(with_lease) * 1000:.0f} ms with the lease, "
              f"{statistics.median(without) * 1000:.0f} ms without leader: (the lease is renewed on its own thread; "
              f"a pass only reads the role)")
    finally:
        if bench is not None:
            bench.close()
        cluster.close()
        fleet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
