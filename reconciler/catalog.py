"""Load a catalog directory into an immutable Catalog, or report every problem in it.

Three layers of checks, each reporting at the line and column of the
offending value:

1. bytes and YAML: UTF-8, syntax, tabs, duplicate keys, a mapping at the top;
2. the JSON Schemas in schema/ (field names, types, ranges, enums);
3. what a schema cannot say: unique ids and names, engines that can run
   without GPUs, loopback addresses in a multi-node fleet, placeholders only
   where they are resolved, one fabric per HCA.

A file that fails an earlier layer is not checked by the later ones (its
values cannot be trusted), but every other file still is, so one run shows
every problem in the catalog.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import jsonschema
import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from reconciler.constants import STATUS_DIR
from reconciler.errors import CatalogInvalid, Problem
from reconciler.model import (
    CPU_CAPABLE_ENGINES,
    DEFAULT_PORTS,
    FETCH_PLACEHOLDERS,
    PLACEHOLDERS,
    Catalog,
    FetchPolicy,
    Fleet,
    Model,
    NodeSpec,
    Profile,
    SlurmSettings,
    SshSettings,
    UpdatePolicy,
    SecretRef,
    frozen_map,
    is_path_source,
)
from reconciler.engines import ADAPTERS
from reconciler.engines.flags import describe, option_uses, owned_uses
from reconciler.engines.llamacpp import NGL, offloads_nothing
from reconciler.host import Host
from reconciler.render import placeholders_in
from reconciler.schemas import is_valid, validator

FLEET_FILE = "fleet.yaml"
MODELS_DIR = "models"
YAML_SUFFIXES = (".yaml", ".yml")
# Bounds on what one catalog file may cost to read. A 4,000-node fleet.yaml is a few MiB and a
# few hundred thousand values; past these a file is refused, not read (a YAML alias "bomb" is a
# few hundred bytes that expand to billions of values for whatever walks them next).
MAX_FILE_BYTES = 32 << 20
MAX_VALUES = 1_000_000



# --------------------------------------------------------------------------
# Positions
# --------------------------------------------------------------------------


@dataclass
class _Doc:
    """One parsed file: its relative path and the ruamel tree that knows positions."""

    rel: str
    data: Any

    def at(self, path: tuple, message: str, *, key: bool = False) -> Problem:
        line, col = position(self.data, path, key=key)
        return Problem(self.rel, line, col, message)


def position(root: Any, path: tuple, *, key: bool = False) -> tuple[int, int]:
    """1-based line and column of the value at `path` (or of its key, with key=True).

    Falls back to the deepest container that exists, so a missing field points
    at the mapping that lacks it.
    """
    node = root
    line, col = 0, 0
    if isinstance(root, (CommentedMap, CommentedSeq)):
        line, col = root.lc.line, root.lc.col
    for i, step in enumerate(path):
        last = i == len(path) - 1
        try:
            if isinstance(node, CommentedMap) and step in node:
                kl, kc = node.lc.key(step)
                vl, vc = node.lc.value(step)
                line, col = (kl, kc) if (key and last) else (vl, vc)
                node = node[step]
            elif isinstance(node, CommentedSeq) and isinstance(step, int) and 0 <= step < len(node):
                line, col = node.lc.item(step)
                node = node[step]
            else:
                break
        except (KeyError, TypeError, AttributeError):
            break
    return line + 1, col + 1


# --------------------------------------------------------------------------
# Layer 1: bytes and YAML
# --------------------------------------------------------------------------


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    return y


def _decode(rel: str, raw: bytes) -> tuple[str | None, Problem | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        return None, Problem(rel, line, col, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")


def parse_yaml_text(rel: str, text: str) -> tuple[Any, Problem | None]:
    """Parse YAML keeping positions; a syntax problem becomes a Problem at its mark."""
    if text.lstrip("\ufeff").strip() == "" or all(
        not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()
    ):
        return None, Problem(rel, 1, 1, "file is empty; expected a mapping of fields")
    try:
        return _yaml().load(text), None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = (exc.problem or str(exc)).strip()
        lines = text.splitlines()
        if mark and mark.line < len(lines) and "\t" in lines[mark.line]:
            tab_col = lines[mark.line].index("\t") + 1
            return None, Problem(rel, line, tab_col, "tab character; YAML indents with spaces only")
        if "duplicate key" in problem or "found duplicate key" in str(exc):
            key = re.search(r'duplicate key "?([^"\s]+)"?', str(exc))
            name = f" '{key.group(1)}'" if key else ""
            return None, Problem(rel, line, col, f"duplicate key{name}; each key may appear once in a mapping")
        return None, Problem(rel, line, col, f"YAML syntax error: {problem}")
    except YAMLError as exc:  # errors without a mark
        return None, Problem(rel, 1, 1, f"YAML error: {exc}")


# --------------------------------------------------------------------------
# Layer 2: schema
# --------------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _field_name(path: tuple) -> str:
    parts = [p for p in path if isinstance(p, str)]
    return parts[-1] if parts else "document"


def schema_problems(doc: _Doc, schema_name: str) -> list[Problem]:
    # The compiled check answers for a valid file (a 4,000-node fleet.yaml: jsonschema took
    # seconds to walk it); only a refused file is walked again for every error with its path.
    if is_valid(schema_name)(doc.data):
        return []
    problems = []
    required_seen: set[int] = set()
    for err in validator(schema_name).iter_errors(doc.data):
        path = tuple(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = list((err.schema.get("properties") or {}).keys())
            for extra in _unexpected_keys(err):
                hint = difflib.get_close_matches(extra, allowed, n=1)
                suggestion = f" (did you mean '{hint[0]}'?)" if hint else f"; known fields: {', '.join(allowed)}"
                problems.append(doc.at(path + (extra,), f"unknown field '{extra}'{suggestion}", key=True))
        elif err.validator == "required":
            # jsonschema says each missing field in a sentence of its own; the fields are read from
            # the schema and the document instead, all at the first of those errors.
            if id(err.instance) in required_seen:
                continue
            required_seen.add(id(err.instance))
            where = _field_name(path) if path else "the file"
            for name in [f for f in err.validator_value if f not in err.instance]:
                problems.append(doc.at(path, f"missing required field '{name}' in {where}", key=bool(path)))
        else:
            secret = _secret_problem(err, path)
            problems.append(doc.at(path, secret or f"{_field_name(path)}: {_value_problem(err)}"))
    return problems


def _secret_problem(err: jsonschema.ValidationError, path: tuple) -> str | None:
    """A malformed secret reference in `env`, said in its own words (SPEC section 7); None otherwise."""
    field, kind = _field_name(path), err.validator
    if kind == "pattern" and err.validator_value == "^/" and field == "from_file":
        return (f"env {_field_name(path[:-1])}: from_file {err.instance!r} must be an absolute path (it is read "
                "on the node, at launch, where there is no catalog directory to be relative to)")
    if kind == "pattern" and field == "from_env":
        return (f"env {_field_name(path[:-1])}: from_env {err.instance!r} is not a valid environment "
                "variable name (letters, digits and _, not starting with a digit)")
    if kind in ("minProperties", "maxProperties") and len(path) >= 2 and path[-2] == "env":
        return f"env {field}: a secret reference names exactly one of from_file or from_env"
    return None


_RANGE_WORDS = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "above", "exclusiveMaximum": "below"}


def _value_problem(err: jsonschema.ValidationError) -> str:
    """What is wrong with one value, in the words of YAML, which users write, not of JSON Schema."""
    kind = err.validator
    if kind == "type":
        want = err.validator_value
        yaml_words = {"object": "mapping", "array": "list"}
        want = [yaml_words.get(w, w) for w in want] if isinstance(want, list) else yaml_words.get(want, want)
        want = " or ".join(want) if isinstance(want, list) else want
        article = "an" if str(want)[:1] in "aeiou" else "a"
        return f"expected {article} {want}, got {_describe(err.instance)}"
    if kind == "enum":
        return f"{_describe(err.instance)} is not one of: {', '.join(str(c) for c in err.validator_value)}"
    if kind in _RANGE_WORDS:
        return f"{err.instance} is out of range; must be {_RANGE_WORDS[kind]} {err.validator_value}"
    if kind == "pattern" and err.validator_value == "^/":
        return f"{err.instance!r} must start with / (an absolute path)"
    if kind == "pattern":
        return f"{_describe(err.instance)} does not match the required form {err.validator_value}"
    if kind in ("minLength", "minItems"):
        return "must not be empty"
    if kind == "propertyNames":
        return f"key {err.instance!r} is not allowed: {err.message}"
    return err.message


def _unexpected_keys(err: jsonschema.ValidationError) -> list[str]:
    allowed = set((err.schema.get("properties") or {}).keys())
    patterns = err.schema.get("patternProperties") or {}
    out = []
    for k in err.instance:
        if k in allowed or any(re.search(p, k) for p in patterns):
            continue
        out.append(str(k))
    return out


# --------------------------------------------------------------------------
# Layer 3: what a schema cannot say
# --------------------------------------------------------------------------




def fleet_problems(doc: _Doc) -> list[Problem]:
    problems: list[Problem] = []
    nodes = doc.data.get("nodes") or []
    seen: dict[str, int] = {}
    for i, node in enumerate(nodes):
        nid = node["id"]
        if nid in seen:
            problems.append(doc.at(("nodes", i, "id"), f"duplicate node id '{nid}' (first defined as nodes[{seen[nid]}])"))
        else:
            seen[nid] = i
        owner: dict[str, str] = {}
        for fabric, hcas in (node.get("fabrics") or {}).items():
            for j, hca in enumerate(hcas):
                if hca in owner:
                    problems.append(
                        doc.at(("nodes", i, "fabrics", fabric, j), f"node {nid}: HCA {hca} is declared on both fabric {owner[hca]} and {fabric}")
                    )
                owner[hca] = fabric
    for i, node in enumerate(nodes):
        # Engines get the data address as a command-line value (`--rpc a:1,b:2`, `--master-addr a`):
        # a comma, colon or space in a name would splice in another endpoint or break the flag.
        field = "data_address" if "data_address" in node else "address"
        value = str(node.get(field, ""))
        if value and not Host(value).is_valid:
            hint = "" if field == "data_address" else " (an ~/.ssh/config alias works for address; then set data_address)"
            problems.append(doc.at(("nodes", i, field), f"node {node['id']}: {field} {value!r} is not a host name or an IP address{hint}"))
    problems += _slurm_problems(doc, nodes, seen)
    if len(nodes) > 1:
        for i, node in enumerate(nodes):
            for field in ("address", "data_address"):
                value = node.get(field)
                if value is not None and Host(str(value)).is_loopback:
                    problems.append(
                        doc.at(
                            ("nodes", i, field),
                            f"node {node['id']}: {field} {value} is loopback; in a fleet of several nodes a loopback "
                            "address makes every multi-node replica talk to itself",
                        )
                    )
    return problems


def _slurm_problems(doc: _Doc, nodes: list, ids: Mapping[str, int]) -> list[Problem]:
    """SPEC section 8: `launcher: slurm` needs the `slurm:` section, whose submit_via names a node or `local`."""
    problems: list[Problem] = []
    slurm = doc.data.get("slurm")
    if slurm is not None:
        via = slurm.get("submit_via")
        if via != "local" and via not in ids:
            problems.append(doc.at(("slurm", "submit_via"), f"submit_via {via!r} is neither a node id of this fleet nor `local`"))
    names: dict[str, str] = {}
    for i, node in enumerate(nodes):
        if node.get("launcher") == "slurm" and slurm is None:
            problems.append(doc.at(("nodes", i, "launcher"), f"node {node['id']}: launcher: slurm needs a `slurm:` section in fleet.yaml (where sbatch runs)"))
        if node.get("launcher") == "slurm":
            name = node.get("slurm_name", node["id"])
            if name in names:
                problems.append(doc.at(("nodes", i, "slurm_name" if "slurm_name" in node else "id"),
                                       f"node {node['id']}: Slurm node {name} is also node {names[name]}"))
            names[name] = node["id"]
    return problems


def model_problems(doc: _Doc) -> list[Problem]:
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
                    doc.at(base + ("engine",), f"{where}: engine {engine} needs GPUs; set gpu_class (CPU-only serving works with llama.cpp or command)")
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
    if str(data.get("source", "")).startswith("-"):
        # Render refuses it at launch; saying so here keeps it out of a merged catalog.
        problems.append(doc.at(("source",), f"source '{data['source']}' starts with '-', which an engine would read as a flag, not as the weights"))
    if "$" in data.get("source", ""):
        for name in placeholders_in(data["source"]):
            problems.append(doc.at(("source",), f"placeholder ${{{name}}} is not allowed in source; placeholders work only in a command profile's command and env"))
    return problems


def _rollout_problems(doc: _Doc) -> Iterator[Problem]:
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


def _args_problems(doc: _Doc, base: tuple, prof: dict) -> Iterator[Problem]:
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


def llama_ipv6_problems(fleet_doc: _Doc, models: list[Model]) -> list[Problem]:
    """An IPv6 data address on a node a multi-node llama.cpp profile may place a rank on.

    ggml's RPC speaks IPv4 only: the head aborts on `--rpc [v6]:port` and the RPC server
    exits 0 without serving on a v6 host, so such a replica could never run there.
    """
    problems = []
    nodes = fleet_doc.data.get("nodes") or []
    profiles = [(m, p) for m in models for p in m.profiles if p.engine == "llama.cpp" and p.nodes > 1]
    for i, node in enumerate(nodes):
        field = "data_address" if "data_address" in node else "address"
        if not Host(str(node.get(field, ""))).is_ipv6:
            continue
        labels = node.get("labels") or {}
        for model, prof in profiles:
            if all(labels.get(k) == v for k, v in prof.node_selector.items()):
                problems.append(fleet_doc.at(
                    ("nodes", i, field),
                    f"node {node['id']}: {field} {node[field]} is IPv6, and model {model.name} profile {prof.name} "
                    f"(llama.cpp on {prof.nodes} nodes) may place a rank here; llama.cpp's RPC speaks IPv4 only: give "
                    "the node an IPv4 data_address, or the profile a node_selector that leaves it out",
                ))
                break
    return problems


def _placeholder_problems(doc: _Doc, base: tuple, prof: dict, resolvable: bool) -> Iterator[Problem]:
    known = set(PLACEHOLDERS)
    for field, path, value in _string_fields(prof, base):
        names = placeholders_in(value) if "$" in value else []
        for name in names:
            if resolvable and field in ("command", "env"):
                if name not in known:
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


# --------------------------------------------------------------------------
# Building the Catalog
# --------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """ruamel's commented containers to plain dict/list (for frozen dataclasses)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _ssh(base: SshSettings, overrides: dict | None) -> SshSettings:
    o = overrides or {}
    return SshSettings(
        user=o.get("user", base.user),
        port=o.get("port", base.port),
        identity_file=o.get("identity_file", base.identity_file),
        known_hosts=o.get("known_hosts", base.known_hosts),
        connect_timeout_s=float(o.get("connect_timeout_s", base.connect_timeout_s)),
        command_timeout_s=float(o.get("command_timeout_s", base.command_timeout_s)),
    )


