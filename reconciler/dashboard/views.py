"""What each page shows, computed from one StatusSnapshot (pure: no I/O, no HTTP).

The pages are these values rendered by templates; tests can read them directly.
Everything a node or a catalog wrote is data here: the templates escape it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import SimpleNamespace
from typing import Any, Iterable, Mapping

from reconciler.commands.plan_markdown import _reason_groups as reason_groups
from reconciler.dashboard.files import StatusSnapshot
from reconciler.vocabulary import GpuHealth, NodeState, Phase

CORDONED_REASON = "cordoned in fleet.yaml"  # SPEC section 9: how a fleet.yaml `cordon_gpus` entry is reported
PAGE_SIZE = 100  # nodes per fleet page; ?per= up to MAX_PAGE_SIZE
MODELS_PAGE_SIZE = 25  # models per models page
MAX_PAGE_SIZE = 1000
REPLICAS_SHOWN = 10  # replicas per model on the models page before "N more" (choosing the model shows them all)
NODES_NAMED = 20  # nodes named per rejection reason before "... N more", as the pull-request comment does


class GpuUse(StrEnum):
    """A fleet grid cell's colour: what one GPU is doing, worst first (SPEC sections 3 and 9)."""

    UNHEALTHY = "unhealthy"  # health unhealthy or lost
    QUARANTINED = "quarantined"  # the crash-loop breaker's, until a time
    CORDONED = "cordoned"  # fleet.yaml's cordon_gpus
    HELD = "held"  # a replica's rank holds it (running, or placed by this pass)
    FOREIGN = "foreign"  # a process the reconciler did not start uses it
    FREE = "free"


GPU_USES = tuple(GpuUse)


# ---------------------------------------------------------------- filters


@dataclass(frozen=True)
class Filters:
    """What the URL narrows a page to: ?model=&label=k=v&phase=&state=&gpu=&node=&page=&per=."""

    model: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    phase: str = ""
    state: str = ""  # node state
    gpu: str = ""  # a GpuUse: nodes with at least one such GPU
    node: str = ""  # part of a node id
    unplaced: bool = False  # replicas no node could take
    page: int = 1
    per: int | None = None  # rows a page shows; None: the page's own default

    @classmethod
    def from_query(cls, params: Mapping[str, str], labels: Iterable[str]) -> "Filters":
        pairs = []
        for text in labels:
            key, sep, value = text.partition("=")
            if key.strip():
                pairs.append((key.strip(), value.strip() if sep else ""))
        return cls(
            model=params.get("model", "").strip(), labels=tuple(pairs), phase=params.get("phase", "").strip(),
            state=params.get("state", "").strip(), gpu=params.get("gpu", "").strip(),
            node=params.get("node", "").strip(), unplaced=params.get("unplaced", "") not in ("", "0"),
            page=_int(params.get("page"), 1, 1, 10**6),
            per=_int(params.get("per"), None, 1, MAX_PAGE_SIZE),
        )

    @property
    def active(self) -> bool:
        return bool(self.model or self.labels or self.phase or self.state or self.gpu or self.node or self.unplaced)

    def label_text(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.labels]

    def node_matches(self, node: dict) -> bool:
        labels = node.get("labels") if isinstance(node.get("labels"), dict) else {}
        return all(str(labels.get(k, "\0")) == v for k, v in self.labels)


def _int(text: str | None, default: int | None, low: int, high: int) -> int | None:
    try:
        return min(max(int(text), low), high) if text is not None else default
    except ValueError:
        return default


# ---------------------------------------------------------------- the index of one snapshot


