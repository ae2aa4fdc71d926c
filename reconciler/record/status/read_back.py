"""What status/ holds that a pass plans with: each autoscaled model's count in force (SPEC section 11:
`apply`, `plan` and `explain` take it from status/models/<name>.yaml, never from the catalog)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from reconciler.decide.autoscale import AutoscaleState, kept_states, state_from_document
from reconciler.constants import STATUS_DIR
from reconciler.model import Catalog, Model


def read_autoscale_states(catalog_root: str | os.PathLike, models: Iterable[Model]) -> dict[str, AutoscaleState]:
    """Each autoscaled model's count as status/models/<name>.yaml holds it (SPEC section 11: `apply`
    and `plan` take it from there); a model without a readable block is absent, so it starts at min."""
    states: dict[str, AutoscaleState] = {}
    scaled = [m for m in models if m.scale is not None]
    if not scaled:
        return states
    import yaml

    from reconciler import pyyaml_bounded

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    root = Path(catalog_root) / STATUS_DIR / "models"
    for m in scaled:
        try:
            doc = pyyaml_bounded.load((root / f"{m.name}.yaml").read_bytes(), loader)
        except (OSError, yaml.YAMLError):
            continue
        state = state_from_document(doc.get("autoscale")) if isinstance(doc, dict) else None
        if state is not None:
            states[m.name] = state
    return states


def counts_in_force(catalog: Catalog) -> dict[str, AutoscaleState]:
    """Each autoscaled model's state as status/models/<name>.yaml holds it, clamped to its range
    (min without one): the count every pass, `plan` and `explain` run the model at."""
    if not any(m.scale is not None for m in catalog.models):
        return {}
    return kept_states(catalog, read_autoscale_states(catalog.root, catalog.models))
