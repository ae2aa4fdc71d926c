"""History (SPEC section 15): one sample of the fleet per pass, pure; the dashboard charts the last 24 h.

A sample holds, per model, its Ready and desired replicas and its requests in flight, and the
fleet's GPUs by health. Requests in flight are the sum over the model's Ready replicas that the pass
read (an autoscaled model's, AutoscaleState.metric_sum); a model whose load the pass did not read
has none (None), which a chart leaves as a gap rather than drawing a zero.
"""

from __future__ import annotations

from dataclasses import field
from typing import Iterable, Mapping

from reconciler.frozen import frozen
from reconciler.model import Catalog
from reconciler.decide.outcomes import PassResult
from reconciler.vocabulary import GpuHealth, NodeState, Phase
from reconciler.errors import parse_json

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
    totals: ModelFigures | None = None  # the fleet's (fleet_figures), kept so a fleet chart reads no model

    def fleet(self) -> ModelFigures:
        return self.totals if self.totals is not None else fleet_figures(self.models)


def fleet_figures(models: Mapping[str, ModelFigures]) -> ModelFigures:
    """The fleet's figures: the models' summed (requests in flight over those that have a figure)."""
    flights = [m.in_flight for m in models.values() if m.in_flight is not None]
    return ModelFigures(sum(m.ready for m in models.values()), sum(m.desired for m in models.values()),
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
    ok, quarantined = 0, 0
    healthy = GpuHealth.OK
    for n in nodes:
        if n.state == NodeState.UNREACHABLE:
            continue
        for g in n.gpus:
            h = g.health
            # `is` first: 32,000 GPUs at 4,000 nodes, and a StrEnum's == is a Python call each
            if h is healthy or h == healthy:
                if g.quarantined is None:
                    ok += 1
                else:
                    quarantined += 1
            else:
                gpus[str(h)] = gpus.get(str(h), 0) + 1
    gpus["ok"], gpus["quarantined"] = ok, quarantined
    return Sample(now, models, gpus, fleet_figures(models))


# Every this many samples the whole sample is written (a keyframe); the others hold only the models
# whose figures changed, so a quiet day of a 10,000-replica fleet is a few bytes a pass, and a reader
# that starts in the middle of a rotated file is whole again at the next keyframe.
KEYFRAME_EVERY = 120


def sample_to_document(s: Sample, previous: Sample | None = None) -> dict:
    """A sample as one compact JSON object: `m` holds every model (a keyframe, `k`) or, after
    `previous`, only the models whose figures changed and `x` the models gone since."""
    models = s.models if previous is None else {n: f for n, f in s.models.items() if previous.models.get(n) != f}
    doc = {"t": round(s.time, 3), "f": _figures(s.fleet()), "g": [s.gpus.get(k, 0) for k in GPU_KINDS],
           "m": {name: _figures(f) for name, f in models.items()}}
    if previous is None:
        doc["k"] = 1
    else:
        gone = [n for n in previous.models if n not in s.models]
        if gone:
            doc["x"] = gone
    return doc


def _figures(f: ModelFigures) -> list:
    return [f.ready, f.desired] + ([round(f.in_flight, 3)] if f.in_flight is not None else [])


def _from_figures(v) -> ModelFigures:
    return ModelFigures(int(v[0]), int(v[1]), float(v[2]) if len(v) > 2 else None)


def read_samples(lines: Iterable[bytes | str], since: float | None = None,
                 models: dict[str, ModelFigures] | None = None) -> list[Sample]:
    """The samples of a file's lines at or after `since`, each whole (a delta laid over the models
    before it; `models`: those carried from an older file); a line that is not one is passed over."""
    out = []
    state: dict[str, ModelFigures] = models if models is not None else {}
    for line in lines:
        if not line.strip():
            continue
        try:
            doc = parse_json(line)
            changed = {str(n): _from_figures(v) for n, v in doc["m"].items()}
            when, totals = float(doc["t"]), _from_figures(doc["f"])
            gpus = dict(zip(GPU_KINDS, (int(x) for x in doc["g"])))
            gone = [str(n) for n in doc.get("x", ())]
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, ArithmeticError):  # int(Infinity)
            continue
        if doc.get("k"):
            state.clear()
        state.update(changed)
        for n in gone:
            state.pop(n, None)
        if since is None or when >= since:
            out.append(Sample(when, dict(state), gpus, totals))
    return out
