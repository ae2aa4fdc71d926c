"""@frozen builds the same values as @dataclass(frozen=True), with its own faster __init__."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import InitVar, field

import pytest

from reconciler.frozen import frozen
from reconciler.model import Gpu, Placement, Assignment
from reconciler.vocabulary import GpuHealth


@frozen
class Point:
    x: int
    y: int = 2
    tags: tuple = field(default_factory=tuple)
    seen: list = field(default_factory=list, compare=False)


@frozen
class Derived:
    text: str
    upper: str = field(init=False)
    count: int = field(init=False, default=7)

    def __post_init__(self) -> None:
        object.__setattr__(self, "upper", self.text.upper())


@frozen
class WithKeywords:
    a: int
    b: int = 1
    c: int = field(kw_only=True, default=3)
    d: int = field(kw_only=True)


def test_values_signature_and_defaults_match_a_dataclass():
    assert Point(1) == Point(1, 2, ()) and Point(1).y == 2
    assert Point(x=5, tags=(1,)).tags == (1,)
    # A default factory makes a new value each time, as the dataclass's does.
    assert Point(1).seen is not Point(1).seen
    assert repr(Point(1, 3)) == "Point(x=1, y=3, tags=(), seen=[])"
    with pytest.raises(TypeError):
        Point()  # x has no default
    with pytest.raises(TypeError):
        Point(1, 2, (), [], 9)


def test_it_stays_frozen_hashable_and_replaceable():
    p = Point(1, tags=(2,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    assert dataclasses.replace(p, y=9) == Point(1, 9, (2,))
    assert hash(Placement("r-0", "m", "p", None, None, ())) == hash(Placement("r-0", "m", "p", None, None, ()))


def test_post_init_and_fields_not_in_init():
    d = Derived("ab")
    assert (d.upper, d.count) == ("AB", 7)
    assert dataclasses.replace(d, text="c").upper == "C"


def test_keyword_only_fields():
    w = WithKeywords(1, d=4)
    assert (w.a, w.b, w.c, w.d) == (1, 1, 3, 4)
    with pytest.raises(TypeError):
        WithKeywords(1, 2, 3, 4)  # c and d are keyword-only


def test_what_it_cannot_build_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match="follows default"):
        @frozen
        class Bad:
            a: int = 1
            b: int

    with pytest.raises(TypeError, match="InitVar"):
        @frozen
        class WithInitVar:
            a: int
            b: InitVar[int]

    with pytest.raises(TypeError, match="defines __repr__"):
        @frozen
        class OwnRepr:
            a: int

            def __repr__(self) -> str:
                return "mine"

    with pytest.raises(TypeError, match="no options"):
        frozen(slots=True)


@dataclasses.dataclass(frozen=True)
class TwinByDataclass:
    a: int
    b: tuple = ()
    note: str = field(default="", compare=False, repr=False)


@frozen
class TwinByFrozen:
    a: int
    b: tuple = ()
    note: str = field(default="", compare=False, repr=False)


def test_repr_equality_and_hash_are_the_dataclass_s():
    made, reference = TwinByFrozen(1, (2, 3), "x"), TwinByDataclass(1, (2, 3), "x")
    assert repr(made).replace("TwinByFrozen", "") == repr(reference).replace("TwinByDataclass", "")
    assert hash(made) == hash(reference)  # the same tuple of compared fields
    assert made == TwinByFrozen(1, (2, 3), "other note") and made != TwinByFrozen(2, (2, 3))
    assert made != reference  # another class, as with dataclasses
    assert {made, TwinByFrozen(1, (2, 3))} == {made}
    with pytest.raises(dataclasses.FrozenInstanceError):
        del made.a
    assert dataclasses.is_dataclass(made) and made.__dataclass_params__.frozen
    assert [f.name for f in dataclasses.fields(made)] == ["a", "b", "note"]
    assert dataclasses.asdict(made) == {"a": 1, "b": (2, 3), "note": "x"}


def test_the_hot_values_read_as_before():
    g = Gpu(0, "GPU-1", "NVIDIA H100", "H100-80GB", 81559)
    assert (g.memory_used_mb, g.processes, g.health, g.quarantined) == (0, (), GpuHealth.OK, None)
    assert g.healthy
    a = Assignment(node="n1", rank=0, gpus=(0, 1), hcas=(), port=8000)
    assert dataclasses.asdict(a)["gpus"] == (0, 1)



def test_instances_of_a_class_share_its_field_names():
    # The fields are stored in order into the instance's own __dict__, so CPython keeps one table of
    # keys for the class and each instance holds only values (a snapshot has 30,000 GPUs): its
    # __dict__ is smaller than a dict of the same items. A dict literal set as __dict__ is not.
    gpus = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", "H100", 81559) for i in range(3)]
    for g in gpus + [dataclasses.replace(gpus[0], memory_used_mb=5)]:
        assert sys.getsizeof(g.__dict__) < sys.getsizeof(dict(g.__dict__))
    assert list(vars(gpus[1])) == [f.name for f in dataclasses.fields(Gpu)]
    d = Derived("abc")  # a field __post_init__ sets comes after those __init__ stores
    assert list(vars(d)) == ["text", "count", "upper"] and d.upper == "ABC"
