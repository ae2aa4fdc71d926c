"""`reconciler run`: the daemon. Wiring only; the loop lives in reconciler/daemon/ (loop.py)."""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

from reconciler.decide.autoscale import rising_models, with_counts
from reconciler.control.reconcile import ProbeFleet, ProbeOnly, run_pass as run_apply_pass
from reconciler.commands.apply import load_memory, memory_path, save_memory
from reconciler.control.loop import Daemon, DaemonOptions, PassFn
from reconciler.control.log import EventLog
from reconciler.act.launcher.slurm_launcher import has_slurm
from reconciler.observe.probe import FleetProber
from reconciler.act.scaling import default_reader, read_model_loads
from reconciler.observe.ssh import TransportPool
from reconciler.observe.transport import FleetTransports
from reconciler.errors import ReconcilerError, UsageError, parse_json
from reconciler.vocabulary import NodeState


MIN_INTERVAL_S = 1.0


def daemon_from_args(args, *, pass_fn: PassFn | None = None, load=None, stream=None) -> Daemon:
    if args.push and not args.commit_status:
        raise UsageError("--push pushes status commits: it needs --commit-status")
    # Each resync probes every node: below a second the daemon would spend the fleet's SSH capacity on
    # re-asking what it just heard (and `nan` compares false with everything, so it is refused by name).
    if not (MIN_INTERVAL_S <= args.interval < float("inf")):
        raise UsageError(f"--interval must be at least {MIN_INTERVAL_S:g} second (a finite number), not {args.interval:g}")
    if args.max_passes is not None and args.max_passes < 1:
        raise UsageError("--max-passes must be at least 1")
    if not Path(args.catalog).is_dir():
        raise ReconcilerError(f"{args.catalog}: no such catalog directory")
    if args.git_pull or args.commit_status:
        from reconciler.catalog.gitrev import GitCatalog

        if GitCatalog.open(args.catalog) is None:  # else the flag would be silently ignored
            flag = "--git-pull" if args.git_pull else "--commit-status"
            raise UsageError(f"{flag} needs the catalog in a git repository; {args.catalog} is not in one")
    log = EventLog(args.log_format, stream if stream is not None else sys.stderr)
    options = DaemonOptions(
        interval=args.interval,
        git_pull=args.git_pull,
        commit_status=args.commit_status,
        push=args.push,
        metrics_address=args.metrics_address,
        max_passes=args.max_passes,
    )
    if options.metrics_address:  # a bad address is a usage error before anything starts
        from reconciler.record.metrics import parse_address

        parse_address(options.metrics_address)
    if getattr(args, "dashboard_address", None):
        from reconciler.dashboard.server import parse_address as parse_dashboard_address

        parse_dashboard_address(args.dashboard_address, "--dashboard-address")
    return Daemon(args.catalog, pass_fn=pass_fn or apply_pass(options.interval), load=load, options=options, log=log)


class ReusedInventory:
    """The pass's probe for a commit right after a pass: the inventory that pass left, no round trip."""

    def __init__(self, inventory):
        self.inventory = inventory

    def __call__(self, _catalog, _transports):
        return self.inventory


