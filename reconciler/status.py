"""Status files: deterministic YAML, written atomically, only when content changes.

A status file with a timestamp that ticks on every pass turns `git diff
status/` into noise, and people stop reading it. So documents here carry no
clock, keep the key order they were built with, and a write that would not
change a byte does not touch the file at all.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from enum import StrEnum
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from reconciler.autoscale import AutoscaleState, kept_states, state_document, state_from_document
from reconciler.constants import STATUS_DIR
from reconciler.errors import Problem, StatusWriteError
from reconciler.frozen import frozen
from reconciler.host import Host
from reconciler.canary import Rollout, current
from reconciler.inventory import inventory_to_document, utc_text
from reconciler.model import Catalog, Fleet, Inventory, Model, Placement, Rejection, replica_ordinal
from reconciler import gateway
from reconciler.outcomes import Decision, PassResult, ReplicaState
from reconciler.placement import port_windows, summarize
from reconciler.plan import Plan
from reconciler.vocabulary import ActionKind, DecisionAction, FailureKind, Phase, WaitKind

@functools.cache
def _status_dumper() -> type:
    """PyYAML's dumper for status/: block style for structure, flow style for short lists of scalars
    (GPU indices, peers), a StrEnum as the string it is (a phase reads `Ready`, not a tag). Made on
    first use: `plan` and `validate` write no status file and need no PyYAML."""
    import yaml

    base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # the C emitter: several times faster on nodes.yaml

    class StatusDumper(base):
        pass

    def represent_list(dumper, data: list):
        flow = all(isinstance(x, (int, float, str, bool)) or x is None for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)

    StatusDumper.add_representer(list, represent_list)
    StatusDumper.add_multi_representer(StrEnum, lambda dumper, data: dumper.represent_str(str(data)))
    return StatusDumper


def dump_yaml(doc: Any) -> str:
    import yaml

    return yaml.dump(doc, Dumper=_status_dumper(), sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


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
        # mkstemp makes the file 0600; status files are read by gateways, dashboards and monitors
        # running as other users, so they get the mode any new file gets here (0644 under umask 022).
        os.fchmod(fd, 0o666 & ~_umask())
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


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return mask


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
# Model and endpoint status documents (SPEC section 2), from one PassResult
# --------------------------------------------------------------------------


def endpoint_url(data_address: str, port: int) -> str:
    return Host(data_address).url(port)


def _where_it_runs(plan: Plan, rid: str) -> Placement | None:
    """Where the plan puts a replica, else where it was found running."""
    out = plan.outcomes.get(rid)
    return out.placement if out is not None and out.placement is not None else plan.observed.get(rid)


_HELD_FOR_FAILURE = {WaitKind.BACKOFF: FailureKind.TEMPORARY, WaitKind.START_BACKOFF: FailureKind.TEMPORARY,
                     WaitKind.STALLED: FailureKind.PERMANENT}


def predicted_phases(plan: Plan) -> dict[str, Phase]:
    """The phase each desired replica will be in once the plan is applied, as far as a plan can tell.

    Kept replicas are assumed Ready (a plan has no health checks); anything about
    to be started is Pending; a crashed replica waiting out its backoff is Failed;
    one on a node that stopped answering is Unknown.
    """
    phases: dict[str, Phase] = {}
    for rid, out in plan.outcomes.items():
        phases[rid] = Phase.READY if out.kept else Phase.PENDING
    for w in plan.waiting:
        if w.kind in _HELD_FOR_FAILURE:
            phases[w.replica] = Phase.FAILED
        elif w.kind is WaitKind.NODE_UNREACHABLE:
            phases[w.replica] = Phase.UNKNOWN
        elif w.kind is WaitKind.DRAINING:
            # Out of endpoints.yaml and every gateway file, stopped once its requests end (SPEC section 10).
            phases[w.replica] = Phase.DRAINING
    for a in plan.actions:
        if a.action in (ActionKind.RESTART, ActionKind.REPLACE) and a.replica in phases:
            phases[a.replica] = Phase.PENDING if a.placement is not None else phases[a.replica]
    return phases


def predicted_failures(plan: Plan) -> dict[str, FailureKind]:
    """The failure kind of each replica the plan holds because it failed: a crash waiting out its
    restart backoff, a failed start backing off (temporary), or stalled (permanent)."""
    return {w.replica: _HELD_FOR_FAILURE[w.kind] for w in plan.waiting if w.kind in _HELD_FOR_FAILURE}


def unplaced_message(out, show_all: bool = False) -> str:
    """The one-line status message of a replica that could not be placed; the same whether
    predicted (plan --write-status) or observed (apply, the daemon), so status does not flip."""
    if out.rejections_same_as:
        return f"cannot be placed; same rejections as {out.rejections_same_as}"
    return "cannot be placed: " + " | ".join(summarize(out.rejections, out.nodes_considered, show_all))


def rejection_document(r: Rejection) -> dict:
    return {"profile": r.profile, "pool": r.pool, "node": r.node, "reason": r.reason}


def _plan_reasons(plan: Plan) -> dict[str, str]:
    """replica id -> what the plan does with it or waits for: the message when nothing else says more."""
    reasons: dict[str, str] = {}
    for a in plan.actions:
        reasons[a.replica] = f"{a.action}: {a.reason}"
    for w in plan.waiting:
        reasons[w.replica] = w.reason
    return reasons


def predicted_pass(catalog: Catalog, plan: Plan, observed: Mapping[str, str | None] | None = None) -> PassResult:
    """The pass a plan predicts, as the PassResult an applied one would be: what `plan --write-status`
    writes, and what a pass reports for the replicas it has not settled yet. Each desired replica's
    phase as far as a plan can tell, its message the plan's reason, its revision the plan's for what it
    starts and the record's (`observed`) for what it keeps."""
    phases = predicted_phases(plan)
    failures = predicted_failures(plan)
    revisions = predicted_revisions(plan, observed)
    reasons = _plan_reasons(plan)
    replicas: dict[str, ReplicaState] = {}
    for model in catalog.models:
        for rid in model.replica_ids():
            out = plan.outcomes.get(rid)
            placement = _where_it_runs(plan, rid)
            phase = phases.get(rid, Phase.UNKNOWN)
            unplaced = out is not None and out.placement is None
            replicas[rid] = ReplicaState(
                rid, model.name, placement.profile if placement is not None else None, phase,
                unplaced_message(out) if unplaced else reasons.get(rid, ""),
                placement.nodes if placement is not None else (),
                catalog.fleet.endpoint(placement.head.node, placement.head.port) if placement and placement.nodes else None,
                revision=revisions.get(rid),
                failure=failures.get(rid) if phase == Phase.FAILED else None,
            )
    for w in plan.waiting:  # no longer desired (a scale down, a removed model), draining before it stops
        where = plan.observed.get(w.replica)
        if w.kind is WaitKind.DRAINING and w.replica not in replicas and where is not None and where.nodes:
            replicas[w.replica] = ReplicaState(w.replica, w.model, where.profile, Phase.DRAINING, w.reason, where.nodes,
                                               catalog.fleet.endpoint(where.head.node, where.head.port))
    return PassResult(catalog.revision, None, plan, replicas=replicas, dry_run=True)


