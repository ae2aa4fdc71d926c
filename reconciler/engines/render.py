"""Rendering: a placement becomes the exact argv and environment of every rank.

This is the one path every launch takes, so the checks that keep a launch
honest live here and not in the adapters:

- every placeholder is resolved, and anything still shaped like `$NAME` or
  `${NAME}` refuses the launch (the seed's harness sent `$HEAD_ADDR` to the
  engine as text: it was accepted and failed much later, somewhere else);
- a multi-node replica never names a loopback address for its head or its
  peers, and never puts two ranks on one node (a "two-node" run on one host);
- every value stays one argv element. Nothing here quotes or joins: the argv
  travels as a JSON list in the node agent's request (on its stdin), and the
  agent execs it without a shell, so a catalog string holding `; rm -rf`,
  `$(...)`, backquotes or newlines reaches the engine literally.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Iterator, Mapping

from reconciler.engines import ADAPTERS, Peer, RankContext
from reconciler.engines.flags import describe, owned_uses
from reconciler.engines.llamacpp import llama_cpp_problems
from reconciler.engines.command import placeholder_values
from reconciler.errors import RenderError
from reconciler.model import (
    Assignment,
    Fleet,
    Inventory,
    Model,
    NodeSpec,
    Placement,
    Profile,
    RankLaunch,
    SecretRef,
    spec_hash,
)

# `$$` is an escaped dollar and is consumed first, so `$$HOME` is the text `$HOME`,
# not a placeholder. Any other `$` (`$(`, `$1`, a trailing `$`) is ordinary text.
PLACEHOLDER_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def render_replica(
    model: Model, profile: Profile, placement: Placement, fleet: Fleet, inventory: Inventory
) -> list[RankLaunch]:
    """Every rank of one replica, rank order (head first), fully rendered; RenderError when unsafe."""
    rid = placement.replica
    adapter = ADAPTERS.get(profile.engine)
    if adapter is None:
        raise RenderError(rid, f"profile {profile.name}: unknown engine {profile.engine!r}")
    nodes = _node_specs(rid, profile, placement, fleet)
    _check_topology(rid, profile, placement, nodes)
    _check_profile(rid, model, profile, adapter.owned_flags)
    if profile.engine == "llama.cpp":
        for problem in llama_cpp_problems(profile, nodes, inventory):
            raise RenderError(rid, problem)

    head = nodes[0]
    peers = tuple(
        Peer(rank=a.rank, node=a.node, address=spec.data_host, port=a.port)
        for a, spec in zip(placement.nodes, nodes)
    )
    digest = spec_hash(model, profile)
    launches = []
    for assignment, spec in zip(placement.nodes, nodes):
        observed = inventory.node(spec.id)
        ctx = RankContext(
            replica=rid,
            model=model,
            profile=profile,
            rank=assignment.rank,
            nnodes=len(placement.nodes),
            node=spec,
            assignment=assignment,
            bind_host=bind_host(spec),
            head_address=head.data_host,
            dist_port=placement.dist_port,
            peers=peers,
            cuda_visible_devices=_cuda_visible_devices(profile, assignment, inventory),
            rpc_server=observed.llama_cpp.rpc_server if observed is not None and observed.llama_cpp else None,
            cpu_count=observed.cpu_count if observed is not None else None,
        )
        argv, env, secrets = _render_rank(ctx, adapter)
        launches.append(
            RankLaunch(
                replica=rid,
                model=model.name,
                profile=profile.name,
                node=spec.id,
                rank=assignment.rank,
                nnodes=ctx.nnodes,
                argv=tuple(argv),
                env=MappingProxyType(env),
                port=assignment.port,
                gpus=tuple(assignment.gpus),
                spec_hash=digest,
                health_path=profile.health_path if ctx.is_head else None,
                start_timeout_s=profile.start_timeout_s,
                listen_timeout_s=adapter.listen_timeout_s(ctx),
                secret_env=MappingProxyType(secrets),
            )
        )
    return launches


def bind_host(node: NodeSpec) -> str:
    """What a rank's server binds.

    A loopback data address (allowed only in a single-node fleet) means "this
    machine only", so the engine binds exactly that and is not exposed.
    Otherwise the wildcard: data_address may be a DNS name or an ~/.ssh/config
    alias that cannot be bound, or a NAT'd address not on any interface, and
    the gateway and health checks may arrive on another interface than the
    fabric one. (llama.cpp's unauthenticated rpc-server is the exception; see
    engines/llamacpp.py.)
    """
    host = node.data_host
    if host.loopback_ip is not None:
        return host.loopback_ip
    return "::" if host.is_ipv6 else "0.0.0.0"


def placeholders_in(value: str) -> list[str]:
    """Names of the `$NAME` / `${NAME}` placeholders in a string (`$$` is a literal dollar)."""
    return [m.group(1) or m.group(2) for m in PLACEHOLDER_RE.finditer(value) if m.group(0) != "$$"]


def substitute(value: str, values: Mapping[str, str | None]) -> str:
    """Resolve placeholders in one value; KeyError(name) for one that is unknown or has no value.

    One pass only: a substituted value is never scanned again, so a value that
    happens to contain `$` cannot smuggle in a second expansion.
    """

    def repl(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(2)
        resolved = values.get(name)
        if resolved is None:
            raise KeyError(name)
        return resolved

    return PLACEHOLDER_RE.sub(repl, value)


# --------------------------------------------------------------------------


def _node_specs(rid: str, profile: Profile, placement: Placement, fleet: Fleet) -> list[NodeSpec]:
    if not placement.nodes:
        raise RenderError(rid, "placement has no nodes")
    if placement.profile != profile.name:
        raise RenderError(rid, f"placement is for profile {placement.profile}, not {profile.name}")
    specs = []
    for a in placement.nodes:
        spec = fleet.node(a.node)
        if spec is None:
            raise RenderError(rid, f"rank {a.rank}: node {a.node} is not in fleet.yaml")
        specs.append(spec)
    return specs


def _check_topology(rid: str, profile: Profile, placement: Placement, nodes: list[NodeSpec]) -> None:
    ranks = [a.rank for a in placement.nodes]
    if ranks != list(range(len(ranks))):
        raise RenderError(rid, f"ranks must be 0..{len(ranks) - 1} in order, got {ranks}")
    if len(ranks) != profile.nodes:
        raise RenderError(rid, f"profile {profile.name} asks for {profile.nodes} nodes, placement has {len(ranks)}")
    for a in placement.nodes:
        if len(a.gpus) != profile.gpus_per_node:
            raise RenderError(
                rid, f"rank {a.rank} on {a.node}: placed {len(a.gpus)} GPUs, profile {profile.name} needs {profile.gpus_per_node}"
            )
        if a.port <= 0:
            raise RenderError(rid, f"rank {a.rank} on {a.node}: no port assigned")
    if len(ranks) == 1:
        return
    seen: dict[str, int] = {}
    for a in placement.nodes:
        if a.node in seen:
            raise RenderError(
                rid, f"ranks {seen[a.node]} and {a.rank} are both on node {a.node}; a multi-node replica needs distinct nodes"
            )
        seen[a.node] = a.rank
    by_address: dict[str, str] = {}
    for spec in nodes:
        other = by_address.setdefault(spec.data_host.canonical, spec.id)
        if other != spec.id:
            raise RenderError(
                rid, f"nodes {other} and {spec.id} share data address {spec.data_address}; the ranks would land on one host"
            )
    for a, spec in zip(placement.nodes, nodes):
        if spec.data_host.is_loopback:
            role = "head" if a.rank == 0 else f"rank {a.rank}"
            raise RenderError(
                rid,
                f"{role} address {spec.data_address} of node {spec.id} is loopback; the other ranks of a "
                "multi-node replica would connect to themselves (set data_address in fleet.yaml)",
            )
    if profile.engine in ("vllm", "sglang") and placement.dist_port is None:
        raise RenderError(rid, "multi-node replica has no rendezvous port (dist_port) on its head")
    if placement.dist_port is not None and placement.dist_port == placement.head.port:
        raise RenderError(rid, f"rendezvous port {placement.dist_port} is also the head's serving port")


def _check_profile(rid: str, model: Model, profile: Profile, owned: frozenset[str]) -> None:
    clash = owned_uses(profile.engine, profile.args, owned)
    if clash:
        raise RenderError(
            rid, f"profile {profile.name}: args set {', '.join(describe(u) for u in clash)}, which the reconciler sets for each rank"
        )
    if profile.engine == "command":
        if not profile.command:
            raise RenderError(rid, f"profile {profile.name}: engine command needs a command")
    elif model.source.startswith("-"):
        # A leading dash would be read by the engine as a flag, not as the weights.
        raise RenderError(rid, f"source {model.source!r} starts with '-', which {profile.engine} would read as a flag")


def _cuda_visible_devices(profile: Profile, assignment: Assignment, inventory: Inventory) -> str:
    if profile.cpu_only:
        return ""
    observed = inventory.node(assignment.node)
    uuids = {g.index: g.uuid for g in observed.gpus} if observed else {}
    if all(uuids.get(i) for i in assignment.gpus):
        return ",".join(uuids[i] for i in assignment.gpus)
    return ",".join(str(i) for i in assignment.gpus)


def _base_env(ctx: RankContext) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": ctx.cuda_visible_devices}
    # NCCL/Gloo choose their bootstrap socket by interface NAME; the catalog gives an
    # address, and which interface holds it is only known on the node. So these are
    # set only when fleet.yaml names the interface (socket_ifname); otherwise NCCL's
    # own choice stands (it skips lo and docker*), and vLLM gets VLLM_HOST_IP. A CPU-only
    # rank needs them as much: vLLM's CPU build talks Gloo between nodes, and Gloo
    # without GLOO_SOCKET_IFNAME binds where the host name resolves, often loopback.
    if ctx.multi_node and ctx.node.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = ctx.node.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = ctx.node.socket_ifname
    # A CPU-only rank gets an empty CUDA_VISIBLE_DEVICES: placement gave it no
    # GPU, and a CUDA build of an engine would otherwise grab one anyway.
    if ctx.profile.cpu_only:
        return env
    if ctx.cuda_visible_devices == ",".join(str(i) for i in ctx.assignment.gpus):
        # Indices come from nvidia-smi, which numbers GPUs in PCI bus order; CUDA's
        # default order is "fastest first", so without this index 0 may be another card.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if ctx.assignment.hcas:
        # `=` asks NCCL for exact names: a bare `mlx5_1` is a prefix and would also
        # select mlx5_10..mlx5_17, HCAs of another fabric on a large node.
        env["NCCL_IB_HCA"] = "=" + ",".join(ctx.assignment.hcas)
    return env


def _render_rank(ctx: RankContext, adapter) -> tuple[list[str], dict[str, str], dict[str, SecretRef]]:
    rid, profile = ctx.replica, ctx.profile
    where = f"rank {ctx.rank} on {ctx.node.id}"
    argv = adapter.argv(ctx)
    ours = _base_env(ctx)
    ours.update(adapter.env(ctx))
    # Secret references are resolved by the launcher at launch (never here: render is pure and its
    # output is logged); they only have to be names the engine can receive and not clash with ours.
    secrets = {k: v for k, v in profile.env.items() if isinstance(v, SecretRef)}
    user_env = {k: v for k, v in profile.env.items() if not isinstance(v, SecretRef)}
    _check_secret_names(rid, where, profile, secrets, ours)
    if profile.engine == "command":
        argv, user_env = _substituted(ctx, where, argv, user_env)
    else:
        # Belt and braces: no engine resolves placeholders outside `command`, so
        # anything placeholder-shaped in the final argv is a launch refused.
        for i, v in enumerate(argv):
            _refuse_placeholders(rid, where, f"argv[{i}]", v)
        for k, v in user_env.items():
            _refuse_placeholders(rid, where, f"env {k}", v)
    for k, v in ours.items():
        _refuse_placeholders(rid, where, f"env {k}", v)
    env = _merged_env(rid, where, profile, ours, user_env)
    _check_argv(rid, where, argv)
    return argv, env, secrets


def _check_secret_names(rid: str, where: str, profile: Profile, secrets: Mapping[str, SecretRef],
                        ours: Mapping[str, str]) -> None:
    for k, ref in secrets.items():
        if k in ours:
            raise RenderError(rid, f"{where}: profile {profile.name} sets env {k} to {ref}, but the reconciler sets "
                                   f"{k} for this placement")
        if not ENV_NAME_RE.match(k):
            raise RenderError(rid, f"{where}: env name {k!r} is not a valid variable name")


def _substituted(ctx: RankContext, where: str, argv: list[str],
                 user_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """A command profile's argv and env with their placeholders resolved for this rank."""
    rid = ctx.replica
    values = placeholder_values(ctx)
    for name, value in values.items():
        if value is not None and placeholders_in(value):
            raise RenderError(
                rid, f"{where}: value of ${{{name}}} ({value!r}) itself holds placeholder ${placeholders_in(value)[0]}"
            )
    argv = [_resolve(rid, where, f"command[{i}]", v, values) for i, v in enumerate(argv)]
    return argv, {k: _resolve(rid, where, f"env {k}", v, values) for k, v in user_env.items()}


