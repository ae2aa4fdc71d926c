"""The catalog directory: fleet.yaml, models/*.yaml, stray model files outside models/; every
problem of every file in one CatalogInvalid, sorted by file and position.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator

from reconciler.constants import STATUS_DIR
from reconciler.errors import CatalogInvalid, Problem
from reconciler.model import Catalog, Fleet, Model
from reconciler.catalog.build import build_fleet, build_model
from reconciler.catalog.documents import Document, position, read_bounded, read_native, read_positioned
from reconciler.catalog.fleet_rules import fleet_problems, llama_ipv6_problems
from reconciler.catalog.rules import model_problems
from reconciler.catalog.schema_check import schema_problems
from reconciler.teardown import leave_to_exit

FLEET_FILE = "fleet.yaml"
MODELS_DIR = "models"
YAML_SUFFIXES = (".yaml", ".yml")


def catalog_tree(root: Path) -> Iterator[tuple[str, list[str]]]:
    """(folder, its file names, sorted) for every folder of the catalog the loader looks in: hidden
    folders and the top-level status/ (the reconciler's own output) are left out."""
    top = True
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (top and d == STATUS_DIR))
        top = False
        yield dirpath, sorted(filenames)


def _stray_yaml(root: Path) -> Iterator[Path]:
    """YAML files outside models/ that look like model files: they would be silently ignored."""
    for dirpath, filenames in catalog_tree(root):
        for f in filenames:
            if not f.endswith(YAML_SUFFIXES):
                continue
            p = Path(dirpath) / f
            rel = p.relative_to(root)
            if rel == Path(FLEET_FILE) or (rel.parent == Path(MODELS_DIR)):
                continue
            yield p


# A YAML file larger than this is not taken for a stray model file (a model file is a few KiB): a
# snapshot kept beside fleet.yaml (megabytes at fleet scale) is not read at all.
STRAY_MODEL_MAX_BYTES = 1 << 20


def _looks_like_model(path: Path) -> bool:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > STRAY_MODEL_MAX_BYTES:
            return False
        raw = read_bounded(path)
    except OSError:
        return False
    # A snapshot or any large YAML beside the catalog is passed over at memchr speed: without the
    # word, the line-anchored searches cannot match (they cost 0.2 s over a 4,000-node snapshot).
    if b"profiles" not in raw:
        return False
    text = raw.decode(errors="replace")
    return bool(re.search(r"(?m)^profiles\s*:", text)) and bool(re.search(r"(?m)^(source|name)\s*:", text))


def field_locator(root: str | os.PathLike):
    """(file, path) -> (line, column) of a field in a catalog file, for problems found after loading.

    The file is read again with positions, once, on the first question. A str step on a
    list picks the item with that `name` (("profiles", "h100-tp8", "gpus_per_node")).
    """
    root = Path(root)
    docs: dict[str, Any] = {}

    def locate(rel: str, path: tuple) -> tuple[int, int]:
        if rel not in docs:
            doc, _ = read_positioned(root, root / rel, rel)
            docs[rel] = doc.data if doc is not None else None
        data = docs[rel]
        if data is None:
            return 1, 1
        steps, node = [], data
        for step in path:
            if isinstance(step, str) and isinstance(node, list):
                step = next((i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == step), None)
                if step is None:
                    break
            steps.append(step)
            try:
                node = node[step]
            except (KeyError, IndexError, TypeError):
                break
        return position(data, tuple(steps), key=True)

    return locate


def git_revision(root: Path) -> str | None:
    """The catalog's revision as the daemon names it (gitrev.catalog_revision_of), or None outside git."""
    if not _may_be_in_git(root):
        return None
    from reconciler.catalog.gitrev import catalog_revision_of  # git runs only when a revision is asked for

    return catalog_revision_of(root)


def _may_be_in_git(root: Path) -> bool:
    """False only when git would find no repository for `root`: no `.git` in it or any folder above
    it, and no GIT_DIR or GIT_WORK_TREE to point elsewhere. A plain folder (a snapshot of a catalog,
    a pull request check's checkout without its .git) then costs no git process: 10-45 ms of `plan`."""
    if os.environ.get("GIT_DIR") or os.environ.get("GIT_WORK_TREE"):
        return True
    try:
        here = root.resolve()
    except OSError:
        return True  # git says what is wrong
    return any(os.path.lexists(folder / ".git") for folder in (here, *here.parents))


def load_catalog(path: str | os.PathLike, *, revision: str | None = None, with_revision: bool = True) -> Catalog:
    """Load and validate the catalog at `path`. Raises CatalogInvalid with every problem found."""
    root = Path(path)
    if not root.exists():
        raise CatalogInvalid([Problem(str(path), 1, 1, "catalog directory does not exist")])
    if not root.is_dir():
        raise CatalogInvalid([Problem(str(path), 1, 1, "not a directory; a catalog is a directory with fleet.yaml and models/")])
    root = root.resolve()
    try:
        # Positions cost ten times the parse (ruamel's round-trip loader reads a 4,000-node
        # fleet.yaml in seconds) and are only needed to report a problem: read without them
        # first (documents.read_native), and again with positions only when something is wrong.
        fleet, models = _load(root, read_native)
    except CatalogInvalid:
        fleet, models = _load(root, read_positioned)
    rev = revision if revision is not None else (git_revision(root) if with_revision else None)
    return Catalog(root=str(root), fleet=fleet, models=tuple(models), revision=rev)


# (catalog root, revision, model name) -> the model read there: a commit never changes.
_MODELS_AT: dict[tuple[str, str, str], Model] = {}


