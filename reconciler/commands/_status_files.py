"""Reading what the reconciler wrote under status/: for `status` and `logs`, which never probe.

Status files are machine-written but live in a git repository people edit and
merge: a file may be missing, half-merged or hand-edited. Each problem is one
line naming the file, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reconciler.constants import STATUS_DIR
from reconciler.errors import ReconcilerError

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader


class StatusUnreadable(ReconcilerError):
    """A catalog directory whose status/ cannot be read (exit 1)."""


@dataclass(frozen=True)
class CatalogStatus:
    root: Path
    revision: str | None  # the revision applied, as status/catalog.yaml records it
    message: str  # the daemon's (or apply's) one line on the last attempt
    warnings: tuple[str, ...]
    models: tuple[dict, ...]  # status/models/<name>.yaml documents, by name
    written: bool  # False: nothing has written status/ yet

    def replicas(self) -> dict[str, tuple[str, dict]]:
        """replica id -> (model name, replica document)."""
        return {r["id"]: (m["name"], r) for m in self.models for r in m["replicas"]}


def read_catalog_status(catalog: str) -> CatalogStatus:
    root = Path(catalog)
    if not root.is_dir():
        raise StatusUnreadable(f"{catalog}: no such directory")
    status = root / STATUS_DIR
    if not (root / "fleet.yaml").is_file() and not (root / "models").is_dir() and not status.is_dir():
        raise StatusUnreadable(f"{catalog} is not a catalog (no fleet.yaml, models/ or status/ in it); "
                               "give the catalog directory, e.g. `reconciler status path/to/catalog`")
    catalog_doc = _read(status / "catalog.yaml", optional=True) or {}
    if not isinstance(catalog_doc, dict):  # said before any model file is read, as it always was
        raise StatusUnreadable(f"{status / 'catalog.yaml'}: not a catalog status document (a mapping)")
    model_docs = [(path, _read(path)) for path in sorted((status / "models").glob("*.yaml"))] \
        if (status / "models").is_dir() else []
    return catalog_status_from_documents(root, catalog_doc, model_docs)


def catalog_status_from_documents(root: Path, catalog_doc: Any, model_docs: list[tuple[Path, Any]]) -> CatalogStatus:
    """The CatalogStatus of documents already parsed: `status` reads them from disk, the dashboard
    from its cache of the files; both answer the same JSON from the same files."""
    status = root / STATUS_DIR
    if not isinstance(catalog_doc, dict):
        raise StatusUnreadable(f"{status / 'catalog.yaml'}: not a catalog status document (a mapping)")
    models = [model_entry(path, doc) for path, doc in model_docs]
    revision = catalog_doc.get("last_applied_revision")
    return CatalogStatus(
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
    replicas = [r for r in doc.get("replicas") or [] if isinstance(r, dict) and isinstance(r.get("id"), str)]
    entry = {"name": str(doc.get("name") or path.stem), "desired": doc.get("desired"),
             "ready": doc.get("ready"), "replicas": replicas}
    if isinstance(doc.get("autoscale"), dict):  # SPEC section 11: the count in force and why
        entry["autoscale"] = doc["autoscale"]
    if isinstance(doc.get("rollout"), dict):  # SPEC section 13: the canary rollout, its weight and checks
        entry["rollout"] = doc["rollout"]
    return entry


def _read(path: Path, optional: bool = False) -> Any:
    try:
        return yaml.load(path.read_bytes(), Loader=_Loader)
    except FileNotFoundError:
        if optional:
            return None
        raise StatusUnreadable(f"{path}: no such file") from None
    except OSError as exc:
        raise StatusUnreadable(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise StatusUnreadable(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