@dataclass(frozen=True)
class Replica:
    id: str
    model: str
    doc: dict  # the replica's entry in status/models/<model>.yaml, as written

    @property
    def phase(self) -> str:
        return str(self.doc.get("phase") or Phase.UNKNOWN)

    @property
    def nodes(self) -> list[dict]:
        return sorted((n for n in self.doc.get("nodes") or [] if isinstance(n, dict)), key=lambda n: _rank(n))

    @property
    def endpoint(self) -> str:
        head = next((n for n in self.nodes if n.get("rank") == 0), None)
        return str((head or {}).get("endpoint") or "")

    @property
    def unplaced(self) -> bool:
        return not self.nodes and ("rejections" in self.doc or "rejections_same_as" in self.doc)


def _rank(n: dict) -> int:
    r = n.get("rank")
    return r if isinstance(r, int) else 0


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


@dataclass(frozen=True)
class NodeRow:
    id: str
    state: str
    reason: str
    labels: dict
    gpus: tuple[GpuCell, ...]
    replicas: tuple[str, ...]  # replica ids with a rank here
    doc: dict


@dataclass
class Index:
    """One snapshot, cross-referenced: built once per version of the files."""

    replicas: dict[str, Replica] = field(default_factory=dict)
    models: list[dict] = field(default_factory=list)  # status/models documents, by name
    nodes: list[NodeRow] = field(default_factory=list)
    node_labels: dict[str, dict] = field(default_factory=dict)
    replicas_on_node: dict[str, list[str]] = field(default_factory=dict)
    models_on_node: dict[str, set[str]] = field(default_factory=dict)
    phases_on_node: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # node -> {(model, phase)}
    _groups: dict[str, Any] = field(default_factory=dict)  # replica -> its RejectionGroups, once
    _rows: dict[str, tuple[dict, tuple, "NodeRow"]] = field(default_factory=dict)  # see build_index

    def groups(self, rep: "Replica") -> "RejectionGroups | None":
        if rep.id not in self._groups:
            self._groups[rep.id] = rejection_groups(rep.doc)
        return self._groups[rep.id]


def build_index(snap: StatusSnapshot, previous: Index | None = None) -> Index:
    """previous: the index of the last snapshot. A node whose document is the very object it was
    (files.NodeByNodeSnapshot reuses an unchanged node's) and whose placements are the same keeps
    its row: a pass that changed a few nodes of 4,000 rebuilds a few rows, not 32,000 GPU cells."""
    ix = Index()
    for read in snap.models:
        doc = read.doc
        if not isinstance(doc, dict):
            continue
        name = str(doc.get("name") or read.rel.rsplit("/", 1)[1].removesuffix(".yaml"))
        ix.models.append(doc | {"name": name})
        for r in doc.get("replicas") or []:
            if isinstance(r, dict) and isinstance(r.get("id"), str):
                ix.replicas[r["id"]] = Replica(r["id"], name, r)
    holders: dict[tuple[str, Any], tuple[str, int]] = {}  # (node, gpu index) -> (replica, rank)
    placed: dict[str, list[tuple]] = {}  # node -> what the model files place on it: a row's inputs
    for rep in ix.replicas.values():
        for n in rep.nodes:
            node = str(n.get("node"))
            placed.setdefault(node, []).append((rep.id, rep.phase, _rank(n), repr(n.get("gpus"))))
            ix.replicas_on_node.setdefault(node, []).append(rep.id)
            ix.models_on_node.setdefault(node, set()).add(rep.model)
            ix.phases_on_node.setdefault(node, set()).add((rep.model, rep.phase))
            for g in n.get("gpus") or []:
                holders[(node, g)] = (rep.id, _rank(n))
    nodes_doc = snap.nodes.doc if isinstance(snap.nodes.doc, dict) else {}
    for d in nodes_doc.get("nodes") or []:
        if not isinstance(d, dict) or "id" not in d:
            continue
        nid = str(d["id"])
        labels = d.get("labels") if isinstance(d.get("labels"), dict) else {}
        ix.node_labels[nid] = labels
        observed = {}
        for rank in d.get("replicas") or []:  # ranks the probe found running: they hold their GPUs too
            if isinstance(rank, dict):
                for g in rank.get("gpus") or []:
                    observed[g] = (str(rank.get("id")), _rank(rank))
                if rank.get("id") and str(rank["id"]) not in ix.replicas_on_node.get(nid, []):
                    ix.replicas_on_node.setdefault(nid, []).append(str(rank["id"]))
                    if rank.get("model"):
                        ix.models_on_node.setdefault(nid, set()).add(str(rank["model"]))
        # The phases of replicas the probe found here count too: a cell names its holder's phase.
        key = (tuple(placed.get(nid, ())), tuple(ix.replicas[h[0]].phase if h[0] in ix.replicas else ""
                                                  for h in observed.values()))
        kept = previous._rows.get(nid) if previous is not None else None
        if kept is not None and kept[0] is d and kept[1] == key:
            row = kept[2]
        else:
            cells = tuple(gpu_cell(g, holders.get((nid, g.get("index"))) or observed.get(g.get("index")), ix.replicas)
                          for g in d.get("gpus") or [] if isinstance(g, dict))
            row = NodeRow(nid, str(d.get("state") or ""), str(d.get("reason") or ""), labels, cells,
                          tuple(ix.replicas_on_node.get(nid, ())), d)
        ix._rows[nid] = (d, key, row)
        ix.nodes.append(row)
    return ix


