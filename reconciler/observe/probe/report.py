"""A node's probe report -> ObservedNode, joined with the operator's intent from fleet.yaml
(labels, cordoned/drained, fabric declarations, GPU class override). Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from reconciler.agent_keys import Record
from reconciler.model import (
    Disk,
    FabricAttachment,
    Gpu,
    GpuProcess,
    LlamaCppBinaries,
    NodeSpec,
    ObservedNode,
    RunningRank,
    frozen_map,
)
from reconciler.observe.probe.parse import DEFAULT_GID_PREFIX, fabric_name_for_prefix, gpu_class
from reconciler.vocabulary import CheckResult, FailureKind, GpuHealth, NodeState


def _int(v, default=0) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def map_fabrics(spec: NodeSpec, hcas: Sequence[Mapping] | None, warnings: list[str]) -> tuple[FabricAttachment, ...]:
    """HCAs to fabrics: by the fleet's declarations, else by a non-default GID subnet prefix.

    A declared HCA is attached when the node has it; one the node lacks is
    left out, with a warning. When the node has no InfiniBand class at all
    (hcas is None) there is no fact to contradict the declaration, so it is
    kept as declared. Undeclared ACTIVE InfiniBand ports whose subnet prefix
    is not the default join a fabric named after the prefix (`ib-fec0-0-0-1`):
    ports sharing a configured prefix are on one subnet manager's fabric.
    """
    attached: dict[str, list[str]] = {}
    if hcas is None:
        for name, declared in spec.fabrics.items():
            attached[name] = list(declared)
        if spec.fabrics:
            warnings.append("no /sys/class/infiniband on the node: fabric declarations taken as written")
        return tuple(FabricAttachment(n, tuple(h)) for n, h in sorted(attached.items()))
    present = {}
    for port in hcas:
        present.setdefault(port.get("hca"), []).append(port)
    declared_hcas = set()
    for name, declared in sorted(spec.fabrics.items()):
        for hca in declared:
            declared_hcas.add(hca)
            if hca in present:
                attached.setdefault(name, []).append(hca)
            else:
                warnings.append(f"fabric {name}: HCA {hca} is declared but not present on the node")
    for hca, ports in sorted(present.items()):
        if hca in declared_hcas or hca is None:
            continue
        for port in ports:
            prefix = port.get("subnet_prefix")
            if (
                port.get("state") == "ACTIVE"
                and str(port.get("link_layer", "")).lower() == "infiniband"
                and prefix
                and prefix != DEFAULT_GID_PREFIX
            ):
                fabric = attached.setdefault(fabric_name_for_prefix(prefix), [])
                if hca not in fabric:
                    fabric.append(hca)
    return tuple(FabricAttachment(n, tuple(h)) for n, h in sorted(attached.items()))


def _rank(rec: Mapping) -> RunningRank:
    return RunningRank(
        id=str(rec[Record.ID]),
        model=str(rec[Record.MODEL]),
        profile=str(rec[Record.PROFILE]),
        rank=_int(rec.get(Record.RANK)),
        gpus=tuple(int(g) for g in rec.get(Record.GPUS) or ()),
        port=_int(rec.get(Record.PORT)),
        spec_hash=str(rec.get(Record.SPEC_HASH, "")),
        nnodes=_int(rec.get(Record.NNODES), 1),
        pid=rec.get(Record.PID) if isinstance(rec.get(Record.PID), int) else None,
        alive=bool(rec.get(Record.ALIVE)),
        revision=rec.get(Record.REVISION) if isinstance(rec.get(Record.REVISION), str) else None,
    )


def is_own(rec: Mapping, owner: str | None) -> bool:
    """Whether a process record is this catalog's (SPEC 7 Ownership). A record without an owner
    predates ownership and belongs to whichever catalog runs its replica; owner None: all are."""
    return owner is None or rec.get(Record.OWNER) in (None, owner)


def observed_from_report(spec: NodeSpec, report: Mapping, *, owner: str | None = None) -> tuple[ObservedNode, list[str]]:
    """Join one node's probe report with its fleet.yaml entry. Pure.

    Another owner's records are not replicas of this catalog: never stopped, adopted or
    counted; the GPUs and the port of each of its live ranks are reported taken.
    """
    # What a node says is kept bounded: a few dozen warnings of a few hundred characters.
    warnings = [str(w)[:500] for w in list(report.get("warnings") or ())[:50]]
    gpus = _lost_named(_gpus(spec, report, warnings))
    replicas, foreign = _split_records(report, owner, warnings)
    gpus = _with_foreign_processes(gpus, foreign)
    state, reason, failure = _gpu_verdict(spec, report)
    engines = report.get("engines")
    weights = report.get("weights")
    node = ObservedNode(
        id=spec.id,
        state=state,
        reason=reason,
        failure=failure,
        labels=spec.labels,
        memory_total_mb=report.get("memory_total_mb") if isinstance(report.get("memory_total_mb"), int) else None,
        engines=None if not isinstance(engines, dict) else frozen_map({str(k): str(v or "") for k, v in sorted(engines.items())}),
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        fabrics=map_fabrics(spec, report.get("hcas"), warnings),
        disks=tuple(
            Disk(str(d["path"]), _int(d.get("free_bytes")), _int(d.get("total_bytes"))) for d in report.get("disks") or ()
        ),
        weights=None if weights is None else tuple(sorted(str(w) for w in weights)),
        replicas=tuple(sorted(replicas, key=lambda r: (r.id, r.rank))),
        ports_in_use=tuple(sorted(set(int(p) for p in report.get("ports_in_use") or ())
                                  | {r.port for r, _ in foreign if r.port})),
        llama_cpp=_llama_cpp(report.get("llama_cpp")),
        cpu_count=_positive_int(report.get("cpu_count")),
        health_checks=_health_checks(report.get("health_checks")),
    )
    return node, warnings


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _gpus(spec: NodeSpec, report: Mapping, warnings: list[str]) -> list[Gpu]:
    """The report's GPUs; an entry that cannot be read is left out, with a warning."""
    gpus = []
    for g in report.get("gpus") or ():
        try:
            gpus.append(_gpu(spec, g))
        except (KeyError, TypeError, ValueError) as exc:
            warnings.append(f"unreadable GPU entry in the probe report: {exc}")
    return gpus


