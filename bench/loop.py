"""How fast the loop reacts, and what a pass with nothing to do costs.

    python bench/loop.py [--commits 20] [--idle-passes 20] [--pass fake|apply]

1. commit -> launch: a replica bump is committed to a real git catalog while
   the real daemon loop runs (watcher, revision read, snapshot export, load);
   the time is from just before `git commit` to the moment the launch command
   runs on the node (it prints its own clock). Engine start-up is excluded: the
   "engine" is `date`. Median and worst over N commits. Target: median < 1 s.
2. idle pass: passes with nothing changed, timed one by one, and every file
   under the catalog (its .git included) compared before and after. Target:
   < 300 ms and zero bytes written.

--pass fake (default): the daemon with a minimal pass that launches each new
replica with LocalTransport (`date +%s.%N` on this machine): it measures the
daemon's own part of the loop. --pass apply: the real reconciler.control.reconcile.run_pass
on one `transport: local` node; add --fleet N for N namespaced nodes reached
over SSH (tests/fleet.py, needs root).

Figures on the 2-core development machine (2026-11-29):

    python bench/loop.py --commits 20 --idle-passes 20
        commit -> launch: median 98 ms, worst 105 ms; idle pass 6.5 ms, 0 bytes
    python bench/loop.py --pass apply --commits 20 --idle-passes 20
        commit -> launch: median 143 ms, worst 168 ms; idle pass 144 ms, 0 bytes
    python bench/loop.py --pass apply --fleet 50 --commits 20 --idle-passes 10
        commit -> launch: median 144 ms, worst 182 ms; idle pass 69 ms, 0 bytes

With a node cut off (issue 13): --cut 1 takes the last node's link down after the first
launch, waits until a resync has seen it unreachable, then commits, while resync passes
run every --interval seconds beside the commits; --hostile adds a node whose probe prints
50 MB of junk per pass and reports the daemon's peak memory.

    python bench/loop.py --pass apply --fleet 6 --commits 4 --interval 2            (all up)
        commit -> launch: median 369 ms, worst 458 ms; peak memory 72 MiB
    python bench/loop.py --pass apply --fleet 6 --commits 4 --interval 2 --cut 1    (one cut)
        commit -> launch: median 431 ms, worst 468 ms (seen unreachable 32 s after the cut:
        the first probe after it waits out ssh.command_timeout_s, later passes do not wait)
    python bench/loop.py --pass apply --fleet 6 --commits 4 --interval 2 --cut 1 --commit-at-cut
        commit -> launch: median 476 ms, worst 534 ms (commits while a resync still waits on
        the node just cut; before issue 13: median 456 ms, worst 58175 ms, the probe's 60 s)
    python bench/loop.py --pass apply --fleet 4 --commits 2 --interval 2 --hostile
        peak memory 77 MiB (72 MiB without the hostile node: what is read is capped at 4 MiB)

A cut node that the plan still acts on (issue 13, actions at once): --holding puts --commits
replicas of a second model on the last node and each commit stops one of them there beside
starting a bench replica elsewhere; with --cut 1 that node's link goes down between passes, so
the commit's plan (from the inventory the last pass left, which saw it up) sends a stop to a
node that does not answer. --sequential-actions carries the actions out one at a time, as
before. On the 2-core machine, 2026-12-01, 3 namespaced nodes, 6 commits:

    python3 bench/loop.py --pass apply --fleet 3 --holding --commits 6                       (all up)
        commit -> launch: median 398 ms, p90 404 ms, worst 510 ms
    python3 bench/loop.py --pass apply --fleet 3 --holding --commits 6 --cut 1               (one cut)
        commit -> launch: median 360 ms, p90 390 ms, worst 3942 ms
    python3 bench/loop.py --pass apply --fleet 3 --holding --commits 6 --sequential-actions --cut 1
        commit -> launch: median 323 ms, p90 506 ms, worst 4368 ms

With actions at once the start in the pass that meets the cut node is not held up by its stop
(with them one at a time that commit waited the stop's 4 s); the worst figure left is the next
commit, which waits for that pass to end (passes never overlap). That pass marks the node
unreachable in the snapshot it leaves, so later commits do not act on it again.

Most of the latency is the watcher's 50 ms quiet step and `git commit` itself.
A pass started by a commit plans against the inventory the previous pass left
(see reconciler/commands/run.py ApplyPass); without that it was 1.56 s at 50
nodes, when each probe still started a python3 per node.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.control.loop import Daemon, DaemonOptions  # noqa: E402
from reconciler.control.log import EventLog  # noqa: E402
from reconciler.observe.transport import LocalTransport  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def fleet_yaml(state_dir: Path) -> str:
    # One local node (loopback is allowed in a fleet of one); replicas share it (spread: preferred).
    return f"state_dir: {state_dir}\nnodes:\n  - id: local\n    address: 127.0.0.1\n    transport: local\n"


def model_yaml(replicas: int, port: int = 23000) -> str:
    # The engine prints its clock the moment it runs (that is the launch), then serves /health:
    # engine start-up is after the timestamp, so it is excluded.
    engine = f"date +%s.%N; exec {sys.executable} -m reconciler.tiny_server --host 127.0.0.1 --port ${{PORT}}"
    return (
        "name: bench\nsource: bench-weights\n"
        f"replicas: {replicas}\nspread: preferred\n"
        "profiles:\n  - name: cpu\n    engine: command\n"
        f"    command: [/bin/sh, -c, {json.dumps(engine)}]\n"
        f"    env: {{PYTHONPATH: {json.dumps(str(REPO))}}}\n"
        f"    port: {port}\n    start_timeout_s: 60\n"
    )


class PassCountingLog(EventLog):
    """The daemon's log, counting the passes that ended (so the bench cuts a node between passes)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ended = 0
        self.cond = threading.Condition()

    def __call__(self, event="", /, **fields):
        super().__call__(event, **fields)
        if event == "pass.end":
            with self.cond:
                self.ended += 1
                self.cond.notify_all()

    def wait_passes(self, n: int, timeout: float = 120.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.ended >= n, timeout):
                raise TimeoutError(f"the daemon did not finish {n} passes")


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


