"""status/ read back for people, from documents already parsed (pure): `reconciler status` reads them
from disk (commands/_status_files), the dashboard from its cache of the files (dashboard/files), and both
answer the same JSON and the same words from here, below both.

Status files are machine-written but live in a git repository people edit and merge: a document may be
half-merged or hand-edited. Each problem is one line naming the file (StatusUnreadable), never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.constants import STATUS_DIR
from reconciler.errors import ReconcilerError
from reconciler.schemas import first_problem
from reconciler.vocabulary import FailureKind


class StatusUnreadable(ReconcilerError):
    """A catalog directory whose status/ cannot be read (exit 1)."""


@dataclass(frozen=True)
class StatusReport:
    """What status/ says, as `reconciler status` and the dashboard read it back (the writer's input for
    status/catalog.yaml is status.documents.CatalogStatus)."""

    root: Path
    revision: str | None  # the revision applied, as status/catalog.yaml records it
    message: str  # the daemon's (or apply's) one line on the last attempt
    warnings: tuple[str, ...]
    models: tuple[dict, ...]  # status/models/<name>.yaml documents, by name
    written: bool  # False: nothing has written status/ yet

    def replicas(self) -> dict[str, tuple[str, dict]]:
        """replica id -> (model name, replica document)."""
        return {r["id"]: (m["name"], r) for m in self.models for r in m["replicas"]}


def status_report_from_documents(root: Path, catalog_doc: Any, model_docs: list[tuple[Path, Any]]) -> StatusReport:
    """The StatusReport of documents already parsed: `status` reads them from disk, the dashboard
    from its cache of the files; both answer the same JSON from the same files."""
    status = root / STATUS_DIR
    if not isinstance(catalog_doc, dict):
        raise StatusUnreadable(f"{status / 'catalog.yaml'}: not a catalog status document (a mapping)")
    problem = first_problem("status-catalog", catalog_doc, missing_ok=True)
    if problem:
        raise StatusUnreadable(f"{status / 'catalog.yaml'}: not a catalog status document: {problem}")
    models = [model_entry(path, doc) for path, doc in model_docs]
    revision = catalog_doc.get("last_applied_revision")
    return StatusReport(
        root=root,
        revision=revision if isinstance(revision, str) else None,
        message=str(catalog_doc.get("message") or ""),
        warnings=tuple(str(w) for w in catalog_doc.get("warnings") or ()),
        models=tuple(models),
        written=bool(catalog_doc) or bool(models),
    )


def model_entry(path: Path, doc: Any) -> dict:
    """One status/models/<name>.yaml as `status --format json` lists it (StatusUnreadable: not one)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("replicas", []), list):
        raise StatusUnreadable(f"{path}: not a model status document (a mapping with `replicas`)")
    problem = first_problem("status-model", doc, missing_ok=True)
    if problem:
        raise StatusUnreadable(f"{path}: not a model status document: {problem}")
    replicas = [r for r in doc.get("replicas") or [] if isinstance(r, dict) and isinstance(r.get("id"), str)]
    entry = {"name": str(doc.get("name") or path.stem), "desired": doc.get("desired"),
             "ready": doc.get("ready"), "replicas": replicas}
    if isinstance(doc.get("autoscale"), dict):  # SPEC section 11: the count in force and why
        entry["autoscale"] = doc["autoscale"]
    if isinstance(doc.get("rollout"), dict):  # SPEC section 13: the canary rollout, its weight and checks
        entry["rollout"] = doc["rollout"]
    return entry


def json_document(status: StatusReport) -> dict:
    """SPEC section 6: {"revision", "models": [{"name", "desired", "ready", "replicas": [...]}]}."""
    return {"revision": status.revision, "models": [dict(m) for m in status.models]}


def nodes_text(replica: dict) -> str:
    """`a1[0,1]:8000 a2[0,1]:8000`: node, GPUs and port of every rank, head first."""
    parts = []
    for n in sorted(replica.get("nodes") or [], key=lambda n: n.get("rank", 0)):
        gpus = n.get("gpus") or []
        parts.append(f"{n.get('node')}{'[' + ','.join(map(str, gpus)) + ']' if gpus else ''}:{n.get('port')}")
    return " ".join(parts) or "-"


def endpoint_text(replica: dict) -> str:
    head = next((n for n in replica.get("nodes") or [] if n.get("rank") == 0), None)
    return (head or {}).get("endpoint") or "-"


def message_text(replica: dict) -> str:
    """The message on one line; a Failed replica's failure kind beside it, as `nodes` shows a node's:
    temporary (retried with backoff) or permanent (stalled until the catalog or the node changes)."""
    message = " ".join(str(replica.get("message") or "").split())
    if replica.get("canary") is True:  # a canary copy of a rollout Progressing (SPEC section 13)
        message = f"canary copy; {message}" if message else "canary copy"
    failure = replica.get("failure")
    return f"{message} ({failure})" if failure in (FailureKind.TEMPORARY, FailureKind.PERMANENT) else message