def model_at(root: str | os.PathLike, revision: str, name: str) -> Model:
    """The model `name` as the catalog's git repository held it at `revision` (an aborted canary's
    from_revision: the spec its replicas start on again), read and validated as load_catalog reads
    models/. Raises CatalogInvalid with one problem in words when it cannot be had."""
    from reconciler.catalog.gitrev import GitCatalog, GitError  # git runs only when an old spec is asked for

    key = (str(Path(root).resolve()), revision, name)
    if key in _MODELS_AT:
        return _MODELS_AT[key]

    def refused(why: str) -> CatalogInvalid:
        return CatalogInvalid([Problem(MODELS_DIR, 1, 1, why)])

    short = revision[:12]
    try:
        repo = GitCatalog.open(root)
        if repo is None:
            raise refused("the catalog is not a git repository, so its old spec cannot be read")
        if not repo.has_commit(revision):
            raise refused(f"revision {short} is not in the catalog's git repository")
        tree = repo.export(revision)
    except GitError as exc:
        raise refused(f"git could not read revision {short}: {exc.stderr or exc}") from None
    problems: list[Problem] = []
    # Every model file of that revision, each checked as load_catalog checks it; another model's
    # problems there do not keep this one from being read.
    found = [m for m in _load_models(tree, read_positioned, problems) if m.name == name]
    if not found:
        raise refused(f"revision {short} has no valid model named {name} in {MODELS_DIR}/")
    _MODELS_AT[key] = found[0]
    return found[0]


def _load(root: Path, read) -> tuple[Fleet, list[Model]]:
    fleet_path = root / FLEET_FILE
    if not fleet_path.exists() and not (root / MODELS_DIR).exists():
        # Not a catalog at all (validate run in the wrong directory): one line that says where,
        # not a "looks like a model file" for every YAML file of every project below it.
        raise CatalogInvalid([Problem(FLEET_FILE, 1, 1, f"missing: {root} is not a catalog; "
                                      "a catalog is a directory with fleet.yaml and models/")])
    problems: list[Problem] = []
    fleet, fleet_doc = _load_fleet(root, read, problems)
    models = _load_models(root, read, problems)
    for stray in _stray_yaml(root):
        if stray.resolve().is_relative_to(root) and _looks_like_model(stray):
            rel = str(stray.relative_to(root))
            problems.append(Problem(rel, 1, 1, f"looks like a model file but is outside models/, so it would be ignored; move it to models/{stray.name}"))

    if fleet_doc is not None:
        problems += llama_ipv6_problems(fleet_doc, models)
    if problems or fleet is None:
        order = {FLEET_FILE: 0}
        problems.sort(key=lambda p: (order.get(p.file, 1), p.file, p.line, p.column))
        raise CatalogInvalid(problems)
    models.sort(key=lambda m: m.name)
    leave_to_exit(fleet_doc)  # 4,000 nodes' parsed YAML: a one-shot command leaves it to the exit
    return fleet, models


def _load_fleet(root: Path, read, problems: list[Problem]) -> tuple[Fleet | None, Document | None]:
    """fleet.yaml, checked and built; (None, None) with its problems added when it is missing or wrong."""
    fleet_path = root / FLEET_FILE
    if not fleet_path.exists():
        problems.append(Problem(FLEET_FILE, 1, 1, "missing: a catalog needs fleet.yaml listing its nodes"))
        return None, None
    doc, errs = read(root, fleet_path, FLEET_FILE)
    problems += errs
    if doc is None:
        return None, None
    errs = schema_problems(doc, "fleet")
    if not errs:
        errs = fleet_problems(doc, str(root))
    problems += errs
    if errs:
        return None, None
    return build_fleet(doc.data), doc


def _load_models(root: Path, read, problems: list[Problem]) -> list[Model]:
    """Every models/*.yaml that passes its checks, in file name order; the problems of the others added."""
    models: list[Model] = []
    names: dict[str, tuple[str, int, int]] = {}
    served: dict[str, tuple[str, int, int]] = {}  # served name -> where it was first given
    models_dir = root / MODELS_DIR
    if not models_dir.is_dir():
        if models_dir.exists():  # a file named models: every model it was meant to hold would be silently absent
            problems.append(Problem(MODELS_DIR, 1, 1, "not a directory; models/ holds one YAML file per model"))
        return models
    for p in sorted(models_dir.iterdir()):
        rel = f"{MODELS_DIR}/{p.name}"
        if p.name.startswith("."):
            continue
        if p.is_dir():
            problems.append(Problem(rel, 1, 1, "model files go directly in models/, not in a subdirectory"))
            continue
        if not p.name.endswith(YAML_SUFFIXES):
            continue
        doc, errs = read(root, p, rel)
        problems += errs
        if doc is None:
            continue
        errs = schema_problems(doc, "model")
        if not errs:
            errs = model_problems(doc)
        problems += errs
        if errs:
            continue
        model = build_model(doc.data, rel)
        if model.name in names:
            first = names[model.name]
            problems.append(doc.at(("name",), f"duplicate model name '{model.name}' (also in {first[0]}:{first[1]}:{first[2]})"))
            continue
        line, col = position(doc.data, ("name",))
        names[model.name] = (rel, line, col)
        served_field = "served_name" if "served_name" in doc.data else "name"
        if model.served in served:
            first = served[model.served]
            # One name, two models: a gateway would load-balance requests for one model onto the other.
            problems.append(doc.at((served_field,), f"served name '{model.served}' is also the served name of the "
                                                    f"model in {first[0]}:{first[1]}:{first[2]}; give one of them "
                                                    "another served_name"))
            continue
        served[model.served] = (rel, *position(doc.data, (served_field,)))
        models.append(model)
    return models