def _node_entries(fleet: Fleet, placement: Placement | None) -> list[dict]:
    nodes = []
    for a in placement.nodes if placement is not None else ():
        entry = {"node": a.node, "rank": a.rank, "gpus": list(a.gpus), "port": a.port}
        if a.rank == 0:
            # Only the head serves; other ranks' ports are for the engine's own traffic.
            entry["endpoint"] = fleet.endpoint(a.node, a.port)
        nodes.append(entry)
    return nodes


def _replica_entry(fleet: Fleet, result: PassResult, state: ReplicaState | None, rid: str, show_all: bool) -> dict:
    plan = result.plan
    out = plan.outcomes.get(rid)
    placement = _where_it_runs(plan, rid)
    phase = state.phase if state is not None else Phase.UNKNOWN
    entry = {
        "id": rid,
        "profile": placement.profile if placement is not None else None,
        "phase": phase,
        "nodes": _node_entries(fleet, placement),
        "message": state.message if state is not None else "",
    }
    if phase == Phase.FAILED and state.failure:
        # Beside the message: whether retrying can help (temporary) or not until something changes (permanent).
        entry["failure"] = state.failure
    entry["restarts"] = plan.restarts.get(rid, 0)
    if state is not None and state.revision:  # known only for a catalog in git; absent rather than null
        entry["revision"] = state.revision
    if state is not None and state.canary:  # a canary copy of a rollout Progressing (SPEC section 13)
        entry["canary"] = True
    if out is not None and out.placement is None:
        # An unplaced replica: its message and the rejections behind it (or the replica that has the same).
        entry["message"] = entry["message"] or unplaced_message(out, show_all)
        if out.rejections_same_as:
            entry["rejections_same_as"] = out.rejections_same_as
        else:
            entry["rejections"] = [rejection_document(r) for r in out.rejections]
    return entry