class FakeLaunchPass:
    """Starts each replica it has not started yet by running the launch command on a LocalTransport."""

    def __init__(self) -> None:
        self.transport = LocalTransport("node-00")
        self.launched: dict[str, float] = {}
        self.cond = threading.Condition()

    def __call__(self, catalog, log, **_):
        for model in catalog.models:
            for rid in model.replica_ids():
                if rid in self.launched:
                    continue
                result = self.transport.run(["date", "+%s.%N"])
                with self.cond:
                    self.launched[rid] = float(result.stdout.decode().strip())
                    self.cond.notify_all()
                log("replica.start", replica=rid, node=self.transport.node_id, reason="replica missing")
        return None

    def wait(self, rid: str, timeout: float = 30.0) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.launched, timeout):
                raise TimeoutError(f"{rid} never launched")
            return self.launched[rid]

    def stop_all(self) -> None:
        pass


class LaunchFiles:
    """Namespaced nodes: each engine appends its clock to <dir>/<replica> (a path every node sees)."""

    def __init__(self, directory: Path, stop):
        self.directory = directory
        self.stop_all = stop

    def wait(self, rid: str, timeout: float = 60.0) -> float:
        path = self.directory / rid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                text = path.read_text()
                if text.endswith("\n"):
                    return float(text.split()[0])
            except (FileNotFoundError, ValueError, IndexError):
                pass
            time.sleep(0.002)
        raise TimeoutError(f"{rid} never launched")

    def all_ready(self, catalog: Path, count: int) -> bool:
        return EngineLogs.all_ready(self, catalog, count)


