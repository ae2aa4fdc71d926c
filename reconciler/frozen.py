"""`@frozen`: a frozen dataclass whose __init__ sets its fields without a call per field, and
that costs one generated function to define instead of six.

A frozen dataclass's generated __init__ sets each field with its own
object.__setattr__ call (its __setattr__ refuses). A 4,000-node pass builds
some 150,000 of these values (30,000 GPUs, 10,000 placements, actions and
outcomes ...), and those calls were a fifth of `plan`'s time. This __init__
stores each field straight into the instance's __dict__ (no call per field), in
field order, so CPython keeps it a key-sharing dict: the same signature,
defaults, default factories and __post_init__.

Defining one costs less too. @dataclass writes the source of __init__,
__repr__, __eq__, __hash__, __setattr__ and __delattr__ and compiles each, at
every start: with some eighty such classes that was a third of the time `plan`
spent importing. Here only __init__ is compiled (its signature is the class's
own); the others are shared functions over the class's field names, with the
dataclass's behaviour: the same repr text, equality and hash over the compared
fields, FrozenInstanceError on assignment, and dataclasses.fields, replace and
asdict work as on any dataclass. Stdlib only.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import reprlib
from typing import Any, Callable, TypeVar

T = TypeVar("T", bound=type)

_FACTORY_SENTINEL = object()  # "no value given" for a field with a default_factory
_WRITTEN_HERE = frozenset({"__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"})


def frozen(cls: T | None = None, /, **options: Any) -> T | Callable[[T], T]:
    """@dataclass(frozen=True) with an __init__ that makes no call per field; used as @frozen."""

    if options:
        raise TypeError(f"@frozen takes no options (given {', '.join(options)}): use @dataclass for those")

    def wrap(c: T) -> T:
        own = sorted(_WRITTEN_HERE & set(c.__dict__))
        if own:  # @dataclass would keep them; here they would be replaced without a word
            raise TypeError(f"{c.__name__} defines {', '.join(own)}: @frozen writes those, use @dataclass")
        # The dataclass machinery reads the fields (defaults, factories, ClassVar, kw_only) and
        # generates nothing; the methods come from here. A class without a docstring is given the
        # one @dataclass would give it, written here: its way (inspect.signature) costs more than
        # the class.
        undocumented = not c.__dict__.get("__doc__")
        if undocumented:
            c.__doc__ = c.__name__
        made = dataclasses.dataclass(c, init=False, repr=False, eq=False)
        fields = dataclasses.fields(made)
        if undocumented:
            made.__doc__ = f"{c.__name__}({', '.join(f.name for f in fields if f.init)})"
        made.__init__ = _one_step_init(made)
        made.__repr__ = _repr([f.name for f in fields if f.repr])
        compared = [f.name for f in fields if f.compare]
        hashed = [f.name for f in fields if (f.hash is None and f.compare) or f.hash]
        made.__eq__ = _eq(_values(compared))
        made.__hash__ = _hash(_values(hashed))
        made.__setattr__, made.__delattr__ = _refusals(made, {f.name for f in fields})
        params = copy.copy(made.__dataclass_params__)
        for name in ("init", "repr", "eq", "frozen"):
            setattr(params, name, True)
        made.__dataclass_params__ = params
        return made

    return wrap if cls is None else wrap(cls)


def _values(names: list[str]) -> Callable[[Any], tuple]:
    """The tuple of these attributes of an instance, as the dataclass's methods compare and hash it."""
    if len(names) > 1:
        return operator.attrgetter(*names)  # a tuple already, built in C
    if names:
        (name,) = names
        return lambda self: (getattr(self, name),)
    return lambda self: ()


def _repr(names: list[str]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__


def _eq(values: Callable[[Any], tuple]) -> Callable[[Any, Any], Any]:
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash(values: Callable[[Any], tuple]) -> Callable[[Any], int]:
    def __hash__(self) -> int:
        return hash(values(self))

    return __hash__


def _refusals(cls: type, names: set[str]) -> tuple[Callable, Callable]:
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


def _one_step_init(cls: type) -> Callable[..., None]:
    if any(f._field_type is dataclasses._FIELD_INITVAR for f in cls.__dataclass_fields__.values()):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: @frozen does not take InitVar fields")
    env: dict[str, Any] = {"_UNSET": _FACTORY_SENTINEL}
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
                entries.append((repr(name), f"_default_{name}"))
            elif has_factory:
                entries.append((repr(name), f"_factory_{name}()"))
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
        entries.append((repr(name), value))
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    # Stored one by one into the instance's own __dict__, in field order: CPython then keeps it a
    # key-sharing dict, the keys held once by the class (288 bytes a GPU, against 560 for a dict
    # of its own, and attribute reads a third faster), as fast to build as the dict literal it replaced.
    body = "    _d = self.__dict__\n" + "".join(f"    _d[{key}] = {value}\n" for key, value in entries)
    if hasattr(cls, "__post_init__"):
        body += "    self.__post_init__()\n"
    namespace: dict[str, Any] = {}
    exec(f"def __init__({signature}):\n{body}", env, namespace)  # noqa: S102 - our own text, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init
