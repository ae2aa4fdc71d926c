"""Layer 3 of the catalog's checks for a model file: what a schema cannot say. Unique profile names,
engines that can run without GPUs, placeholders only where they are resolved, owned engine flags,
and what update, fetch, rollout (canary and checks), replicas and autoscale cannot say alone.
fleet.yaml's checks, llama.cpp over IPv6 among them, are fleet_rules'.
"""

from __future__ import annotations

import re
from typing import Iterator

from reconciler.errors import Problem
from reconciler.model import CPU_CAPABLE_ENGINES, FETCH_PLACEHOLDERS, PLACEHOLDERS, is_path_source
from reconciler.engines import ADAPTERS
from reconciler.engines.flags import describe, option_uses, owned_uses
from reconciler.engines.llamacpp import NGL, offloads_nothing
from reconciler.engines.render import placeholders_in
from reconciler.catalog.documents import Document

# schema/model.schema.json's served_name pattern: what vLLM, SGLang, llama.cpp's --alias (a comma would
# split it) and a LiteLLM model name all take as one name.
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def model_problems(doc: Document) -> list[Problem]:
    problems: list[Problem] = []
    data = doc.data
    seen: dict[str, int] = {}
    for i, prof in enumerate(data.get("profiles") or []):
        base = ("profiles", i)
        name, engine = prof["name"], prof["engine"]
        where = f"profile {name}"
        if name in seen:
            problems.append(doc.at(base + ("name",), f"duplicate profile name '{name}' (first defined as profiles[{seen[name]}])"))
        else:
            seen[name] = i
        if "gpu_class" not in prof:
            if engine not in CPU_CAPABLE_ENGINES:
                problems.append(
                    doc.at(base + ("engine",), f"{where}: engine {engine} needs GPUs; set gpu_class (CPU-only serving works with llama.cpp, vllm's CPU build or command)")
                )
            if "gpus_per_node" in prof:
                problems.append(doc.at(base + ("gpus_per_node",), f"{where}: gpus_per_node needs gpu_class; without it the profile is CPU-only"))
        if engine == "command":
            if "command" not in prof:
                problems.append(doc.at(base, f"{where}: engine command needs a 'command' (the argv to run)", key=True))
            if "port" not in prof:
                problems.append(doc.at(base, f"{where}: engine command needs a 'port' (there is no default to guess)", key=True))
        elif "command" in prof:
            problems.append(doc.at(base + ("command",), f"{where}: 'command' is only for engine: command; engine {engine} builds its own command line"))
        problems.extend(_placeholder_problems(doc, base, prof, engine == "command"))
        problems.extend(_args_problems(doc, base, prof))
    problems.extend(_rollout_problems(doc))
    problems.extend(_canary_problems(doc))
    served = data.get("served_name")
    if served is not None and not SERVED_NAME.fullmatch(str(served)):
        # The schema's pattern, anchored for real: Python's `$` also matches before a final newline.
        problems.append(doc.at(("served_name",), f"served_name {served!r} has characters an engine or LiteLLM would "
                                                 "refuse; use letters, digits and . _ : / - (at most 128)"))
    problems.extend(_scaling_problems(doc))
    if str(data.get("source", "")).startswith("-"):
        # Render refuses it at launch; saying so here keeps it out of a merged catalog.
        problems.append(doc.at(("source",), f"source '{data['source']}' starts with '-', which an engine would read as a flag, not as the weights"))
    if "$" in data.get("source", ""):
        for name in placeholders_in(data["source"]):
            problems.append(doc.at(("source",), f"placeholder ${{{name}}} is not allowed in source; placeholders work only in a command profile's command and env"))
    return problems


