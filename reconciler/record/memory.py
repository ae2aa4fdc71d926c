"""What one pass hands to the next, and how `apply` keeps it between runs.

The daemon keeps a PassMemory in memory; a one-shot `apply` persists it as a
JSON-able document (memory_document), so backoff and grace periods survive between runs.
`remember` is pure: the memory after a pass, from the memory before it (the
jitter comes in as a function).

Each replica's backoff is reconciler/decide/backoff.py's: the plan counts its crashes
and holds its restarts and starts; `remember` records how the pass's starts
went (`backoff_after`), since only the act stage sees that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from reconciler.decide.backoff import Backoff, attempt_key
from reconciler.decide.canary import OldSpec, Rollout, current
from reconciler.catalog import model_at
from reconciler.errors import CatalogInvalid, parse_json
from reconciler.observe.inventory import utc_text
from reconciler.model import DEFAULT_DRAIN_S, Action, Catalog, Fleet, Inventory, Placement, Quarantine
from reconciler.decide.outcomes import GpuStrikes, PassMemory, ReplicaState, StartedWith, copy_key  # noqa: F401  (re-exported)
from reconciler.record.memory_document import memory_from_document, memory_to_document
from reconciler.record.status.files import write_rendered
from reconciler.decide.plan import plan as make_plan
from reconciler.decide.plan_values import Drain, Plan, Waiting, drain_key
from reconciler.vocabulary import ActionKind, FailureKind, NodeState, Phase, RolloutPhase, WaitKind

# SPEC section 9, the crash-loop breaker: this many failed starts (or crashes before Ready) in a row
# of one replica on the same GPUs quarantine those GPUs for fleet.yaml's gpu_quarantine_s.
CRASH_LOOP_STARTS = 3


def remember(
    memory: PassMemory,
    plan: Plan | None,
    inventory: Inventory,
    acted: Mapping[str, ReplicaState],
    now: float,
    desired: Iterable[str] | None = None,
    attempt_keys: Mapping[str, str] | None = None,
    jitter: Callable[[], float] = random.random,
    drains_begun: Mapping[str, Drain] | None = None,
    quarantine_s: float = Fleet.gpu_quarantine_s,
) -> PassMemory:
    """The memory after a pass (pure, given `jitter`).

    desired: every replica still wanted; the others are forgotten, so the memory does not grow forever.
    attempt_keys: replica -> attempt_key of the start tried this pass (a failed start's backoff needs it).
    drains_begun: copies the actor left draining in this pass (a replace's old copy, once the new serves).
    """
    wanted = _Wanted(desired)
    unreachable_since, last_seen = nodes_after(memory, inventory, now)
    # The plan's backoff (its crashes counted, its restarts ordered), then how this pass's starts went.
    backoff = backoff_after(plan.backoff if plan is not None else memory.backoff, inventory, acted, now,
                            attempt_keys or {}, jitter)
    strikes, quarantines = crash_loops_after(memory.gpu_strikes, memory.quarantines, inventory, acted, now, quarantine_s)
    return PassMemory(
        backoff=wanted(backoff),
        unreachable_since=unreachable_since,
        last_seen=last_seen,
        placed_on=wanted(placed_on_after(memory.placed_on, acted)),
        gpu_strikes=wanted(strikes),
        quarantines=quarantines,
        draining=draining_after(plan, inventory, drains_begun or {}) if plan is not None else dict(memory.draining),
        rollouts=dict(memory.rollouts),  # moved after the pass's checks (canary_pass.rollouts_after)
        started_with=dict(memory.started_with),
    )


def started_with_after(catalog: Catalog, inventory: Inventory, before: Mapping[str, StartedWith]
                       ) -> dict[str, StartedWith]:
    """What each running copy was started with (pure): kept from when it was first seen (the pass that
    started it), so a copy whose model or profile is later removed or changed still drains by the
    series its engine reports. A copy seen for the first time is recorded from the catalog in force
    (the one it was started from, or for a copy older than this record, the best knowledge there is).
    Copies no longer running are forgotten; those on a node that does not answer are kept."""
    out: dict[str, StartedWith] = {}
    away = {n.id for n in inventory.nodes if n.state == NodeState.UNREACHABLE}
    for key, value in before.items():
        if _head_node(key) in away:
            out[key] = value
    for n in inventory.nodes:
        if n.id in away:
            continue
        for r in n.replicas:
            if r.rank != 0:
                continue
            key = copy_key(r.id, n.id, r.port)
            if key in before:
                out[key] = before[key]
                continue
            model = catalog.model(r.model)
            profile = model.profile(r.profile) if model is not None else None
            if profile is not None:
                out[key] = StartedWith(profile.engine, profile.metrics, model.drain_s)
    return dict(sorted(out.items()))


def _head_node(key: str) -> str:
    return key.rpartition("@")[2].rpartition(":")[0]


class _Wanted:
    """The entries of the replicas still desired (every entry when `desired` is None)."""

    def __init__(self, desired: Iterable[str] | None):
        self.desired = None if desired is None else set(desired)

    def __call__(self, by_replica: Mapping[str, Any]) -> dict[str, Any]:
        if self.desired is None:
            return dict(by_replica)
        return {rid: v for rid, v in by_replica.items() if rid in self.desired}


def nodes_after(memory: PassMemory, inventory: Inventory, now: float) -> tuple[dict[str, float], Inventory]:
    """When each node that does not answer stopped answering, and the last snapshot in which each
    node answered (the records of a node that does not answer, as last seen)."""
    unreachable = {}
    last_nodes = []
    for node in inventory.nodes:
        if node.state == NodeState.UNREACHABLE:
            unreachable[node.id] = memory.unreachable_since.get(node.id, now)
            previous = memory.last_seen.node(node.id) if memory.last_seen is not None else None
            if previous is not None:
                last_nodes.append(previous)
        else:
            last_nodes.append(node)
    return unreachable, Inventory(tuple(last_nodes))


def placed_on_after(placed_on: Mapping[str, tuple[str, ...]], acted: Mapping[str, ReplicaState]
                    ) -> dict[str, tuple[str, ...]]:
    """Where each replica was last placed, with where this pass put those it did not fail to place."""
    out = dict(placed_on)
    for rid, state in acted.items():
        if state.nodes and state.phase != Phase.FAILED:
            out[rid] = tuple(a.node for a in state.nodes)
    return out


def crash_loops_after(strikes: Mapping[str, GpuStrikes], quarantines: Mapping[tuple[str, int], Quarantine],
                      inventory: Inventory, acted: Mapping[str, ReplicaState], now: float, quarantine_s: float
                      ) -> tuple[dict[str, GpuStrikes], dict[tuple[str, int], Quarantine]]:
    """The crash-loop breaker (SPEC section 9), pure. A replica that failed again on the GPUs it failed
    on counts one more strike; a different place starts again at one; Ready forgets it. The third
    strike quarantines those GPUs until now + quarantine_s. A quarantine ends when it expires, or
    when its GPU shows another uuid (a reset, a replaced card)."""
    strikes = dict(strikes)
    quarantines = live_quarantines(quarantines, inventory, now)
    for rid, state in acted.items():
        if state.phase != Phase.FAILED:
            strikes.pop(rid, None)
            continue
        where = tuple((a.node, tuple(a.gpus)) for a in state.nodes if a.gpus)
        if not where or state.failure == FailureKind.PERMANENT:  # a missing binary is not the GPU's doing
            continue
        before = strikes.get(rid)
        count = before.count + 1 if before is not None and before.where == where else 1
        if count < CRASH_LOOP_STARTS:
            strikes[rid] = GpuStrikes(where, count, state.message[:200])
            continue
        strikes.pop(rid, None)
        said = f"{count} failed starts in a row of {rid}" + (f": {state.message[:160]}" if state.message else "")
        for node_id, gpus in where:
            node = inventory.node(node_id)
            uuids = {g.index: g.uuid for g in node.gpus} if node is not None else {}
            for g in gpus:
                quarantines[(node_id, g)] = Quarantine(said, now + quarantine_s, uuids.get(g, ""))
    return dict(sorted(strikes.items())), dict(sorted(quarantines.items()))


def live_quarantines(quarantines: Mapping[tuple[str, int], Quarantine], inventory: Inventory,
                     now: float) -> dict[tuple[str, int], Quarantine]:
    """The quarantines still in force: not expired, and on a GPU that still has the uuid it was
    quarantined with (a node that did not answer keeps its quarantines: nothing says they changed)."""
    kept = {}
    for (node_id, index), q in quarantines.items():
        if q.until <= now:
            continue
        node = inventory.node(node_id)
        if node is not None and node.gpus and q.uuid:
            gpu = next((g for g in node.gpus if g.index == index), None)
            if gpu is None or (gpu.uuid and gpu.uuid != q.uuid):
                continue
        kept[(node_id, index)] = q
    return kept


def with_quarantines(inventory: Inventory, quarantines: Mapping[tuple[str, int], Quarantine], now: float) -> Inventory:
    """The inventory with each quarantined GPU marked (placement treats it as unhealthy), pure. A mark
    the inventory already carries (a snapshot read with --inventory) is dropped once it has expired."""
    live = live_quarantines(quarantines, inventory, now)
    if not live and not any(g.quarantined is not None for n in inventory.nodes for g in n.gpus):
        return inventory
    nodes = []
    for n in inventory.nodes:
        marks = {i: q for (nid, i), q in live.items() if nid == n.id}
        if marks or any(g.quarantined is not None for g in n.gpus):
            n = dataclasses.replace(n, gpus=tuple(_marked(g, marks.get(g.index), now) for g in n.gpus))
        nodes.append(n)
    return Inventory(tuple(nodes))


def _marked(gpu, quarantine: Quarantine | None, now: float):
    if quarantine is None and gpu.quarantined is not None and gpu.quarantined.until > now:
        quarantine = gpu.quarantined  # the snapshot's own mark, still in force
    return gpu if gpu.quarantined == quarantine else dataclasses.replace(gpu, quarantined=quarantine)


def draining_after(plan: Plan, inventory: Inventory, begun: Mapping[str, Drain]) -> dict[str, Drain]:
    """The drains still under way: those the plan holds and those begun in the pass, while their copy
    still runs (a copy stopped by hand, or crashed and stopped, is forgotten). `running` and the
    hand-off's answer are dropped: the next pass asks the engine and the gateway again; `out_at` stays."""
    recorded = {(n.id, r.id) for n in inventory.nodes for r in n.replicas}
    out = {}
    for key, d in {**plan.draining, **begun}.items():
        if (d.nodes[0], d.replica) in recorded:
            out[key] = dataclasses.replace(d, running=None, note="", handed_off=False, handoff_note="")
    return dict(sorted(out.items()))


def backoff_after(before: Mapping[str, Backoff], inventory: Inventory, acted: Mapping[str, ReplicaState],
                  now: float, attempt_keys: Mapping[str, str], jitter: Callable[[], float]) -> dict[str, Backoff]:
    """How this pass's starts went, into each replica's backoff: a failed start that left no record is
    remembered with its kind; one that took (or a replica otherwise not failed) forgets it. A start
    that left a record is a crash: the plan counts those."""
    recorded = {r.id for n in inventory.nodes for r in n.replicas}
    out = dict(before)
    for rid, state in acted.items():
        tries = out.get(rid)
        if state.phase != Phase.FAILED:
            if tries is not None:
                out[rid] = tries.start_took()
            continue
        if rid in recorded or rid not in attempt_keys or not state.failure:
            continue
        out[rid] = (tries or Backoff()).start_failed(state.failure, now, attempt_keys[rid], state.message,
                                                     tuple(dict.fromkeys(a.node for a in state.nodes)), jitter)
    return dict(sorted(out.items()))


def attempt_keys(catalog: Catalog, inventory: Inventory, plan: Plan) -> dict[str, str]:
    """attempt_key of every start (and restart, replace) the plan tries, for `remember`."""
    return {a.replica: attempt_key(catalog, inventory, a) for a in plan.actions if a.placement is not None}


def draining_copy(action: Action) -> Placement | None:
    """The serving copy an action stops first, when the plan marked it to drain: a stop's ranks, a
    stop-first replace's old copy. None for a new-first replace: its old copy serves until the new one
    does, and the actor leaves it draining then (Actor.begin_drain)."""
    if not action.drain:
        return None
    if action.action == ActionKind.STOP:
        return action.placement
    if action.action == ActionKind.REPLACE and action.stop_first and action.placement is not None:
        return action.previous
    return None


def new_drain(action: Action, copy: Placement, catalog: Catalog, now: float,
              started_with: Mapping[str, StartedWith] | None = None) -> Drain:
    """A drain beginning now. A removed model's copy takes the drain_s and engine it was started with
    (PassMemory.started_with), not a default: its model's file is gone."""
    model = catalog.model(action.model)
    started = (started_with or {}).get(copy_key(action.replica, copy.nodes[0].node, copy.nodes[0].port))
    if model is not None:
        drain_s = model.drain_s
    else:
        drain_s = started.drain_s if started is not None and started.drain_s is not None else DEFAULT_DRAIN_S
    profile = model.profile(copy.profile) if model is not None else None
    engine = profile.engine if profile is not None else (started.engine if started is not None else "")
    return Drain(action.replica, action.model, tuple(a.node for a in copy.nodes), copy.nodes[0].port,
                 engine, now, now + drain_s, profile=copy.profile)


def drain_done(d: Drain, now: float) -> str | None:
    """Why a drain is over (pure), or None while it goes on. SPEC 13: never before the gateway serves
    without the copy (drain_s 0 included: it skips waiting for requests, never the hand-off); then once
    its engine runs no request, or drain_s has passed."""
    if not d.handed_off:
        return None
    if d.running is not None and d.running <= 0:
        return "the gateway serves without it and its engine runs no request"
    if now >= d.until:
        return (f"the gateway serves without it and drain_s ({d.until - d.started:g} s) has passed"
                + (f"; {d.note}" if d.note else ""))
    return None


def with_out_at(memory: PassMemory, at: float) -> PassMemory:
    """The memory with each drain whose removal from the status files was just written stamped with
    when (SPEC 13, step 1): the hand-off is counted from there, never from when the pass began."""
    if all(d.out_at is not None for d in memory.draining.values()):
        return memory
    return dataclasses.replace(memory, draining={
        k: d if d.out_at is not None else dataclasses.replace(d, out_at=at) for k, d in memory.draining.items()})


# How soon the daemon asks a draining copy's engine again while it still runs requests: a drain ends
# the pass after its last request does, not a resync interval (60 s) later.
DRAIN_RECHECK_S = 5.0


def next_drain_check(draining: Mapping[str, Drain], now: float, settle_s: float = 0.0) -> float | None:
    """When a pass should run next for the drains left going (pure, epoch seconds): each one's deadline,
    or the end of its gateway.settle_s, or sooner to ask its engine and the gateway again; None without
    drains. Never now: a drain kept past its deadline (its stop failed, a gateway that does not take the
    change) is looked at again DRAIN_RECHECK_S later, not in a loop of passes."""
    due = []
    for d in draining.values():
        times = [d.until]
        if d.out_at is not None and not d.handed_off:
            times.append(d.out_at + settle_s)
        soon = [t for t in times if now < t < now + DRAIN_RECHECK_S]
        due.append(min(soon) if soon else now + DRAIN_RECHECK_S)
    return min(due) if due else None


def hold_drains(plan: Plan, catalog: Catalog, draining: Mapping[str, Drain], now: float,
                started_with: Mapping[str, StartedWith] | None = None) -> Plan:
    """The plan with each stop of a serving copy turned into a Draining wait until the copy has drained
    (pure; SPEC sections 10 and 13). A drain begins in the pass that first decides the stop: that pass
    writes the gateway files without the replica, and a later pass stops it once the gateway serves
    without it (Drain.handed_off) and its engine (asked before the pass, Drain.running) runs no request,
    or drain_s has passed; drain_s 0 waits for the hand-off only. A crash, a node that does not answer,
    a broken GPU: the plan marks no drain (Action.drain), so no wait."""
    actions, waiting, kept = [], list(plan.waiting), {}
    for a in plan.actions:
        copy = draining_copy(a)
        if copy is None or not copy.nodes:
            actions.append(a)
            continue
        key = drain_key(a.replica, (n.node for n in copy.nodes))
        d = draining.get(key) or new_drain(a, copy, catalog, now, started_with)
        done = drain_done(d, now) if key in draining else None
        if done is not None:
            actions.append(dataclasses.replace(a, reason=f"{a.reason}; drained: {done}"))
            continue
        kept[key] = d
        if key in draining and not d.handed_off:
            step = f"waiting for the gateway to serve without it: {d.handoff_note or 'not asked yet'}"
        elif key in draining:
            load = f"{d.running:g} request{'s' * (d.running != 1)} running" if d.running is not None else d.note
            step = f"{load}; stopped once no request runs, at the latest after {utc_text(d.until)}"
        else:  # begins now: no clock time in the message, so `plan` says the same thing on every run
            step = (f"stopped once the gateway serves without it and no request runs "
                    f"(requests: at most {d.until - d.started:g} s)")
        waiting.append(Waiting(a.replica, a.model, f"draining ({a.reason}): out of every gateway file; {step}",
                               d.until, kind=WaitKind.DRAINING, nodes=d.nodes, next_step=step))
    if not kept and tuple(actions) == plan.actions:
        return plan
    return dataclasses.replace(plan, actions=tuple(actions), waiting=tuple(sorted(waiting, key=lambda w: w.replica)),
                               draining=kept)


def plan_remembering(catalog: Catalog, inventory: Inventory, *, now: float, memory: PassMemory, explain=()) -> Plan:
    """The pass's plan, against what earlier passes remember: reconcile's default planner, and what
    `plan` and `explain` call with the memory `apply` keeps, so they predict it (here, not in
    reconcile, so those commands start without importing the pass's effects: SSH, the actor)."""
    # Quarantined GPUs (the crash-loop breaker's) are unhealthy to placement until they expire. The
    # plan holds the restarts and starts that their backoff says wait (reconciler/decide/backoff.py).
    inventory = with_quarantines(inventory, memory.quarantines, now)
    planned = make_plan(
        catalog, inventory, now=now, backoff=memory.backoff, unreachable_since=memory.unreachable_since,
        last_seen=memory.last_seen, placed_on=memory.placed_on, explain=explain, rollouts=memory.rollouts,
        old_specs=old_specs(catalog, memory.rollouts),
    )
    # Serving copies to be stopped drain first (hold_drains).
    return hold_drains(planned, catalog, memory.draining, now, memory.started_with)


def old_specs(catalog: Catalog, rollouts: Mapping[str, Rollout]) -> dict[str, OldSpec]:
    """Per model whose rollout of its spec at HEAD is Aborted, the model at the rollout's from_revision
    (read from the catalog's git repository: an effect, here at the edge of the plan), or why not."""
    found: dict[str, OldSpec] = {}
    for m in catalog.models:
        r = current(m, rollouts.get(m.name))
        if r is None or r.state != RolloutPhase.ABORTED:
            continue
        if not r.from_revision:
            found[m.name] = OldSpec(None, None, "the revision the rollout rolled away from is not known")
            continue
        try:
            found[m.name] = OldSpec(model_at(catalog.root, r.from_revision, m.name), r.from_revision)
        except CatalogInvalid as exc:
            found[m.name] = OldSpec(None, r.from_revision, "; ".join(p.message for p in exc.problems))
    return found


def memory_path(catalog_root: str) -> Path:
    """Where one-shot `apply` keeps what the daemon keeps in memory (restart backoff, when a node
    became unreachable, where replicas were placed): per catalog, on this management host,
    outside the catalog (it is not desired state and must not show in `git status`)."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    key = hashlib.sha256(str(Path(catalog_root).resolve()).encode()).hexdigest()[:16]
    return base / "llm-reconciler" / "apply-memory" / f"{key}.json"


def _frozen(memory: PassMemory) -> tuple:
    """The memory's contents as a value no later change to its mappings can alter: the daemon
    saves after every pass, and an equal memory is not rendered to JSON again (write_rendered)."""
    return (tuple(sorted(memory.backoff.items())), tuple(sorted(memory.unreachable_since.items())),
            memory.last_seen, tuple(sorted(memory.placed_on.items())),
            tuple(sorted(memory.gpu_strikes.items())), tuple(sorted(memory.quarantines.items())),
            tuple(sorted(memory.draining.items())), tuple(sorted(memory.rollouts.items())),
            tuple(sorted(memory.started_with.items())))


def save_memory(path: Path, memory: PassMemory) -> None:
    """Write the memory where load_memory reads it (atomically, only on change); StatusWriteError when
    it cannot be written."""
    write_rendered(path, _frozen(memory), lambda: json.dumps(memory_to_document(memory), sort_keys=True))


def load_memory(path: Path) -> PassMemory:
    try:
        return memory_from_document(parse_json(path.read_text()))
    except (OSError, ValueError):
        return PassMemory()
