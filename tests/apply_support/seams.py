"""Stand-ins for probe, plan and render in apply tests that run before (or without) the real ones.

They are deliberately simple: the probe reads the records through the same
launcher, the planner starts what is missing and stops what is not desired,
and the renderer launches the tiny engine. The real modules are exercised by
the fleet tests.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.model import (
    Action,
    Assignment,
    Catalog,
    Fleet,
    Inventory,
    Model,
    NodeSpec,
    ObservedNode,
    Placement,
    Profile,
    RankLaunch,
    RunningRank,
    spec_hash,
)
from tests.apply_support.local import TINY_ENGINE


def local_fleet(tmp_path: Path, node_ids=("n1", "n2")) -> Fleet:
    return Fleet(tuple(
        NodeSpec(id=n, address="127.0.0.1", data_address="127.0.0.1", transport="local",
                 state_dir=str(tmp_path / f"state-{n}"))
        for n in node_ids
    ))


def tiny_model(name="m", replicas=1, *, nodes=1, args=(), start_timeout_s=30.0, profile_name="p") -> Model:
    profile = Profile(name=profile_name, engine="command", nodes=nodes, port=0, args=tuple(args),
                      start_timeout_s=start_timeout_s, command=("tiny",))
    return Model(name=name, source="/models/" + name, replicas=replicas, profiles=(profile,))


def catalog(tmp_path: Path, fleet: Fleet, *models: Model) -> Catalog:
    root = tmp_path / "catalog"
    root.mkdir(exist_ok=True)
    return Catalog(root=str(root), fleet=fleet, models=tuple(sorted(models, key=lambda m: m.name)))


def local_probe(launcher, extra: dict[str, ObservedNode] | None = None):
    """A probe that reads the managed records through the launcher (and nothing else)."""

    def probe(catalog: Catalog, transports) -> Inventory:
        fleet = catalog.fleet
        nodes = []
        for spec in fleet.nodes:
            ranks = tuple(
                RunningRank(id=r.replica, model=r.model, profile=r.profile, rank=r.rank, gpus=r.gpus,
                            port=r.port, spec_hash=r.spec_hash, nnodes=r.nnodes, pid=r.pid, alive=r.alive)
                for r in launcher.ranks(spec.id)
            )
            base = (extra or {}).get(spec.id) or ObservedNode(spec.id)
            # Like the real probe: an engine's port shows up as a port in use.
            ports = tuple(sorted(set(base.ports_in_use) | {r.port for r in ranks if r.alive}))
            nodes.append(ObservedNode(**{**base.__dict__, "id": spec.id, "replicas": ranks, "ports_in_use": ports}))
        return Inventory(tuple(nodes))

    return probe


@dataclass
class SimplePlanner:
    """placements: replica id -> list of (node, port, gpus); rank order, head first."""

    placements: dict[str, list[tuple]]
    calls: list = field(default_factory=list)

    def __call__(self, catalog: Catalog, inventory: Inventory, **_):
        self.calls.append(inventory)
        running: dict[str, list[RunningRank]] = {}
        for node in inventory.nodes:
            for r in node.replicas:
                running.setdefault(r.id, []).append(r)
        actions = []
        desired = {}
        for model in catalog.models:
            profile = model.profiles[0]
            for rid in model.replica_ids():
                desired[rid] = model
                slots = self.placements[rid]
                placement = Placement(
                    replica=rid, model=model.name, profile=profile.name, fabric=None, pool="none/cpu",
                    nodes=tuple(Assignment(node, rank, tuple(gpus), (), port) for rank, (node, port, gpus) in enumerate(slots)),
                    dist_port=slots[0][1] if len(slots) > 1 else None,
                )
                ranks = running.get(rid, [])
                if not ranks:
                    actions.append(Action("start", rid, model.name, "missing", placement))
                elif any(r.spec_hash != spec_hash(model, profile) for r in ranks):
                    actions.append(Action("replace", rid, model.name, "spec changed", placement))
        for rid, ranks in sorted(running.items()):
            if rid not in desired:
                actions.append(Action("stop", rid, ranks[0].model, "model removed from the catalog"))
        return actions


def as_plan(catalog: Catalog, inventory: Inventory, actions):
    """Bare actions wrapped as the real plan_values.Plan, so status is written by the real writer.

    A desired replica's outcome is where its action puts it, else where it runs now.
    """
    from reconciler.decide.placement import Outcome
    from reconciler.decide.plan_values import Plan

    actions = tuple(actions)
    running: dict[str, list] = {}
    for node in inventory.nodes:
        for r in node.replicas:
            running.setdefault(r.id, []).append((node.id, r))
    observed = {
        rid: Placement(rid, ranks[0][1].model, ranks[0][1].profile, None, "",
                       tuple(Assignment(n, r.rank, r.gpus, (), r.port) for n, r in sorted(ranks, key=lambda x: x[1].rank)))
        for rid, ranks in running.items()
    }
    moved = {a.replica: a.placement for a in actions if a.action in ("start", "replace", "restart")}
    outcomes = {}
    for model in catalog.models:
        for rid in model.replica_ids():
            placement = moved.get(rid) or observed.get(rid)
            outcomes[rid] = Outcome(rid, model.name, placement, kept=rid not in moved and placement is not None)
    return Plan(actions=actions, outcomes=outcomes, unplaced=tuple(o for o in outcomes.values() if o.placement is None),
                waiting=(), observed=observed, backoff={}, revision=catalog.revision)


def tiny_render(record_dir: Path):
    """Renders every rank as the tiny engine; rank > 0 is told where its head is (recorded in its argv)."""

    def render(model: Model, profile: Profile, placement: Placement, fleet: Fleet, inventory) -> list[RankLaunch]:
        head = placement.head
        head_address = fleet.node(head.node).data_address
        launches = []
        for a in placement.nodes:
            argv = [sys.executable, TINY_ENGINE, "--port", str(a.port),
                    "--record", str(record_dir / f"{placement.replica}.rank{a.rank}.json"),
                    "--head", f"{head_address}:{head.port}", "--rank", str(a.rank), *profile.args]
            launches.append(RankLaunch(
                replica=placement.replica, model=model.name, profile=profile.name, node=a.node, rank=a.rank,
                nnodes=len(placement.nodes), argv=tuple(argv), env={"REPLICA": placement.replica}, port=a.port,
                gpus=a.gpus, spec_hash=spec_hash(model, profile),
                health_path=profile.health_path if a.rank == 0 else None, start_timeout_s=profile.start_timeout_s,
            ))
        return launches

    return render
