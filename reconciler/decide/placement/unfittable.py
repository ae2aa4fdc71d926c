"""Models that can never fit, for `validate --inventory`: no profile would fit even on an empty
fleet with every node ready. A catalog mistake (16 GPUs per node on a fleet of 8-GPU nodes),
said as one at the field to change, instead of a replica left Pending forever."""

from __future__ import annotations

from typing import Callable, Mapping

from reconciler.errors import Problem
from reconciler.frozen import frozen
from reconciler.model import Catalog, Fleet, Inventory, NodeSpec, ObservedNode, Profile

# --------------------------------------------------------------------------


@frozen
class _NodeFacts:
    """What decides whether a node could ever hold a rank: read once per node, not once per profile
    (a 4,000-node fleet weighed for 300 profiles counted every GPU of every node 300 times)."""

    spec: NodeSpec
    obs: ObservedNode
    gpus: Mapping[str, int]  # GPU class -> how many the node has
    fabrics: tuple[str, ...]  # the fabrics it is attached to with adapters


def _facts(fleet: Fleet, inventory: Inventory) -> list[_NodeFacts]:
    out = []
    for spec in fleet.nodes:
        obs = inventory.node(spec.id)
        if obs is None:
            continue  # not in the snapshot: it can hold nothing
        gpus: dict[str, int] = {}
        for g in obs.gpus:
            cls = spec.gpu_class or g.gpu_class
            gpus[cls] = gpus.get(cls, 0) + 1
        fabrics = tuple(spec.fabrics.keys()) if spec.fabrics else tuple(f.name for f in obs.fabrics if f.hcas)
        out.append(_NodeFacts(spec, obs, gpus, fabrics))
    return out


def _can_hold(node: _NodeFacts, profile: Profile) -> bool:
    """Whether this node could take a rank of the profile with nothing running and every node ready."""
    spec, obs = node.spec, node.obs
    if any(spec.labels.get(key) != want for key, want in profile.node_selector.items()):
        return False
    if profile.engine != "command" and obs.engines is not None and profile.engine not in obs.engines:
        return False
    if profile.min_memory_gb and obs.memory_total_mb and obs.memory_total_mb / 1024 < profile.min_memory_gb:
        return False
    return profile.gpu_class is None or node.gpus.get(profile.gpu_class, 0) >= profile.gpus_per_node


def _shape(profile: Profile) -> tuple:
    """What _can_hold reads of a profile: profiles of one shape are weighed against the fleet once."""
    return (tuple(sorted(profile.node_selector.items())), profile.engine, profile.min_memory_gb,
            profile.gpu_class, profile.gpus_per_node)


def _why_never(facts: list[_NodeFacts], profile: Profile,
               holders: dict[tuple, list[_NodeFacts]]) -> tuple[str | None, str, set[str]]:
    """(None, "", nodes that can hold a rank) when the profile fits an empty fleet; else (why not, field to blame, {}).
    `holders` keeps, per profile shape, the nodes that could hold a rank of it."""
    key = _shape(profile)
    ok_nodes = holders.get(key)
    if ok_nodes is None:
        ok_nodes = holders[key] = [n for n in facts if _can_hold(n, profile)]
    if profile.nodes <= 1:
        if ok_nodes:
            return None, "", {n.spec.id for n in ok_nodes}
    else:
        per_fabric: dict[str, int] = {}
        for n in ok_nodes:
            for f in n.fabrics:
                per_fabric[f] = per_fabric.get(f, 0) + 1
        if any(c >= profile.nodes for c in per_fabric.values()):
            return None, "", {n.spec.id for n in ok_nodes}
        if ok_nodes:
            best = max(per_fabric.values(), default=0)
            return (f"profile {profile.name} needs {profile.nodes} nodes on one fabric, "
                    f"the most any fabric has that could hold a rank is {best}"), "nodes", set()
    if profile.gpu_class is not None:
        most = max((n.gpus.get(profile.gpu_class, 0) for n in facts), default=0)
        if most < profile.gpus_per_node:
            return (f"profile {profile.name} needs {profile.gpus_per_node} {profile.gpu_class} GPUs per node, "
                    f"the most any node has is {most}"), "gpus_per_node", set()
    return (f"profile {profile.name}: no node in the fleet matches its selector, engine, memory and GPUs",
            "name", set())


def unfittable_problems(
    catalog: Catalog, inventory: Inventory, locate: Callable[[str, tuple], tuple[int, int]] | None = None,
) -> list[Problem]:
    """Models that no profile could ever fit on this fleet, even with nothing running.

    Left alone these would sit Pending forever with a rejection list that reads
    like a capacity problem; they are a catalog mistake (16 GPUs per node on a
    fleet of 8-GPU nodes) and `validate --inventory` says so.

    locate(file, path) -> (line, column) places a problem at a field; a path names list items
    by their `name` (("profiles", "h100-tp16", "gpus_per_node")). Without it, problems point
    at 1:1 of the model file.
    """
    problems = []
    facts = _facts(catalog.fleet, inventory)
    holders: dict[tuple, list[_NodeFacts]] = {}
    for model in catalog.models:
        reasons = []
        blame: tuple | None = None
        hosts: set[str] = set()
        single_only = all(p.nodes <= 1 for p in model.profiles)
        for profile in model.profiles:
            why, fieldname, ok = _why_never(facts, profile, holders)
            if why is None:
                hosts |= ok
            else:
                reasons.append(why)
                if blame is None:
                    blame = ("profiles", profile.name, fieldname)
        where = model.file or f"models/{model.name}.yaml"

        def at(path: tuple) -> tuple[int, int]:
            return locate(where, path) if locate is not None else (1, 1)

        if model.profiles and len(reasons) == len(model.profiles):
            problems.append(Problem(where, *at(blame or ("profiles",)),
                                    f"model {model.name} can never be placed on this inventory: " + "; ".join(reasons)))
        elif single_only and model.spread != "preferred" and model.replicas > len(hosts):
            problems.append(Problem(
                where, *at(("replicas",)),
                f"model {model.name} asks for {model.replicas} replica{'s' * (model.replicas != 1)}, but only "
                f"{len(hosts)} node{'s' * (len(hosts) != 1)} can ever hold one "
                f"and replicas of a model never share a node (set spread: preferred to allow it)",
            ))
    return problems
