"""`record` (opcheck._records) against `dataclass(frozen=True)`: the same class behaviour, side by side."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from opcheck._records import record


def _point(decorate, qualname):
    """The class body both decorators take (named `qualname`, where pickle finds it)."""

    class Point:
        a: int
        b: str = "x"
        c: list[int] = field(default_factory=list, compare=False)
        d: float = field(default=1.0, repr=False, hash=False)

    Point.__qualname__, Point.__name__ = qualname, qualname.rpartition(".")[2]
    return decorate(Point)


def _counts(decorate, qualname):
    class Counts:
        calls: int = 0
        paths: list[str] = field(default_factory=list)

    Counts.__qualname__ = qualname
    return decorate(Counts)


class Ours:
    """The same class bodies under `record`..."""

    Point = _point(record, "Ours.Point")
    Handle = _point(record(eq=False), "Ours.Handle")
    Counts = _counts(record(frozen=False), "Ours.Counts")


class Theirs:
    """... and under dataclass(frozen=True)."""

    Point = _point(dataclass(frozen=True), "Theirs.Point")
    Handle = _point(dataclass(frozen=True, eq=False), "Theirs.Handle")
    Counts = _counts(dataclass, "Theirs.Counts")


CLASSES = [Ours.Point, Theirs.Point, Ours.Handle, Theirs.Handle]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_a_record_behaves_as_a_frozen_dataclass(cls):
    eq = cls.__name__ == "Point"
    p = cls(1, "y", [1], 2.0)
    assert dataclasses.is_dataclass(p)
    assert [f.name for f in dataclasses.fields(p)] == ["a", "b", "c", "d"]
    assert dataclasses.asdict(p) == {"a": 1, "b": "y", "c": [1], "d": 2.0}
    assert repr(p) == f"{cls.__qualname__}(a=1, b='y', c=[1])"
    q = dataclasses.replace(p, a=2)
    assert (q.a, q.b, q.c, q.d) == (2, "y", [1], 2.0)
    for name in ("a", "other"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(p, name, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.a
    same = cls(1, "y", [9], 2.0)  # c is not compared
    if eq:
        assert p == same and p != q and p != cls(1, "y", [1], 3.0) and p != (1, "y")
        assert hash(p) == hash(cls(1, "y", [], 3.0))  # d is compared, not hashed
    else:
        assert p != same and p == p and hash(p) == object.__hash__(p)
    for copied in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert (copied == p) is eq and repr(copied) == repr(p)


@pytest.mark.parametrize("cls", [Ours.Counts, Theirs.Counts], ids=lambda c: c.__qualname__)
def test_a_mutable_record_behaves_as_a_dataclass(cls):
    c = cls()
    c.calls += 2
    c.paths.append("full")
    c.other = 1  # a plain attribute, as on any instance
    assert repr(c) == f"{cls.__qualname__}(calls=2, paths=['full'])"
    assert c == cls(2, ["full"]) and c != cls(2) and dataclasses.replace(c, calls=3).calls == 3
    with pytest.raises(TypeError, match="unhashable"):
        hash(c)
    del c.other


def test_ours_and_theirs_give_the_same_answers():
    for ours, theirs in [(Ours.Point, Theirs.Point), (Ours.Handle, Theirs.Handle)]:
        for args in [(1,), (1, "y"), (2, "y", [3], 4.0)]:
            a, b = ours(*args), theirs(*args)
            assert repr(a).replace("Ours.", "") == repr(b).replace("Theirs.", "")
            assert (a == ours(*args)) == (b == theirs(*args))
            assert (hash(a) == hash(ours(*args))) == (hash(b) == hash(theirs(*args)))


def test_subclasses_post_init_and_methods_of_the_body():
    @record
    class Base:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a < 0")

    @record(eq=False)
    class Child(Base):
        b: int = 0
        doubled: int = field(init=False, default=0)

        def __post_init__(self) -> None:
            super().__post_init__()
            object.__setattr__(self, "doubled", 2 * self.b)

        def __repr__(self) -> str:
            return "child"

    @record
    class OwnEq:
        a: int

        def __eq__(self, other: object) -> bool:
            return isinstance(other, OwnEq)

    c = Child(1, 3)
    assert (c.a, c.b, c.doubled, repr(c)) == (1, 3, 6, "child")
    with pytest.raises(ValueError, match="a < 0"):
        Child(-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.b = 4
    # eq=False inherits the base's __eq__, over the base's fields and the exact class, as dataclass's
    assert c == Child(1, 4) and Base(1) == Base(1) and Base(1) != Child(1)
    assert OwnEq(1) == OwnEq(2) and hash(OwnEq(1)) != hash(OwnEq(2))  # the body's __eq__, hashed by field
