"""`@frozen`: a frozen dataclass whose __init__ sets every field in one step.

A frozen dataclass's generated __init__ sets each field with its own
object.__setattr__ call (its __setattr__ refuses). A 4,000-node pass builds
some 150,000 of these values (30,000 GPUs, 10,000 placements, actions and
outcomes ...), and those calls were a fifth of `plan`'s time. This __init__
builds the instance's __dict__ as one dict literal and sets it once: the same
signature, defaults, default factories and __post_init__, the same frozen
value afterwards (equality, hashing, repr, dataclasses.replace are the
dataclass's own). Stdlib only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

T = TypeVar("T", bound=type)

_FACTORY_SENTINEL = object()  # "no value given" for a field with a default_factory


def frozen(cls: T | None = None, /, **options: Any) -> T | Callable[[T], T]:
    """@dataclass(frozen=True, **options) with the one-step __init__; used as @frozen or @frozen(eq=False)."""

    def wrap(c: T) -> T:
        if options.get("init", True) is False or options.get("slots"):
            raise TypeError("@frozen writes __init__ itself and needs instances with a __dict__")
        made = dataclasses.dataclass(c, frozen=True, init=False, **options)
        made.__init__ = _one_step_init(made)
        return made

    return wrap if cls is None else wrap(cls)


def _one_step_init(cls: type) -> Callable[..., None]:
    if any(f._field_type is dataclasses._FIELD_INITVAR for f in cls.__dataclass_fields__.values()):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: @frozen does not take InitVar fields")
    env: dict[str, Any] = {"_set": object.__setattr__, "_UNSET": _FACTORY_SENTINEL}
    positional, keyword, entries = [], [], []
    seen_default = False
    for f in dataclasses.fields(cls):
        name = f.name
        has_default = f.default is not dataclasses.MISSING
        has_factory = f.default_factory is not dataclasses.MISSING
        if has_default:
            env[f"_default_{name}"] = f.default
        if has_factory:
            env[f"_factory_{name}"] = f.default_factory
        if not f.init:
            if has_default:
                entries.append(f"{name!r}: _default_{name}")
            elif has_factory:
                entries.append(f"{name!r}: _factory_{name}()")
            continue  # no default: __post_init__ sets it, as with the dataclass's own __init__
        params = keyword if f.kw_only else positional
        if has_default:
            params.append(f"{name}=_default_{name}")
            value = name
        elif has_factory:
            params.append(f"{name}=_UNSET")
            value = f"_factory_{name}() if {name} is _UNSET else {name}"
        else:
            if seen_default and not f.kw_only:
                raise TypeError(f"non-default argument {name!r} follows default argument")
            params.append(name)
            value = name
        seen_default = seen_default or ((has_default or has_factory) and not f.kw_only)
        entries.append(f"{name!r}: {value}")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    body = f"    _set(self, '__dict__', {{{', '.join(entries)}}})\n"
    if hasattr(cls, "__post_init__"):
        body += "    self.__post_init__()\n"
    namespace: dict[str, Any] = {}
    exec(f"def __init__({signature}):\n{body}", env, namespace)  # noqa: S102 - our own text, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init