def build_fleet(data: dict) -> Fleet:
    data = _plain(data)
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
                state=n.get("state", "ready"),
                model_dirs=tuple(n.get("model_dirs") or ()),
                fabrics=frozen_map({k: tuple(v) for k, v in (n.get("fabrics") or {}).items()}),
                ssh=_ssh(defaults, n.get("ssh")),
                transport=n.get("transport", "ssh"),
                gpu_class=n.get("gpu_class"),
                state_dir=n.get("state_dir", fleet_state_dir),
                socket_ifname=n.get("socket_ifname"),
                launcher=n.get("launcher", "ssh"),
                slurm_name=n.get("slurm_name", ""),
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
    return Fleet(nodes=tuple(nodes), ssh=defaults, slurm=slurm_settings, owner=data.get("owner"),
                 unreachable_grace_s=float(data.get("unreachable_grace_s", Fleet.unreachable_grace_s)))


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
    )


def _env_value(value: Any) -> "str | SecretRef":
    """A string, or (the schema allows exactly one key) a reference to a secret."""
    if isinstance(value, dict):
        [(kind, name)] = value.items()
        return SecretRef(kind, name)
    return value


def build_model(data: dict, rel: str) -> Model:
    data = _plain(data)
    profiles = [build_profile(p) for p in data["profiles"]]
    # Stable: among equal priorities, catalog order decides.
    profiles.sort(key=lambda p: -p.priority)
    update = data.get("update")
    fetch = data.get("fetch")
    return Model(
        name=data["name"],
        source=data["source"],
        replicas=data.get("replicas", 1),
        spread=data.get("spread", "required"),
        profiles=tuple(profiles),
        file=rel,
        update=None if update is None else UpdatePolicy(update.get("max_surge", 0), update.get("max_unavailable", 0)),
        fetch=None if fetch is None else FetchPolicy(
            from_node=bool(fetch.get("from_node", False)),
            command=tuple(fetch["command"]) if "command" in fetch else None,
            max_parallel=fetch.get("max_parallel", 2),
        ),
    )