def _gpu(spec: NodeSpec, g: Mapping) -> Gpu:
    total = _int(g.get("memory_total_mb"))
    health, reason = _health(g)
    if int(g["index"]) in spec.cordon_gpus:
        reason = "; ".join(r for r in (reason, CORDONED_REASON) if r)
    return Gpu(
        index=int(g["index"]),
        uuid=str(g.get("uuid", "")),
        name=str(g.get("name", "")),
        gpu_class=spec.gpu_class or gpu_class(str(g.get("name", "")), total),
        memory_total_mb=total,
        memory_used_mb=_int(g.get("memory_used_mb")),
        nvlink_peers=tuple(sorted(int(p) for p in g.get("nvlink_peers") or ())),
        processes=tuple(
            GpuProcess(int(p["pid"]), str(p.get("name", "")), _int(p.get("used_mb")))
            for p in g.get("processes") or ()
        ),
        health=health,
        health_reason=reason,
        xid_info=tuple(_said(x, 200) for x in list(g.get("xid_info") or ())[:3]),
    )


CORDONED_REASON = "cordoned in fleet.yaml"


def _said(text, limit: int) -> str:
    """What a node said, kept to one printable line."""
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in str(text)[:limit])


def _health(g: Mapping) -> tuple[GpuHealth, str]:
    """The node's verdict on one GPU. A word that is not a verdict is no verdict: the GPU is taken
    as unhealthy with that said, never as healthy (the probe that would have said ok did not)."""
    said = g.get("health", GpuHealth.OK)
    reason = _said(g.get("health_reason", "") or "", 300)
    try:
        health = GpuHealth(said)
    except ValueError:
        return GpuHealth.UNHEALTHY, f"the probe reported health {_said(said, 40)!r}"
    if health != GpuHealth.OK and not reason:
        reason = f"the probe reported it {health}"
    return health, reason if health != GpuHealth.OK else ""


