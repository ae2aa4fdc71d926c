"""One snapshot of status/, cross-referenced: the replicas, the models, the nodes and their grid rows (pure).

Built once per version of the files; a node whose document and placements did not change keeps its row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reconciler.dashboard.cells import GpuCell, gpu_cell
from reconciler.dashboard.files import FileRead, StatusSnapshot
from reconciler.dashboard.rejections import RejectionGroups, rejection_groups
from reconciler.vocabulary import Phase

Holders = dict[tuple[str, Any], tuple[str, int]]  # (node, gpu index) -> (replica, rank)
Placed = dict[str, list[tuple]]  # node -> what the model files place on it: a row's inputs


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
        _index_model(ix, read)
    holders, placed = _index_placements(ix)
    for d in _node_documents(snap):
        _index_node(ix, d, holders, placed, previous)
    return ix


def _index_model(ix: Index, read: FileRead) -> None:
    """One status/models/<model>.yaml: the model (named by its file when it names itself not) and its replicas."""
    doc = read.doc
    if not isinstance(doc, dict):
        return
    name = str(doc.get("name") or read.rel.rsplit("/", 1)[1].removesuffix(".yaml"))
    ix.models.append(doc | {"name": name})
    for r in doc.get("replicas") or []:
        if isinstance(r, dict) and isinstance(r.get("id"), str):
            ix.replicas[r["id"]] = Replica(r["id"], name, r)


def _index_placements(ix: Index) -> tuple[Holders, Placed]:
    """Where the model files place each replica's ranks: indexed by node, and the GPUs they hold."""
    holders: Holders = {}
    placed: Placed = {}
    for rep in ix.replicas.values():
        for n in rep.nodes:
            node = str(n.get("node"))
            placed.setdefault(node, []).append((rep.id, rep.phase, _rank(n), repr(n.get("gpus"))))
            ix.replicas_on_node.setdefault(node, []).append(rep.id)
            ix.models_on_node.setdefault(node, set()).add(rep.model)
            ix.phases_on_node.setdefault(node, set()).add((rep.model, rep.phase))
            for g in n.get("gpus") or []:
                holders[(node, g)] = (rep.id, _rank(n))
    return holders, placed


def _node_documents(snap: StatusSnapshot) -> list[dict]:
    """The entries of nodes.yaml that are a node with an id."""
    nodes_doc = snap.nodes.doc if isinstance(snap.nodes.doc, dict) else {}
    return [d for d in nodes_doc.get("nodes") or [] if isinstance(d, dict) and "id" in d]


def _index_node(ix: Index, d: dict, holders: Holders, placed: Placed, previous: Index | None) -> None:
    """One node of nodes.yaml: its labels, the replicas found running on it, and its row (kept or built)."""
    nid = str(d["id"])
    labels = d.get("labels") if isinstance(d.get("labels"), dict) else {}
    ix.node_labels[nid] = labels
    observed = _observed_ranks(ix, nid, d)
    key = _row_key(ix, placed.get(nid, ()), observed)
    row = _kept_row(previous, nid, d, key)
    if row is None:
        row = _node_row(ix, nid, d, labels, holders, observed)
    ix._rows[nid] = (d, key, row)
    ix.nodes.append(row)


def _observed_ranks(ix: Index, nid: str, d: dict) -> dict[Any, tuple[str, int]]:
    """The ranks the probe found running on a node (gpu index -> (replica, rank)): they hold their GPUs too."""
    observed = {}
    for rank in d.get("replicas") or []:
        if isinstance(rank, dict):
            for g in rank.get("gpus") or []:
                observed[g] = (str(rank.get("id")), _rank(rank))
            _index_found_replica(ix, nid, rank)
    return observed


def _index_found_replica(ix: Index, nid: str, rank: dict) -> None:
    """A replica the probe found on a node that the model files do not place there is on the node too."""
    if rank.get("id") and str(rank["id"]) not in ix.replicas_on_node.get(nid, []):
        ix.replicas_on_node.setdefault(nid, []).append(str(rank["id"]))
        if rank.get("model"):
            ix.models_on_node.setdefault(nid, set()).add(str(rank["model"]))


def _row_key(ix: Index, placed_here: Any, observed: dict[Any, tuple[str, int]]) -> tuple:
    """A row's inputs besides its document. The phases of replicas the probe found here count too: a
    cell names its holder's phase."""
    return (tuple(placed_here), tuple(ix.replicas[h[0]].phase if h[0] in ix.replicas else ""
                                      for h in observed.values()))


def _kept_row(previous: Index | None, nid: str, d: dict, key: tuple) -> NodeRow | None:
    """The last index's row of the node when its document is the very same object and its key is equal."""
    kept = previous._rows.get(nid) if previous is not None else None
    if kept is not None and kept[0] is d and kept[1] == key:
        return kept[2]
    return None


def _node_row(ix: Index, nid: str, d: dict, labels: dict, holders: Holders,
              observed: dict[Any, tuple[str, int]]) -> NodeRow:
    """A node's row built anew: a cell per GPU, held by what the model files place there or else by what was found."""
    cells = tuple(gpu_cell(g, holders.get((nid, g.get("index"))) or observed.get(g.get("index")), ix.replicas)
                  for g in d.get("gpus") or [] if isinstance(g, dict))
    return NodeRow(nid, str(d.get("state") or ""), str(d.get("reason") or ""), labels, cells,
                   tuple(ix.replicas_on_node.get(nid, ())), d)
