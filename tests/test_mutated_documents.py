"""Documents the reconciler reads back, mutated at random: each is read, or refused in words, never a crash.

The status files, the pass memory, a node's probe report and the daemon's load samples are written by
the reconciler, but they live where people edit, merge and hand-write them (status/ is in git) or come
from a node. Mutating real ones by hand found a crash in each (a rank that is a string, warnings that are
a number, Infinity where a count belongs); these properties keep them found.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.commands.status import autoscale_lines, print_text, rollout_lines, rows
from reconciler.model import NodeSpec
from reconciler.observe.probe.collect import _from_report
from reconciler.record.history import read_samples
from reconciler.record.memory_document import memory_from_document
from reconciler.record.status_view import StatusUnreadable, json_document, status_report_from_documents
from reconciler.vocabulary import NodeState

# What a hand, a merge or a node may put where a value was: other types, numbers JSON cannot say
# (Python's json reads Infinity and NaN), a key that is not a string.
ODD = [1e309, None, "x", ["n1"], True, -1, 0, 2**63, float("nan"), "", "10.0.0.1", [], {}, [None], {"a": 1}, {5: "x"},
       [[1]], "2026-12-01T21:00:00Z"]

MODEL_STATUS = {
    "name": "m", "revision": "3c1e2d", "desired": 2, "ready": 1,
    "replicas": [
        {"id": "m-0", "profile": "p", "phase": "Ready", "revision": "3c1e2d", "restarts": 0, "message": "",
         "nodes": [{"node": "n1", "rank": 0, "gpus": [0, 1], "port": 8000, "endpoint": "http://10.0.0.1:8000"}]},
        {"id": "m-1", "profile": "p", "phase": "Failed", "failure": "temporary", "restarts": 2, "canary": True,
         "message": "exited 1; restart in 20s", "nodes": [{"node": "n2", "rank": 0, "gpus": [3], "port": 8000}]},
    ],
    "unplaced": [{"replica": "m-2", "reason": "no node fits", "rejections": [{"profile": "p", "node": "n3",
                                                                               "reason": "cordoned"}]}],
    "autoscale": {"min": 1, "max": 4, "current": 2, "wanted": 3, "metric_sum": 13, "reason": "requests 13 over 2",
                  "since": "2026-12-01T20:00:00Z"},
    "rollout": {"state": "Progressing", "weight": 20, "reason": "", "checks": [{"name": "request", "passed": 2,
                                                                               "failed": 0, "last": "200"}]},
}
CATALOG_STATUS = {"last_attempted_revision": "3c1e2d", "last_applied_revision": "3c1e2d", "errors": [],
                  "message": "revision 3c1e2d applied", "warnings": ["status/gateway/litellm.yaml was edited by hand"]}

MEMORY = {
    "rollouts": {"chat": {"model": "chat", "state": "Aborted", "target": "b111a9f71527", "since": 5, "weight": 20,
                          "revision": "b", "from_revision": None, "checks": [], "reason": "canary chat-0 failed",
                          "ready_since": None, "next_check_at": None}},
    "draining": {"m-2@a": {"replica": "m-2", "model": "m", "nodes": ["a"], "port": 8002, "engine": "vllm",
                           "started": 1000.0, "until": 1010.0, "running": None, "note": "", "profile": "p",
                           "out_at": None, "handed_off": False, "handoff_note": ""}},
    "gpu_strikes": {"m-0": {"where": [["a", [0, 1]]], "count": 2, "message": "exit 1"}},
    "quarantines": [{"node": "a", "gpu": 3, "reason": "3 failed starts", "until": 5000.0, "uuid": "GPU-3"}],
    "unreachable_since": {"g2": 900.0},
    "placed_on": {"crashy-0": ["g1"]},
    "backoff": {"crashy-0": {"restarts": 3, "streak": 2, "last_restart": 1000.0},
                "slow-0": {"failure": "temporary", "failed_starts": 1, "retry_at": 1010.0, "key": "fedcba9876543210",
                           "message": "rank 0 on g1 did not start: timed out", "nodes": ["g1"]}},
    "last_seen": {"nodes": [{"id": "a", "state": "ready", "reason": "", "labels": {}, "memory_total_mb": 1048576,
                             "engines": {"vllm": ""}, "fabrics": [], "weights": None,
                             "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100-80GB", "class": "H100-80GB",
                                       "memory_total_mb": 81559, "memory_used_mb": 0, "nvlink_peers": [1]},
                                      {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H100-80GB", "class": "H100-80GB",
                                       "memory_total_mb": 81559, "memory_used_mb": 0, "nvlink_peers": [0]}],
                             "disks": [{"path": "/models", "free_bytes": 2147483648000, "total_bytes": 4294967296000}],
                             "replicas": [{"id": "m-0", "model": "m", "profile": "p", "rank": 0, "nnodes": 1,
                                           "gpus": [0, 1], "port": 8000, "spec_hash": "9372f2db1849"}]}]},
}

REPORT = {
    "probe_version": 1, "cpu_count": 64, "memory_total_mb": 1048576, "engines": {"vllm": "0.11.0"},
    "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559,
              "memory_used_mb": 10, "nvlink_peers": [1 - i], "processes": [{"pid": 100 + i, "name": "python",
                                                                             "used_mb": 5}], "health": "ok"}
             for i in range(2)],
    "hcas": [{"hca": "mlx5_0", "state": "ACTIVE", "link_layer": "InfiniBand", "subnet_prefix": "fec0:0000:0000:0001"}],
    "disks": [{"path": "/models", "free_bytes": 10**12, "total_bytes": 2 * 10**12}], "weights": ["/models/m"],
    "replicas": [{"id": "m-0", "model": "m", "profile": "p", "rank": 0, "nnodes": 1, "gpus": [0], "port": 8000,
                  "spec_hash": "9372f2db1849", "pid": 4242, "alive": True}],
    "ports_in_use": [22, 8000], "llama_cpp": {"llama-server": "/usr/bin/llama-server"}, "warnings": [],
}

SAMPLE = {"t": 1000.0, "k": 1, "m": {"m": [1, 2, 3.5]}, "f": [1, 2, 3.5], "g": [8, 1, 0, 0]}


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw, base):
    """`base`, with one to three of its values replaced by an odd one, deleted, or given a stray sibling."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        how = draw(st.sampled_from(["replace", "replace", "delete", "stray"]))
        value = copy.deepcopy(draw(st.sampled_from(ODD)))
        if how == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "stray" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["zzz", 5, None]))] = value
        else:
            parent[path[-1]] = value
    return doc


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(model=st.one_of(st.just(MODEL_STATUS), mutated(MODEL_STATUS)), catalog=st.one_of(st.just(CATALOG_STATUS),
                                                                                        mutated(CATALOG_STATUS)))
