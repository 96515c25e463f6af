"""Model values as Python expressions: constructor calls with defaults left out.

Every scalar (string, number, bool, None) is written by `escape.literal`, the only place a spec's
values become module text, so nothing a spec says can become code. Class and field names come from
the model itself. The output is deterministic: fields in declaration order, no hashing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from opcheck.codegen.escape import identifier, literal
from opcheck.codegen.layout import Atom, CallExpr, Expr, Seq, Str
from opcheck.spec import model

# Classes the generated module imports; anything else in a model value is a bug here.
MODEL_CLASSES = {
    cls.__name__: cls
    for cls in (
        model.OpSpec,
        model.Sample,
        model.TensorArg,
        model.TensorListArg,
        model.TupleArg,
        model.DtypeArg,
        model.GradcheckFlags,
        model.GradgradcheckFlags,
        model.CompileFlags,
        model.ReducedPrecision,
        model.Where,
        model.ToleranceRule,
        model.LowprecPartsRule,
        model.Rule,
        model.Location,
    )
}


def to_expr(value: object, *, source: str | None = None, source_name: str = "") -> Expr:
    """The expression that constructs a model value. Where a spec's path (`OpSpec.source`, every
    `Location.file`) equals `source`, it is written as the name `source_name` instead (a module
    constant holding that path), so that a Location fits on its Sample's line."""
    return _Builder(source, source_name).expr(value)


class _Builder:
    def __init__(self, source: str | None, source_name: str):
        self._source = source
        self._name = Atom(identifier(source_name)) if source is not None else None

    def expr(self, value: object) -> Expr:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = _check_class(value)
            return CallExpr(
                name,
                tuple(
                    (None if positional else field, self._field(value, field, v))
                    for field, positional, v in _parts(value)
                ),
            )
        if isinstance(value, tuple):
            return Seq(tuple(self.expr(v) for v in value))
        if isinstance(value, list):
            return Seq(tuple(self.expr(v) for v in value), brackets="[]")
        if isinstance(value, str):
            return Str(value)
        return Atom(literal(value))

    def _field(self, obj: object, field: str, value: object) -> Expr:
        is_path = (
            field == "file"
            if isinstance(obj, model.Location)
            else (field == "source" and isinstance(obj, model.OpSpec))
        )
        if is_path and self._name is not None and isinstance(value, str) and value == self._source:
            return self._name
        return self.expr(value)


def used_classes(value: object) -> set[str]:
    """Names of the model classes `to_expr(value)` refers to."""
    found: set[str] = set()

    def walk(v: object) -> None:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            found.add(type(v).__name__)
            for f in _non_default_fields(v):
                walk(getattr(v, f.name))
        elif isinstance(v, (tuple, list)):
            for item in v:
                walk(item)

    walk(value)
    return found


def _non_default_fields(obj: Any) -> Iterator[dataclasses.Field[Any]]:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING and value == f.default and _same_kind(value, f.default):
            continue
        if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
            continue
        yield f


def _same_kind(value: object, default: object) -> bool:
    """Whether an equal value is the default itself: 1 is not 1.0 or True; a str enum member is its name."""
    return type(value) is type(default) or (isinstance(value, str) and isinstance(default, str))


def _positional(obj: object) -> list[str]:
    """Leading required fields written positionally: Location("x.yaml", 3, 5), Sample("rows", ...)."""
    if isinstance(obj, model.Location):
        return ["file", "line", "col"]
    if isinstance(obj, (model.Sample, model.DtypeArg)):
        return ["name"]
    return []


def _check_class(obj: object) -> str:
    name = type(obj).__name__
    if MODEL_CLASSES.get(name) is not type(obj):
        raise TypeError(f"{name} is not a model class the generated modules import")
    return name


def _parts(obj: object) -> list[tuple[str, bool, object]]:
    """(field name, written positionally, value) for each field the constructor call writes."""
    positional = _positional(obj)
    parts: list[tuple[str, bool, object]] = [(n, True, getattr(obj, n)) for n in positional]
    parts += [(f.name, False, getattr(obj, f.name)) for f in _non_default_fields(obj) if f.name not in positional]
    return parts