def _merged_env(rid: str, where: str, profile: Profile, ours: Mapping[str, str],
                user_env: Mapping[str, str]) -> dict[str, str]:
    """The reconciler's variables and the profile's; a profile may not set one of ours differently."""
    for k, v in user_env.items():
        if k in ours and ours[k] != v:
            raise RenderError(
                rid, f"{where}: profile {profile.name} sets env {k}={v!r}, but the reconciler sets it to {ours[k]!r} for this placement"
            )
    env = {**ours, **user_env}
    for k, v in env.items():
        if not ENV_NAME_RE.match(k):
            raise RenderError(rid, f"{where}: env name {k!r} is not a valid variable name")
        if "\x00" in v:
            raise RenderError(rid, f"{where}: env {k} holds a NUL byte, which no process can receive")
    return env


def _check_argv(rid: str, where: str, argv: list[str]) -> None:
    for i, v in enumerate(argv):
        if "\x00" in v:
            raise RenderError(rid, f"{where}: argv[{i}] holds a NUL byte, which no process can receive")
    if not argv or not argv[0]:
        raise RenderError(rid, f"{where}: empty command")


def _resolve(rid: str, where: str, field: str, value: str, values: Mapping[str, str | None]) -> str:
    try:
        return substitute(value, values)
    except KeyError as exc:
        name = exc.args[0]
        if name in values:
            reason = f"placeholder ${{{name}}} has no value for this replica (in {field})"
        else:
            reason = f"unresolved placeholder ${{{name}}} in {field}; known placeholders: " + ", ".join(
                "${" + k + "}" for k in values
            )
        raise RenderError(rid, f"{where}: {reason}") from None


def _refuse_placeholders(rid: str, where: str, field: str, value: str) -> None:
    names = list(_placeholder_spellings(value))
    if names:
        raise RenderError(
            rid,
            f"{where}: unresolved placeholder {names[0]} in {field}; placeholders are resolved only in a "
            "command profile's command and env",
        )


def _placeholder_spellings(value: str) -> Iterator[str]:
    for m in PLACEHOLDER_RE.finditer(value):
        if m.group(0) != "$$":
            yield m.group(0)