def test_a_mutated_status_file_is_shown_or_refused_in_one_line(model, catalog):
    root = Path("/catalog")
    try:
        status = status_report_from_documents(root, catalog, [(root / "status" / "models" / "m.yaml", model)])
    except StatusUnreadable as exc:
        assert "\n" not in str(exc) and str(exc).startswith("/catalog/status/")
        return
    # Everything `reconciler status` does with what it read (the dashboard shares status_view).
    rows(status), autoscale_lines(status), rollout_lines(status)
    json.dumps(json_document(status))
    with contextlib.redirect_stdout(io.StringIO()):
        print_text(status)


@SETTINGS
@given(doc=mutated(MEMORY))
def test_a_mutated_pass_memory_is_read_or_forgotten(doc):
    memory_from_document(json.loads(json.dumps(doc)))


@SETTINGS
@given(report=mutated(REPORT))
def test_a_mutated_probe_report_is_a_node_or_an_unreachable_one(report):
    spec = NodeSpec(id="n1", address="10.0.0.1", data_address="10.0.0.1")
    probe = _from_report(spec, json.loads(json.dumps(report)), 0.0, lambda: 0.0)
    assert probe.node.id == "n1" and probe.node.state in set(NodeState)


@SETTINGS
@given(sample=mutated(SAMPLE))
def test_a_mutated_load_sample_is_read_or_passed_over(sample):
    good = json.dumps(SAMPLE)
    read = read_samples([good, json.dumps(sample), good])
    assert 2 <= len(read) <= 3
