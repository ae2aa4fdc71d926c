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

from reconciler.decide.canary import canary_weights
from reconciler.frozen import frozen
from reconciler.model import Catalog, Model, replica_ordinal
from reconciler.decide.outcomes import ReplicaState
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


# --------------------------------------------------------------------------
# The hand-off (SPEC 13): does the gateway serve without a copy that drains?
# --------------------------------------------------------------------------

# status/gateway/served.json: what `reconciler gateway` says it serves, written by it, read by the pass.
SERVED_FILE = "served.json"
# `reconciler gateway` rewrites its report at least this often while it runs; a report older than
# SERVED_STALE_S is a gateway that is gone (the pass then counts gateway.settle_s, as for one it does not run).
SERVED_HEARTBEAT_S = 5.0
SERVED_STALE_S = 30.0


@frozen
class Served:
    """What `reconciler gateway` serves now: the litellm.yaml it has live (its sha256, and the api_base
    of every entry in it), since when, and the last file it could not take with why, in words."""

    sha256: str
    api_bases: tuple[str, ...]
    since: float
    alive_at: float  # when the gateway last said so (SERVED_HEARTBEAT_S)
    pid: int = 0
    refused_sha256: str = ""  # the newest file it tried and did not take ("" when it took every one)
    refused: str = ""

    def as_document(self) -> dict:
        return {"sha256": self.sha256, "api_bases": list(self.api_bases), "since": self.since,
                "alive_at": self.alive_at, "pid": self.pid, "refused_sha256": self.refused_sha256,
                "refused": self.refused}

    @classmethod
    def from_document(cls, doc) -> "Served | None":
        """None for anything that is not such a report (a half-written or foreign file reads as none)."""
        try:
            return cls(str(doc["sha256"]), tuple(str(a) for a in doc["api_bases"]), float(doc["since"]),
                       float(doc["alive_at"]), int(doc.get("pid", 0)), str(doc.get("refused_sha256", "")),
                       str(doc.get("refused", "")))
        except (TypeError, KeyError, ValueError, AttributeError):
            return None


def litellm_api_bases(doc) -> tuple[str, ...]:
    """The api_base of every entry of a LiteLLM config (what a gateway serving it may send requests to)."""
    entries = doc.get("model_list") if isinstance(doc, dict) else None
    bases = []
    for e in entries if isinstance(entries, list) else ():
        params = e.get("litellm_params") if isinstance(e, dict) else None
        if isinstance(params, dict) and isinstance(params.get("api_base"), str):
            bases.append(params["api_base"])
    return tuple(sorted(set(bases)))


def handoff(out_at: float | None, api_base: str | None, now: float, settle_s: float,
            served: Served | None) -> tuple[bool, str]:
    """Whether a draining copy's removal has reached the gateway (pure), and if not why, in words.

    out_at: when the status files without it were written (None: not yet). With `reconciler gateway`
    running (a fresh Served), exactly when what it serves has no entry at the copy's api_base; otherwise
    once settle_s has passed since out_at (a gateway the user runs says nothing)."""
    if out_at is None:
        return False, "the gateway files without it are not written yet"
    if served is not None and now - served.alive_at <= SERVED_STALE_S:
        if api_base is None or api_base not in served.api_bases:
            return True, ""
        why = f"reconciler gateway (pid {served.pid}) still serves it (litellm.yaml sha256 {served.sha256[:12]})"
        if served.refused:
            why += f"; it did not take the new file: {served.refused}"
        return False, why
    if now >= out_at + settle_s:
        return True, ""
    return False, f"gateway.settle_s ({settle_s:g} s) since the files without it were written has not passed"