_BROKEN = frozenset({GpuHealth.UNHEALTHY.value, GpuHealth.LOST.value})


def gpu_cell(g: dict, holder: tuple[str, int] | None, replicas: Mapping[str, Replica]) -> GpuCell:
    """One GPU's cell. The health fields of SPEC section 9 (health, health_reason, quarantined,
    allocated_mb) are read when the snapshot has them; a snapshot from before them still shows."""
    health = g.get("health")
    health_reason = g.get("health_reason") or ""
    quarantined = g.get("quarantined")
    holder_id, rank = holder if holder else ("", 0)
    reason = ""
    if health in _BROKEN:
        use, reason = GpuUse.UNHEALTHY, str(health_reason or health)
    elif isinstance(quarantined, dict):
        use = GpuUse.QUARANTINED
        reason = f"quarantined: {quarantined.get('reason') or 'crash loop'}" + (
            f" (until {quarantined['until']})" if quarantined.get("until") else "")
    elif health_reason == CORDONED_REASON or g.get("cordoned") is True:
        use, reason = GpuUse.CORDONED, CORDONED_REASON
    elif holder_id:
        use = GpuUse.HELD
    elif g.get("processes"):
        use = GpuUse.FOREIGN
    else:
        use = GpuUse.FREE
    holder_phase = replicas[holder_id].phase if holder_id in replicas else ""
    return GpuCell(g.get("index"), use, holder_id, rank, holder_phase, reason, g)