def model_status_document(model: Model, result: PassResult, fleet: Fleet, show_all: bool = False) -> dict:
    """status/models/<name>.yaml: desired and ready counts, every replica with its nodes and endpoints,
    from the pass's replica states (observed by apply and the daemon, or predicted_pass's); a model
    with a range also its count and why (result.autoscale, SPEC section 11), after `ready`."""
    replicas = [_replica_entry(fleet, result, result.replicas.get(rid), rid, show_all) 
                for rid in model.replica_ids() + _draining_beyond(model, result.replicas)]
    doc = {
        "name": model.name,
        "desired": model.replicas,
        "ready": sum(1 for r in replicas if r["phase"] == Phase.READY),
    }
    autoscale = result.autoscale.get(model.name)
    if model.scale is not None and autoscale is not None:
        doc["autoscale"] = state_document(model, autoscale)
    rollout = current(model, result.rollouts.get(model.name))
    if rollout is not None:
        doc["rollout"] = rollout_document(rollout)
    doc["replicas"] = replicas
    return doc


def rollout_document(r: Rollout) -> dict:
    """status/models `rollout:` (SPEC section 13): no clock time but `since`, so it changes only with the rollout."""
    return {
        "state": str(r.state),
        "revision": r.revision,
        "from_revision": r.from_revision,
        "since": utc_text(r.since),
        "weight": r.weight,
        "checks": [{"name": c.name, "passed": c.passed, "failed": c.failed, "last": c.last} for c in r.checks],
        "reason": r.reason,
    }


def read_autoscale_states(catalog_root: str | os.PathLike, models: Iterable[Model]) -> dict[str, AutoscaleState]:
    """Each autoscaled model's count as status/models/<name>.yaml holds it (SPEC section 11: `apply`
    and `plan` take it from there); a model without a readable block is absent, so it starts at min."""
    states: dict[str, AutoscaleState] = {}
    scaled = [m for m in models if m.scale is not None]
    if not scaled:
        return states
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    root = Path(catalog_root) / STATUS_DIR / "models"
    for m in scaled:
        try:
            doc = yaml.load((root / f"{m.name}.yaml").read_bytes(), Loader=loader)
        except (OSError, yaml.YAMLError):
            continue
        state = state_from_document(doc.get("autoscale")) if isinstance(doc, dict) else None
        if state is not None:
            states[m.name] = state
    return states


def _draining_beyond(model: Model, replicas: Mapping[str, ReplicaState]) -> list[str]:
    """Replicas above the replica count still draining after a scale down: listed until they stop."""
    extra = []
    for rid, state in replicas.items():
        ordinal = replica_ordinal(model.name, rid)
        if state.phase == Phase.DRAINING and ordinal is not None and ordinal >= model.replicas:
            extra.append((ordinal, rid))
    return [rid for _, rid in sorted(extra)]


def endpoints_document(catalog: Catalog, result: PassResult) -> dict:
    """status/endpoints.yaml: per model of the catalog, the URLs of its Ready replicas (PassResult.endpoints)."""
    ready = result.endpoints()
    doc: dict[str, Any] = {"models": {model.name: sorted(ready.get(model.name, ())) for model in catalog.models}}
    # Canary URLs (SPEC section 13), also listed under models: a gateway that weighs by hand can tell them.
    canary = {}
    for st in result.replicas.values():
        if st.canary and st.phase == Phase.READY and st.endpoint:
            canary.setdefault(st.model, []).append(st.endpoint)
    if canary:
        doc["canary"] = {name: sorted(urls) for name, urls in sorted(canary.items())}
    return doc


