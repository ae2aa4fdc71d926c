"""The order a pass's actions need when they run at once, and the buffers their effects go to.

Pure: `action_dependencies` reads the actions and the probed snapshot only. An
action waits for the earlier ones about the same replica, and for those that
take or free a GPU or a port it takes or frees (a stop that frees GPUs before
the start that takes them); nothing else orders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Sequence

from reconciler.model import Action, Inventory, RankKey, RankLaunch
from reconciler.decide.outcomes import Decision
from reconciler.observe.snapshot import RankRecords, ranks_by_replica

# Actions carried out at once; each holds a thread while its commands wait on their nodes' deadlines.
MAX_PARALLEL_ACTIONS = 16


@dataclass
class Effects:
    """What actions did to the fleet, in the order they did it (one buffer per action while they run)."""

    decisions: list[Decision] = field(default_factory=list)
    started: list[RankLaunch] = field(default_factory=list)
    stopped: list[RankKey] = field(default_factory=list)
    pids: dict[RankKey, int] = field(default_factory=dict)
    taken_ports: dict[str, set[int]] = field(default_factory=dict)
    adopted_revisions: dict[RankKey, str | None] = field(default_factory=dict)
    unanswered: dict[str, str] = field(default_factory=dict)  # node -> why: it did not answer a stop

    def merge(self, other: "Effects") -> None:
        self.decisions += other.decisions
        self.started += other.started
        self.stopped += other.stopped
        self.pids.update(other.pids)
        for node, ports in other.taken_ports.items():
            self.taken_ports.setdefault(node, set()).update(ports)
        self.adopted_revisions.update(other.adopted_revisions)
        for node, why in other.unanswered.items():
            self.unanswered.setdefault(node, why)


def action_dependencies(actions: Sequence[Action], inventory: Inventory,
                        scheduled_nodes: Collection[str] = ()) -> list[tuple[int, ...]]:
    """For each action, the earlier actions it waits for: those about the same replica, and those
    that take or free (stop) a GPU or a port it takes or frees. Pure; one walk, so a first pass
    with thousands of starts costs what it reads.

    scheduled_nodes: nodes a scheduler launches on (`launcher: slurm`). Its controller hands out
    GPUs in the order jobs arrive, so actions there are submitted in the plan's order, as before;
    a controller answers for every node at once, so this orders them without waiting on a node."""
    records = ranks_by_replica(inventory)
    scheduled = frozenset(scheduled_nodes)
    last: dict[tuple, int] = {}  # resource -> the latest action that touched it
    after = []
    for i, action in enumerate(actions):
        keys = _resources(action, records)
        if scheduled and any(k[0] in ("gpu", "port") and k[1] in scheduled for k in keys):
            keys.add(("scheduler",))
        after.append(tuple(sorted({last[k] for k in keys if k in last})))
        for k in keys:
            last[k] = i
    return after


def _resources(action: Action, records: dict[str, RankRecords]) -> set[tuple]:
    """The replica, and every GPU and port an action may take (its placement) or free (the copy
    it supersedes, and whatever the probe found of the replica)."""
    keys: set[tuple] = {("replica", action.replica)}
    for placement in (action.placement, action.previous):
        if placement is None:
            continue
        for a in placement.nodes:
            keys.update(("gpu", a.node, g) for g in a.gpus)
            keys.add(("port", a.node, a.port))
        if placement.dist_port is not None and placement.nodes:
            keys.add(("port", placement.nodes[0].node, placement.dist_port))
    for node, rank in records.get(action.replica, ()):
        keys.update(("gpu", node.id, g) for g in rank.gpus)
        keys.add(("port", node.id, rank.port))
    return keys
