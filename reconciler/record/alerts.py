"""The Prometheus alerting rules shipped with the project (SPEC section 15), over the daemon's metrics.

Generated here rather than kept as a YAML file so each rule's PromQL sits beside the metric names it
reads (reconciler/record/metrics.py) and `reconciler alert-rules --for 0s` can print the same rules with
short `for:` durations for a test; the shipped durations are the ones below. As with kube-prometheus,
the rules are a file people load (`rule_files:`), not something configured inside the reconciler.

Every rule carries `severity`, labels naming what it is about (model, replica, node, gpu, taken from
the series), and annotations: a summary and what to do.
"""

from __future__ import annotations

import re

import yaml

from reconciler.frozen import frozen

GROUP = "llm-fleet-reconciler"


@frozen
class Rule:
    alert: str
    expr: str
    for_: str  # Prometheus duration; "0s" fires at the first evaluation
    severity: str
    summary: str
    action: str  # what to do, in words
    labels: tuple[tuple[str, str], ...] = ()


# A pass running longer than this is stuck (the catalog's HEAD waits behind it).
HEAD_NOT_APPLIED = "10m"


def rules(*, for_: str | None = None) -> list[Rule]:
    """The shipped rules; `for_` replaces every rule's `for:` (and the stuck-pass threshold) for tests."""
    stuck = _seconds(for_ if for_ is not None else HEAD_NOT_APPLIED)
    shipped = [
        Rule("ReconcilerModelBelowDesired",
             "reconciler_model_replicas_ready < reconciler_model_replicas_desired",
             "5m", "warning",
             "{{ $labels.model }} has {{ $value }} Ready replicas, fewer than desired, for 5 minutes",
             "Run `reconciler status` and `reconciler explain {{ $labels.model }}`: unplaced replicas say why no node "
             "fits; Failed ones say what their engine printed (`reconciler logs REPLICA`); `reconciler events "
             "--model {{ $labels.model }}` shows what changed."),
        Rule("ReconcilerReplicaCrashLooping",
             "reconciler_replica_failures_in_a_row >= 3",
             "5m", "warning",
             "{{ $labels.replica }} of {{ $labels.model }} failed {{ $value }} times in a row",
             "Read its engine's log (`reconciler logs {{ $labels.replica }}`) and `reconciler events --model "
             "{{ $labels.model }} --kind replica.failed`; fix the engine arguments or the model in git, or "
             "quarantine the node (state: cordoned in fleet.yaml) if its GPUs are at fault."),
        Rule("ReconcilerGpuUnhealthy",
             "reconciler_gpu_unhealthy == 1",
             "1m", "warning",
             "GPU {{ $labels.gpu }} of {{ $labels.node }} is {{ $labels.health }}",
             "No new replica is placed on it. Check `reconciler nodes` for the reason (ECC, remap, Xid); drain the "
             "node (state: drained in fleet.yaml) and reset or replace the GPU."),
        Rule("ReconcilerGpuQuarantined",
             "reconciler_gpu_quarantined == 1",
             "0s", "warning",
             "GPU {{ $labels.gpu }} of {{ $labels.node }} is quarantined after a crash loop",
             "Replicas kept failing on it: read their logs (`reconciler events --node {{ $labels.node }}`); the "
             "quarantine ends by itself after gpu_quarantine_s, or when the GPU is reset (a new uuid)."),
        Rule("ReconcilerNodeUnreachable",
             "(time() - reconciler_node_unreachable_since_timestamp_seconds) > on(instance, job) group_left() "
             "reconciler_node_unreachable_grace_seconds",
             "0s", "critical",
             "{{ $labels.node }} has not answered for longer than its grace period",
             "Its replicas are being moved to other nodes. Check the node's network, SSH and power; "
             "`reconciler nodes` says how the probe failed."),
        Rule("ReconcilerRolloutAborted",
             "reconciler_model_rollout_aborted == 1",
             "0s", "warning",
             "The rollout of {{ $labels.model }} was aborted",
             "The stable copies keep serving the old spec. `reconciler status` says which check failed with its "
             "figures; fix the change and commit again, or revert it in git."),
        Rule("ReconcilerHeadNotApplied",
             "reconciler_catalog_head_applied == 0",
             HEAD_NOT_APPLIED, "warning",
             "The catalog's HEAD has not been applied for 10 minutes",
             "HEAD does not validate: run `reconciler validate` on it (the errors are in status/catalog.yaml and "
             "`reconciler events --kind revision.refused`) and push a fix; the last good revision stays in force.",
             (("cause", "invalid-revision"),)),
        Rule("ReconcilerHeadNotApplied",
             f"reconciler_pass_in_progress == 1 and (time() - reconciler_pass_started_timestamp_seconds) > {stuck:g}",
             "0s", "warning",
             "A pass has run for more than 10 minutes: the catalog's HEAD waits behind it",
             "Read the daemon's log for the step it is in (a node that hangs a command); restarting the daemon "
             "leaves engines running and adopts them.",
             (("cause", "stuck-pass"),)),
        Rule("ReconcilerNoPass",
             "(time() - reconciler_last_pass_timestamp_seconds) > 3 * reconciler_resync_interval_seconds",
             "0s", "critical",
             "No reconcile pass for 3 resync intervals",
             "The daemon is stuck or down: check `systemctl status` of its unit and its log; while it is down "
             "engines keep serving but nothing is reconciled."),
    ]
    if for_ is None:
        return shipped
    return [Rule(r.alert, r.expr, for_, r.severity, r.summary, r.action, r.labels) for r in shipped]


def rules_document(*, for_: str | None = None) -> dict:
    return {"groups": [{"name": GROUP, "rules": [
        {"alert": r.alert, "expr": r.expr, "for": r.for_,
         "labels": {"severity": r.severity, **dict(r.labels)},
         "annotations": {"summary": r.summary, "action": r.action}}
        for r in rules(for_=for_)]}]}


def rules_yaml(*, for_: str | None = None) -> str:
    header = ("# Prometheus alerting rules for llm-fleet-reconciler's daemon (`reconciler run --metrics-address`).\n"
              "# Printed by `reconciler alert-rules`; load them with `rule_files:` in prometheus.yml.\n")
    return header + yaml.safe_dump(rules_document(for_=for_), sort_keys=False, width=1000, allow_unicode=True)


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _seconds(text: str) -> float:
    """A Prometheus duration ('10m', '1h30m', '0s') in seconds; ValueError when it is not one."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(text)
    return total


def check_duration(text: str) -> str:
    _seconds(text)
    return text
