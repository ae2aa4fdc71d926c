"""The files a gateway and a monitor read as they are (SPEC section 10): status/gateway/.

    litellm.yaml     a LiteLLM proxy config: `litellm --config status/gateway/litellm.yaml`
    prometheus.json  Prometheus file_sd_configs targets: every engine's own /metrics

Both list each Ready replica's head and nothing else (a Draining one has left them), in model
then ordinal order, and are pure functions of the catalog and the pass's replica states, so a
predicted status (`plan --write-status`) and an applied one read the same. They are written with
the other status files, atomically and only when their content changes; a file someone edited is
written over on the next pass, with one warning (the digests of what was written last are kept in
status/gateway/.written, so a one-shot `apply` notices it too): status.write_pass writes them.
"""

from __future__ import annotations

from typing import Mapping

from reconciler.canary import canary_weights
from reconciler.frozen import frozen
from reconciler.model import Catalog, Model, replica_ordinal
from reconciler.outcomes import ReplicaState
from reconciler.vocabulary import Phase

# LiteLLM's provider prefixes: vLLM has its own (hosted_vllm: its extra parameters pass through);
# SGLang, llama-server and a command engine speak the OpenAI API as it is.
LITELLM_PROVIDER = {"vllm": "hosted_vllm"}
DEFAULT_PROVIDER = "openai"
METRICS_PATH = "/metrics"  # vLLM, SGLang, and llama-server started with --metrics
LITELLM_HEADER = ("# Written by llm-reconciler on every pass from the catalog and what is Ready (SPEC section 10).\n"
          "# An edit here is written over on the next pass: change the catalog instead.\n")


@frozen
class Head:
    """One Ready replica's head, where a gateway sends requests and Prometheus scrapes."""

    model: Model
    replica: str
    node: str
    target: str  # <data_address>:<port>, an IPv6 address bracketed
    api_base: str  # http://<data_address>:<port>/v1
    engine: str
    canary: bool = False  # a canary copy of a rollout Progressing (SPEC section 13)

    @property
    def entry_id(self) -> str:
        """The gateway entry's id (LiteLLM returns it as x-litellm-model-id): `/canary` marks a canary copy."""
        return f"{self.replica}/canary" if self.canary else self.replica


def ready_heads(catalog: Catalog, replicas: Mapping[str, ReplicaState]) -> list[Head]:
    """Every Ready replica's head, in model then ordinal order (pure)."""
    heads = []
    for model in catalog.models:
        states = [s for s in replicas.values() if s.model == model.name and s.phase == Phase.READY and s.nodes]
        states.sort(key=lambda s: (replica_ordinal(model.name, s.replica) or 0, s.replica))
        for state in states:
            head = next((a for a in state.nodes if a.rank == 0), state.nodes[0])
            spec = catalog.fleet.node(head.node)
            profile = model.profile(state.profile) if state.profile else None
            if spec is None or profile is None or not head.port:
                continue  # nowhere a gateway could reach it
            heads.append(Head(model, state.replica, head.node, spec.data_host.with_port(head.port),
                              spec.data_host.url(head.port, "/v1"), profile.engine, canary=state.canary))
    return heads


def litellm_document(catalog: Catalog, replicas: Mapping[str, ReplicaState]) -> dict:
    """status/gateway/litellm.yaml: one model_list entry per Ready replica; entries of one model share
    its served name, so LiteLLM load-balances over them."""
    entries = []
    heads = ready_heads(catalog, replicas)
    weights = canary_weights_of(heads)
    for h in heads:
        provider = LITELLM_PROVIDER.get(h.engine, DEFAULT_PROVIDER)
        params = {
            "model": f"{provider}/{h.model.served}",
            "api_base": h.api_base,
            # The engines are started without a key; LiteLLM's OpenAI client needs one to send.
            "api_key": "none",
        }
        if h.model.name in weights:
            params["weight"] = weights[h.model.name][h.canary]
        entries.append({
            "model_name": h.model.served,
            "litellm_params": params,
            "model_info": {"id": h.entry_id},
        })
    return {"model_list": entries}


def canary_weights_of(heads: list[Head]) -> dict[str, dict[bool, int]]:
    """Per model with canary and stable heads both Ready: LiteLLM weights (stable, canary) that give its
    canary copies `rollout.canary.weight` percent of its requests together (SPEC section 13); a model
    without a canary serving has none, so all its copies weigh the same."""
    out = {}
    for name in dict.fromkeys(h.model.name for h in heads):
        mine = [h for h in heads if h.model.name == name]
        canaries = sum(h.canary for h in mine)
        policy = mine[0].model.rollout
        if policy is None or not canaries or canaries == len(mine):
            continue
        c, s = canary_weights(policy.weight, canaries, len(mine) - canaries)
        out[name] = {True: c, False: s}
    return out


def prometheus_targets(catalog: Catalog, replicas: Mapping[str, ReplicaState]) -> list[dict]:
    """status/gateway/prometheus.json: one file_sd target group per Ready replica's head."""
    return [{
        "targets": [h.target],
        "labels": {"model": h.model.name, "replica": h.replica, "node": h.node, "engine": h.engine,
                   "__metrics_path__": METRICS_PATH},
    } for h in ready_heads(catalog, replicas)]