class ApplyPass:
    """The daemon's pass: reconciler.control.reconcile.run_pass, with SSH connections kept open between
    passes and the restart memory (backoff, restart counts) handed from one pass to the next.

    The daemon does not wait for replicas to become Ready inside a pass (ready_wait_s=0):
    a pass that blocked on a slow engine would hold back every other change; later
    passes judge them instead.

    A pass started by a commit plans against the inventory the previous pass left
    (what it probed, updated with what it started and stopped) when that is younger
    than the resync interval and fleet.yaml did not change: probing every node is
    most of a pass on a large fleet, and a commit should reach the nodes in well
    under a second. What that snapshot cannot know (an engine that died since, a
    port taken since) is caught by the node agent at launch or by the next resync,
    which always probes.

    A pass the last one asked for (trigger "wake": a start to judge, a drain, a wait that
    ends) probes only the nodes it is about (reconcile.wake_nodes) and takes every other
    node as the last pass left it, under the same bound: younger than the resync interval
    since every node was last probed, fleet.yaml unchanged, and no Slurm nodes.
    """

    def __init__(
        self, reuse_inventory_s: float = 60.0, clock=time.monotonic, run_pass=None, pool=None, memory=None,
        read_loads=None,
    ) -> None:
        """memory: (load(root) -> memory, save(root, memory)); default: the file one-shot `apply` keeps,
        so restart counts and backoff survive a daemon restart and agree with `apply` run by hand."""
        self._run_pass = run_pass or run_apply_pass
        self._read_loads = read_loads or default_reader  # Ready replicas' loads, for autoscaling
        self._ready: dict = {}  # the last pass's replica states: whose loads the next pass reads
        self._scaled: tuple | None = None  # (the catalog at its counts, model -> AutoscaleState) the last pass left
        self._pool = pool if pool is not None else TransportPool()
        self._history = None
        self._memory = memory or _memory_file_store()
        self._memory_loaded = False
        self._nodes: set[str] = set()
        self._reuse_s = reuse_inventory_s
        self._clock = clock
        self._last: tuple | None = None  # (fleet, inventory after the pass, when)
        self._probed_at: float | None = None  # when a pass last probed every node
        self._wake_nodes: frozenset[str] = frozenset()  # what the pass the last one asked for is about
        self._prober = FleetProber()  # probes outlive a pass: a silent node is not waited on twice
        # Set by the daemon: whether work waits for the loop (a commit arrived during this pass).
        self.pending = lambda: False
        # Set by the daemon under fleet.yaml `leader:` (SPEC 14): the election, whose epoch each pass acts
        # with; None: no leader, no fencing, the memory in its local file.
        self.leadership = None
        self._epoch: int | None = None  # the epoch this pass memory and the nodes' fences are for
        self._counts = (lambda: None, lambda catalog, states: None)  # autoscaled counts in etcd, under leader:

    def _transports(self, catalog) -> dict:
        ids = {n.id for n in catalog.fleet.nodes}
        for gone in self._nodes - ids:  # a node removed from fleet.yaml: drop its connection
            self._pool.forget(gone)
        self._nodes = ids
        return {node.id: self._pool.transport_for(node) for node in catalog.fleet.nodes}

    def __call__(self, catalog, log, *, trigger: str = "interval"):
        leading = self._lead(catalog, log)
        if leading is None:
            return None  # lost the lease between the loop's question and now: act on nothing
        if not self._memory_loaded:
            self._history = self._memory[0](catalog.root)
            self._memory_loaded = True
        probe_all = ProbeFleet(self._prober, log, self.pending)
        probe = self._probe_for(catalog, trigger, probe_all, log)
        result = self._run_pass(
            catalog, transports=self._transports(catalog), history=self._history, log=log, ready_wait_s=0,
            probe=probe, **self._autoscale_inputs(catalog), **leading,
        )
        self._remember(catalog, result, leading, probed_all=probe is probe_all)
        return result

    def stand_by(self, catalog, log) -> None:
        """A standby's turn (SPEC 14: it may probe, read-only): every node probed on the connections and
        with the answers this daemon keeps, nothing acted on or remembered as the fleet's state (a takeover
        probes the fleet whole again). Its first pass as the leader then opens no connection: at 10,000
        nodes a pass that must open them all takes 42 s, one on open connections 2 s."""
        started = self._clock()
        transports = FleetTransports(self._transports(catalog), catalog.fleet)
        probed = ProbeFleet(self._prober, log, self.pending)(catalog, transports)
        unreachable = sum(1 for n in probed.inventory.nodes if n.state == NodeState.UNREACHABLE)
        log("probe.standby", nodes=len(catalog.fleet.nodes), unreachable=unreachable,
            seconds=round(self._clock() - started, 3),
            msg="standing by: every node probed, read-only, so that a takeover starts on open connections")

    def _lead(self, catalog, log) -> dict | None:
        """What the pass acts with as the leader under fleet.yaml `leader:` (its epoch, the check that it
        still leads before each action, the autoscaled counts kept in etcd); {} with no leader; None when
        the lease was lost between the loop's question and now."""
        if self.leadership is None:
            return {}
        epoch = self.leadership.epoch()
        if epoch is None:
            return None
        if epoch != self._epoch:
            self._take_over(catalog, epoch, log)
        election = self.leadership
        leading = {"epoch": epoch, "may_act": lambda: (
            None if election.epoch() == epoch else f"this daemon no longer leads (its epoch was {epoch})")}
        if any(m.autoscale is not None for m in catalog.models):
            leading["counts_kept"] = self._counts[0]()
        return leading

    def _take_over(self, catalog, epoch: int, log) -> None:
        """A new epoch (this daemon has just become the leader): the memory the last leader left in
        etcd, and every node told the new epoch before anything is done, so that nothing the
        deposed leader still has in flight lands on a node after this one's first action."""
        self._memory = _etcd_memory_store(self.leadership, log)
        self._memory_loaded = False
        self._counts = _etcd_counts_store(self.leadership, log)
        # What this daemon saw before another led in between is not the fleet now: probe it whole.
        self._last, self._probed_at, self._ready = None, None, {}
        self._fence_all(catalog, epoch, log)
        self._epoch = epoch

    def _probe_for(self, catalog, trigger: str, probe_all, log):
        """How this pass sees the fleet: every node probed (probe_all), or, when the last pass's inventory
        is young enough to stand for it, that inventory (a commit) or it with the woken nodes probed (a wake)."""
        if trigger == "commit" and self._last is not None:
            fleet, inventory, when = self._last
            age = self._clock() - when
            if fleet == catalog.fleet and inventory is not None and age < self._reuse_s:
                log("probe.reused", age_s=round(age, 1), msg="a commit pass plans against the inventory the last "
                    "pass left; the next resync probes every node")
                return ReusedInventory(inventory)
        elif trigger == "wake" and self._last is not None and self._probed_at is not None:
            fleet, inventory, _ = self._last
            age = self._clock() - self._probed_at
            # Slurm's view comes from its controller for the whole fleet at once: such a fleet is probed whole.
            if fleet == catalog.fleet and inventory is not None and age < self._reuse_s and not has_slurm(fleet):
                nodes = sorted(self._wake_nodes & {n.id for n in fleet.nodes})
                log("probe.partial", nodes=nodes, of=len(fleet.nodes), age_s=round(age, 1),
                    msg="a pass the last one asked for probes only the nodes it is about; the others stay as "
                        "the last pass left them until the resync, which probes every node")
                return ProbeOnly(probe_all, inventory, frozenset(nodes))
        return probe_all

    def _autoscale_inputs(self, catalog) -> dict:
        """The daemon decides counts, from the loads of what the last pass left Ready; apply keeps them."""
        if not any(m.autoscale is not None for m in catalog.models):
            return {}
        return {"autoscale": self._read_loads, "ready": self._ready}

    def _remember(self, catalog, result, leading: dict, *, probed_all: bool) -> None:
        """What the next pass starts from: the pass memory (saved), the counts it left (in etcd too
        under `leader:`), the replicas whose loads it reads, the inventory, and the nodes it is about."""
        self._history = result.memory
        if "counts_kept" in leading and getattr(result, "autoscale", None):
            self._counts[1](catalog, result.autoscale)
        self._ready = getattr(result, "replicas", None) or {}
        counts = getattr(result, "autoscale", None)
        self._scaled = (with_counts(catalog, counts), counts) if counts else None
        if self._history is not None:
            self._memory[1](catalog.root, self._history)
        self._last = (catalog.fleet, result.inventory, self._clock())
        if probed_all:
            self._probed_at = self._last[2]
        self._wake_nodes = getattr(result, "next_pass_nodes", frozenset())

    def load_rose(self) -> list[str]:
        """Between passes (the daemon's loop, every autoscale.look_every): the autoscaled models whose
        Ready replicas' loads, read now, want more replicas than the last pass saw; the daemon passes at
        once for them, where the load would otherwise first be read by the next resync."""
        if self._scaled is None or not self._ready:
            return []
        catalog, states = self._scaled
        return rising_models(catalog, states, read_model_loads(catalog, self._ready, self._read_loads))

    def _fence_all(self, catalog, epoch: int, log) -> None:
        """The new epoch recorded on every node that answers (the node agent's `fence`), at once."""
        from concurrent.futures import ThreadPoolExecutor

        from reconciler.act.launcher import SshLauncher
        from reconciler.owner import catalog_owner

        nodes = [n.id for n in catalog.fleet.nodes]
        launcher = SshLauncher.for_fleet(catalog.fleet, self._transports(catalog), owner=catalog_owner(catalog),
                                         epoch=epoch)
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
            outcomes = list(pool.map(launcher.fence, nodes))
        missed = {node: o.reason for node, o in zip(nodes, outcomes) if o is not None}
        log("leader.fenced", epoch=epoch, nodes=len(nodes) - len(missed), of=len(nodes),
            missed=sorted(missed) or None,
            msg=f"epoch {epoch} recorded on {len(nodes) - len(missed)} of {len(nodes)} nodes"
                + (f"; not on {', '.join(sorted(missed))} (each action there carries it too)" if missed else ""))

    def close(self) -> None:
        self._pool.close()


