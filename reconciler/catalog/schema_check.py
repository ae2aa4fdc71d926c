"""Layer 2 of the catalog's checks: the JSON Schemas in schema/ (field names, types, ranges,
enums), each error said in the words of YAML at the position of the value.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from reconciler.errors import Problem
from reconciler.schemas import is_valid, non_string_keys, validator
from reconciler.catalog.documents import Document, describe_value

if TYPE_CHECKING:  # jsonschema is imported only when a file is refused (schemas.validator)
    import jsonschema


def _field_name(path: tuple) -> str:
    parts = [p for p in path if isinstance(p, str)]
    return parts[-1] if parts else "document"


def schema_problems(doc: Document, schema_name: str) -> list[Problem]:
    # The compiled check answers for a valid file (a 4,000-node fleet.yaml: jsonschema took
    # seconds to walk it); only a refused file is walked again for every error with its path.
    if is_valid(schema_name)(doc.data):
        return []
    # A key JSON cannot hold (`5:` in node_selector): jsonschema walks past it and every check below
    # would take the file, so it is said here, at the key.
    problems = [doc.at(path, f"{_field_name(path[:-1])}: a key must be a string, this one is "
                       f"{describe_value(path[-1])} (quote it)", key=True) for path in non_string_keys(doc.data)]
    required_seen: set[int] = set()
    for err in validator(schema_name).iter_errors(doc.data):
        path = tuple(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = list((err.schema.get("properties") or {}).keys())
            for extra in _unexpected_keys(err):
                import difflib  # only for a catalog with a problem: plan starts sooner

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
        return f"expected {article} {want}, got {describe_value(err.instance)}"
    if kind == "enum":
        return f"{describe_value(err.instance)} is not one of: {', '.join(str(c) for c in err.validator_value)}"
    if kind in _RANGE_WORDS:
        return f"{err.instance} is out of range; must be {_RANGE_WORDS[kind]} {err.validator_value}"
    if kind == "pattern" and err.validator_value == "^/":
        return f"{err.instance!r} must start with / (an absolute path)"
    if kind == "pattern":
        return f"{describe_value(err.instance)} does not match the required form {err.validator_value}"
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
