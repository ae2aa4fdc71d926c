"""A small catalog written as text, for the tests of the catalog's reading and checking: one fleet, one
model file (with its profiles' lines where a test's expected line:column positions count on them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.catalog import load_catalog
from reconciler.errors import CatalogInvalid

FLEET = """\
ssh:
  user: serve
nodes:
  - id: gpu-1
    address: 10.9.0.1
    labels: {zone: a}
    model_dirs: [/models]
    fabrics: {ib-a: [mlx5_0]}
  - id: gpu-2
    address: 10.9.0.2
    data_address: 10.9.1.2
    model_dirs: [/models]
"""

# One vLLM profile, nothing after its gpu_class: a test appends keys to the model (line 4 on) or to the profile.
ONE_PROFILE_MODEL = """\
name: llama
source: /models/llama
replicas: 2
profiles:
  - name: big
    engine: vllm
    gpu_class: H100-80GB
"""

# The same model with a second, CPU profile below a prioritised GPU one.
MODEL = ONE_PROFILE_MODEL + """\
    gpus_per_node: 8
    priority: 10
  - name: cpu
    engine: llama.cpp
    args: ["--threads", "8"]
"""


def write_catalog(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


def problems_of(root: Path) -> list[str]:
    with pytest.raises(CatalogInvalid) as info:
        load_catalog(root)
    return [str(p) for p in info.value.problems]
