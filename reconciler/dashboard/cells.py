"""The fleet grid's cells: what one GPU is doing, judged from its entry in nodes.yaml (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Mapping

from reconciler.vocabulary import GpuHealth

CORDONED_REASON = "cordoned in fleet.yaml"  # SPEC section 9: how a fleet.yaml `cordon_gpus` entry is reported


class GpuUse(StrEnum):
    """A fleet grid cell's colour: what one GPU is doing, worst first (SPEC sections 3 and 9)."""

    UNHEALTHY = "unhealthy"  # health unhealthy or lost
    QUARANTINED = "quarantined"  # the crash-loop breaker's, until a time
    CORDONED = "cordoned"  # fleet.yaml's cordon_gpus
    HELD = "held"  # a replica's rank holds it (running, or placed by this pass)
    FOREIGN = "foreign"  # a process the reconciler did not start uses it
    FREE = "free"


GPU_USES = tuple(GpuUse)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a third of a 4,000-node index
class GpuCell:
    """One GPU of the grid. Only `use` and the holder are computed for every GPU of the fleet; the
    text of a cell is computed when a page shows it (a page shows 100 nodes, not 4,000)."""

    index: Any
    use: GpuUse
    holder: str  # the replica holding it, "" if none
    rank: int
    holder_phase: str
    reason: str  # health or quarantine reason
    doc: dict  # the GPU's entry in nodes.yaml

    @property
    def used_mb(self) -> int | None:
        return _mb(self.doc.get("memory_used_mb"))

    @property
    def total_mb(self) -> int | None:
        return _mb(self.doc.get("memory_total_mb"))

    @property
    def allocated_mb(self) -> int | None:
        return _mb(self.doc.get("allocated_mb"))

    @property
    def used_pct(self) -> int:
        """Used VRAM in 5 % steps: a bar's width is a class (p0 .. p100), the CSP allows no inline style."""
        return _pct(self.used_mb, self.total_mb)

    @property
    def allocated_pct(self) -> int:
        return _pct(self.allocated_mb, self.total_mb)

    @property
    def text(self) -> str:
        return self.holder or str(self.use)

    @property
    def title(self) -> str:
        g = self.doc
        lines = [f"GPU {self.index}: {g.get('name') or g.get('class') or ''}".rstrip(), f"state: {self.use}"]
        if self.holder:
            lines.append(f"held by {self.holder} (rank {self.rank}{', ' + self.holder_phase if self.holder_phase else ''})")
        if self.reason:
            lines.append(self.reason)
        for p in _processes(g):
            lines.append(f"foreign process {p.get('name')} (pid {p.get('pid')}, {p.get('used_mb')} MiB)")
        if self.total_mb is not None:
            used = self.used_mb if self.used_mb is not None else "?"
            alloc = f", allocated {self.allocated_mb} MiB" if self.allocated_mb is not None else ""
            lines.append(f"VRAM used {used} of {self.total_mb} MiB{alloc}")
        return "\n".join(lines)


def _pct(part: int | None, whole: int | None) -> int:
    if not part or not whole:
        return 0
    return min(100, max(5, round(part * 20 / whole) * 5))


def _processes(g: dict) -> list[dict]:
    return [p for p in g.get("processes") or [] if isinstance(p, dict)]


_BROKEN = frozenset({GpuHealth.UNHEALTHY.value, GpuHealth.LOST.value})


def gpu_cell(g: dict, holder: tuple[str, int] | None, replicas: Mapping[str, Any]) -> GpuCell:
    """One GPU's cell. The health fields of SPEC section 9 (health, health_reason, quarantined,
    allocated_mb) are read when the snapshot has them; a snapshot from before them still shows.
    replicas: the index's, by id (a holder's phase is read there)."""
    holder_id, rank = holder if holder else ("", 0)
    use, reason = gpu_use(g, holder_id)
    holder_phase = replicas[holder_id].phase if holder_id in replicas else ""
    return GpuCell(g.get("index"), use, holder_id, rank, holder_phase, reason, g)


def gpu_use(g: dict, holder_id: str) -> tuple[GpuUse, str]:
    """What a GPU is doing, the worst of what its entry says first, and why ("" when it is held, foreign or free)."""
    health = g.get("health")
    health_reason = g.get("health_reason") or ""
    quarantined = g.get("quarantined")
    if health in _BROKEN:
        return GpuUse.UNHEALTHY, str(health_reason or health)
    if isinstance(quarantined, dict):
        return GpuUse.QUARANTINED, _quarantine_reason(quarantined)
    if health_reason == CORDONED_REASON or g.get("cordoned") is True:
        return GpuUse.CORDONED, CORDONED_REASON
    if holder_id:
        return GpuUse.HELD, ""
    if g.get("processes"):
        return GpuUse.FOREIGN, ""
    return GpuUse.FREE, ""


def _quarantine_reason(quarantined: dict) -> str:
    return f"quarantined: {quarantined.get('reason') or 'crash loop'}" + (
        f" (until {quarantined['until']})" if quarantined.get("until") else "")


def _mb(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
