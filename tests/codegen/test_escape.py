"""The escaping routine: whatever the input, each context it lands in parses to what opcheck meant,
and reads back as the input."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import unicodedata
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opcheck.codegen.escape import identifier, literal, text
from opcheck.module_header import MARKER as GENERATED_MARKER

LINE_SEPARATORS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


@lru_cache(maxsize=1)
def _one_per_category() -> str:
    """The first code point of every Unicode general category (Cs: a lone surrogate, Cn: unassigned)."""
    found: dict[str, str] = {}
    for code in range(sys.maxunicode + 1):
        found.setdefault(unicodedata.category(chr(code)), chr(code))
    return "".join(found.values())


CORNERS = [
    "",
    "".join(map(chr, range(128))),
    LINE_SEPARATORS,
    '"""',
    "'''",
    '"',
    "'",
    "\\",
    '\\"""',
    "x\\",
    'ends with a quote"',
    "ends with a quote'",
    "\x00",
    "\ud800",
    "\udfff",
    "\ud83d\ude00",
    "\U0001f600",
    "\u202e bidi override \u202c",
    "\ufeff",
    _one_per_category(),
    'x"""+str(__import__("os").system("touch PWNED"))+""".yaml',
    "op_specs\n",
    "op_specs/evil\n import os.yaml",
    "# coding: utf-7",
    "-*- coding:latin-1 -*-",
    "vim: set fileencoding=unicode_escape :",
    "CODING=rot13",
    "{{ header }} {% if x %} }} {#",
]
CORNERS += list(LINE_SEPARATORS) + [chr(c) for c in range(128)]


def _literal_value(source_text: str):
    """The value of `source_text` as a string literal's body (what a docstring made of it holds)."""
    return ast.literal_eval(f'"{source_text}"')


def _check_text(value: str) -> None:
    escaped = text(value)
    assert escaped.isascii() and escaped.isprintable(), escaped
    assert escaped.splitlines() == ([escaped] if escaped else [])
    assert '"""' not in escaped and "'''" not in escaped
    # Every quote is escaped, and every backslash starts an escape (none escapes what follows the text).
    assert not set(re.sub(r"\\.", "", escaped)) & set("\\\"'"), escaped
    assert _literal_value(escaped) == value  # the escapes say exactly what the input was

    comment = f"# {escaped}\nx = 1\n"
    tree = ast.parse(comment)
    assert [type(n) for n in tree.body] == [ast.Assign], comment

    for doc, meant in (
        (f'"""{escaped}"""\n', value),
        (f"'''{escaped}'''\n", value),
        (
            f'"""Gradient tests for {escaped}, generated from {escaped}."""\n',
            f"Gradient tests for {value}, generated from {value}.",
        ),
    ):
        tree = ast.parse(doc)
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr), doc
        assert ast.get_docstring(tree, clean=False) == meant

    # The header is the file's first lines, where a `coding[:=]` comment would choose the encoding
    # Python reads the rest of the file with.
    header = f"{GENERATED_MARKER} from {escaped}.\n# regenerate: {escaped}\nx = 1\n".encode()
    assert tokenize.detect_encoding(io.BytesIO(header).readline)[0] == "utf-8"
    assert [type(n) for n in ast.parse(header).body] == [ast.Assign]


def _check_literal(value: str) -> None:
    source = literal(value)
    assert source.splitlines() == [source]
    assert ast.literal_eval(source) == value
    assert source[0] == source[-1] == ("'" if value.count('"') > value.count("'") else '"'), source
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.STRING]
    assert [t.string for t in tokens] == [source]
    for module in (f"x = {source}\n", f"f(reason={source}, strict=True)  # {source}\n"):
        tree = ast.parse(module.encode("utf-8"))  # as written to disk and read back
        assert len(tree.body) == 1, module
        assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)][0] == value


@pytest.mark.parametrize("value", CORNERS, ids=lambda v: ascii(v)[:40])
def test_text_is_one_inert_line_that_reads_back_as_the_input(value):
    _check_text(value)


@pytest.mark.parametrize("value", CORNERS, ids=lambda v: ascii(v)[:40])
def test_literal_evaluates_to_exactly_the_input(value):
    _check_literal(value)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_is_inert_and_reads_back(value):
    _check_text(value)
    _check_literal(value)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))))
def test_invisible_characters_are_inert_and_read_back(value):
    _check_text(value)
    _check_literal(value)


def test_plain_text_is_left_as_it_is():
    plain = "op_specs/unary.yaml torch.nn.functional.softmax examples.ops:Square.apply --out a/b-c_d@e+f"
    assert text(plain) == plain


def test_text_shows_the_characters_it_escapes():
    assert text('a"""b\nc\\d\u2028e\x00\udc80') == 'a\\"\\"\\"b\\nc\\\\d\\u2028e\\x00\\udc80'
    assert text("x coding: utf-7") == "x coding\\x3a utf-7"


@pytest.mark.parametrize(
    ("value", "source"),
    [
        ("plain", '"plain"'),
        ("it's", '"it\'s"'),
        ('say "x"', "'say \"x\"'"),
        ("both ' and \"", '"both \' and \\""'),
        ('b \' " "', "'b \\' \" \"'"),
        ("\\'", '"\\\\\'"'),
        ("x\u2028y\x00", '"x\\u2028y\\x00"'),
        ("", '""'),
    ],
)
def test_string_literals_take_the_quotes_ruff_format_prefers(value, source):
    assert literal(value) == source


class _Sneaky(str):
    def __repr__(self):
        return "__import__('os')"

    def __str__(self):
        return "__import__('os')"


def test_a_str_subclass_is_written_as_its_characters():
    assert ast.literal_eval(literal(_Sneaky("plain"))) == "plain"
    assert text(_Sneaky("a\nb")) == "a\\nb"


@pytest.mark.parametrize(
    ("value", "source"),
    [
        (None, "None"),
        (True, "True"),
        (0, "0"),
        (-3, "-3"),
        (10**30, str(10**30)),
        (0.1, "0.1"),
        (-0.0, "-0.0"),
        (1e-300, "1e-300"),
        (float("inf"), 'float("inf")'),
        (float("-inf"), '-float("inf")'),
    ],
)
def test_scalar_literals(value, source):
    assert literal(value) == source
    assert eval(source, {"__builtins__": {"float": float}}) == value  # noqa: S307 - a literal we wrote


def test_nan_literal_and_unknown_types():
    assert literal(float("nan")) == 'float("nan")'
    with pytest.raises(TypeError, match="no literal form for bytes"):
        literal(b"x")


@pytest.mark.parametrize("name", ["", "1x", "a-b", "a b", "class", "None", "x\n", "é", "a.b", "os.system('x')"])
def test_identifier_rejects_anything_but_a_plain_name(name):
    with pytest.raises(ValueError, match="cannot be written as a Python name"):
        identifier(name)


def test_identifier_accepts_names():
    assert identifier("test_gradcheck") == "test_gradcheck"
    assert identifier("OpSpec") == "OpSpec"
