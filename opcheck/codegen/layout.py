"""Python expressions as generated modules write them: laid out the way `ruff format` lays them out.

A generated module is written already formatted (the project's `ruff format` settings: 120
columns, double quotes), so formatting never rewrites it and a diff between two generations shows
only what changed in the spec. The rules are ruff's for the few forms a generated module uses:

- an expression that fits on its line stays on it;
- a call that does not fit puts its arguments on one indented line, or, when they do not fit there
  either, one argument per line with a trailing comma;
- a tuple, list or dict that does not fit has one item per line with a trailing comma;
- a sole argument, list item or dict entry that does not fit is broken on its own line, with no
  trailing comma (a tuple of one keeps the comma that makes it a tuple);
- a string that does not fit becomes an implicit concatenation in parentheses, one line per
  part, broken after spaces (its value is unchanged: the parts join back to it).

Every string a node holds is written by `escape.literal`; `Atom` text is opcheck's own (names,
numbers, literals already escaped).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import cached_property

from opcheck.codegen.escape import literal

WIDTH = 120
"""Columns per line: pyproject.toml's `line-length`."""
INDENT = "    "


@dataclass(frozen=True)
class Atom:
    """Text that is never broken: a name, a number, an escaped literal."""

    text: str

    @cached_property
    def flat(self) -> str:
        return self.text


@dataclass(frozen=True)
class Str:
    """A string value, written by escape.literal (in parts when it does not fit)."""

    value: str

    @cached_property
    def flat(self) -> str:
        return literal(self.value)


@dataclass(frozen=True)
class CallExpr:
    """`func(args)`; an argument is (keyword or None, value)."""

    func: str
    args: tuple[tuple[str | None, Expr], ...]

    @cached_property
    def flat(self) -> str:
        return f"{self.func}({_joined(self.args)})"


@dataclass(frozen=True)
class Seq:
    """A tuple (`brackets="()"`) or list (`"[]"`)."""

    items: tuple[Expr, ...]
    brackets: str = "()"

    @cached_property
    def flat(self) -> str:
        inner = ", ".join(item.flat for item in self.items)
        if self.brackets == "()" and len(self.items) == 1:
            inner += ","
        return f"{self.brackets[0]}{inner}{self.brackets[1]}"


@dataclass(frozen=True)
class Dict:
    """`{key: value, ...}`."""

    items: tuple[tuple[Expr, Expr], ...]

    @cached_property
    def flat(self) -> str:
        return "{" + ", ".join(f"{k.flat}: {v.flat}" for k, v in self.items) + "}"


Expr = Atom | Str | CallExpr | Seq | Dict


def lines(expr: Expr, *, level: int = 0, prefix: str = "", suffix: str = "") -> list[str]:
    """`expr` at indentation `level`, after `prefix` (`SPEC = `, `key=`, `@`) and before `suffix` (`,`)."""
    pad = INDENT * level
    one = f"{pad}{prefix}{expr.flat}{suffix}"
    if width(one) <= WIDTH:
        return [one]
    inner = INDENT * (level + 1)
    if isinstance(expr, CallExpr) and expr.args:
        head, tail = f"{pad}{prefix}{expr.func}(", f"{pad}){suffix}"
        hugged = f"{inner}{_joined(expr.args)}"
        if width(hugged) <= WIDTH:
            return [head, hugged, tail]
        comma = _comma(len(expr.args))
        body = [
            line
            for key, value in expr.args
            for line in lines(value, level=level + 1, prefix=f"{key}=" if key else "", suffix=comma)
        ]
        return [head, *body, tail]
    if isinstance(expr, Seq) and expr.items:
        comma = "," if expr.brackets == "()" else _comma(len(expr.items))  # (x,) needs its comma
        body = [line for item in expr.items for line in lines(item, level=level + 1, suffix=comma)]
        return [f"{pad}{prefix}{expr.brackets[0]}", *body, f"{pad}{expr.brackets[1]}{suffix}"]
    if isinstance(expr, Dict) and expr.items:
        comma = _comma(len(expr.items))
        body = [
            line
            for key, value in expr.items
            for line in lines(value, level=level + 1, prefix=f"{key.flat}: ", suffix=comma)
        ]
        return [f"{pad}{prefix}{{", *body, f"{pad}}}{suffix}"]
    if isinstance(expr, Str):
        parts = [f"{inner}{literal(part)}" for part in split_words(expr.value, WIDTH - len(inner))]
        return [f"{pad}{prefix}(", *parts, f"{pad}){suffix}"]
    return [one]


def _comma(items: int) -> str:
    """What follows each item of a broken bracket: a comma, except after a sole item (ruff adds none)."""
    return "," if items > 1 else ""


def import_from(module: str, names: list[str]) -> list[str]:
    """`from module import a, b`, or one name per line in parentheses when that does not fit."""
    one = f"from {module} import {', '.join(names)}"
    if width(one) <= WIDTH:
        return [one]
    return [f"from {module} import (", *(f"{INDENT}{name}," for name in names), ")"]


def split_words(value: str, room: int) -> list[str]:
    """`value` cut after spaces into parts whose literals fit in `room` columns where a word allows.

    The parts join back to `value`; a word longer than the room is a part of its own.
    """
    parts: list[str] = []
    current = ""
    for word in _words(value):
        if current and width(literal(current + word)) > room:
            parts.append(current)
            current = ""
        current += word
    parts.append(current)
    return parts


def width(line: str) -> int:
    """Columns `line` takes in a terminal, as ruff counts them (wide characters two, combining none)."""
    if line.isascii():
        return len(line)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def _words(value: str) -> list[str]:
    """`value` in pieces that each end after a run of spaces (the last one may not)."""
    words, start, i = [], 0, 0
    while i < len(value):
        if value[i] == " ":
            while i < len(value) and value[i] == " ":
                i += 1
            words.append(value[start:i])
            start = i
        else:
            i += 1
    if start < len(value):
        words.append(value[start:])
    return words


def _joined(args: tuple[tuple[str | None, Expr], ...]) -> str:
    return ", ".join(f"{key}={value.flat}" if key else value.flat for key, value in args)