def _health_checks(reported) -> Mapping[str, str] | None:
    if not isinstance(reported, dict):
        return None
    checks = {}
    for name in ("ecc", "remap", "xid"):
        try:
            checks[name] = CheckResult(reported.get(name, CheckResult.UNREADABLE))
        except ValueError:
            checks[name] = CheckResult.UNREADABLE
    return frozen_map(checks)


def _lost_named(gpus: list[Gpu]) -> list[Gpu]:
    """A GPU the driver cannot name (lost, or no handle) has no name: on a node whose other GPUs are
    all one model (the common case) it takes theirs, so a rejection counts it among that class's GPUs."""
    names = {(g.name, g.gpu_class, g.memory_total_mb) for g in gpus if g.name and g.memory_total_mb}
    if len(names) != 1 or all(g.name for g in gpus):
        return gpus
    (name, cls, total), = names
    return [replace(g, name=name, gpu_class=cls, memory_total_mb=total) if not g.name else g for g in gpus]


def _split_records(report: Mapping, owner: str | None,
                   warnings: list[str]) -> tuple[list[RunningRank], list[tuple[RunningRank, str]]]:
    """The node's process records: (this catalog's ranks, [(another owner's live rank, who it is)])."""
    ours: list[RunningRank] = []
    foreign: list[tuple[RunningRank, str]] = []
    for rec in report.get("replicas") or ():
        try:
            rank = _rank(rec)
        except (KeyError, TypeError, ValueError) as exc:
            warnings.append(f"managed-process record {rec.get(Record.FILE, '?')} lacks {exc}")
            continue
        if is_own(rec, owner):
            ours.append(rank)
        elif rank.alive:
            foreign.append((rank, f"{rank.id} rank {rank.rank} of owner {str(rec.get(Record.OWNER))[:40]}"))
    return ours, foreign


def _with_foreign_processes(gpus: list[Gpu], foreign: Sequence[tuple[RunningRank, str]]) -> list[Gpu]:
    """Each GPU another owner's live rank holds carries that rank as a process (taken, to placement)."""
    for rank, who in foreign:
        for i, g in enumerate(gpus):
            if g.index in rank.gpus and not any(p.pid == rank.pid for p in g.processes):
                gpus[i] = replace(g, processes=g.processes + (GpuProcess(rank.pid or 0, who, 0),))
    return gpus


def _gpu_verdict(spec: NodeSpec, report: Mapping) -> tuple[str, str, str]:
    """(state, reason, failure) of the node, given what its probe said about its GPUs."""
    gpu_error = report.get("gpu_error")
    if not gpu_error:
        return spec.state, "", ""
    # nvidia-smi is there but said nothing usable (garbage, a hang): the node's GPUs are
    # unknown, not absent. Placing on it as a GPU-less node would be a guess; what runs
    # there stays (its records were read), nothing new goes there.
    said = "".join(c if c.isascii() and c.isprintable() else "?" for c in str(gpu_error)[:300])
    return (NodeState.UNUSABLE if spec.state == NodeState.READY else spec.state), f"GPUs unknown: {said}", FailureKind.PERMANENT


def _llama_cpp(reported) -> LlamaCppBinaries | None:
    if not isinstance(reported, dict):
        return None
    rpc = reported.get("rpc_server")
    return LlamaCppBinaries(server=reported.get("server") is True, rpc_server=rpc if isinstance(rpc, str) and rpc else None)
