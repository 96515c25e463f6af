"""The one way a spec's names, paths and strings reach the text of a generated module.

A spec is code for the op it tests, never for the module: whatever it says, the module must parse
to the same statements. Every value from a spec therefore passes through one of three forms here,
chosen by where it lands:

- `literal(value)`: a Python literal. Strings are repr() of the exact `str` (so a subclass cannot
  override its own repr), which escapes the quote, backslashes and every character
  `str.isprintable()` rejects: line breaks and separators, control characters, NUL, format
  characters such as bidi overrides, lone surrogates. `ast.literal_eval` gives back exactly the value.
  The quotes are the ones `ruff format` chooses (double, unless the string holds more double quotes
  than single ones), so a generated module is already formatted.
- `text(value)`: a line of a comment, docstring or header. The result is one line of printable
  ASCII without quotes, in which every other character is the Python escape that means it
  (`\\n`, `\\x00`, `\\u2028`, `\\udc80`, `\\"`, `\\'`, `\\\\`). It is thus the body of a string literal
  whose value is the original: a docstring built from it reads back exactly, a comment shows it
  visibly, and it can close neither a comment nor a docstring. The `:`/`=` after "coding" is
  escaped as well, so no header line is a PEP 263 encoding declaration (`# coding: utf-7` would
  make Python read the rest of the file as a different text).
- `identifier(name)`: a name written as code (test functions, markers, imported classes). Only
  opcheck's own constants belong there, so a name is checked, never escaped.

Text is ASCII-only, whereas literals keep printable non-ASCII (`2^-8 · W/2` in a reason stays
readable): a literal is evaluated before anyone reads it, a header line is read as it is. (What
repr() counts as printable follows the running Python's Unicode tables, so a character assigned
in a later Unicode version may be written raw by a newer Python and escaped by an older one.)
"""

from __future__ import annotations

import keyword
import math
import re

# Printable ASCII that means itself both in a comment and inside a string literal.
_PLAIN = re.compile(r"[ !#-&(-\[\]-~]*")
_NAMED_ESCAPES = {"\\": "\\\\", '"': '\\"', "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# PEP 263: a comment on line 1 or 2 matching `coding[:=]` names the file's encoding.
_CODING_COOKIE = re.compile(r"(?<=coding)[:=]", re.IGNORECASE)


def literal(value: object) -> str:
    """A Python literal for None, a bool, an int, a float or a str; equal to `value` when evaluated."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else '-float("inf")'
        return float.__repr__(value)
    if isinstance(value, str):
        return _string_literal(str.__str__(value))
    raise TypeError(f"no literal form for {type(value).__name__}")


def text(value: str) -> str:
    """`value` as one line of printable ASCII for a comment, docstring or header line."""
    value = str.__str__(value)  # the characters themselves, whatever a subclass says about them
    escaped = value if _PLAIN.fullmatch(value) else "".join(_escape_char(c) for c in value)
    return _CODING_COOKIE.sub(lambda m: _escape_char(m.group(), force=True), escaped)


def identifier(name: str) -> str:
    """`name` itself, when it is an ASCII identifier that Python reads as a plain name."""
    if type(name) is not str or not (name.isascii() and name.isidentifier()) or keyword.iskeyword(name):
        raise ValueError(f"{name!r} cannot be written as a Python name in a generated module")
    return name


def _string_literal(value: str) -> str:
    source = str.__repr__(value)
    quote = "'" if value.count('"') > value.count("'") else '"'
    if source[0] == quote:
        return source
    # repr() chose single quotes where double ones are wanted: in its body a backslash always opens
    # an escape, so `\'` is an escaped quote (now plain) and a bare `"` needs escaping.
    body, out, i = source[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\":
            out.append("'" if body[i + 1] == "'" else body[i : i + 2])
            i += 2
        else:
            out.append('\\"' if body[i] == '"' else body[i])
            i += 1
    return '"' + "".join(out) + '"'


def _escape_char(c: str, *, force: bool = False) -> str:
    if c in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[c]
    code = ord(c)
    if 0x20 <= code < 0x7F and not force:
        return c
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
