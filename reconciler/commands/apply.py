"""`reconciler apply [CATALOG] [--dry-run]`: one reconcile pass, one line per decision, then the endpoints."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from reconciler.decide import canary
from reconciler.record import memory as memory_store
from reconciler.record.memory import PassMemory, load_memory, memory_path
from reconciler.control.reconcile import apply_pass, run_pass
from reconciler.catalog import load_catalog
from reconciler.constants import STATUS_DIR, Exit
from reconciler.control.lock import APPLY, CatalogLock, lock_path
from reconciler.errors import StatusWriteError
from reconciler.record.eventlog import EventJournal, SampleRing
from reconciler.record.events import pass_events, revision_applied, seen_after
from reconciler.record.history import sample_of
from reconciler.catalog.gitrev import GitCatalog, GitError
from reconciler.observe.ssh import TransportPool
from reconciler.record.status import write as status_write
from reconciler.record.status.documents import CatalogStatus
from reconciler.vocabulary import NodeState, Phase


def catalog_status(catalog, out_of_sync: tuple[str, ...] = ()) -> CatalogStatus:
    """status/catalog.yaml as `apply` leaves it: the keys the daemon writes (SPEC section 6).

    apply applies the working tree as it is, uncommitted edits included; status says so.
    """
    rev = catalog.revision
    message = (f"revision {rev[:12]} applied by reconciler apply" if rev
               else "not a git repository: the directory is applied as it is")
    branch, uncommitted, warnings = None, None, []
    try:
        repo = GitCatalog.open(catalog.root)
        if repo is not None:
            branch, uncommitted = repo.branch(), tuple(repo.uncommitted())
            if uncommitted:
                warnings.append("reconciler apply applied the working tree, uncommitted changes included: "
                                + ", ".join(uncommitted))
    except GitError as exc:  # git broke: status still says what was applied
        warnings.append(f"git: {exc.stderr or exc}")
    return CatalogStatus(rev, rev, message, branch=branch, uncommitted=uncommitted, warnings=tuple(warnings),
                         out_of_sync=tuple(out_of_sync))


def refuse_while_a_leader_acts(catalog) -> None:
    """Under fleet.yaml `leader:` (SPEC 14), a pass by hand beside the leader's would act on the same
    nodes with no epoch: refused, naming the leader, unless --force. etcd out of reach: refused too, as
    nobody can say that no leader acts."""
    settings = catalog.fleet.leader
    if settings is None:
        return
    import os

    from reconciler.control.election import current_leader
    from reconciler.control.etcd import EtcdClient, EtcdUnavailable
    from reconciler.errors import ReconcilerError
    from reconciler.owner import catalog_owner

    def path(name):
        return None if name is None else os.path.join(catalog.root, os.path.expanduser(name))

    client = EtcdClient(settings.endpoints, ca_file=path(settings.ca_file), cert_file=path(settings.cert_file),
                        key_file=path(settings.key_file))
    try:
        leader = current_leader(client, catalog_owner(catalog))
    except EtcdUnavailable as exc:
        raise ReconcilerError(f"cannot ask etcd who leads this fleet ({exc}); nothing was applied: "
                              "`reconciler apply --force` applies anyway") from None
    if leader is not None:
        raise ReconcilerError(f"a reconciler daemon on {leader.host} (pid {leader.pid}, epoch "
                              f"{leader.create_revision}) leads this fleet and holds the lease in etcd; nothing "
                              "was applied: the leader applies what is committed, or `reconciler apply --force`")


def write_catalog_status(catalog, out_of_sync: tuple[str, ...] = ()) -> None:
    try:
        status_write.write_catalog_status(catalog.root, catalog_status(catalog, out_of_sync))
    except StatusWriteError as exc:
        print(f"reconciler: could not write {Path(catalog.root) / STATUS_DIR / 'catalog.yaml'}: {exc.reason}",
              file=sys.stderr)


def save_memory(path: Path, memory: PassMemory) -> None:
    try:
        memory_store.save_memory(path, memory)
    except StatusWriteError as exc:  # losing the memory costs a backoff step, never the pass
        print(f"reconciler: could not save {path}: {exc.reason}", file=sys.stderr)


def main(args) -> int:
    catalog = load_catalog(args.catalog)
    as_json = getattr(args, "log_format", "text") == "json"

    def log(decision) -> None:
        line = json.dumps(decision.as_dict()) if as_json else str(decision)
        print(line, flush=True)

    # One reconciler acts on a catalog at a time: a pass of ours beside a daemon's would start what
    # it starts a second time. A dry run changes nothing and takes no lock.
    lock = None if args.dry_run else CatalogLock(lock_path(Path(catalog.root), _git_of(catalog)), catalog.root, APPLY)
    if not args.dry_run and not getattr(args, "force", False):
        refuse_while_a_leader_acts(catalog)
    if lock is not None:
        lock.acquire()  # DaemonLocked (exit 1) names the holder
    try:
        result = _apply_once(catalog, args.dry_run, log)
    finally:
        if lock is not None:
            lock.release()

    nodes = result.inventory.nodes if result.inventory is not None else ()
    if nodes and all(n.state == NodeState.UNREACHABLE for n in nodes):
        for n in nodes:
            print(f"reconciler: {n.id}: unreachable: {n.reason}", file=sys.stderr)
        return Exit.UNREACHABLE
    say = _Say(as_json)
    shown = _say_unplaced(say, result) + _say_waiting(say, result) + _say_down_nodes(say, nodes)
    if not result.decisions and not as_json and not shown:
        print("nothing to do")
    if not args.dry_run:
        _say_endpoints(say, result.endpoints())
    failed = [d for d in result.decisions if not d.ok]
    if failed:
        print(f"reconciler: {len(failed)} decision{'s' if len(failed) != 1 else ''} failed", file=sys.stderr)
        return Exit.FAILED
    return Exit.OK


def _apply_once(catalog, dry_run: bool, log):
    """One pass, its memory saved and status/catalog.yaml written (unless a dry run)."""
    memory_file = memory_path(catalog.root)
    transports = TransportPool()  # LocalTransport for `transport: local` nodes, SSH otherwise
    try:
        history = load_memory(memory_file)
        if dry_run:
            result = run_pass(catalog, transports=transports, dry_run=True, log=log, history=history)
        else:
            result = apply_pass(catalog, transports=transports, log=log, history=history)
    finally:
        transports.close()
    if result.memory is not None and not dry_run:
        save_memory(memory_file, result.memory)
    if not dry_run:
        write_catalog_status(catalog, tuple(canary.out_of_sync(catalog.models, result.rollouts)))
        record_events(catalog, result)
    return result


def record_events(catalog, result) -> None:
    """The pass's events and history sample, in the log the daemon keeps (SPEC section 15): `apply`
    and the daemon share it, and what the last of either saw, so neither says a change twice."""
    journal = EventJournal.for_catalog(catalog.root)
    now = time.time()
    seen = journal.load_seen()
    events = [revision_applied(catalog.revision, now, by="reconciler apply")] \
        if seen is None or seen.revision != catalog.revision else []
    events += pass_events(seen, result, now)
    try:
        journal.append(events)
        SampleRing(journal.directory).append(sample_of(result, catalog, now))
        journal.save_seen(seen_after(result, seen))
    except StatusWriteError as exc:  # losing an event costs history, never the pass
        print(f"reconciler: could not write the event log: {exc}", file=sys.stderr)


def _git_of(catalog) -> GitCatalog | None:
    """The catalog's repository, for where the lock lives; None outside git, or when git cannot say."""
    try:
        return GitCatalog.open(catalog.root)
    except GitError:
        return None