# --------------------------------------------------------------------------
# The directory
# --------------------------------------------------------------------------


def _file_problem(root: Path, path: Path, rel: str) -> Problem | None:
    """Why `path` is not read at all: outside the catalog (through a symlink, its own or a
    directory's), not a regular file (a FIFO would block forever), or too large. Its content is
    never read for this, so never printed."""
    real = path.resolve()
    if not real.is_relative_to(root):
        return Problem(rel, 1, 1, f"symbolic link points outside the catalog ({real}); catalog files must live in the catalog")
    try:
        st = real.stat()
    except OSError as exc:
        return Problem(rel, 1, 1, f"cannot read: {exc.strerror}")
    if not stat.S_ISREG(st.st_mode):
        return Problem(rel, 1, 1, "not a regular file; catalog files are YAML files")
    if st.st_size > MAX_FILE_BYTES:
        return Problem(rel, 1, 1, f"file is {st.st_size >> 20} MiB; catalog files are refused above {MAX_FILE_BYTES >> 20} MiB")
    return None


def _read_bounded(path: Path) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)  # it may have grown since it was checked
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES >> 20} MiB")
    return raw


def _too_many_values(data: Any, limit: int = MAX_VALUES) -> bool:
    """Whether `data`, with every YAML alias expanded, holds more than `limit` values (or refers
    to itself). Sizes are kept per shared object, so the cost is that of the file as written,
    however much its aliases multiply."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        item, children_done = stack.pop()
        key = id(item)
        if key in sizes:
            continue
        values = list(item.values()) if isinstance(item, dict) else item if isinstance(item, list) else []
        kids = [v for v in values if isinstance(v, (dict, list))]
        if not children_done:
            open_.add(key)
            stack.append((item, True))
            for k in kids:
                if id(k) in open_:
                    return True  # an alias to an enclosing value: it never ends
                if id(k) not in sizes:
                    stack.append((k, False))
            continue
        open_.discard(key)
        sizes[key] = min(limit + 1, len(values) + sum(sizes[id(k)] for k in kids))
    return sizes.get(id(data), 0) > limit


_TOO_MANY_VALUES = (f"expands to more than {MAX_VALUES:,} values (YAML anchors and aliases repeated "
                    "into each other); refused")


def _read(root: Path, path: Path, rel: str) -> tuple[_Doc | None, list[Problem]]:
    problem = _file_problem(root, path, rel)
    if problem:
        return None, [problem]
    try:
        raw = _read_bounded(path)
    except OSError as exc:
        return None, [Problem(rel, 1, 1, f"cannot read: {exc.strerror}")]
    text, problem = _decode(rel, raw)
    if problem:
        return None, [problem]
    data, problem = parse_yaml_text(rel, text)
    if problem:
        return None, [problem]
    if not isinstance(data, CommentedMap):
        kind = "a list" if isinstance(data, list) else _describe(data)
        line, col = position(data, ())
        return None, [Problem(rel, line, col, f"expected a mapping of fields at the top of the file, found {kind}")]
    if _too_many_values(data):
        return None, [Problem(rel, 1, 1, _TOO_MANY_VALUES)]
    return _Doc(rel, data), []


def _stray_yaml(root: Path) -> Iterator[Path]:
    """YAML files outside models/ that look like model files: they would be silently ignored."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and not (rel_dir == Path(".") and d in (STATUS_DIR,))
        )
        for f in sorted(filenames):
            if not f.endswith(YAML_SUFFIXES):
                continue
            p = Path(dirpath) / f
            rel = p.relative_to(root)
            if rel == Path(FLEET_FILE) or (rel.parent == Path(MODELS_DIR)):
                continue
            yield p


