"""Status YAML written directly (record/status/emit.py) is byte for byte what PyYAML's status dumper
writes, or the emitter declines and PyYAML writes it: generated documents with the strings YAML
treats specially, and the real documents status files are made of."""

from __future__ import annotations

import math
from enum import StrEnum

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.record.status.emit import Unsupported, emit
from reconciler.record.status.files import dump_yaml, pyyaml_dump

# Strings that YAML reads as something else, or that need quotes somewhere: each must come out as
# PyYAML writes it.
TRICKY = ["", "true", "False", "yes", "no", "on", "OFF", "null", "Null", "~", "1", "-1", "0o17", "017", "0x1F",
          "1.5", "1e5", ".inf", "-.Inf", ".nan", "1_000", "2026-01-31", "2026-01-31T03:00:00Z", "12:30",
          "---", "...", "--- x", "-", "- a", "-a", "a-", ":", ":a", "a:", "a: b", "a:b", "?", "? a", "?a", "a?b",
          "#", "a #b", "a#b", "a,b", "[a]", "{a}", "a]", "!tag", "&anchor", "*alias", "|", ">", "'", "'a'",
          '"', '"a"', "%", "@", "`", "a'b", "a\"b", " a", "a ", "a  b", "a\nb", "a\tb", "é", "GPU-0001",
          "NVIDIA H100 80GB HBM3", "http://10.0.0.1:8000", "/models/llama-3", "=mlx5_0,mlx5_1", "x" * 990,
          ("word " * 250).strip()]

texts = st.one_of(st.sampled_from(TRICKY), st.text(alphabet=st.characters(min_codepoint=9, max_codepoint=0x2030),
                                                   max_size=12))
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**20, max_value=10**20),
                    st.floats(allow_nan=True, allow_infinity=True), texts)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=30,
)


def same_as_pyyaml(doc) -> bool:
    """True when the emitter wrote the document (and wrote what PyYAML writes); False when it declined."""
    try:
        text = emit(doc)
    except Unsupported:
        return False
    assert text == pyyaml_dump(doc), (doc, text, pyyaml_dump(doc))
    return True


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.dictionaries(texts, documents, max_size=6), st.lists(documents, max_size=6)))
def test_every_document_the_emitter_writes_is_what_pyyaml_writes(doc):
    same_as_pyyaml(doc)
    assert dump_yaml(doc) == pyyaml_dump(doc)


def test_each_special_string_is_quoted_or_left_plain_as_pyyaml_does_as_key_value_and_list_item():
    written = 0
    for s in TRICKY:
        for doc in ({s: s}, {"k": [s, 1]}, {"k": [{s: [s]}]}, [s], [[s, {s: s}]]):
            written += same_as_pyyaml(doc)
    # The emitter writes most of them itself (declining only line breaks, tabs, non-ASCII, spaces at
    # either end and lines PyYAML would fold): a fallback for everything would pass the check above.
    assert written >= 0.8 * 5 * len(TRICKY), written


class Phase(StrEnum):
    READY = "Ready"


def test_status_documents_are_written_directly_and_read_back_the_same():
    nodes = {"nodes": [{"id": f"h100-{i:05d}", "state": "ready", "reason": "", "labels": {"zone": "a"},
                        "engines": {"vllm": "0.32.0", "llama.cpp": ""},
                        "gpus": [{"index": g, "uuid": f"GPU-{i}-{g}", "name": "NVIDIA H100 80GB HBM3",
                                  "memory_total_mb": 81559, "nvlink_peers": [p for p in range(8) if p != g],
                                  "processes": []} for g in range(8)],
                        "disks": [{"path": "/models", "free_bytes": 10**12}], "fabrics": {}, "weights": None}
                       for i in range(3)]}
    model = {"name": "llama", "desired": 2, "ready": 1, "replicas": [
        {"id": "llama-0", "phase": Phase.READY, "nodes": [{"node": "a1", "rank": 0, "gpus": [0, 1], "port": 8000,
                                                          "endpoint": "http://10.0.0.1:8000"}],
         "message": "rank 0 on a1: ready: /health answered 200", "load": 0.5, "restarts": 0}],
        "rejections": {"a2": "needs 2 GPUs of class H100-80GB; 1 free (GPU 3: held by pid 4242 'python')"}}
    for doc in (nodes, model):
        text = emit(doc)  # written directly, not declined
        assert text == pyyaml_dump(doc)
        back = yaml.safe_load(text)
        assert back == yaml.safe_load(pyyaml_dump(doc)) and back["nodes" if "nodes" in doc else "name"]


def test_what_the_emitter_declines_pyyaml_still_writes():
    for doc in ({"message": "line one\nline two"}, {"name": "モデル"}, {"k": "x " * 600}, {("a",): 1} and {"k": (1, 2)}):
        try:
            emit(doc)
        except Unsupported:
            pass
        else:
            raise AssertionError(f"emit wrote {doc!r}")
    assert dump_yaml({"message": "line one\nline two"}) == pyyaml_dump({"message": "line one\nline two"})
    assert yaml.safe_load(dump_yaml({"name": "モデル"})) == {"name": "モデル"}
    assert math.isnan(yaml.safe_load(dump_yaml({"x": float("nan")}))["x"])
