"""The event log and the history at fleet scale (SPEC section 15): what they cost a pass, what they
take on disk in a day, and how fast the history page answers.

    python bench/events.py [--nodes 4000] [--replicas 10000] [--passes 200] [--keep DIR]

Generates bench/placement.py's fleet and catalog and writes its status/ with `reconciler plan
--write-status` (as bench/dashboard.py does), then:

1. The cost on a pass: the daemon's record step (Daemon._record: events derived against what the
   last pass left, the history sample, both appended, what was seen saved) on a PassResult of that
   catalog and snapshot, every replica Ready, for --passes passes in which a few replicas crash and
   come back, a node goes and comes back every 50 passes, and an autoscaled count moves: the
   per-pass time (median and worst) and the bytes each pass appends.
2. The size per day at one pass per 30 s (2,880 passes): those bytes times 2,880, and the bound.
3. The history page: a day of samples (2,880 at one per 30 s) and its events, served by `python -m
   reconciler dashboard` on loopback: first byte and full answer of /history, /history?model=...,
   /api/events (the first request, and the best of five after).

Measured on 2 shared cores, `python3 bench/events.py --passes 60` (4,000 nodes, 10,040 replicas,
202 models): the record step 307 ms on the first pass (10,101 events: every replica Ready is news),
median 92 ms (worst 316 ms) after, at 7 events a pass (three crashes and their Ready each pass, a
pessimistic churn); 3.3 MiB of events and 0.3 MiB of samples a day at one pass per 30 s. /history
on that day: first byte 1.18 s for the first request, 0.56 s after (1.3 MB); /history?model= 0.58 s;
/api/events?since=1h 0.38 s; the whole day's /api/events 0.74 s (4 MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dashboard import first_byte  # noqa: E402

from reconciler.decide.autoscale import AutoscaleState  # noqa: E402
from reconciler.catalog import load_catalog  # noqa: E402
from reconciler.record.eventlog import EventJournal, SampleRing  # noqa: E402
from reconciler.record.events import Event, pass_events, revision_applied, seen_after  # noqa: E402
from reconciler.record.history import Sample, fleet_figures, sample_of  # noqa: E402
from reconciler.observe.inventory import inventory_from_document, read_snapshot_document  # noqa: E402
from reconciler.model import Assignment, Inventory  # noqa: E402
from reconciler.decide.outcomes import Decision, PassMemory, PassResult, ReplicaState  # noqa: E402
from reconciler.vocabulary import EventKind, NodeState, Phase  # noqa: E402
from tests.test_dashboard_browser import Dashboard, big_tree  # noqa: E402

DAY_PASSES = 2880  # one pass every 30 s


def record(journal: EventJournal, ring: SampleRing, seen, result: PassResult, catalog, now: float):
    """What Daemon._record does after a pass."""
    events = [] if seen is not None and seen.revision == catalog.revision else [revision_applied(catalog.revision, now)]
    events += pass_events(seen, result, now)
    seen = seen_after(result, seen)
    journal.append(events)
    ring.append(sample_of(result, catalog, now))
    journal.save_seen(seen)
    return seen, len(events)


def passes(root: Path, work: Path, n: int) -> None:
    catalog = load_catalog(str(root))
    inventory = inventory_from_document(read_snapshot_document(root / "status" / "nodes.yaml"))
    node_ids = [node.id for node in inventory.nodes]
    replicas = {}
    for i, m in enumerate(catalog.models):
        for j, rid in enumerate(m.replica_ids()):
            node = node_ids[(i * 7 + j) % len(node_ids)]
            replicas[rid] = ReplicaState(rid, m.name, None, Phase.READY, "", (Assignment(node, 0, (0,), (), 8000),),
                                         endpoint=f"http://{node}:8000")
    ids = sorted(replicas)
    scaled = catalog.models[0].name
    journal = EventJournal(work / "log")
    ring = SampleRing(journal.directory)
    seen, times, counts = None, [], []
    now = time.time() - n * 30
    for p in range(n):
        states = dict(replicas)
        for k in range(3):  # three replicas crash this pass, and are Ready again the next
            rid = ids[(p * 3 + k) % len(ids)]
            states[rid] = dataclasses.replace(states[rid], phase=Phase.FAILED, message="rank 0 exited with status 1")
        nodes = inventory.nodes
        if p % 50 == 25:  # a node goes for a pass
            nodes = tuple(dataclasses.replace(x, state=NodeState.UNREACHABLE, reason="timed out") if x.id == node_ids[p]
                          else x for x in nodes)
        decisions = [Decision(ids[(p * 3) % len(ids)], node_ids[0], "start", "restart")]
        result = PassResult(catalog.revision, Inventory(nodes), None, decisions=decisions, replicas=states,
                            memory=PassMemory(), autoscale={scaled: AutoscaleState(2 + (p // 40) % 3, 2)})
        t0 = time.perf_counter()
        seen, said = record(journal, ring, seen, result, catalog, now + p * 30)
        times.append(time.perf_counter() - t0)
        counts.append(said)
    events_bytes = sum(f.stat().st_size for f in journal.events.files())
    sample_bytes = sum(f.stat().st_size for f in ring.lines.files())
    first = times[0]
    rest = sorted(times[1:])
    print(f"record step on a pass: {len(node_ids)} nodes, {len(ids)} replicas, {len(catalog.models)} models, {n} passes")
    print(f"  first pass (every replica Ready is news): {first * 1000:.0f} ms, {counts[0]} events")
    print(f"  later passes: median {statistics.median(rest) * 1000:.1f} ms, worst {rest[-1] * 1000:.1f} ms, "
          f"{statistics.mean(counts[1:]):.1f} events a pass")
    per_pass_events = (events_bytes - 0) / n
    per_pass_samples = sample_bytes / n
    print(f"  bytes a pass: events {per_pass_events:,.0f} (the first pass's Ready events included), samples "
          f"{per_pass_samples:,.0f} (a whole keyframe every 120 samples)")
    later_events = (events_bytes - counts[0] * (events_bytes / max(1, sum(counts)))) / max(1, n - 1)
    print(f"size per day at one pass per 30 s ({DAY_PASSES} passes): events {later_events * DAY_PASSES / 2**20:.1f} MiB, "
          f"samples {per_pass_samples * DAY_PASSES / 2**20:.1f} MiB (each bounded at 2 x 8 MiB and 2 x 32 MiB)")


def history(root: Path, work: Path) -> None:
    """A day of samples and events in the dashboard's log for this catalog, then the page timed."""
    import os

    os.environ["XDG_STATE_HOME"] = str(work / "xdg")
    catalog = load_catalog(str(root))
    inventory = inventory_from_document(read_snapshot_document(root / "status" / "nodes.yaml"))
    journal = EventJournal.for_catalog(root)
    ring = SampleRing(journal.directory)
    ids = [(m.name, rid) for m in catalog.models for rid in m.replica_ids()]
    now = time.time()
    t0 = time.perf_counter()
    # The first pass through the record step (every replica Ready is news), then a day of passes as
    # the record step leaves them, written directly: three replicas crash and come back each pass.
    states = {rid: ReplicaState(rid, name, None, Phase.READY) for name, rid in ids}
    first = PassResult(catalog.revision, inventory, None, replicas=states, memory=PassMemory())
    record(journal, ring, None, first, catalog, now - 86400)
    base = sample_of(first, catalog, now - 86400)
    for p in range(1, DAY_PASSES):
        t = now - 86400 + p * 30
        crashed = [ids[(p * 3 + k) % len(ids)] for k in range(3)]
        models = dict(base.models)
        for name, _ in crashed:
            f = models[name]
            models[name] = dataclasses.replace(f, ready=f.ready - 1)
        ring.append(Sample(t, models, base.gpus, fleet_figures(models)))
        journal.append([Event(t, EventKind.REPLICA_FAILED, "rank 0 exited with status 1", model=name, replica=rid,
                              node="n1", failure="temporary") for name, rid in crashed]
                       + [Event(t, EventKind.REPLICA_READY, "Ready", model=name, replica=rid, node="n1")
                          for name, rid in crashed])
    print(f"\na day written ({DAY_PASSES} passes) in {time.perf_counter() - t0:.0f} s: events "
          f"{sum(f.stat().st_size for f in journal.events.files()) >> 20} MiB, samples "
          f"{sum(f.stat().st_size for f in ring.lines.files()) >> 10} KiB")
    dash = Dashboard(root)
    try:
        first_byte(dash.port, "/")  # the status tree parsed once, as a running dashboard has it
        model = catalog.models[0].name
        print("page                              first byte   full    (best of 5 after)    bytes")
        for target in ("/history", f"/history?model={model}", "/api/events?since=1h", "/api/events"):
            ttfb, total, size = first_byte(dash.port, target)
            best = min((first_byte(dash.port, target) for _ in range(5)), key=lambda x: x[1])
            print(f"{target:<34}{ttfb:8.3f} s {total:7.3f} s   {best[0]:.3f} s / {best[1]:.3f} s   {size:>10,}")
    finally:
        dash.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--replicas", type=int, default=10000)
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--keep", metavar="DIR", help="work here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        root = work / "catalog"
        t0 = time.perf_counter()
        big_tree(root, args.nodes, args.replicas)
        print(f"catalog and status/ of {args.nodes} nodes, {args.replicas} replicas in {time.perf_counter() - t0:.0f} s\n")
        passes(root, work, args.passes)
        history(root, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
