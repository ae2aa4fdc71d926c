"""status/ for one pass (apply, the daemon, `plan --write-status`): every model's file, endpoints.yaml,
the gateway files and nodes.yaml, each written only when its content changed."""

from __future__ import annotations

import bisect
import dataclasses
import os
from pathlib import Path
from typing import Iterable

from reconciler.frozen import frozen
from reconciler.observe.inventory import inventory_to_document
from reconciler.model import Catalog, Inventory, Model
from reconciler.decide.outcomes import PassResult
from reconciler.decide.placement import port_windows
from reconciler.record.status.documents import (
    CatalogStatus, catalog_document, endpoints_document, model_status_document, removed_model_document,
)
from reconciler.record.status.files import dump_yaml, status_dir, write_document, write_rendered
from reconciler.record.status.gateway_files import write_gateway_files


@frozen
class Written:
    """What writing one pass's status/ did: the files whose content changed, and one line per gateway
    file that had been edited by hand since the reconciler wrote it (written over: the catalog rules)."""

    paths: tuple[Path, ...]
    hand_edits: tuple[str, ...] = ()


def write_pass(catalog: Catalog, result: PassResult, *, nodes: bool = True) -> Written:
    """status/ for one pass, from its PassResult alone: status/models/<name>.yaml for every model (the
    files of removed models removed), status/endpoints.yaml, status/gateway/ (SPEC section 10), and
    status/nodes.yaml when the pass has an inventory and `nodes`. It changes nothing of `result`: the
    files whose content changed and the hand edits found come back (Written), for the pass to log.

    apply and the daemon hand it the pass they observed; `plan --write-status` the pass the plan
    predicts (predicted_pass), so a predicted status and an applied one have one shape."""
    root = status_dir(catalog.root)
    changed = write_model_files(root, catalog, result)
    if write_document(root / "endpoints.yaml", endpoints_document(catalog, result)):
        changed.append(root / "endpoints.yaml")
    gateway_written, edited = write_gateway_files(catalog.root, catalog, result.replicas)
    changed += gateway_written
    if nodes and result.inventory is not None:
        changed += write_nodes_status(catalog.root, result.inventory, catalog.models)
    return Written(tuple(changed), tuple(edited))


def write_model_files(root: Path, catalog: Catalog, result: PassResult) -> list[Path]:
    changed = []
    wanted = set()
    for model in catalog.models:
        path = root / "models" / f"{model.name}.yaml"
        wanted.add(path.name)
        if write_document(path, model_status_document(model, result, catalog.fleet)):
            changed.append(path)
    known = {m.name for m in catalog.models}
    for name in sorted({s.model for s in result.replicas.values() if s.model not in known}):
        path = root / "models" / f"{name}.yaml"
        wanted.add(path.name)
        if write_document(path, removed_model_document(name, result, catalog.fleet)):
            changed.append(path)
    models_dir = root / "models"
    if models_dir.is_dir():
        for stale in sorted(models_dir.glob("*.yaml")):
            if stale.name not in wanted:
                stale.unlink()
                changed.append(stale)
    return changed


def write_nodes_status(
    catalog_root: str | os.PathLike, inventory: Inventory, models: Iterable[Model] | None = None
) -> list[Path]:
    """Write status/nodes.yaml (the snapshot as observed); returns it when its content changed.

    With the catalog's models, a node's ports_in_use keeps only the ports placement could hand
    out to them: every other listener on a busy node (a browser, a test server, anything bound
    to port 0) comes and goes between passes and would rewrite the file, and with
    --commit-status make a commit, for a change nobody needs to review.
    """
    if models is not None:
        inventory = status_snapshot(inventory, models)
    path = status_dir(catalog_root) / "nodes.yaml"
    # Keyed by the (frozen) snapshot itself: an idle pass hands on an equal one, mostly the very
    # node objects of the last pass (a node that answered the same is not read again), so the
    # comparison is nearly free where building the document and its repr took a tenth of the pass.
    return [path] if write_rendered(path, ("nodes", inventory), lambda: dump_yaml(inventory_to_document(inventory))) else []


def status_snapshot(inventory: Inventory, models: Iterable[Model]) -> Inventory:
    """The inventory as status/nodes.yaml records it: ports_in_use only where placement hands out ports.
    A node whose ports all stay is handed on as it is (the same object, which keeps the comparison
    write_nodes_status makes on an idle pass nearly free)."""
    windows = port_windows(models)  # sorted, disjoint
    starts = [lo for lo, _ in windows]

    def kept(ports: tuple[int, ...]) -> tuple[int, ...]:
        out = []
        for p in ports:
            i = bisect.bisect_right(starts, p) - 1
            if i >= 0 and p < windows[i][1]:
                out.append(p)
        return tuple(out)

    nodes = []
    for n in inventory.nodes:
        ports = kept(n.ports_in_use) if n.ports_in_use else ()
        nodes.append(n if ports == n.ports_in_use else dataclasses.replace(n, ports_in_use=ports))
    return Inventory(tuple(nodes))


def write_catalog_status(catalog_root: str | os.PathLike, st: CatalogStatus) -> bool:
    """status/catalog.yaml, when its content changed; StatusWriteError when it cannot be written."""
    return write_document(status_dir(catalog_root) / "catalog.yaml", catalog_document(st))