# --------------------------------------------------------------------------
# status/catalog.yaml (SPEC section 2 and 6): one builder, for apply and the daemon
# --------------------------------------------------------------------------


@frozen
class Upstream:
    """What a daemon with --git-pull last heard from its upstream."""

    ref: str
    state: str  # up-to-date | diverged | unreachable | ...
    message: str = ""


@frozen
class LeaderStatus:
    host: str
    since: str  # UTC, ISO 8601
    epoch: int


@frozen
class CatalogStatus:
    """What status/catalog.yaml says, whoever applied last (`apply` or the daemon), so a reviewer and
    a daemon started later read one shape.

    branch/uncommitted are None outside git (and then not written); never HEAD's own id, which a
    status commit would move."""

    attempted: str | None
    applied: str | None
    message: str
    errors: tuple[Problem, ...] = ()
    branch: str | None = None
    uncommitted: tuple[str, ...] | None = None
    upstream: Upstream | None = None
    warnings: tuple[str, ...] = ()
    # Models the fleet does not run as HEAD says, in words: a canary rollout aborted (SPEC section 13).
    out_of_sync: tuple[str, ...] = ()
    leader: LeaderStatus | None = None  # with `leader:` in fleet.yaml: who leads (SPEC 14)


def catalog_document(st: CatalogStatus) -> dict:
    doc: dict[str, Any] = {
        "last_attempted_revision": st.attempted,
        "last_applied_revision": st.applied,
        "message": st.message,
        "errors": [{"file": p.file, "line": p.line, "column": p.column, "message": p.message} for p in st.errors],
    }
    if st.uncommitted is not None:
        doc["branch"] = st.branch
        doc["uncommitted_changes"] = list(st.uncommitted)
        if st.upstream is not None:
            doc["upstream"] = {"ref": st.upstream.ref, "state": st.upstream.state, "message": st.upstream.message}
    if st.leader is not None:
        doc["leader"] = {"host": st.leader.host, "since": st.leader.since, "epoch": st.leader.epoch}
    doc["warnings"] = list(st.warnings)
    if st.out_of_sync:  # only when some model is: a catalog without rollouts keeps its file as it was
        doc["out_of_sync"] = list(st.out_of_sync)
    return doc


def write_catalog_status(catalog_root: str | os.PathLike, st: CatalogStatus) -> bool:
    """status/catalog.yaml, when its content changed; StatusWriteError when it cannot be written."""
    return write_document(status_dir(catalog_root) / "catalog.yaml", catalog_document(st))


def status_dir(catalog_root: str | os.PathLike) -> Path:
    """<catalog>/status, refusing to write anywhere it (or status/models) leads outside the catalog,
    with its .gitignore for the temporaries every write goes through.

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
    try:
        write_if_changed(d / ".gitignore", _IGNORE_TEMPORARIES)
    except StatusWriteError:
        pass  # status/ itself cannot be written: the status file written next says so, naming itself
    return d


# Every status file is written through a hidden `.<name>.*.tmp` beside it and renamed into place.
# Without this, a person's `git add -A` in the deployed checkout can list such a file and then
# fail with "unable to stat" when the rename removes it; git skips ignored files without a stat.
_IGNORE_TEMPORARIES = "# written by the reconciler: its half-written status files, renamed into place when whole\n.*.tmp\n"


def predicted_revisions(plan: Plan, observed: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """The revision each replica will run once the plan is applied: the plan's for what it starts,
    what the records say (`observed`) for what it keeps."""
    revisions = dict(observed or {})
    for a in plan.actions:
        if a.action in (ActionKind.START, ActionKind.REPLACE, ActionKind.RESTART) and a.placement is not None:
            revisions[a.replica] = plan.revision
    return revisions


def observed_revisions(inventory: Inventory) -> dict[str, str | None]:
    """Per replica, the revision its head rank's record names."""
    return {r.id: r.revision for n in inventory.nodes for r in n.replicas if r.rank == 0}


