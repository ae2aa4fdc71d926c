"""Status files: deterministic YAML, written atomically, only when content changes.

A status file with a timestamp that ticks on every pass turns `git diff
status/` into noise, and people stop reading it. So documents here carry no
clock, keep the key order they were built with, and a write that would not
change a byte does not touch the file at all.
"""

from __future__ import annotations

import dataclasses
import os
from enum import StrEnum
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from reconciler.autoscale import AutoscaleState, kept_states, state_document, state_from_document
from reconciler.constants import STATUS_DIR
from reconciler.errors import PERMANENT, TEMPORARY, StatusWriteError
from reconciler.host import Host
from reconciler.inventory import inventory_to_document
from reconciler.model import Catalog, Fleet, Inventory, Model, Placement, Rejection
from reconciler.placement import port_windows, summarize
from reconciler.plan import Plan, WaitKind

try:  # the C emitter is several times faster on a fleet-sized nodes.yaml
    from yaml import CSafeDumper as _Dumper
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeDumper as _Dumper
    from yaml import SafeLoader as _Loader


class _StatusDumper(_Dumper):
    """Block style for structure, flow style for short lists of scalars (GPU indices, peers)."""


def _represent_list(dumper: yaml.BaseDumper, data: list) -> yaml.Node:
    flow = all(isinstance(x, (int, float, str, bool)) or x is None for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_StatusDumper.add_representer(list, _represent_list)
# The vocabulary's StrEnums are written as the strings they are (a phase reads `Ready`, not a tag).
_StatusDumper.add_multi_representer(StrEnum, lambda dumper, data: dumper.represent_str(str(data)))




def dump_yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_StatusDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def write_if_changed(path: str | os.PathLike, text: str) -> bool:
    """Atomically replace `path` with `text` unless it already holds exactly that. True if written.

    StatusWriteError when the file system refuses (read-only catalog, `status` a plain file):
    a message naming the file, not an OSError traceback.
    """
    path = Path(path)
    try:
        return _write_if_changed(path, text.encode())
    except OSError as exc:
        raise StatusWriteError(str(path), exc.strerror or str(exc)) from None


def _write_if_changed(path: Path, data: bytes) -> bool:
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return True


# path -> (key, text) as this process last wrote it. An idle pass hands on an equal document:
# comparing keys takes milliseconds where rendering a 4,000-node snapshot again took seconds
# (PyYAML's representer is Python even with the C emitter; the pass memory's JSON half a second).
_LAST_WRITTEN: dict[Path, tuple[Any, str]] = {}


def write_rendered(path: str | os.PathLike, key: Any, render: Callable[[], str]) -> bool:
    """write_if_changed(path, render()), rendering only when `key` differs from the key of what this
    process last wrote to path. key must be a value no later change can alter (a repr, a tuple of
    frozen values), so a caller mutating its document cannot make the cache lie."""
    path = Path(path)
    last = _LAST_WRITTEN.get(path)
    text = last[1] if last is not None and last[0] == key else render()
    # Still compared with the file itself: an edit or a checkout under us is written over.
    written = write_if_changed(path, text)
    _LAST_WRITTEN[path] = (key, text)
    return written


def write_document(path: str | os.PathLike, doc: Any) -> bool:
    """Write doc as YAML to path unless the file already holds it; True if written."""
    return write_rendered(path, repr(doc), lambda: dump_yaml(doc))


# --------------------------------------------------------------------------
# Model and endpoint status documents (SPEC section 2), from a plan and the phases seen
# --------------------------------------------------------------------------


def endpoint_url(data_address: str, port: int) -> str:
    return Host(data_address).url(port)


def replica_endpoint(fleet: Fleet, node_id: str, port: int) -> str:
    """Where a replica serves: the head's data address (what other hosts reach), not its SSH address."""
    spec = fleet.node(node_id)
    return (spec.data_host if spec is not None else Host(node_id)).url(port)


def _where_it_runs(plan: Plan, rid: str) -> Placement | None:
    """Where the plan puts a replica, else where it was found running."""
    out = plan.outcomes.get(rid)
    return out.placement if out is not None and out.placement is not None else plan.observed.get(rid)


def predicted_phases(plan: Plan) -> dict[str, str]:
    """The phase each desired replica will be in once the plan is applied, as far as a plan can tell.

    Kept replicas are assumed Ready (a plan has no health checks); anything about
    to be started is Pending; a crashed replica waiting out its backoff is Failed;
    one on a node that stopped answering is Unknown.
    """
    phases: dict[str, str] = {}
    for rid, out in plan.outcomes.items():
        phases[rid] = "Ready" if out.kept else "Pending"
    for w in plan.waiting:
        if w.kind in (WaitKind.BACKOFF, WaitKind.START_BACKOFF, WaitKind.STALLED):
            phases[w.replica] = "Failed"
        elif w.kind is WaitKind.NODE_UNREACHABLE:
            phases[w.replica] = "Unknown"
    for a in plan.actions:
        if a.action in ("restart", "replace") and a.replica in phases:
            phases[a.replica] = "Pending" if a.placement is not None else phases[a.replica]
    return phases


def predicted_failures(plan: Plan) -> dict[str, str]:
    """The failure kind (errors.TEMPORARY / PERMANENT) of each replica the plan holds because it failed:
    a crash waiting out its restart backoff, a failed start backing off (temporary), or stalled (permanent)."""
    kinds = {WaitKind.BACKOFF: TEMPORARY, WaitKind.START_BACKOFF: TEMPORARY, WaitKind.STALLED: PERMANENT}
    return {w.replica: kinds[w.kind] for w in plan.waiting if w.kind in kinds}


def unplaced_message(out, show_all: bool = False) -> str:
    """The one-line status message of a replica that could not be placed; the same whether
    predicted (plan --write-status) or observed (apply, the daemon), so status does not flip."""
    if out.rejections_same_as:
        return f"cannot be placed; same rejections as {out.rejections_same_as}"
    return "cannot be placed: " + " | ".join(summarize(out.rejections, out.nodes_considered, show_all))


def rejection_document(r: Rejection) -> dict:
    return {"profile": r.profile, "pool": r.pool, "node": r.node, "reason": r.reason}


def _plan_reasons(model: Model, plan: Plan) -> dict[str, str]:
    """replica id -> what the plan does with it or waits for: the message when nothing else says more."""
    reasons: dict[str, str] = {}
    for a in plan.actions:
        if a.model == model.name:
            reasons[a.replica] = f"{a.action}: {a.reason}"
    for w in plan.waiting:
        if w.model == model.name:
            reasons[w.replica] = w.reason
    return reasons


def _node_entries(fleet: Fleet, placement) -> list[dict]:
    nodes = []
    for a in placement.nodes if placement is not None else ():
        entry = {"node": a.node, "rank": a.rank, "gpus": list(a.gpus), "port": a.port}
        if a.rank == 0:
            # Only the head serves; other ranks' ports are for the engine's own traffic.
            entry["endpoint"] = replica_endpoint(fleet, a.node, a.port)
        nodes.append(entry)
    return nodes


def _with_rejections(entry: dict, out, show_all: bool) -> None:
    """An unplaced replica's message and the rejections behind it (or the replica that has the same)."""
    entry["message"] = entry["message"] or unplaced_message(out, show_all)
    if out.rejections_same_as:
        entry["rejections_same_as"] = out.rejections_same_as
    else:
        entry["rejections"] = [rejection_document(r) for r in out.rejections]


def model_status_document(model: Model, plan: Plan, fleet: Fleet, phases: Mapping[str, str] | None = None,
                          messages: Mapping[str, str] | None = None, show_all: bool = False,
                          revisions: Mapping[str, str | None] | None = None,
                          failures: Mapping[str, str] | None = None,
                          autoscale: AutoscaleState | None = None) -> dict:
    """status/models/<name>.yaml: desired and ready counts, every replica with its nodes and endpoints.

    autoscale: a model with a range: its count and why (SPEC section 11), after `ready`.

    phases: replica id -> phase (what apply or the daemon observed); predicted_phases(plan) when None.
    messages: replica id -> message, overriding the plan's own reasons.
    failures: replica id -> the kind of a Failed replica's failure; predicted_failures(plan) when None.
    """
    phases = predicted_phases(plan) if phases is None else phases
    failures = predicted_failures(plan) if failures is None else failures
    messages = messages or {}
    revisions = predicted_revisions(plan) if revisions is None else revisions
    reasons = _plan_reasons(model, plan)
    replicas = []
    for rid in model.replica_ids():
        out = plan.outcomes.get(rid)
        placement = _where_it_runs(plan, rid)
        entry = {
            "id": rid,
            "profile": placement.profile if placement is not None else None,
            "phase": phases.get(rid, "Unknown"),
            "nodes": _node_entries(fleet, placement),
            "message": messages.get(rid, ""),
        }
        if entry["phase"] == "Failed" and failures.get(rid):
            # Beside the message: whether retrying can help (temporary) or not until something changes (permanent).
            entry["failure"] = failures[rid]
        entry["restarts"] = plan.restarts.get(rid, 0)
        if revisions.get(rid):  # known only for a catalog in git; absent rather than a null on every line
            entry["revision"] = revisions[rid]
        if out is not None and out.placement is None:
            _with_rejections(entry, out, show_all)
        if not entry["message"]:
            entry["message"] = reasons.get(rid, "")
        replicas.append(entry)
    doc = {
        "name": model.name,
        "desired": model.replicas,
        "ready": sum(1 for r in replicas if r["phase"] == "Ready"),
    }
    if model.scale is not None and autoscale is not None:
        doc["autoscale"] = state_document(model, autoscale)
    doc["replicas"] = replicas
    return doc


def read_autoscale_states(catalog_root: str | os.PathLike, models: Iterable[Model]) -> dict[str, AutoscaleState]:
    """Each autoscaled model's count as status/models/<name>.yaml holds it (SPEC section 11: `apply`
    and `plan` take it from there); a model without a readable block is absent, so it starts at min."""
    states = {}
    root = Path(catalog_root) / STATUS_DIR / "models"
    for m in models:
        if m.scale is None:
            continue
        try:
            doc = yaml.load((root / f"{m.name}.yaml").read_bytes(), Loader=_Loader)
        except (OSError, yaml.YAMLError):
            continue
        state = state_from_document(doc.get("autoscale")) if isinstance(doc, dict) else None
        if state is not None:
            states[m.name] = state
    return states


def endpoints_document(catalog: Catalog, plan: Plan, phases: Mapping[str, str] | None = None) -> dict:
    """status/endpoints.yaml: per model, the URLs of its Ready replicas (the head's serving port)."""
    phases = predicted_phases(plan) if phases is None else phases
    models = {}
    for model in catalog.models:
        urls = []
        for rid in model.replica_ids():
            if phases.get(rid) != "Ready":
                continue
            placement = _where_it_runs(plan, rid)
            if placement is None or not placement.nodes:
                continue
            head = placement.nodes[0]
            urls.append(replica_endpoint(catalog.fleet, head.node, head.port))
        models[model.name] = sorted(urls)
    return {"models": models}


def status_dir(catalog_root: str | os.PathLike) -> Path:
    """<catalog>/status, refusing to write anywhere it (or status/models) leads outside the catalog.

    A committed `status` symlink to /etc, or to another repository, would otherwise have the
    reconciler rewrite files there on every pass.
    """
    root = Path(catalog_root)
    real_root = root.resolve()
    d = root / STATUS_DIR
    for p in (d, d / "models"):
        real = p.resolve()
        if not real.is_relative_to(real_root):
            link = f" (a symbolic link to {os.readlink(p)})" if p.is_symlink() else ""
            raise StatusWriteError(str(p), f"it leads outside the catalog{link}, to {real}; refusing to write there "
                                   "(status/ is the reconciler's own: remove the link)")
    return d


def predicted_revisions(plan: Plan, observed: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """The revision each replica will run once the plan is applied: the plan's for what it starts,
    what the records say (`observed`) for what it keeps."""
    revisions = dict(observed or {})
    for a in plan.actions:
        if a.action in ("start", "replace", "restart") and a.placement is not None:
            revisions[a.replica] = plan.revision
    return revisions


def observed_revisions(inventory: Inventory) -> dict[str, str | None]:
    """Per replica, the revision its head rank's record names."""
    return {r.id: r.revision for n in inventory.nodes for r in n.replicas if r.rank == 0}


def write_plan_status(catalog_root: str | os.PathLike, catalog: Catalog, plan: Plan, phases: Mapping[str, str] | None = None,
                      messages: Mapping[str, str] | None = None,
                      revisions: Mapping[str, str | None] | None = None,
                      failures: Mapping[str, str] | None = None,
                      autoscale: Mapping[str, AutoscaleState] | None = None) -> list[Path]:
    """Write status/models/<name>.yaml for every model and status/endpoints.yaml; remove files of removed models.

    autoscale: model -> its count and why; a model with a range and no state here is written without
    the block (which reads back as min): callers hand on the state in force (autoscale.kept_states).

    Returns the paths whose content changed.
    """
    root = status_dir(catalog_root)
    phases = predicted_phases(plan) if phases is None else phases
    changed = []
    wanted = set()
    for model in catalog.models:
        path = root / "models" / f"{model.name}.yaml"
        wanted.add(path.name)
        if write_document(path, model_status_document(model, plan, catalog.fleet, phases, messages, revisions=revisions,
                                                       failures=failures,
                                                       autoscale=(autoscale or {}).get(model.name))):
            changed.append(path)
    models_dir = root / "models"
    if models_dir.is_dir():
        for stale in sorted(models_dir.glob("*.yaml")):
            if stale.name not in wanted:
                stale.unlink()
                changed.append(stale)
    if write_document(root / "endpoints.yaml", endpoints_document(catalog, plan, phases)):
        changed.append(root / "endpoints.yaml")
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
    return [path] if write_document(path, inventory_to_document(inventory)) else []


def status_snapshot(inventory: Inventory, models: Iterable[Model]) -> Inventory:
    """The inventory as status/nodes.yaml records it: ports_in_use only where placement hands out ports."""
    windows = port_windows(models)

    def keep(port: int) -> bool:
        return any(lo <= port < hi for lo, hi in windows)

    return Inventory(tuple(
        dataclasses.replace(n, ports_in_use=tuple(p for p in n.ports_in_use if keep(p))) if n.ports_in_use else n
        for n in inventory.nodes
    ))


def counts_in_force(catalog: Catalog) -> dict[str, AutoscaleState]:
    """Each autoscaled model's state as status/models/<name>.yaml holds it, clamped to its range
    (min without one): the count every pass, `plan` and `explain` run the model at."""
    if not any(m.scale is not None for m in catalog.models):
        return {}
    return kept_states(catalog, read_autoscale_states(catalog.root, catalog.models))
