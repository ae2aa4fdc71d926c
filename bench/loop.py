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
daemon's own part of the loop. --pass apply: the real reconciler.apply.run_pass
on `transport: local` nodes, once it is available.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.daemon import Daemon, DaemonOptions, EventLog  # noqa: E402
from reconciler.transport import LocalTransport  # noqa: E402

FLEET = "nodes:\n" + "".join(
    f"  - id: node-{i:02d}\n    address: 10.213.9.{10 + i}\n    transport: local\n" for i in range(64)
)


def model_yaml(replicas: int) -> str:
    return (
        "name: bench\nsource: /models/bench\n"
        f"replicas: {replicas}\nspread: preferred\n"
        "profiles:\n  - name: cpu\n    engine: command\n    command: [date, '+%s.%N']\n    port: 9000\n"
    )


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


class FakeLaunchPass:
    """Starts each replica it has not started yet by running the launch command on a LocalTransport."""

    def __init__(self) -> None:
        self.transport = LocalTransport("node-00")
        self.launched: dict[str, float] = {}
        self.cond = threading.Condition()

    def __call__(self, catalog, log):
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


def make_catalog(root: Path) -> None:
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(FLEET)
    (root / "models/bench.yaml").write_text(model_yaml(1))
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "bench@example.com")
    git(root, "config", "user.name", "bench")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")


def bench(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="reconciler-bench-"))
    catalog = work / "catalog"
    make_catalog(catalog)
    devnull = open(os.devnull, "w")
    log = EventLog("text", devnull)
    from reconciler.catalog import load_catalog as load

    if args.pass_kind == "apply":
        from reconciler.commands.run import apply_pass

        pass_fn, waiter = apply_pass(), None
        raise SystemExit("--pass apply: not wired yet")
    fake = FakeLaunchPass()
    pass_fn, waiter = fake, fake
    print(f"nodes: LocalTransport on this machine ({args.pass_kind} pass); catalog: real git repository")

    daemon = Daemon(catalog, pass_fn=pass_fn, load=load, options=DaemonOptions(interval=3600), log=log)
    latencies: list[float] = []
    failure: list[BaseException] = []

    def committer():
        try:
            waiter.wait("bench-0")
            time.sleep(0.3)  # let the watcher settle after start-up
            for i in range(1, args.commits + 1):
                (catalog / "models/bench.yaml").write_text(model_yaml(i + 1))
                git(catalog, "add", "models/bench.yaml")
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
    daemon.serve()
    thread.join()
    if failure:
        raise failure[0]

    ms = sorted(x * 1000 for x in latencies)
    print(
        f"commit -> launch command running, {len(ms)} commits: median {statistics.median(ms):.0f} ms, "
        f"p90 {ms[int(0.9 * (len(ms) - 1))]:.0f} ms, worst {ms[-1]:.0f} ms (target: median < 1000 ms)"
    )

    # Idle passes: nothing changed since the last pass.
    idle = Daemon(catalog, pass_fn=pass_fn, load=load, options=DaemonOptions(interval=3600), log=log)
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
    devnull.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--idle-passes", type=int, default=20)
    parser.add_argument("--pass", dest="pass_kind", choices=("fake", "apply"), default="fake")
    return bench(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