def write_pass(catalog: Catalog, result: PassResult, *, nodes: bool = True) -> list[Path]:
    """status/ for one pass, from its PassResult alone: status/models/<name>.yaml for every model (the
    files of removed models removed), status/endpoints.yaml, status/gateway/ (SPEC section 10), and
    status/nodes.yaml when the pass has an inventory and `nodes`. Returns the paths whose content
    changed; a gateway file edited by hand adds one `warn` decision to result.decisions.

    apply and the daemon hand it the pass they observed; `plan --write-status` the pass the plan
    predicts (predicted_pass), so a predicted status and an applied one have one shape."""
    root = status_dir(catalog.root)
    changed = write_model_files(root, catalog, result)
    if write_document(root / "endpoints.yaml", endpoints_document(catalog, result)):
        changed.append(root / "endpoints.yaml")
    gateway_written, edited = write_gateway_files(catalog.root, catalog, result.replicas)
    changed += gateway_written
    result.decisions += [Decision("-", "-", DecisionAction.WARN, line, ok=True) for line in edited]
    if nodes and result.inventory is not None:
        changed += write_nodes_status(catalog.root, result.inventory, catalog.models)
    return changed


GATEWAY_DIR = "gateway"
LITELLM_FILE = "litellm.yaml"
PROMETHEUS_FILE = "prometheus.json"
DIGESTS_FILE = ".written"


def render_litellm(doc: dict) -> str:
    return gateway.LITELLM_HEADER + dump_yaml(doc)


def render_prometheus(groups: list[dict]) -> str:
    return json.dumps(groups, indent=2) + "\n"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_gateway_files(catalog_root: str | os.PathLike, catalog: Catalog,
                        replicas: Mapping[str, ReplicaState]) -> tuple[list[Path], list[str]]:
    """Write both files where their content changed; (paths written, one warning per file that had
    been edited by hand since it was written). StatusWriteError when the file system refuses."""
    directory = status_dir(catalog_root) / GATEWAY_DIR
    texts = {
        LITELLM_FILE: render_litellm(gateway.litellm_document(catalog, replicas)),
        PROMETHEUS_FILE: render_prometheus(gateway.prometheus_targets(catalog, replicas)),
    }
    digests_path = directory / DIGESTS_FILE
    try:
        written_before = json.loads(digests_path.read_text())
        if not isinstance(written_before, dict):
            written_before = {}
    except (OSError, ValueError):
        written_before = {}
    written, warnings = [], []
    for name, text in texts.items():
        path = directory / name
        try:
            on_disk = path.read_bytes()
        except OSError:
            on_disk = None
        if on_disk is not None and on_disk != text.encode() and written_before.get(name) not in (None, _digest(on_disk)):
            warnings.append(f"status/{GATEWAY_DIR}/{name} was edited by hand; written over from the catalog "
                            "(change the catalog instead)")
        if write_if_changed(path, text):
            written.append(path)
    digests = {name: _digest(text.encode()) for name, text in texts.items()}
    if digests != written_before:
        write_if_changed(digests_path, json.dumps(digests, indent=2, sort_keys=True) + "\n")
    return written, warnings


def read_served(catalog_root: str | os.PathLike) -> gateway.Served | None:
    """status/gateway/served.json, what `reconciler gateway` says it serves; None without one."""
    path = status_dir(catalog_root) / GATEWAY_DIR / gateway.SERVED_FILE
    try:
        doc, touched = json.loads(path.read_text()), path.stat().st_mtime
    except (OSError, ValueError):
        return None
    served = gateway.Served.from_document(doc)
    # Its mtime is the heartbeat: the gateway touches the file rather than rewrite it, so a daemon that
    # commits status/ commits only what changed.
    return None if served is None else dataclasses.replace(served, alive_at=max(served.alive_at, touched))


def write_served(catalog_root: str | os.PathLike, served: gateway.Served) -> bool:
    return write_if_changed(status_dir(catalog_root) / GATEWAY_DIR / gateway.SERVED_FILE,
                            json.dumps(served.as_document(), indent=2, sort_keys=True) + "\n")


def removed_model_document(name: str, result: PassResult, fleet: Fleet) -> dict:
    """status/models/<name>.yaml of a model no longer in the catalog whose copies still drain: kept
    until its last copy has stopped (SPEC 13), so status shows them Draining."""
    states = sorted((s for s in result.replicas.values() if s.model == name),
                    key=lambda s: (replica_ordinal(name, s.replica) or 0, s.replica))
    return {"name": name, "desired": 0, "ready": 0,
            "replicas": [_replica_entry(fleet, result, s, s.replica, False) for s in states]}


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
