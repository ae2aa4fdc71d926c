"""What an engine adapter is given, and what it must answer.

An adapter turns one rank of one replica into an argv and the engine's own
environment variables. It does no I/O and no checking of its own: the
renderer (reconciler/engines/render.py) builds the RankContext, runs the adapter and
then applies every check to the result, so no launch can skip them.
"""

from __future__ import annotations

from typing import Protocol

from reconciler.frozen import frozen
from reconciler.host import Host
from reconciler.model import Assignment, Model, NodeSpec, Profile


@frozen
class Peer:
    """Where one rank of the replica can be reached by the others."""

    rank: int
    node: str
    address: Host  # the node's data address (fleet.yaml)
    port: int


@frozen
class RankContext:
    replica: str
    model: Model
    profile: Profile
    rank: int
    nnodes: int
    node: NodeSpec
    assignment: Assignment
    bind_host: str  # what the rank's listening sockets bind (see render.bind_host)
    head_address: Host  # the head node's data address
    dist_port: int | None  # rendezvous port on the head, multi-node only
    peers: tuple[Peer, ...]  # every rank, rank order; peers[0] is the head
    cuda_visible_devices: str  # "" for a CPU-only rank
    # What the node was observed to have (None: not probed): llama.cpp's RPC server name, CPU count.
    rpc_server: str | None = None
    cpu_count: int | None = None

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def total_gpus(self) -> int:
        return self.profile.gpus_per_node * self.nnodes


class EngineAdapter(Protocol):
    name: str
    # Flags the reconciler sets itself, by their canonical names in the engine's parser
    # (engines/flags.py): a profile's args may not set them too, under any spelling the
    # engine accepts, or the engine would take whichever came last and the plan would lie.
    owned_flags: frozenset[str]

    def argv(self, ctx: RankContext) -> list[str]: ...

    def env(self, ctx: RankContext) -> dict[str, str]: ...

    def listen_timeout_s(self, ctx: RankContext) -> float | None:
        """How long a rank's start may wait for it to listen before the next rank starts (None: no wait)."""
