"""Models that can never fit, for `validate --inventory`: no profile would fit even on an empty
fleet with every node ready. A catalog mistake (16 GPUs per node on a fleet of 8-GPU nodes),
said as one at the field to change, instead of a replica left Pending forever."""

from __future__ import annotations

from typing import Callable

from reconciler.errors import Problem
from reconciler.model import Catalog, Fleet, Inventory, ObservedNode, Profile

# --------------------------------------------------------------------------


def _hardware_reason(spec, obs: ObservedNode | None, profile: Profile) -> str | None:
    """Why this node could not take the profile even with nothing running and every node ready."""
    if obs is None:
        return "not in the snapshot"
    for key, want in profile.node_selector.items():
        if spec.labels.get(key) != want:
            return f"lacks label {key}={want}"
    if profile.engine != "command" and obs.engines is not None and profile.engine not in obs.engines:
        return f"lacks {profile.engine}"
    if profile.min_memory_gb and obs.memory_total_mb and obs.memory_total_mb / 1024 < profile.min_memory_gb:
        return "too little memory"
    if profile.gpu_class is not None:
        n = sum(1 for g in obs.gpus if (spec.gpu_class or g.gpu_class) == profile.gpu_class)
        if n < profile.gpus_per_node:
            return f"has {n} {profile.gpu_class} GPUs"
    return None


def _why_never(fleet: Fleet, inventory: Inventory, profile: Profile) -> tuple[str | None, str, set[str]]:
    """(None, "", nodes that can hold a rank) when the profile fits an empty fleet; else (why not, field to blame, {})."""
    ok_nodes = []
    for spec in fleet.nodes:
        obs = inventory.node(spec.id)
        if _hardware_reason(spec, obs, profile) is None:
            ok_nodes.append((spec, obs))
    if profile.nodes <= 1:
        if ok_nodes:
            return None, "", {s.id for s, _ in ok_nodes}
    else:
        per_fabric: dict[str, int] = {}
        for spec, obs in ok_nodes:
            names = spec.fabrics.keys() if spec.fabrics else [f.name for f in obs.fabrics if f.hcas]
            for f in names:
                per_fabric[f] = per_fabric.get(f, 0) + 1
        if any(c >= profile.nodes for c in per_fabric.values()):
            return None, "", {s.id for s, _ in ok_nodes}
        if ok_nodes:
            best = max(per_fabric.values(), default=0)
            return (f"profile {profile.name} needs {profile.nodes} nodes on one fabric, "
                    f"the most any fabric has that could hold a rank is {best}"), "nodes", set()
    if profile.gpu_class is not None:
        most = 0
        for spec in fleet.nodes:
            obs = inventory.node(spec.id)
            if obs is not None:
                most = max(most, sum(1 for g in obs.gpus if (spec.gpu_class or g.gpu_class) == profile.gpu_class))
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
    for model in catalog.models:
        reasons = []
        blame: tuple | None = None
        hosts: set[str] = set()
        single_only = all(p.nodes <= 1 for p in model.profiles)
        for profile in model.profiles:
            why, fieldname, ok = _why_never(catalog.fleet, inventory, profile)
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