def _looks_like_model(path: Path) -> bool:
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return False
        text = _read_bounded(path).decode(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"(?m)^profiles\s*:", text)) and bool(re.search(r"(?m)^(source|name)\s*:", text))


def field_locator(root: str | os.PathLike):
    """(file, path) -> (line, column) of a field in a catalog file, for problems found after loading.

    The file is read again with positions, once, on the first question. A str step on a
    list picks the item with that `name` (("profiles", "h100-tp8", "gpus_per_node")).
    """
    root = Path(root)
    docs: dict[str, Any] = {}

    def locate(rel: str, path: tuple) -> tuple[int, int]:
        if rel not in docs:
            doc, _ = _read(root, root / rel, rel)
            docs[rel] = doc.data if doc is not None else None
        data = docs[rel]
        if data is None:
            return 1, 1
        steps, node = [], data
        for step in path:
            if isinstance(step, str) and isinstance(node, list):
                step = next((i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == step), None)
                if step is None:
                    break
            steps.append(step)
            try:
                node = node[step]
            except (KeyError, IndexError, TypeError):
                break
        return position(data, tuple(steps), key=True)

    return locate


def git_revision(root: Path) -> str | None:
    """The catalog's revision as the daemon names it (gitrev.catalog_revision_of), or None outside git."""
    from reconciler.gitrev import catalog_revision_of  # git runs only when a revision is asked for

    return catalog_revision_of(root)


