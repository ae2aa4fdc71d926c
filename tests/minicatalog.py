"""A stand-in for reconciler.catalog.load_catalog while it is not on this branch (tests only).

Reads fleet.yaml and models/*.yaml with PyYAML, reports YAML syntax errors and
missing keys as Problems with positions, and builds the model objects.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from reconciler.errors import CatalogInvalid, Problem
from reconciler.model import Catalog, Fleet, Model, NodeSpec, Profile


def _read(root: Path, rel: str, problems: list[Problem]):
    try:
        return yaml.safe_load((root / rel).read_text())
    except FileNotFoundError:
        problems.append(Problem(rel, 1, 1, "file is missing"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        problems.append(Problem(rel, mark.line + 1, mark.column + 1, f"YAML syntax: {exc.problem}"))
    return None


def load_catalog(path: str) -> Catalog:
    root = Path(path)
    problems: list[Problem] = []
    fleet_doc = _read(root, "fleet.yaml", problems)
    nodes = []
    if isinstance(fleet_doc, dict):
        for n in fleet_doc.get("nodes") or []:
            nodes.append(NodeSpec(id=n["id"], address=n["address"], data_address=n.get("data_address", n["address"])))
    models = []
    for f in sorted((root / "models").glob("*.yaml")):
        rel = f"models/{f.name}"
        doc = _read(root, rel, problems)
        if doc is None:
            continue
        if "source" not in doc:
            problems.append(Problem(rel, 1, 1, "missing required field 'source'"))
            continue
        models.append(Model(name=doc["name"], source=doc["source"], replicas=doc.get("replicas", 1),
                            profiles=(Profile(name="p", engine="command", port=9000, command=("true",)),), file=rel))
    if problems:
        raise CatalogInvalid(problems)
    return Catalog(root=str(root), fleet=Fleet(nodes=tuple(nodes)), models=tuple(sorted(models, key=lambda m: m.name)))