def _rollout_problems(doc: Document) -> Iterator[Problem]:
    """update and fetch: what their schema cannot say."""
    data = doc.data
    update = data.get("update")
    if update is not None and not update.get("max_surge", 0) and not update.get("max_unavailable", 0):
        yield doc.at(("update",), "update: max_surge and max_unavailable are both 0, so a spec change could never "
                                  "roll out; allow a surge (max_surge: 1) or an in-place replace (max_unavailable: 1)")
    fetch = data.get("fetch")
    if fetch is None:
        return
    source = str(data.get("source", ""))
    if not is_path_source(source):
        yield doc.at(("fetch",), f"fetch needs a path source; {source!r} is a hub id, which the engine downloads "
                                 "itself (set source to a path under the nodes' model_dirs to fetch it)")
    if ("from_node" in fetch) == ("command" in fetch):
        yield doc.at(("fetch",), "fetch needs exactly one of from_node: true (copy from a fleet node that holds the "
                                 "weights) or command: [...] (run on the node)")
    for j, value in enumerate(fetch.get("command") or ()):
        for name in placeholders_in(value) if "$" in value else ():
            if name not in FETCH_PLACEHOLDERS:
                known = ", ".join("${" + k + "}" for k in FETCH_PLACEHOLDERS)
                yield doc.at(("fetch", "command", j), f"unknown placeholder ${{{name}}} in fetch.command; "
                                                      f"known: {known}; write $$ for a literal $")


def _canary_problems(doc: Document) -> Iterator[Problem]:
    """rollout: canary and checks (SPEC section 13): what their schema cannot say."""
    data = doc.data
    rollout = data.get("rollout")
    if rollout is None:
        return
    yield from _canary_count_problems(doc, data.get("replicas", 1), rollout.get("canary") or {})
    checks = rollout.get("checks") or {}
    yield from _expect_problems(doc, (checks.get("request") or {}).get("expect") or {})
    prom = checks.get("prometheus")
    if prom is not None:
        yield from _prometheus_problems(doc, prom)


def _canary_count_problems(doc: Document, replicas: int | dict, canary: dict) -> Iterator[Problem]:
    """A range's count can fall to min: the canary must leave a stable copy at every count."""
    least = replicas["min"] if isinstance(replicas, dict) else replicas
    wanted = canary.get("replicas", 1)
    if wanted >= least:
        count = f"min {least}" if isinstance(replicas, dict) else str(least)
        yield doc.at(("rollout", "canary", "replicas") if "replicas" in canary else ("rollout", "canary"),
                     f"rollout.canary.replicas {wanted} must be fewer than the model's replicas ({count}): "
                     "a canary needs stable copies to keep serving and to compare with")


def _expect_problems(doc: Document, expect: dict) -> Iterator[Problem]:
    """The canary's request check: one kind of expectation, and a regex that compiles."""
    if "contains" in expect and "matches" in expect:
        yield doc.at(("rollout", "checks", "request", "expect"),
                     "expect takes one of contains (text) or matches (a regex), not both")
    if "matches" in expect:
        try:
            re.compile(expect["matches"])
        except re.error as e:
            yield doc.at(("rollout", "checks", "request", "expect", "matches"),
                         f"matches {expect['matches']!r} is not a regular expression: {e}")


def _prometheus_problems(doc: Document, prom: dict) -> Iterator[Problem]:
    """The canary's PromQL checks: an address to ask, and queries with distinct names and a bound that can fail."""
    address = str(prom.get("address", ""))
    if not _is_http_url(address):
        yield doc.at(("rollout", "checks", "prometheus", "address"),
                     f"address {address!r} is not a URL; write http://host:port (Prometheus's HTTP API)")
    seen: dict[str, int] = {}
    for j, q in enumerate(prom.get("queries") or ()):
        name = q.get("name")
        if name in seen:
            yield doc.at(("rollout", "checks", "prometheus", "queries", j, "name"),
                         f"query name {name!r} is used twice (first as query {seen[name] + 1}); "
                         "each names its check in status")
        else:
            seen[name] = j
        yield from _query_bound_problems(doc, j, q)


def _query_bound_problems(doc: Document, j: int, q: dict) -> Iterator[Problem]:
    """A query's max or min: at least one, and a range that some value passes."""
    name = q.get("name")
    if "max" not in q and "min" not in q:
        yield doc.at(("rollout", "checks", "prometheus", "queries", j),
                     f"query {name!r} needs max or min: without a bound it could never fail")
    elif "max" in q and "min" in q and q["min"] > q["max"]:
        yield doc.at(("rollout", "checks", "prometheus", "queries", j, "min"),
                     f"query {name!r}: min {q['min']} is above max {q['max']}, so every value fails")


