"""`record`: a dataclass that is cheaper to create, for the engine's classes.

`@dataclass(frozen=True)` compiles six methods for each class it makes (`__init__`, `__repr__`,
`__eq__`, `__hash__`, `__setattr__`, `__delattr__`), each by a call of `exec`: about 0.8 ms per
class on a 2-core x86, paid by every process that imports the class. A gradcheck call's first
check, and its first failure, create a dozen such classes each, so their creation was a good part
of what opcheck's first call costs over torch's. `record` has `dataclasses.dataclass` compile the
`__init__` alone (about 0.2 ms) and gives every class the same hand-written `__repr__`, `__eq__`,
`__hash__`, `__setattr__` and `__delattr__`, which behave as the frozen dataclass's do:

- a record is a dataclass: `dataclasses.fields`, `replace` and `asdict` work on it;
- assigning or deleting an attribute after `__init__` raises `dataclasses.FrozenInstanceError`
  (`__init__` sets each field once; `object.__setattr__` still works in `__post_init__`);
- `eq=True` (the default): equal when of the same class with equal fields (those compared),
  hashed by those fields; `eq=False`: compared and hashed by identity;
- `repr` lists the fields shown, as the dataclass's does;
- `frozen=False`, as `@dataclass`: fields may be assigned, and with `eq` the record is unhashable.

A method the class body defines itself is kept, as `dataclass` keeps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f


__all__ = ["record"]

T = TypeVar("T")


def _setattr(self: Any, name: str, value: Any) -> None:
    """A field is set once, by __init__; nothing else is set."""
    if name in self.__dict__ or name not in self.__record_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    self.__dict__[name] = value


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{self.__class__.__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__record_compare__
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in self.__record_hash__))


def _make(cls: type[T], eq: bool, frozen: bool) -> type[T]:
    cls = dataclasses.dataclass(cls, repr=False, eq=False)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    own = cls.__dict__
    cls.__record_fields__ = frozenset(f.name for f in fields)  # type: ignore[attr-defined]
    cls.__record_repr__ = tuple(f.name for f in fields if f.repr)  # type: ignore[attr-defined]
    methods: dict[str, Any] = {"__repr__": _repr}
    if frozen:
        methods |= {"__setattr__": _setattr, "__delattr__": _delattr}
    if eq:
        cls.__record_compare__ = tuple(f.name for f in fields if f.compare)  # type: ignore[attr-defined]
        cls.__record_hash__ = tuple(  # type: ignore[attr-defined]
            f.name for f in fields if (f.compare if f.hash is None else f.hash)
        )
        # a mutable record with eq is unhashable, as a dataclass is
        methods |= {"__eq__": _eq, "__hash__": _hash if frozen else None}
    for name, method in methods.items():
        # as dataclass: a method of the class body stays, except the __hash__ = None that defining
        # __eq__ implies
        if name not in own or (name == "__hash__" and own[name] is None and "__eq__" in own):
            setattr(cls, name, method)
    return cls


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, eq: bool = True, frozen: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, eq_default=True, field_specifiers=(dataclasses.field,))
def record(
    cls: type[T] | None = None, /, *, eq: bool = True, frozen: bool = True
) -> type[T] | Callable[[type[T]], type[T]]:
    """`@record`, `@record(eq=False)` or `@record(frozen=False)` over a class body, as
    `@dataclass(frozen=True)`, `@dataclass(frozen=True, eq=False)` or `@dataclass` (see the
    module doc)."""
    if cls is None:
        return lambda c: _make(c, eq, frozen)
    return _make(cls, eq, frozen)