class EngineLogs:
    """With the real pass: the engine's first log line is the clock when it ran on the node."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir

    def wait(self, rid: str, timeout: float = 30.0) -> float:
        path = self.state_dir / "logs" / f"{rid}.rank0.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                for line in path.read_text().splitlines(keepends=True):
                    if line.endswith("\n") and line[:1].isdigit():  # the node agent writes a header first
                        return float(line)
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.002)
        raise TimeoutError(f"{rid} never launched")

    def stop_all(self) -> None:
        """The daemon leaves engines running by design; the bench stops what it started, by process group."""
        for record in (self.state_dir / "replicas").glob("*.json"):
            try:
                os.killpg(json.loads(record.read_text())["pgid"], signal.SIGTERM)
            except (ProcessLookupError, KeyError, ValueError, OSError):
                pass

    def all_ready(self, catalog: Path, count: int) -> bool:
        import yaml

        try:
            doc = yaml.safe_load((catalog / "status/models/bench.yaml").read_text())
        except FileNotFoundError:
            return False
        return bool(doc) and doc.get("ready") == count


def cut_seen(catalog: Path, nodes: list[str]) -> bool:
    import yaml

    try:
        doc = yaml.safe_load((catalog / "status/nodes.yaml").read_text()) or {}
    except (FileNotFoundError, yaml.YAMLError):
        return False
    states = {n.get("id"): n.get("state") for n in doc.get("nodes") or ()}
    return all(states.get(n) == "unreachable" for n in nodes)


def files_state(root: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            out[p] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def fleet_model_yaml(replicas: int, launched: Path, name: str = "bench", role: str | None = None,
                     port: int = 23000) -> str:
    engine = (f"date +%s.%N >> {launched}/${{REPLICA_ID}}; "
              f"exec python3 -m reconciler.tiny_server --host 0.0.0.0 --port ${{PORT}}")
    return (
        f"name: {name}\nsource: bench-weights\n"
        f"replicas: {replicas}\n" + ("spread: preferred\n" if role else "")
        + "profiles:\n  - name: cpu\n    engine: command\n"
        f"    command: [/bin/sh, -c, {json.dumps(engine)}]\n"
        f"    env: {{PYTHONPATH: {json.dumps(str(REPO))}}}\n"
        + (f"    node_selector: {{role: {role}}}\n" if role else "")
        + f"    port: {port}\n    start_timeout_s: 60\n"
    )


def make_catalog(root: Path, state_dir: Path, fleet_text: str | None = None, model=model_yaml) -> None:
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(fleet_text or fleet_yaml(state_dir))
    (root / "models/bench.yaml").write_text(model(1))
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "bench@example.com")
    git(root, "config", "user.name", "bench")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")


def held_model(args, launched: Path, replicas: int) -> str:
    """--holding: replicas on the last node, one stopped by each commit (the plan's stops come first)."""
    return fleet_model_yaml(replicas, launched, name="held", role="held", port=23500)


def bench(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-"))
    catalog = work / "catalog"
    state_dir = work / "state"
    os.environ["XDG_STATE_HOME"] = str(work / "xdg")  # the pass memory file stays in the bench's directory
    test_fleet = None
    model = model_yaml
    if args.fleet:
        sys.path.insert(0, str(REPO))
        from tests.fleet import TestFleet

        launched = work / "launched"
        launched.mkdir()
        role = "bench" if args.holding else None
        model = lambda n: fleet_model_yaml(n, launched, role=role)  # noqa: E731
        t0 = time.monotonic()
        test_fleet = TestFleet()
        for i in range(args.fleet):
            # --holding: the last node holds the `held` replicas, the others bench's.
            held_node = args.holding and i == args.fleet - 1
            test_fleet.add_node(f"node-{i:02d}", labels={"role": "held" if held_node else "bench"} if args.holding else None)
        if args.hostile:
            # Its python3 prints 50 MB of junk and no end of line for every probe.
            test_fleet.add_node("hostile", executables={"python3": "#!/bin/sh\nexec head -c 50000000 /dev/zero | tr '\\0' x\n"})
        test_fleet.fleet_yaml(work / "fleet-only")
        print(f"fleet: {args.fleet} namespaced nodes with real sshd, up in {time.monotonic() - t0:.1f} s")
        make_catalog(catalog, state_dir, (work / "fleet-only/fleet.yaml").read_text(), model)
        if args.holding:
            (catalog / "models/held.yaml").write_text(held_model(args, launched, args.commits))
            git(catalog, "add", "-A")
            git(catalog, "commit", "-q", "-m", "held replicas")
    else:
        make_catalog(catalog, state_dir)
    try:
        return _bench(args, work, catalog, state_dir, model, test_fleet)
    finally:
        if test_fleet is not None:
            test_fleet.close()  # kills every process in the nodes' namespaces (the engines too), by pid


def _bench(args, work, catalog, state_dir, model, test_fleet) -> int:
    devnull = open(os.devnull, "w")
    log = PassCountingLog("text", sys.stderr if args.verbose else devnull)
    from reconciler.catalog import load_catalog as load

    if args.pass_kind == "apply":
        from reconciler.commands.run import apply_pass

        pass_fn = apply_pass()
        if test_fleet is not None:
            waiter = LaunchFiles(work / "launched", stop=lambda: None)
            where = f"{args.fleet} namespaced nodes over SSH"
        else:
            waiter = EngineLogs(state_dir)
            where = "one `transport: local` node (LocalTransport on this machine, no SSH)"
        what = "the real apply pass (probe, plan, start through the node agent); engines: tiny_server"
    else:
        pass_fn = waiter = FakeLaunchPass()
        where = "one `transport: local` node (LocalTransport on this machine, no SSH)"
        what = "a fake pass that runs the launch command itself (the daemon's own share of the loop)"
    print(f"nodes: {where}; {what}; catalog: a real git repository")

    daemon = Daemon(catalog, pass_fn=pass_fn, load=load, options=DaemonOptions(interval=args.interval), log=log)
    if args.cut:
        print(f"cut off: {', '.join(f'node-{i:02d}' for i in range(args.fleet - args.cut, args.fleet))} "
              f"(link down after the first launch), resync every {args.interval:g} s")
    elif args.interval < 3600:
        print(f"all nodes up, resync every {args.interval:g} s")
    latencies: list[float] = []
    failure: list[BaseException] = []

    def committer():
        try:
            waiter.wait("bench-0")
            for k in range(args.commits if args.holding else 0):
                waiter.wait(f"held-{k}")
            log.wait_passes(1)  # the first pass is over: the cut falls between passes, not inside one
            cut = [f"node-{i:02d}" for i in range(args.fleet - args.cut, args.fleet)]
            for node_id in cut:
                test_fleet.cut(node_id)  # holds nothing (but `held` with --holding): bench-0 is on node-00
            if cut and args.holding:
                # No resync has seen it go: the next commit's plan, from the inventory the last pass
                # left, stops a held replica there before it starts the new bench replica elsewhere.
                print(f"commits start right after the cut; each one stops a held replica on {', '.join(cut)} "
                      "(planned from the inventory of the last pass, which saw it up)")
            elif cut and args.commit_at_cut:
                time.sleep(2 * args.interval)  # a resync is waiting on the cut node's probe now
                print("commits start while a resync still waits on the node just cut")
            elif cut:
                # Steady state with the node cut off: once a resync has found it gone (the first
                # probe after a cut waits out its deadline, ssh.command_timeout_s; later ones do not).
                t_cut = time.monotonic()
                while not cut_seen(catalog, cut):
                    if time.monotonic() - t_cut > 120:
                        raise TimeoutError("the daemon never saw the cut node unreachable")
                    time.sleep(0.1)
                print(f"the daemon saw {', '.join(cut)} unreachable {time.monotonic() - t_cut:.1f} s after the cut")
            time.sleep(0.3)  # let the watcher settle after start-up
            for i in range(1, args.commits + 1):
                (catalog / "models/bench.yaml").write_text(model(i + 1))
                if args.holding:
                    (catalog / "models/held.yaml").write_text(held_model(args, work / "launched", args.commits - i))
                git(catalog, "add", "-A")
                t0 = time.time()
                git(catalog, "commit", "-q", "-m", f"bench: {i + 1} replicas")
                launched = waiter.wait(f"bench-{i}")
                latencies.append(launched - t0)
                time.sleep(0.2)  # separate commits, as people make them
        except BaseException as exc:  # report, and stop the daemon either way
            failure.append(exc)
        finally:
            daemon.stop("bench done")

    thread = threading.Thread(target=committer)
    thread.start()
    try:
        daemon.serve()
        thread.join()
        if failure:
            raise failure[0]
        ms = sorted(x * 1000 for x in latencies)
        print(
            f"commit -> launch command running, {len(ms)} commits: median {statistics.median(ms):.0f} ms, "
            f"p90 {ms[int(0.9 * (len(ms) - 1))]:.0f} ms, worst {ms[-1]:.0f} ms (target: median < 1000 ms)"
        )
        import resource

        print(f"daemon peak memory (max RSS of this process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
              + (" with a node whose probe prints 50 MB of junk every pass" if args.hostile else ""))
        if args.cut:
            return 0  # an idle pass with a node cut costs what the others cost; measured with all up
        ready = (lambda: waiter.all_ready(catalog, args.commits + 1)) if args.pass_kind == "apply" else None
        bench_idle(args, catalog, pass_fn, load, log, ready)
    finally:
        waiter.stop_all()
        devnull.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def bench_idle(args, catalog: Path, pass_fn, load, log, ready=None) -> None:
    """Passes with nothing changed since the last pass: time each, and compare every file before/after."""
    idle = Daemon(catalog, pass_fn=pass_fn, load=load, options=DaemonOptions(interval=3600), log=log)
    deadline = time.monotonic() + 120
    idle.reconcile(trigger="warm-up")
    while ready is not None and not ready():  # the real pass: until every replica is Ready
        if time.monotonic() > deadline:
            raise TimeoutError("replicas never all Ready")
        time.sleep(0.2)
        idle.reconcile(trigger="warm-up")
    idle.reconcile(trigger="warm-up")
    before = files_state(catalog)
    durations = []
    for _ in range(args.idle_passes):
        t0 = time.perf_counter()
        idle.reconcile(trigger="interval")
        durations.append((time.perf_counter() - t0) * 1000)
    after = files_state(catalog)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    written = sum(after.get(p, (0, 0, 0))[2] for p in changed)
    print(
        f"idle pass, {len(durations)} passes: median {statistics.median(durations):.1f} ms, "
        f"worst {max(durations):.1f} ms (target < 300 ms); files changed under the catalog and its .git: "
        f"{len(changed)}, bytes written: {written} (target 0)"
    )
    for p in changed[:10]:
        print("  changed:", p)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--idle-passes", type=int, default=20)
    parser.add_argument("--fleet", type=int, default=0, metavar="N",
                        help="with --pass apply: N namespaced nodes (tests/fleet.py; needs root) instead of one local node")
    parser.add_argument("--verbose", action="store_true", help="print the daemon's log on stderr")
    parser.add_argument("--cut", type=int, default=0, metavar="K",
                        help="with --fleet: cut the links of the last K nodes after the first launch")
    parser.add_argument("--holding", action="store_true",
                        help="with --fleet: the last node holds --commits replicas of a second model, and each "
                             "commit stops one of them beside starting a bench replica (with --cut: on the cut node)")
    parser.add_argument("--sequential-actions", action="store_true",
                        help="carry out a pass's actions one at a time (actor.dispatch.MAX_PARALLEL_ACTIONS = 1), as before "
                             "issue 13: the figure to compare with")
    parser.add_argument("--commit-at-cut", action="store_true",
                        help="with --cut: commit right after the cut, while resyncs still wait on the node's probe")
    parser.add_argument("--interval", type=float, default=3600.0,
                        help="the daemon's resync interval (s); short, resync passes run beside the commits")
    parser.add_argument("--hostile", action="store_true",
                        help="with --fleet: one more node whose probe prints 50 MB of junk (daemon memory)")
    parser.add_argument("--pass", dest="pass_kind", choices=("fake", "apply"), default="fake")
    args = parser.parse_args()
    if args.fleet and args.pass_kind != "apply":
        parser.error("--fleet needs --pass apply")
    if args.holding and (not args.fleet or args.fleet < 2):
        parser.error("--holding needs --fleet 2 or more (the last node holds the held replicas)")
    if args.fleet and not args.holding and args.commits >= args.fleet - args.cut:
        parser.error("--fleet N holds at most N-1 bumps (one replica per node), fewer the nodes cut")
    if (args.cut or args.hostile) and not args.fleet:
        parser.error("--cut and --hostile need --fleet")
    if args.sequential_actions:
        import reconciler.act.actor.dispatch
        import reconciler.act.actor.waiting

        # Both pools the actor sizes by it: the actions', and the health checks' of what they started.
        for module in (reconciler.act.actor.dispatch, reconciler.act.actor.waiting):
            module.MAX_PARALLEL_ACTIONS = 1
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