def _memory_file_store():
    return (lambda root: load_memory(memory_path(root)), lambda root, m: save_memory(memory_path(root), m))


MEMORY_KEY = "memory"
COUNTS_KEY = "autoscale"


def _etcd_counts_store(election, log):
    """Under `leader:`, the autoscaled counts in force, kept in etcd beside the memory: a new leader
    goes on from the count the last one reached, not from its clone's status/, which may be older.
    (load() -> {model: AutoscaleState} or None when etcd has none, save(catalog, states))."""
    import json

    from reconciler.decide.autoscale import state_document, state_from_document
    from reconciler.control.etcd import EtcdUnavailable

    kept = {}

    def load():
        if "states" not in kept:
            try:
                raw = election.load_state(COUNTS_KEY)
                doc = parse_json(raw) if raw else None
            except (EtcdUnavailable, ValueError) as exc:
                log("autoscale.unavailable", error=str(exc), msg="the autoscaled counts could not be read from "
                    "etcd: status/'s are in force this pass")
                return None
            if not isinstance(doc, dict):
                return None  # none kept yet: status/'s
            kept["states"] = {name: s for name, d in doc.items() if (s := state_from_document(d)) is not None}
        return kept["states"]

    def save(catalog, states):
        kept["states"] = dict(states)
        models = {m.name: m for m in catalog.models}
        doc = {name: state_document(models[name], s) for name, s in sorted(states.items()) if name in models}
        try:
            if not election.save_state(COUNTS_KEY, json.dumps(doc, sort_keys=True).encode()):
                log("autoscale.refused", msg="etcd refused the autoscaled counts: this daemon no longer leads")
        except EtcdUnavailable as exc:
            log("autoscale.unavailable", error=str(exc), msg="the autoscaled counts could not be written to etcd")
    return load, save