def _mb(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ---------------------------------------------------------------- overview


class Sync(StrEnum):
    SYNCED = "Synced"  # the revision in force is the catalog at HEAD, and it validated
    OUT_OF_SYNC = "OutOfSync"  # HEAD moved on (or nothing was applied yet)
    FAILED = "Failed"  # the last attempted revision did not validate


@dataclass(frozen=True)
class Overview:
    applied: str | None
    attempted: str | None
    head: str | None
    head_catalog: str | None
    git: bool
    sync: Sync
    sync_reason: str
    errors: list[dict]
    message: str
    warnings: list[str]
    models: int
    desired: int
    ready: int
    unplaced: int
    phases: dict[str, int]
    node_states: dict[str, int]
    gpus: dict[str, int]
    gpu_total: int
    gateway: list[str]


def overview(snap: StatusSnapshot, ix: Index) -> Overview:
    cat = snap.catalog.doc if isinstance(snap.catalog.doc, dict) else {}
    applied, attempted = _rev(cat.get("last_applied_revision")), _rev(cat.get("last_attempted_revision"))
    errors = [e for e in cat.get("errors") or [] if isinstance(e, dict)]
    if errors:
        sync, why = Sync.FAILED, f"revision {_short(attempted) or '(working tree)'} did not validate"
    elif not snap.catalog.doc:
        sync, why = Sync.OUT_OF_SYNC, "nothing applied yet: no status/catalog.yaml"
    elif snap.git and snap.catalog_revision_at_head and applied != snap.catalog_revision_at_head:
        sync, why = Sync.OUT_OF_SYNC, (f"HEAD's catalog is {_short(snap.catalog_revision_at_head)}, "
                                       f"applied is {_short(applied) or 'none'}")
    else:
        sync, why = Sync.SYNCED, ("the catalog at HEAD is applied" if snap.git
                                  else "the working tree is applied (no git: no revision)")
    phases = {str(p): 0 for p in Phase}
    for r in ix.replicas.values():
        phases[r.phase] = phases.get(r.phase, 0) + 1
    states = {str(s): 0 for s in NodeState}
    gpus = {str(u): 0 for u in GpuUse}
    for n in ix.nodes:
        states[n.state] = states.get(n.state, 0) + 1
        for c in n.gpus:
            gpus[c.use] += 1
    desired = sum(m["desired"] for m in ix.models if isinstance(m.get("desired"), int))
    return Overview(
        applied=applied, attempted=attempted, head=snap.head, head_catalog=snap.catalog_revision_at_head,
        git=snap.git, sync=sync, sync_reason=why, errors=errors, message=str(cat.get("message") or ""),
        warnings=[str(w) for w in cat.get("warnings") or []], models=len(ix.models), desired=desired,
        ready=phases.get(Phase.READY, 0), unplaced=sum(1 for r in ix.replicas.values() if r.unplaced),
        phases={k: v for k, v in phases.items() if v or k in Phase.__members__.values()},
        node_states=states, gpus=gpus, gpu_total=sum(gpus.values()), gateway=[rel for rel, _ in snap.gateway],
    )


def _rev(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _short(rev: str | None) -> str:
    return rev[:12] if rev else ""


# ---------------------------------------------------------------- models


@dataclass(frozen=True)
class RejectionGroups:
    """An unplaced replica's rejections as `plan --format markdown` groups them: per profile, per reason."""

    profiles: list[tuple[str, list[tuple[str, list[str], int]]]]  # (profile, [(reason, nodes named, count)])
    nodes_rejected: int


def rejection_groups(doc: dict, show_all: bool = False) -> RejectionGroups | None:
    rejections = [r for r in doc.get("rejections") or [] if isinstance(r, dict)]
    if not rejections:
        return None
    objs = [SimpleNamespace(profile=str(r.get("profile") or "-"), reason=str(r.get("reason") or ""),
                            node=str(r["node"]) if r.get("node") else None) for r in rejections]
    out, rejected = [], set()
    for profile, groups in reason_groups(objs):
        rows = []
        for reason, nodes in groups:
            rejected.update(nodes)
            rows.append((reason, nodes if show_all else nodes[:NODES_NAMED], len(nodes)))
        out.append((profile, rows))
    return RejectionGroups(out, len(rejected))


@dataclass(frozen=True)
class ModelView:
    name: str
    desired: Any
    ready: Any
    autoscale: dict | None
    endpoints: list[str]
    replicas: list[Replica]  # those the filters keep, at most REPLICAS_SHOWN unless a model is chosen
    matched: int  # how many the filters keep
    total: int
    phases: dict[str, int]
    unplaced: list[tuple[Replica, RejectionGroups | None, list[str]]]  # (replica, groups, replicas sharing them)


def replica_matches(rep: Replica, f: Filters, ix: Index) -> bool:
    if f.phase and rep.phase != f.phase:
        return False
    if f.unplaced and not rep.unplaced:
        return False
    if f.labels:
        if not any(f.node_matches({"labels": ix.node_labels.get(str(n.get("node")), {})}) for n in rep.nodes):
            return False
    if f.node and not any(f.node in str(n.get("node")) for n in rep.nodes):
        return False
    return True


@dataclass(frozen=True)
class ModelsPage:
    models: list[ModelView]
    matched: int  # models the filters keep
    total: int
    page: int
    pages: int
    first: int


def models_view(snap: StatusSnapshot, ix: Index, f: Filters) -> ModelsPage:
    endpoints = snap.endpoints.doc.get("models") if isinstance(snap.endpoints.doc, dict) else None
    endpoints = endpoints if isinstance(endpoints, dict) else {}
    replica_filter = bool(f.phase or f.labels or f.node or f.unplaced)
    kept_models = []
    for m in ix.models:
        if f.model and m["name"] != f.model:
            continue
        reps = [ix.replicas[r["id"]] for r in m.get("replicas") or []
                if isinstance(r, dict) and r.get("id") in ix.replicas]
        kept = [r for r in reps if replica_matches(r, f, ix)] if replica_filter else reps
        if replica_filter and not kept:
            continue
        kept_models.append((m, reps, kept))
    per = f.per or MODELS_PAGE_SIZE
    pages = max(1, -(-len(kept_models) // per))
    page = min(f.page, pages)
    start = (page - 1) * per
    out = []
    for m, reps, kept in kept_models[start:start + per]:
        phases: dict[str, int] = {}
        for r in reps:
            phases[r.phase] = phases.get(r.phase, 0) + 1
        same: dict[str, list[str]] = {}
        for r in reps:
            if r.doc.get("rejections_same_as"):
                same.setdefault(str(r.doc["rejections_same_as"]), []).append(r.id)
        unplaced = [(r, ix.groups(r), same.get(r.id, [])) for r in kept
                    if r.unplaced and not r.doc.get("rejections_same_as")]
        autoscale = m.get("autoscale") if isinstance(m.get("autoscale"), dict) else None
        eps = endpoints.get(m["name"])
        out.append(ModelView(
            name=m["name"], desired=m.get("desired"), ready=m.get("ready"), autoscale=autoscale,
            endpoints=[str(e) for e in eps] if isinstance(eps, list) else [],
            replicas=kept[:MAX_PAGE_SIZE] if f.model else kept[:REPLICAS_SHOWN], matched=len(kept), total=len(reps),
            phases=phases, unplaced=unplaced,
        ))
    return ModelsPage(out, len(kept_models), len(ix.models), page, pages, start + 1)


# ---------------------------------------------------------------- fleet


@dataclass(frozen=True)
class FleetPage:
    rows: list[NodeRow]
    matched: int
    total: int
    page: int
    pages: int
    first: int  # 1-based number of the first row shown


def fleet_view(ix: Index, f: Filters) -> FleetPage:
    rows = ix.nodes
    if f.active:
        rows = [n for n in rows if _node_kept(n, f, ix)]
    per = f.per or PAGE_SIZE
    pages = max(1, -(-len(rows) // per))
    page = min(f.page, pages)
    start = (page - 1) * per
    return FleetPage(rows[start:start + per], len(rows), len(ix.nodes), page, pages, start + 1)


def _node_kept(n: NodeRow, f: Filters, ix: Index) -> bool:
    if f.node and f.node not in n.id:
        return False
    if f.unplaced:
        return False  # an unplaced replica is on no node
    if f.state and n.state != f.state:
        return False
    if f.labels and not f.node_matches({"labels": n.labels}):
        return False
    if f.model and f.model not in ix.models_on_node.get(n.id, ()):
        return False
    if f.phase and not any(phase == f.phase and (not f.model or model == f.model)
                           for model, phase in ix.phases_on_node.get(n.id, ())):
        return False
    if f.gpu and not any(c.use == f.gpu for c in n.gpus):
        return False
    return True
