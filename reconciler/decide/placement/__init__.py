"""Which nodes and GPUs each replica runs on, or every reason it cannot run anywhere.

Pure: a function of the catalog, the fleet, an inventory snapshot and the
replicas already running. No I/O, no clock, deterministic (ties go to the
lowest node id).

Two rules here are not negotiable, and the rest of this module exists to keep
them true:

- a multi-node replica never spans two fabrics (only that fabric's HCAs are
  handed out), and
- a tensor-parallel group never mixes GPU classes.

Breaking either gives a replica that starts, passes its health check and then
hangs or crawls under load: it looks like success until traffic arrives.

Every candidate that was considered and discarded gets a Rejection naming the
profile, the pool, the node and the number that failed. "No suitable nodes"
with no reason is the failure people complain about most in schedulers of
this kind, so a rejection is never a bare "does not fit".

At fleet scale (thousands of nodes, ten thousand replicas) the search must not
scan every node for every replica. Nodes are indexed per (static filter, GPU
class, fabric[, weights held]) into buckets by free GPUs (or by replicas
hosted, for CPU-only work), each bucket kept sorted by node id, so the bin
packing choice is the first eligible node of the lowest bucket that fits.
Per-node rejection lists are only built when a replica could not be placed
(or when explain asks for them), and only once per model: the next unplaced
replica of the same model failed against the same state.

The modules, top first (each imports only from those below it; .importlinter holds it):

    placer, summary,   the Placer: indexes, bookkeeping, choosing, committing, place();
    unfittable         rejections as one line per profile, nodes grouped by kind;
                       models that can never fit this fleet (validate --inventory)
    rejections,        every node weighed for a profile and why it was discarded; the nodes that
    indexes            pass a profile's static filters, bucketed by free GPUs and kept current
    rules              why a node cannot take a profile: pure filters returning typed Reasons
    capacity           each node's working state in a pass; nodes bucketed by free GPUs

Callers import from the package (`from reconciler.decide.placement import place`), not the modules.
"""

from reconciler.decide.placement.capacity import MAX_PORT
from reconciler.decide.placement.placer import (
    DIST_PORT_BASE,
    PORT_SEARCH_SPAN,
    Outcome,
    PlacementResult,
    Placer,
    place,
    placement_order,
    port_windows,
)
from reconciler.decide.placement.rules import LLAMA_CPP, RPC_SERVER_NAMES, held_summary, llama_rank_reason, pool_name
from reconciler.decide.placement.summary import SUMMARY_NAMES, reason_groups, summarize
from reconciler.decide.placement.unfittable import unfittable_problems

__all__ = [
    "DIST_PORT_BASE", "LLAMA_CPP", "MAX_PORT", "PORT_SEARCH_SPAN", "RPC_SERVER_NAMES", "SUMMARY_NAMES",
    "Outcome", "PlacementResult", "Placer", "held_summary", "llama_rank_reason", "place",
    "placement_order", "pool_name", "port_windows", "reason_groups", "summarize", "unfittable_problems",
]
