"""Why a node cannot take a profile: the filters placement applies, each a pure function of a
node's working state (capacity.NodeCapacity), the model and the profile, returning a typed
Reason (model.Reason) or None.

Static reasons (state, labels, engine, llama.cpp binaries, memory, disk, weights) hold for a
whole pass; dynamic ones (spread, free GPUs, ports) change as replicas are placed.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Sequence

from reconciler.vocabulary import NodeState
from reconciler.model import Model, Profile, Reason, RejectKind
from reconciler.decide.placement.capacity import NodeCapacity

SCHEDULABLE = NodeState.READY
# Reasons without figures, one value each.
REPLACED_COPY = Reason(RejectKind.REPLACED_COPY)
INCOMPLETE = Reason(RejectKind.INCOMPLETE)
NO_FABRIC = Reason(RejectKind.NO_FABRIC)
_IPV6_RPC = Reason(RejectKind.IPV6_RPC)


@lru_cache(maxsize=4096, typed=True)
def shared_reason(kind: RejectKind, resource: str = "", requested=None, available=None, detail: str = "",
                  held_by: str = "", unhealthy: str = "") -> Reason:
    """Reason(...), one value per distinct set of fields (typed: 8 and 8.0 are said differently). The
    nodes of a fleet fail a profile for a few dozen distinct reasons: an unplaced replica's 4,000
    rejections then share them, and each is said in words (Reason.text) once, not once per node."""
    return Reason(kind, resource, requested, available, detail, held_by, unhealthy)


def pool_name(fabric: str | None, profile: Profile) -> str:
    return f"{fabric or 'none'}/{profile.class_label}"



# --------------------------------------------------------------------------
# Keys: profiles that filter nodes alike share one per-node list and one index
# --------------------------------------------------------------------------


def without_disk(profile: Profile) -> Profile:
    """The profile without its disk requirement (the part of the filter that depends on the model)."""
    return replace(profile, min_disk_gb=0) if profile.min_disk_gb else profile


def selector_key(profile: Profile) -> tuple:
    return tuple(sorted(profile.node_selector.items()))


def base_key(profile: Profile) -> tuple:
    engine = None if profile.engine == "command" else profile.engine
    # llama.cpp's filter differs by shape: one node must run llama-server; a multi-node
    # replica takes nodes with either role (the ranks are matched to roles when choosing).
    shape = (profile.nodes > 1) if profile.engine == LLAMA_CPP else None
    return (engine, selector_key(profile), profile.min_memory_gb or 0, shape)


LLAMA_CPP = "llama.cpp"
RPC_SERVER_NAMES = "ggml-rpc-server or rpc-server"


def llama_rank_reason(binaries, rank: int) -> Reason | None:
    """Why a node cannot run this rank of a llama.cpp replica (its binaries), or None."""
    if binaries is None or binaries.can_run_rank(rank):
        return None
    if rank == 0:
        return Reason(RejectKind.LLAMA_BINARY, "llama-server", "head")
    return Reason(RejectKind.LLAMA_BINARY, RPC_SERVER_NAMES, "worker")


def weights_on_every_node(model: Model, profile: Profile) -> bool:
    """A path source without fetch is needed on every node of the replica (not only on its head)."""
    return model.needs_weights_on_node and (profile.nodes <= 1 or profile.reads_weights(1))


def weights_reason(node, model: Model) -> Reason | None:
    """A path source without `fetch` is a hard requirement, on nodes whose weights were probed."""
    if model.needs_weights_on_node and node.weights is not None and model.source not in node.weights:
        return Reason(RejectKind.WEIGHTS, model.source)
    return None


def node_rules_profile(profile: Profile) -> Profile:
    """The profile every node of a replica is filtered by. A llama.cpp replica's workers store no
    weights, so its disk requirement is asked of the head alone (head_reason), not of every node."""
    if profile.min_disk_gb and profile.nodes > 1 and not profile.reads_weights(1):
        return without_disk(profile)
    return profile


def head_reason(node, model: Model, profile: Profile) -> Reason | None:
    """Why a node cannot be the head (rank 0) of a multi-node llama.cpp replica: its binary, then
    the weights (held, when they cannot be fetched; room for them otherwise)."""
    return (llama_rank_reason(node.llama_cpp, 0) or weights_reason(node, model)
            or (disk_reason(node, model, profile) if profile.min_disk_gb else None))


def rank_reason(node, rank: int, model: Model, profile: Profile) -> Reason | None:
    """What one rank of a multi-node llama.cpp replica asks of its node beyond the profile's
    static filter (its role's binary; the weights on the head), or None."""
    if profile.engine != LLAMA_CPP or profile.nodes <= 1:
        return None
    return head_reason(node, model, profile) if rank == 0 else llama_rank_reason(node.llama_cpp, rank)


def llama_roles_reason(qualified: list, model: Model, profile: Profile, fabric: str) -> Reason:
    """Why enough qualifying nodes on a fabric still make no llama.cpp replica: the roles they can take."""
    servers = [n for n in qualified if llama_rank_reason(n.llama_cpp, 0) is None]
    holding = [n for n in servers if weights_reason(n, model) is None]
    heads = sum(1 for n in holding if head_reason(n, model, profile) is None)
    workers = sum(1 for n in qualified if llama_rank_reason(n.llama_cpp, 1) is None)
    # Only the head reads and stores the weights: the workers are fine; no node that could lead can.
    if servers and not holding:
        return Reason(RejectKind.HEAD_WEIGHTS, model.source, profile.nodes, len(servers), detail=fabric)
    if holding and not heads:
        return Reason(RejectKind.HEAD_DISK, "disk", profile.min_disk_gb, len(servers), detail=fabric)
    return Reason(RejectKind.LLAMA_ROLES, fabric, profile.nodes, len(qualified),
                  detail=f"{heads} have llama-server and {workers} the RPC server")


def assign_llama_roles(candidates: list, count: int, model: Model, profile: Profile) -> list | None:
    """Rank order for a multi-node llama.cpp replica: a head that has llama-server (and the
    weights when they cannot be fetched, room for them otherwise), then count-1 nodes that have the RPC server;
    candidates in preference order; None if impossible."""
    for head in candidates:
        if head_reason(head, model, profile) is not None:
            continue
        workers = [c for c in candidates if c is not head and llama_rank_reason(c.llama_cpp, 1) is None]
        if len(workers) >= count - 1:
            return [head] + workers[: count - 1]
    return None


def static_key(model: Model, profile: Profile) -> tuple:
    return base_key(profile) + ((profile.min_disk_gb, model.source) if profile.min_disk_gb else None,)



# --------------------------------------------------------------------------
# Static filters: the same all pass
# --------------------------------------------------------------------------


def static_reason(node: NodeCapacity, model: Model, profile: Profile) -> Reason | None:
    """Why this node can never take this profile in this pass, or None."""
    if node.state != SCHEDULABLE:
        return shared_reason(RejectKind.NODE_STATE, node.state, detail=node.state_reason)
    if profile.node_selector:  # most profiles have none: no sort of an empty map, 20,000 times a plan
        for key, want in sorted(profile.node_selector.items()):
            have = node.labels.get(key)
            if have != want:
                return shared_reason(RejectKind.LABEL, key, want, have)
    if profile.engine != "command" and node.engines is not None and profile.engine not in node.engines:
        return shared_reason(RejectKind.ENGINE, profile.engine)
    if profile.engine == LLAMA_CPP:
        if profile.nodes <= 1:
            reason = llama_rank_reason(node.llama_cpp, 0)
            if reason is not None:
                return reason
        elif node.data_ipv6:
            return _IPV6_RPC
    if profile.min_memory_gb and node.memory_gib is not None and node.memory_gib < profile.min_memory_gb:
        return shared_reason(RejectKind.MEMORY, "memory", profile.min_memory_gb, round(node.memory_gib, 1))
    if profile.min_disk_gb:
        return disk_reason(node, model, profile)
    return None


def has_room(node: NodeCapacity, profile: Profile) -> bool:
    """Room for weights on the node's model disk (or nothing known about it)."""
    return node.disk_free_gib is None or node.disk_free_gib >= profile.min_disk_gb


def _disk_ok(node: NodeCapacity, model: Model, profile: Profile) -> bool:
    """Room for the weights on the node's model disk, or the weights already there (or nothing known)."""
    free = node.disk_free_gib
    return free is None or free >= profile.min_disk_gb or (node.weights is not None and model.source in node.weights)


def disk_reason(node: NodeCapacity, model: Model, profile: Profile) -> Reason | None:
    if _disk_ok(node, model, profile):
        return None
    # Rounded down, so "needs 100" is never shown beside "has 100.0".
    have = math.floor(node.disk_free_gib * 10) / 10
    return shared_reason(RejectKind.DISK, "disk", profile.min_disk_gb, have, detail=node.disk_path)


# --------------------------------------------------------------------------
# Dynamic filters: what is taken so far
# --------------------------------------------------------------------------


def held_summary(held: Sequence[str]) -> str:
    """`2 held by other Slurm jobs: Slurm job 5 of alice` (the first three jobs named)."""
    if not held:
        return ""
    jobs = sorted(set(held))
    return f"{len(held)} held by other Slurm jobs: {', '.join(jobs[:3])}{', ...' if len(jobs) > 3 else ''}"


def unusable_summary(bad: Sequence[tuple[int, str]]) -> str:
    """`gpu3: Xid 79 at ...: GPU has fallen off the bus; gpu5: 2 uncorrected ECC errors` (the first four named)."""
    named = "; ".join(f"gpu{g}: {why}" for g, why in bad[:4])
    return named + (f"; and {len(bad) - 4} more" if len(bad) > 4 else "")


def dynamic_reason(n: NodeCapacity, model: Model, profile: Profile, exclude: frozenset,
                    *, may_share: bool = False) -> Reason | None:
    if n.id in exclude:
        return REPLACED_COPY
    if model.spread != "preferred" and model.name in n.models and not may_share:
        return Reason(RejectKind.HOSTS_MODEL, detail=n.models[model.name][0])  # a replica each: not shared
    if profile.gpu_class is not None:
        have = n.level(profile.gpu_class)
        if have < profile.gpus_per_node:
            # Asked of every node short of GPUs when a replica is unplaced: the lists are built only when
            # they can say something (the node has none of the class; it has unusable GPUs).
            other_classes = ""
            if have == 0 and profile.gpu_class not in n.total:
                other_classes = ", ".join(sorted(c for c in n.total if c != profile.gpu_class))
            held = n.held.get(profile.gpu_class, ())
            bad = [(g, why) for g, why in sorted(n.unusable.items()) if n.gpu_class.get(g) == profile.gpu_class
                   and n.busy.get(g) == why] if n.unusable else []
            # The unhealthy ones are why it fails when the node would fit with them.
            kind = RejectKind.GPU_UNHEALTHY if bad and have + len(bad) >= profile.gpus_per_node else RejectKind.GPUS
            return shared_reason(kind, profile.gpu_class, profile.gpus_per_node, have, detail=other_classes,
                                 held_by=held_summary(held), unhealthy=unusable_summary(bad))
    if n.free_port(profile.port) is None:
        return Reason(RejectKind.NO_PORT, "port", profile.port)
    return None