def load_catalog(path: str | os.PathLike, *, revision: str | None = None, with_revision: bool = True) -> Catalog:
    """Load and validate the catalog at `path`. Raises CatalogInvalid with every problem found."""
    root = Path(path)
    if not root.exists():
        raise CatalogInvalid([Problem(str(path), 1, 1, "catalog directory does not exist")])
    if not root.is_dir():
        raise CatalogInvalid([Problem(str(path), 1, 1, "not a directory; a catalog is a directory with fleet.yaml and models/")])
    root = root.resolve()
    try:
        # Positions cost ten times the parse (ruamel's round-trip loader reads a 4,000-node
        # fleet.yaml in seconds) and are only needed to report a problem: read with the C
        # loader first, and read again with positions only when something is wrong.
        fleet, models = _load(root, _read_fast)
    except CatalogInvalid:
        fleet, models = _load(root, _read)
    rev = revision if revision is not None else (git_revision(root) if with_revision else None)
    return Catalog(root=str(root), fleet=fleet, models=tuple(models), revision=rev)


class _FastLoader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):
    """PyYAML's C loader, refusing duplicate keys (the positioned path then reports them)."""


def _no_duplicates(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    if len(keys) != len(set(map(repr, keys))):
        raise yaml.YAMLError("duplicate key")
    return loader.construct_mapping(node, deep=deep)


_FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)
# YAML 1.1 readings the round-trip (1.2) loader does not share: yes/no/on/off are strings there,
# 0755 is decimal, 1:30 is a string. Leave them as strings here too; any real mismatch fails the
# schema and the positioned path decides.
_FastLoader.yaml_implicit_resolvers = {
    k: [(t, r) for t, r in v if t not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp",
                                         "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for k, v in _FastLoader.yaml_implicit_resolvers.items()
}
_FastLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# Plain decimals only (no octal 0755, no 1_000, no 1:30): anything else stays a string here.
_FastLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
_FastLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^[-+]?[0-9]+[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _read_fast(root: Path, path: Path, rel: str) -> tuple[_Doc | None, list[Problem]]:
    """_read without positions; any oddity is a Problem so the positioned path runs instead."""
    if _file_problem(root, path, rel) is not None:
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    try:
        raw = _read_bounded(path)
        data = yaml.load(raw.decode("utf-8"), Loader=_FastLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, TypeError):
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    if not isinstance(data, dict) or any(not isinstance(k, str) for k in data) or _too_many_values(data):
        return None, [Problem(rel, 1, 1, "needs the positioned reader")]
    return _Doc(rel, data), []


def _load(root: Path, read) -> tuple[Fleet, list[Model]]:
    problems: list[Problem] = []

    fleet = None
    fleet_doc = None
    fleet_path = root / FLEET_FILE
    if not fleet_path.exists() and not (root / MODELS_DIR).exists():
        # Not a catalog at all (validate run in the wrong directory): one line that says where,
        # not a "looks like a model file" for every YAML file of every project below it.
        raise CatalogInvalid([Problem(FLEET_FILE, 1, 1, f"missing: {root} is not a catalog; "
                                      "a catalog is a directory with fleet.yaml and models/")])
    if not fleet_path.exists():
        problems.append(Problem(FLEET_FILE, 1, 1, "missing: a catalog needs fleet.yaml listing its nodes"))
    else:
        doc, errs = read(root, fleet_path, FLEET_FILE)
        problems += errs
        if doc is not None:
            errs = schema_problems(doc, "fleet")
            if not errs:
                errs = fleet_problems(doc)
            problems += errs
            if not errs:
                fleet = build_fleet(doc.data)
                fleet_doc = doc

    models: list[Model] = []
    names: dict[str, tuple[str, int, int]] = {}
    models_dir = root / MODELS_DIR
    if models_dir.is_dir():
        entries = sorted(models_dir.iterdir())
        for p in entries:
            rel = f"{MODELS_DIR}/{p.name}"
            if p.name.startswith("."):
                continue
            if p.is_dir():
                problems.append(Problem(rel, 1, 1, "model files go directly in models/, not in a subdirectory"))
                continue
            if not p.name.endswith(YAML_SUFFIXES):
                continue
            doc, errs = read(root, p, rel)
            problems += errs
            if doc is None:
                continue
            errs = schema_problems(doc, "model")
            if not errs:
                errs = model_problems(doc)
            problems += errs
            if errs:
                continue
            model = build_model(doc.data, rel)
            if model.name in names:
                first = names[model.name]
                problems.append(doc.at(("name",), f"duplicate model name '{model.name}' (also in {first[0]}:{first[1]}:{first[2]})"))
                continue
            line, col = position(doc.data, ("name",))
            names[model.name] = (rel, line, col)
            models.append(model)
    elif models_dir.exists():  # a file named models: every model it was meant to hold would be silently absent
        problems.append(Problem(MODELS_DIR, 1, 1, "not a directory; models/ holds one YAML file per model"))
    for stray in _stray_yaml(root):
        if stray.resolve().is_relative_to(root) and _looks_like_model(stray):
            rel = str(stray.relative_to(root))
            problems.append(Problem(rel, 1, 1, f"looks like a model file but is outside models/, so it would be ignored; move it to models/{stray.name}"))

    if fleet_doc is not None:
        problems += llama_ipv6_problems(fleet_doc, models)
    if problems or fleet is None:
        order = {FLEET_FILE: 0}
        problems.sort(key=lambda p: (order.get(p.file, 1), p.file, p.line, p.column))
        raise CatalogInvalid(problems)
    models.sort(key=lambda m: m.name)
    return fleet, models