def _etcd_memory_store(election, log):
    """Under `leader:` (SPEC 14) the pass memory (backoffs, grace periods, drains, GPU quarantines) lives in
    etcd, where the next leader finds it; written only while this daemon leads (etcd refuses a deposed
    leader's write). etcd out of reach: the pass goes on, and says so."""
    import json

    from reconciler.control.etcd import EtcdUnavailable
    from reconciler.record.memory_document import memory_from_document, memory_to_document
    from reconciler.decide.outcomes import PassMemory

    def load(_root):
        try:
            raw = election.load_state(MEMORY_KEY)
        except EtcdUnavailable as exc:
            log("memory.unavailable", error=str(exc), msg="the pass memory could not be read from etcd: "
                "this pass starts from none (backoffs and grace periods begin again)")
            return PassMemory()
        try:
            return memory_from_document(parse_json(raw)) if raw else PassMemory()
        except ValueError:  # unreadable: forgotten, never an error (as the local file)
            return PassMemory()

    last = {}

    def save(_root, memory):
        value = json.dumps(memory_to_document(memory), sort_keys=True).encode()
        if last.get("value") == value:
            return
        try:
            if election.save_state(MEMORY_KEY, value):
                last["value"] = value
            else:
                log("memory.refused", msg="etcd refused the pass memory: this daemon no longer leads")
        except EtcdUnavailable as exc:
            log("memory.unavailable", error=str(exc), msg="the pass memory could not be written to etcd")
    return load, save


def apply_pass(interval: float = 60.0) -> PassFn:
    return ApplyPass(reuse_inventory_s=interval)


# Where the kernel caps a process's open files when the hard limit is unlimited.
NR_OPEN = "/proc/sys/fs/nr_open"


def raise_open_files_limit(log) -> tuple[int, int] | None:
    """Raise the soft limit of open files to the hard limit, and say so; (before, after), or None.

    The daemon holds a descriptor per node for as long as its connection is open (the SSH
    socket; the paramiko transport before it held three), so systemd's default soft limit of
    1024 (examples/systemd sets no LimitNOFILE) runs out below 1,000 nodes (at about 330 with
    paramiko): connections fail and status files cannot be written. The hard
    limit is the operator's word on the ceiling; the soft one is only a default.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(Path(NR_OPEN).read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft >= target:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log("limits.nofile", soft=soft, hard=hard, msg=f"open files: could not raise the soft limit of {soft}: {exc}")
        return None
    log("limits.nofile", soft=target, was=soft, hard=hard,
        msg=f"open files: soft limit raised from {soft} to {target} (the hard limit): about one is held per node")
    return soft, target


def main(args) -> int:
    daemon = daemon_from_args(args)
    raise_open_files_limit(daemon.log)
    if not getattr(args, "dashboard_address", None):
        return daemon.serve()
    # The dashboard reads only the status files the loop writes: a thread beside the loop that
    # shares nothing with it, started before the first pass and stopped after the last.
    from reconciler.dashboard.server import DashboardServer

    dashboard = DashboardServer(daemon.root, args.dashboard_address, "--dashboard-address")
    dashboard.start()
    host, port = dashboard.address
    daemon.log("dashboard.serving", address=f"{host}:{port}", msg=f"the dashboard at {dashboard.url} (read-only)")
    try:
        return daemon.serve()
    finally:
        dashboard.stop()