def _is_http_url(text: str) -> bool:
    """http(s)://host[:port][/path], with a host and a port that parse."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        parts.port  # raises on a port that is not a number or out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment


def _scaling_problems(doc: Document) -> Iterator[Problem]:
    """replicas: {min, max} and autoscale (SPEC section 11): what their schema cannot say."""
    data = doc.data
    replicas, policy = data.get("replicas"), data.get("autoscale")
    ranged = isinstance(replicas, dict)
    if ranged and replicas["min"] > replicas["max"]:
        yield doc.at(("replicas", "min"), f"replicas: min {replicas['min']} is above max {replicas['max']}")
    if policy is not None and not ranged:
        count = f"replicas: {replicas}" if replicas is not None else "replicas (1 when omitted)"
        yield doc.at(("autoscale",), f"autoscale needs a range to move in, and {count} is a fixed count; "
                                     "write replicas: {min: N, max: M}")
    if ranged and policy is None:
        # Nothing else moves the count: a range without a policy would sit at min and read as a promise.
        yield doc.at(("replicas",), "replicas: {min, max} is the range autoscale moves the count in, and this "
                                    "model has no autoscale; add autoscale: {target: N} or give a fixed count")
    if ranged and policy is not None and replicas["min"] < 1:
        # Load is read from Ready replicas' engines: with none running, nothing would ever ask for one.
        yield doc.at(("replicas", "min"), "replicas: min 0 with autoscale would never scale up again: the load "
                                          "is read from the engines of Ready replicas; give min 1 or more")
    for i, prof in enumerate(data.get("profiles") or []):
        if "metrics" in prof and prof["engine"] != "command":
            yield doc.at(("profiles", i, "metrics"), f"profile {prof['name']}: 'metrics' is only for engine: command; "
                                                     f"engine {prof['engine']} exports its own series")
        elif policy is not None and prof["engine"] == "command" and "metrics" not in prof:
            yield doc.at(("profiles", i), f"profile {prof['name']}: autoscale reads requests in flight from the "
                                          "engine, and a command profile must say where: metrics: {waiting: "
                                          "<series>, running: <series>}", key=True)


def _args_problems(doc: Document, base: tuple, prof: dict) -> Iterator[Problem]:
    """Args that set what the reconciler sets per rank, read the way the engine's parser reads them."""
    engine, args = prof["engine"], [str(a) for a in prof.get("args") or ()]
    if engine == "command" or not args:
        return
    adapter = ADAPTERS[engine]
    where = f"profile {prof['name']}"
    for use in owned_uses(engine, args, adapter.owned_flags):
        yield doc.at(base + ("args", use.index),
                     f"{where}: args[{use.index}] {describe(use)} is set by the reconciler for each rank; remove it")
    if engine == "llama.cpp" and prof.get("nodes", 1) > 1:
        for use in option_uses(engine, args, frozenset({NGL})):
            if use.option == NGL and offloads_nothing(use.value):
                yield doc.at(base + ("args", use.index),
                             f"{where}: args[{use.index}] {use.token} {use.value} keeps every layer on the head, so the "
                             f"other {prof['nodes'] - 1} rank(s) would hold no part of the model; leave -ngl out or give a count above 0")


def _placeholder_problems(doc: Document, base: tuple, prof: dict, resolvable: bool) -> Iterator[Problem]:
    known = set(PLACEHOLDERS)
    for field, path, value in _string_fields(prof, base):
        names = placeholders_in(value) if "$" in value else []
        for name in names:
            if resolvable and field in ("command", "env"):
                if name not in known:
                    import difflib  # only for a catalog with a problem: plan starts sooner

                    hint = difflib.get_close_matches(name, PLACEHOLDERS, n=1)
                    extra = f" (did you mean ${{{hint[0]}}}?)" if hint else f"; known: {', '.join('${' + k + '}' for k in PLACEHOLDERS)}"
                    yield doc.at(path, f"profile {prof['name']}: unknown placeholder ${{{name}}} in {field}{extra}; write $$ for a literal $")
            else:
                yield doc.at(
                    path,
                    f"profile {prof['name']}: placeholder ${{{name}}} in {field} is never resolved; placeholders work only in a "
                    "command profile's command and env (write $$ for a literal $)",
                )


def _string_fields(prof: dict, base: tuple) -> Iterator[tuple[str, tuple, str]]:
    for field, value in prof.items():
        if isinstance(value, str):
            yield field, base + (field,), value
        elif isinstance(value, list):
            for j, item in enumerate(value):
                if isinstance(item, str):
                    yield field, base + (field, j), item
        elif isinstance(value, dict):
            for k, item in value.items():
                if isinstance(item, str):
                    yield field, base + (field, k), item
