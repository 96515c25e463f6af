"""Render model values as Python source: constructor calls with defaults left out.

Every scalar (string, number, bool, None) is written by `escape.literal`, the only place a spec's
values become module text, so nothing a spec says can become code. Class and field names come from
the model itself. The output is deterministic: fields in declaration order, no hashing.
"""

from __future__ import annotations

import dataclasses

from opcheck.codegen.escape import literal
from opcheck.spec import model

INDENT = "    "
WIDTH = 100

# Classes the generated module imports; anything else in a model value is a bug here.
MODEL_CLASSES = {cls.__name__: cls for cls in (
    model.OpSpec, model.Sample, model.TensorArg, model.TensorListArg, model.TupleArg, model.DtypeArg,
    model.GradcheckFlags, model.GradgradcheckFlags, model.Where, model.ToleranceRule, model.Rule, model.Location,
)}


def to_source(value, level: int = 0) -> str:
    """Source for a model value; one line when it fits, else one item per line."""
    return _Renderer().source(value, level)


class _Renderer:
    """One rendering: the one-line form of each sub-value is computed once (memo by identity,
    not equality: model equality ignores locations, which must still be rendered)."""

    def __init__(self):
        self._flat_memo: dict[int, tuple[object, str]] = {}

    def source(self, value, level: int) -> str:
        flat = self.flat(value)
        if len(flat) + len(INDENT) * level <= WIDTH:
            return flat
        return self._multiline(value, level)

    def flat(self, value) -> str:
        hit = self._flat_memo.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        text = self._flat(value)
        self._flat_memo[id(value)] = (value, text)  # keeps value alive, so its id stays unique
        return text

    def _flat(self, value) -> str:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = _check_class(value)
            args = [(f"{k}={self.flat(v)}" if k else self.flat(v)) for k, v in _parts(value)]
            return f"{name}({', '.join(args)})"
        if isinstance(value, tuple):
            items = [self.flat(v) for v in value]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if isinstance(value, list):
            return f"[{', '.join(self.flat(v) for v in value)}]"
        return literal(value)

    def _multiline(self, value, level: int) -> str:
        pad, inner = INDENT * level, INDENT * (level + 1)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = _check_class(value)
            lines = [f"{inner}{k + '=' if k else ''}{self.source(v, level + 1)}," for k, v in _parts(value)]
            return f"{name}(\n" + "\n".join(lines) + f"\n{pad})"
        if isinstance(value, (tuple, list)):
            opening, closing = ("(", ")") if isinstance(value, tuple) else ("[", "]")
            lines = [f"{inner}{self.source(v, level + 1)}," for v in value]
            return opening + "\n" + "\n".join(lines) + f"\n{pad}{closing}"
        return literal(value)


def used_classes(value) -> set[str]:
    """Names of the model classes `to_source(value)` refers to."""
    found: set[str] = set()

    def walk(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            found.add(type(v).__name__)
            for f in _non_default_fields(v):
                walk(getattr(v, f.name))
        elif isinstance(v, (tuple, list)):
            for item in v:
                walk(item)

    walk(value)
    return found


def _non_default_fields(obj):
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING and value == f.default and type(value) is type(f.default):
            continue
        if f.default_factory is not dataclasses.MISSING and value == f.default_factory():  # type: ignore[misc]
            continue
        yield f


def _positional(obj) -> list[str]:
    """Leading required fields written positionally: Location("x.yaml", 3, 5), Sample("rows", ...)."""
    if isinstance(obj, model.Location):
        return ["file", "line", "col"]
    if isinstance(obj, (model.Sample, model.DtypeArg)):
        return ["name"]
    return []


def _check_class(obj):
    name = type(obj).__name__
    if MODEL_CLASSES.get(name) is not type(obj):
        raise TypeError(f"{name} is not a model class the generated modules import")
    return name


def _parts(obj) -> list[tuple[str | None, object]]:
    positional = _positional(obj)
    parts: list[tuple[str | None, object]] = [(None, getattr(obj, n)) for n in positional]
    parts += [(f.name, getattr(obj, f.name)) for f in _non_default_fields(obj) if f.name not in positional]
    return parts
