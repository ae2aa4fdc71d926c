"""The pass memory as a JSON-able document, and back: what one-shot `apply` keeps on disk and the
daemon under `leader:` keeps in etcd.

memory_from_document forgives: anything unreadable is forgotten, never an error. A memory written
before one Backoff held both (`history`, `start_failures`) still reads, so an upgrade keeps its backoff.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from reconciler.decide.backoff import Backoff
from reconciler.decide.canary import CheckTally, Rollout
from reconciler.observe.inventory import inventory_from_document, inventory_to_document
from reconciler.model import ProfileMetrics, Quarantine
from reconciler.decide.outcomes import GpuStrikes, PassMemory, StartedWith
from reconciler.decide.plan_values import Drain
from reconciler.vocabulary import FailureKind, RolloutPhase


def memory_to_document(memory: PassMemory) -> dict:
    """PassMemory as JSON-able data, so one-shot `apply` runs remember backoff and grace periods."""
    return {
        "backoff": {rid: _backoff_document(b) for rid, b in sorted(memory.backoff.items())},
        "unreachable_since": dict(sorted(memory.unreachable_since.items())),
        "last_seen": inventory_to_document(memory.last_seen) if memory.last_seen is not None else None,
        "placed_on": {rid: list(nodes) for rid, nodes in sorted(memory.placed_on.items())},
        "draining": {key: {**dataclasses.asdict(d), "nodes": list(d.nodes)} for key, d in sorted(memory.draining.items())},
        "gpu_strikes": {rid: {"where": [[n, list(g)] for n, g in s.where], "count": s.count, "message": s.message}
                        for rid, s in sorted(memory.gpu_strikes.items())},
        "quarantines": [{"node": n, "gpu": i, "reason": q.reason, "until": q.until, "uuid": q.uuid}
                        for (n, i), q in sorted(memory.quarantines.items())],
        "rollouts": {name: _rollout_document(r) for name, r in sorted(memory.rollouts.items())},
        "started_with": {key: {"engine": w.engine, "drain_s": w.drain_s,
                               **({"metrics": dataclasses.asdict(w.metrics)} if w.metrics else {})}
                         for key, w in sorted(memory.started_with.items())},
    }


def memory_from_document(doc: Any) -> PassMemory:
    """The inverse of memory_to_document; anything unreadable is forgotten, never an error."""
    try:
        return PassMemory(
            backoff=_backoff_from(doc),
            unreachable_since={n: float(t) for n, t in _entries(doc, "unreachable_since")},
            last_seen=inventory_from_document(doc["last_seen"]) if doc.get("last_seen") else None,
            placed_on={rid: tuple(nodes) for rid, nodes in _entries(doc, "placed_on")},
            draining={key: _drain(d) for key, d in _entries(doc, "draining")},
            gpu_strikes={rid: _gpu_strikes(s) for rid, s in _entries(doc, "gpu_strikes")},
            quarantines=dict(_quarantine(q) for q in doc.get("quarantines") or ()),
            rollouts={str(name): _rollout(r) for name, r in _entries(doc, "rollouts")},
            started_with={str(key): _started_with(w) for key, w in _entries(doc, "started_with")},
        )
    except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError):  # int(inf): json reads Infinity
        return PassMemory()


def _entries(doc: Mapping[str, Any], key: str) -> Iterable[tuple[Any, Any]]:
    """The items of one of the memory document's mappings; absent or null reads as empty."""
    return (doc.get(key) or {}).items()


def _gpu_strikes(doc: Mapping[str, Any]) -> GpuStrikes:
    return GpuStrikes(tuple((str(n), tuple(int(x) for x in g)) for n, g in doc["where"]),
                      int(doc["count"]), str(doc.get("message", "")))


def _quarantine(doc: Mapping[str, Any]) -> tuple[tuple[str, int], Quarantine]:
    """One quarantined GPU: its (node, index) and its quarantine."""
    return (str(doc["node"]), int(doc["gpu"])), Quarantine(str(doc["reason"]), float(doc["until"]), str(doc.get("uuid", "")))


def _started_with(doc: Mapping[str, Any]) -> StartedWith:
    return StartedWith(str(doc["engine"]), ProfileMetrics(**doc["metrics"]) if doc.get("metrics") else None,
                       None if doc.get("drain_s") is None else float(doc["drain_s"]))