class _Say:
    """One line of apply's summary: a JSON object with --log-format json, else text."""

    def __init__(self, as_json: bool):
        self.as_json = as_json

    def __call__(self, doc: dict, text: str) -> None:
        print(json.dumps(doc) if self.as_json else text)


def _say_unplaced(say: _Say, result) -> int:
    """Replicas that could not be placed get no decision line; without these a user sees
    "nothing to do" and no reason why the model does not serve."""
    replicas = result.replicas or {}
    unplaced = sorted(o.replica for o in result.plan.unplaced) if result.plan is not None else []
    for rid in unplaced:
        why = replicas[rid].message if rid in replicas else "cannot be placed"
        say({"replica": rid, "action": "unplaced", "reason": why}, f"{rid}  -  unplaced  {why}")
    return len(unplaced)


def _say_waiting(say: _Say, result) -> int:
    """Replicas held back (a node that does not answer, within its grace period) and Unknown ones:
    said by name, so a quiet pass never reads as "all is well"."""
    replicas = result.replicas or {}
    waiting = list(result.plan.waiting) if result.plan is not None else []
    for w in waiting:
        phase = replicas[w.replica].phase if w.replica in replicas else None
        nodes_of = ",".join(w.nodes) if w.nodes else "-"
        say({"replica": w.replica, "node": nodes_of, "action": "waiting", "phase": phase, "reason": w.reason},
            f"{w.replica}  {nodes_of}  waiting  {w.reason}" + (f" (phase {phase})" if phase else ""))
    named = {w.replica for w in waiting}
    for rid, st in sorted(replicas.items()):
        if st.phase == Phase.UNKNOWN and rid not in named:
            say({"replica": rid, "action": "unknown", "reason": st.message}, f"{rid}  -  unknown  {st.message}")
    return len(waiting)


def _say_down_nodes(say: _Say, nodes) -> int:
    down = [n for n in nodes if n.state in (NodeState.UNREACHABLE, NodeState.UNUSABLE)]
    for n in down:
        say({"node": n.id, "state": n.state, "failure": n.failure or None, "reason": n.reason},
            f"node {n.id}: {n.state}: {n.reason}" + (f" ({n.failure})" if n.failure else ""))
    return len(down)


def _say_endpoints(say: _Say, endpoints: dict) -> None:
    if say.as_json:
        print(json.dumps({"endpoints": endpoints}))
        return
    print("endpoints:" if endpoints else "endpoints: none Ready")
    for model, urls in endpoints.items():
        for url in urls:
            print(f"  {model}  {url}")
