"""The frozen values (model.Fleet, model.Model) built from documents that passed every check.
"""

from __future__ import annotations

import json
from typing import Any

from reconciler.model import (
    DEFAULT_DRAIN_S,
    DEFAULT_PORTS,
    AutoscalePolicy,
    ProfileMetrics,
    ReplicaRange,
    FetchPolicy,
    Fleet,
    Model,
    NodeSpec,
    Profile,
    LeaderSettings,
    SlurmSettings,
    SshSettings,
    UpdatePolicy,
    RequestCheck,
    PrometheusCheck,
    PrometheusQuery,
    RolloutPolicy,
    SecretRef,
    frozen_map,
)
from reconciler.vocabulary import LauncherKind, NodeState, SecretKind, TransportKind


def _plain(value: Any) -> Any:
    """ruamel's commented containers to plain dict/list (for frozen dataclasses)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _plain_document(data: Any) -> Any:
    """A document as plain dicts and lists. What the readers without positions (yaml_rs, PyYAML) give
    is plain already, and has string keys once it passed its schema: only ruamel's tree (dict
    subclasses that carry positions) is copied, which for a 4,000-node fleet.yaml is 50,000 values."""
    return data if type(data) is dict else _plain(data)


def _ssh(base: SshSettings, overrides: dict | None) -> SshSettings:
    if not overrides:
        return base  # most nodes: the fleet's settings, one value shared
    o = overrides
    return SshSettings(
        user=o.get("user", base.user),
        port=o.get("port", base.port),
        identity_file=o.get("identity_file", base.identity_file),
        known_hosts=o.get("known_hosts", base.known_hosts),
        connect_timeout_s=float(o.get("connect_timeout_s", base.connect_timeout_s)),
        command_timeout_s=float(o.get("command_timeout_s", base.command_timeout_s)),
    )


def build_fleet(data: dict) -> Fleet:
    data = _plain_document(data)
    defaults = _ssh(SshSettings(), data.get("ssh"))
    fleet_state_dir = data.get("state_dir", NodeSpec.state_dir)
    nodes = []
    for n in data.get("nodes") or []:
        nodes.append(
            NodeSpec(
                id=n["id"],
                address=n["address"],
                data_address=n.get("data_address", n["address"]),
                labels=frozen_map(n.get("labels")),
                state=NodeState(n.get("state", NodeState.READY)),
                model_dirs=tuple(n.get("model_dirs") or ()),
                fabrics=frozen_map({k: tuple(v) for k, v in (n.get("fabrics") or {}).items()}),
                ssh=_ssh(defaults, n.get("ssh")),
                transport=n.get("transport", TransportKind.SSH),  # typed by NodeSpec
                gpu_class=n.get("gpu_class"),
                state_dir=n.get("state_dir", fleet_state_dir),
                socket_ifname=n.get("socket_ifname"),
                launcher=n.get("launcher", LauncherKind.SSH),
                slurm_name=n.get("slurm_name", ""),
                cordon_gpus=tuple(sorted(n.get("cordon_gpus") or ())),
            )
        )
    slurm = data.get("slurm")
    slurm_settings = None
    if slurm is not None:
        slurm_settings = SlurmSettings(
            submit_via=slurm["submit_via"],
            partition=slurm.get("partition"),
            account=slurm.get("account"),
            qos=slurm.get("qos"),
            time_limit=str(slurm.get("time_limit", "UNLIMITED")),
            extra_args=tuple(str(a) for a in slurm.get("extra_args") or ()),
            command_timeout_s=float(slurm.get("command_timeout_s", 30)),
        )
    leader = data.get("leader")
    leader_settings = None
    if leader is not None:
        etcd = leader["etcd"]
        leader_settings = LeaderSettings(
            endpoints=tuple(str(e) for e in etcd["endpoints"]),
            ca_file=etcd.get("ca_file"), cert_file=etcd.get("cert_file"), key_file=etcd.get("key_file"),
            lease_s=int(leader.get("lease_s", LeaderSettings.lease_s)),
        )
    return Fleet(nodes=tuple(nodes), ssh=defaults, slurm=slurm_settings, owner=data.get("owner"), leader=leader_settings,
                 unreachable_grace_s=float(data.get("unreachable_grace_s", Fleet.unreachable_grace_s)),
                 gpu_quarantine_s=float(data.get("gpu_quarantine_s", Fleet.gpu_quarantine_s)),
                 gateway_settle_s=float((data.get("gateway") or {}).get("settle_s", Fleet.gateway_settle_s)))


def build_profile(p: dict) -> Profile:
    gpu_class = p.get("gpu_class")
    return Profile(
        name=p["name"],
        engine=p["engine"],
        gpu_class=gpu_class,
        gpus_per_node=p.get("gpus_per_node", 1) if gpu_class else 0,
        nodes=p.get("nodes", 1),
        priority=p.get("priority", 0),
        node_selector=frozen_map(p.get("node_selector")),
        min_memory_gb=p.get("min_memory_gb", 0),
        min_disk_gb=p.get("min_disk_gb", 0),
        port=p.get("port", DEFAULT_PORTS.get(p["engine"], 0)),
        args=tuple(p.get("args") or ()),
        env=frozen_map({k: _env_value(v) for k, v in (p.get("env") or {}).items()}),
        health_path=p.get("health_path", "/health"),
        start_timeout_s=float(p.get("start_timeout_s", 900)),
        command=tuple(p["command"]) if "command" in p else None,
        metrics=None if "metrics" not in p else ProfileMetrics(
            waiting=p["metrics"]["waiting"], running=p["metrics"]["running"],
            path=p["metrics"].get("path", "/metrics")),
    )


def _env_value(value: Any) -> "str | SecretRef":
    """A string, or (the schema allows exactly one key) a reference to a secret."""
    if isinstance(value, dict):
        [(kind, name)] = value.items()
        return SecretRef(SecretKind(kind), name)
    return value


def build_model(data: dict, rel: str) -> Model:
    data = _plain_document(data)
    profiles = [build_profile(p) for p in data["profiles"]]
    # Stable: among equal priorities, catalog order decides.
    profiles.sort(key=lambda p: -p.priority)
    update = data.get("update")
    fetch = data.get("fetch")
    replicas = data.get("replicas", 1)
    # A range starts at min; the count autoscaling left in status/ replaces it (autoscale.with_counts).
    scale = ReplicaRange(replicas["min"], replicas["max"]) if isinstance(replicas, dict) else None
    policy = data.get("autoscale")
    return Model(
        name=data["name"],
        source=data["source"],
        replicas=scale.min if scale is not None else replicas,
        scale=scale,
        autoscale=None if policy is None else AutoscalePolicy(
            target=float(policy["target"]),
            metric=policy.get("metric", "requests"),
            up_delay_s=float(policy.get("up_delay_s", AutoscalePolicy.up_delay_s)),
            down_delay_s=float(policy.get("down_delay_s", AutoscalePolicy.down_delay_s)),
        ),
        spread=data.get("spread", "required"),
        profiles=tuple(profiles),
        file=rel,
        update=None if update is None else UpdatePolicy(update.get("max_surge", 0), update.get("max_unavailable", 0)),
        fetch=None if fetch is None else FetchPolicy(
            from_node=bool(fetch.get("from_node", False)),
            command=tuple(fetch["command"]) if "command" in fetch else None,
            max_parallel=fetch.get("max_parallel", 2),
        ),
        served_name=data.get("served_name"),
        drain_s=float(data.get("drain_s", DEFAULT_DRAIN_S)),
        rollout=build_rollout(data.get("rollout")),
    )


def build_rollout(r: dict | None) -> RolloutPolicy | None:
    """`rollout:` (SPEC section 13), its defaults filled in; checked already (schema, rules)."""
    if r is None:
        return None
    canary, checks = r.get("canary") or {}, r.get("checks") or {}
    req, prom = checks.get("request"), checks.get("prometheus")
    request = None
    if req is not None:
        expect = req.get("expect") or {}
        ratio = req.get("max_latency_ratio")
        request = RequestCheck(
            path=req.get("path", RequestCheck.path), body_json=json.dumps(req.get("body") or {}, sort_keys=True),
            status=expect.get("status", 200), contains=expect.get("contains"), matches=expect.get("matches"),
            max_latency_ratio=None if ratio is None else float(ratio),
            timeout_s=float(req.get("timeout_s", RequestCheck.timeout_s)))
    prometheus = None
    if prom is not None:
        prometheus = PrometheusCheck(
            address=prom["address"].rstrip("/"), timeout_s=float(prom.get("timeout_s", PrometheusCheck.timeout_s)),
            queries=tuple(PrometheusQuery(q["name"], q["query"], q.get("max"), q.get("min")) for q in prom["queries"]))
    return RolloutPolicy(
        canary_replicas=canary.get("replicas", 1), weight=canary.get("weight", RolloutPolicy.weight),
        analysis_s=float(canary.get("analysis_s", RolloutPolicy.analysis_s)),
        interval_s=float(checks.get("interval_s", RolloutPolicy.interval_s)),
        failure_limit=checks.get("failure_limit", RolloutPolicy.failure_limit),
        request=request, prometheus=prometheus)