# A Backoff's fields, each with its default: the document leaves out those at their default.
_BACKOFF_FIELDS = {f.name: f.default for f in dataclasses.fields(Backoff)}
# What memories written before one Backoff held both kept under `history` (the plan's crash count) and
# under `start_failures` (old name -> Backoff field): read still, so an upgrade keeps its backoff.
_OLD_HISTORY_FIELDS = ("restarts", "streak", "last_restart")
_OLD_START_FAILURE_FIELDS = {"kind": "failure", "attempts": "failed_starts", "retry_at": "retry_at", "key": "key",
                             "message": "message"}


def _backoff_document(b: Backoff) -> dict[str, Any]:
    """A replica's backoff as JSON-able data: its fields that are not at their default."""
    doc = {}
    for name, default in _BACKOFF_FIELDS.items():
        value = getattr(b, name)
        if value != default:
            doc[name] = list(value) if isinstance(value, tuple) else value
    return doc


def _backoff_from(doc: Mapping[str, Any]) -> dict[str, Backoff]:
    """Each replica's backoff from a memory document: `backoff`, or in a memory written before it the
    two halves it merges (`history`, `start_failures`), one Backoff per replica."""
    if "backoff" in doc:
        return {str(rid): _backoff(b) for rid, b in (doc["backoff"] or {}).items()}
    fields: dict[str, dict[str, Any]] = {}
    for rid, h in (doc.get("history") or {}).items():
        if set(h) - set(_OLD_HISTORY_FIELDS):
            raise ValueError(f"history of {rid}: {sorted(set(h) - set(_OLD_HISTORY_FIELDS))}")
        fields[rid] = dict(h)
    for rid, f in (doc.get("start_failures") or {}).items():
        fields.setdefault(rid, {}).update({new: f[old] for old, new in _OLD_START_FAILURE_FIELDS.items()},
                                          nodes=f.get("nodes") or ())
    return {str(rid): _backoff(b) for rid, b in fields.items()}


def _backoff(doc: Mapping[str, Any]) -> Backoff:
    """One replica's backoff, checked: a field it does not know, a failure kind that is neither temporary
    nor permanent, a failure with no retry time: ValueError (the memory is forgotten)."""
    unknown = set(doc) - set(_BACKOFF_FIELDS)
    failure, last, retry = doc.get("failure"), doc.get("last_restart"), doc.get("retry_at")
    if unknown or failure not in (None, FailureKind.TEMPORARY, FailureKind.PERMANENT) or (failure is not None and retry is None):
        raise ValueError(f"backoff {dict(doc)!r}")
    return Backoff(
        restarts=int(doc.get("restarts", 0)), streak=int(doc.get("streak", 0)),
        last_restart=None if last is None else float(last),
        failure=None if failure is None else FailureKind(failure), failed_starts=int(doc.get("failed_starts", 0)),
        retry_at=None if retry is None else float(retry), key=str(doc.get("key", "")),
        message=str(doc.get("message", "")), nodes=tuple(str(n) for n in doc.get("nodes") or ()),
    )


def _rollout_document(r: Rollout) -> dict[str, Any]:
    return {**dataclasses.asdict(r), "state": str(r.state), "checks": [dataclasses.asdict(c) for c in r.checks]}


def _rollout(doc: Mapping[str, Any]) -> Rollout:
    """A rollout from the memory document; a state this release does not know is an error (forgotten)."""
    def opt(key: str) -> float | None:
        return None if doc.get(key) is None else float(doc[key])

    return Rollout(
        str(doc["model"]), RolloutPhase(doc["state"]), str(doc["target"]), float(doc["since"]), int(doc["weight"]),
        revision=doc.get("revision"), from_revision=doc.get("from_revision"),
        checks=tuple(CheckTally(str(c["name"]), int(c["passed"]), int(c["failed"]), str(c["last"]))
                     for c in doc.get("checks") or ()),
        reason=str(doc.get("reason", "")), ready_since=opt("ready_since"), next_check_at=opt("next_check_at"))


def _drain(doc: Mapping[str, Any]) -> Drain:
    return Drain(str(doc["replica"]), str(doc["model"]), tuple(str(n) for n in doc["nodes"]), int(doc["port"]),
                 str(doc["engine"]), float(doc["started"]), float(doc["until"]), profile=str(doc.get("profile", "")),
                 out_at=None if doc.get("out_at") is None else float(doc["out_at"]))
