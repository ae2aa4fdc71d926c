"""History (SPEC section 15): one sample of the fleet per pass, pure; the dashboard charts the last 24 h.

A sample holds, per model, its Ready and desired replicas and its requests in flight, and the
fleet's GPUs by health. Requests in flight are the sum over the model's Ready replicas that the pass
read (an autoscaled model's, AutoscaleState.metric_sum); a model whose load the pass did not read
has none (None), which a chart leaves as a gap rather than drawing a zero.
"""

from __future__ import annotations

import json
from dataclasses import field
from typing import Iterable, Mapping

from reconciler.frozen import frozen
from reconciler.model import Catalog
from reconciler.outcomes import PassResult
from reconciler.vocabulary import GpuHealth, NodeState, Phase

# GPUs by health, in the order charts stack them: quarantined GPUs are counted apart from the
# probe's verdicts (a quarantined GPU is healthy to the probe, but takes no work).
GPU_KINDS = ("ok", "quarantined", str(GpuHealth.UNHEALTHY), str(GpuHealth.LOST))


@frozen
class ModelFigures:
    ready: int
    desired: int
    in_flight: float | None = None


@frozen
class Sample:
    time: float
    models: Mapping[str, ModelFigures] = field(default_factory=dict)
    gpus: Mapping[str, int] = field(default_factory=dict)  # GPU_KINDS -> GPUs

    def fleet(self) -> ModelFigures:
        """The fleet's figures: the models' summed (requests in flight over those that have a figure)."""
        flights = [m.in_flight for m in self.models.values() if m.in_flight is not None]
        return ModelFigures(sum(m.ready for m in self.models.values()), sum(m.desired for m in self.models.values()),
                            sum(flights) if flights else None)


def sample_of(result: PassResult, catalog: Catalog, now: float) -> Sample:
    """The sample of one pass (pure)."""
    ready: dict[str, int] = {}
    for st in result.replicas.values():
        if st.phase == Phase.READY:
            ready[st.model] = ready.get(st.model, 0) + 1
    models = {}
    for m in catalog.models:
        scaled = result.autoscale.get(m.name)
        desired = scaled.current if scaled is not None else m.replicas
        models[m.name] = ModelFigures(ready.get(m.name, 0), desired, scaled.metric_sum if scaled is not None else None)
    gpus = dict.fromkeys(GPU_KINDS, 0)
    nodes = result.inventory.nodes if result.inventory is not None else ()
    for n in nodes:
        if n.state == NodeState.UNREACHABLE:
            continue
        for g in n.gpus:
            kind = "quarantined" if g.quarantined is not None and g.health == GpuHealth.OK else str(g.health)
            gpus[kind] = gpus.get(kind, 0) + 1
    return Sample(now, models, gpus)


def sample_to_document(s: Sample) -> dict:
    """Compact: a day of samples of a large fleet is most of the history's bytes."""
    return {"t": round(s.time, 3),
            "m": {name: [f.ready, f.desired] + ([f.in_flight] if f.in_flight is not None else [])
                  for name, f in s.models.items()},
            "g": [s.gpus.get(k, 0) for k in GPU_KINDS]}


def sample_from_document(doc: dict) -> Sample:
    models = {str(name): ModelFigures(int(v[0]), int(v[1]), float(v[2]) if len(v) > 2 else None)
              for name, v in doc["m"].items()}
    return Sample(float(doc["t"]), models, dict(zip(GPU_KINDS, (int(x) for x in doc["g"]))))


def read_samples(lines: Iterable[bytes | str], since: float | None = None) -> list[Sample]:
    """The samples of a file's lines at or after `since`; a line that is not one is passed over."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            s = sample_from_document(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            continue
        if since is None or s.time >= since:
            out.append(s)
    return out
