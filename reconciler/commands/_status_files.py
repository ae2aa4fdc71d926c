"""Reading what the reconciler wrote under status/ from disk: for `status` and `logs`, which never probe.

Status files are machine-written but live in a git repository people edit and
merge: a file may be missing, half-merged or hand-edited. Each problem is one
line naming the file, never a traceback. The documents become a StatusReport in
reconciler.record.status_view, which the dashboard reads too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from reconciler import pyyaml_bounded
from reconciler.constants import STATUS_DIR
from reconciler.record.status_view import StatusReport, StatusUnreadable, status_report_from_documents

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader


def read_catalog_status(catalog: str) -> StatusReport:
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
    return status_report_from_documents(root, catalog_doc, model_docs)


def _read(path: Path, optional: bool = False) -> Any:
    try:
        return pyyaml_bounded.load(path.read_bytes(), _Loader)
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
