"""opcheck.codegen.layout: expressions laid out as `ruff format` lays them out, values unchanged."""

from __future__ import annotations

import ast
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opcheck.codegen.layout import WIDTH, Atom, CallExpr, Dict, Seq, Str, import_from, lines, split_words, width

REPO = Path(__file__).resolve().parents[2]
# The project's settings, with trailing commas no longer keeping a bracket broken: then ruff itself
# decides every line break, and leaves a layout alone only if it is the one ruff would choose.
STRICT_FORMAT = [
    "--config",
    str(REPO / "pyproject.toml"),
    "--config",
    "format.skip-magic-trailing-comma=true",
    "--config",
    "lint.isort.split-on-trailing-comma=false",
]


def test_what_fits_stays_on_one_line():
    expr = CallExpr(
        "Sample", ((None, Str("rows")), ("args", Seq((CallExpr("TensorArg", (("shape", Seq((Atom("3"),))),)),))))
    )
    assert lines(expr, prefix="x = ") == ['x = Sample("rows", args=(TensorArg(shape=(3,)),))']


def test_a_call_puts_its_arguments_on_one_line_then_one_per_line():
    args = tuple((f"k{i}", Atom("v" * 24)) for i in range(4))  # 121 columns flat, 118 on a line of their own
    assert lines(CallExpr("f", args), prefix="x = ") == [
        "x = f(",
        "    " + ", ".join(f"k{i}={'v' * 24}" for i in range(4)),
        ")",
    ]
    many = tuple((f"k{i}", Atom("v" * 20)) for i in range(6))
    assert lines(CallExpr("f", many), prefix="x = ") == ["x = f(", *(f"    k{i}={'v' * 20}," for i in range(6)), ")"]


def test_a_sole_item_is_broken_on_its_own_line_without_a_comma():
    inner = CallExpr("TensorArg", (("shape", Atom("(3,)")), ("values", Atom("v" * 120))))
    assert lines(CallExpr("TensorListArg", (("items", Seq((inner, inner))),)))[:3] == [
        "TensorListArg(",
        "    items=(",
        "        TensorArg(",
    ]
    assert lines(CallExpr("TensorListArg", (("items", Seq((inner, inner))),)))[-2:] == ["    )", ")"]
    assert lines(Seq((Atom("a" * 130),), brackets="[]")) == ["[", "    " + "a" * 130, "]"]


def test_collections_that_do_not_fit_have_one_item_per_line():
    one = Seq((Atom("a" * 130),))
    assert lines(one, prefix="x = ") == ["x = (", "    " + "a" * 130 + ",", ")"]
    listed = Seq(tuple(Atom("b" * 50) for _ in range(3)), brackets="[]")
    assert lines(listed) == ["[", *[f"    {'b' * 50}," for _ in range(3)], "]"]
    table = Dict(tuple((Str(f"test_{i}" * 10), Atom("XFAIL_0")) for i in range(2)))
    assert lines(table, prefix="MARKED = ") == [
        "MARKED = {",
        *[f'    "{f"test_{i}" * 10}": XFAIL_0,' for i in range(2)],
        "}",
    ]


def test_a_long_string_becomes_parts_that_join_back():
    value = "a reason " * 30 + "that ends"
    out = lines(CallExpr("Rule", (("reason", Str(value)),)), level=1, prefix="", suffix=",")
    assert out[0] == "    Rule(" and out[1] == "        reason=(" and out[-2] == "        )" and out[-1] == "    ),"
    assert all(width(line) <= WIDTH for line in out)
    assert ast.literal_eval("(" + "\n".join(out[2:-2]) + ")") == value


@pytest.mark.parametrize(
    "value",
    [
        "plain words " * 20,
        "x" * 300,
        "it's \"quoted\" and 'quoted' " * 10,
        "a\nb\\c\u2028 \x00 " * 30,
        "  spaced   out  " * 20,
        "wide 漢字 " * 40,
        " leading and trailing ",
    ],
)
def test_split_words_joins_back_and_fits_where_words_allow(value):
    parts = split_words(value, 60)
    assert "".join(parts) == value
    words_fit = all(len(word) < 40 for word in value.split(" "))
    assert not words_fit or all(width(repr(p)) <= 60 + 2 for p in parts)


def test_width_counts_wide_characters_twice_and_combining_ones_not_at_all():
    assert width("abc") == 3 and width("漢字") == 4 and width("e\u0301") == 1 and width("2^-8 · W/2") == 10


def test_imports_that_do_not_fit_have_one_name_per_line():
    assert import_from("m", ["A", "B"]) == ["from m import A, B"]
    names = [f"Name{i:02d}" for i in range(20)]
    assert import_from("opcheck.spec.model", names) == [
        "from opcheck.spec.model import (",
        *[f"    {n}," for n in names],
        ")",
    ]


def _edge_call(rng: random.Random) -> CallExpr:
    """A call whose one-line form is about a line long: where hugging its arguments decides."""
    n = rng.randint(1, 5)
    size = max(1, (rng.randint(90, 125) - 12 - 2 * n) // n)
    return CallExpr(
        "Sample", tuple((rng.choice([None, "k"]) if i == 0 else f"k{i}", Atom("v" * size)) for i in range(n))
    )


def _random_expr(rng: random.Random, depth: int = 0):
    kinds = ["atom", "str", "call", "edge", "tuple", "list", "dict"] if depth < 4 else ["atom", "str", "edge"]
    kind = rng.choice(kinds)
    if kind == "edge":
        return _edge_call(rng)
    if kind == "atom":
        return Atom(rng.choice(["SPEC", "SOURCE", "1", "-3.0", "None", "True", "1e-06", "x" * rng.randint(1, 30)]))
    if kind == "str":
        words = ["word", "it's", 'say "x"', "a\nb", "\\", "wide 漢字", "x" * 70, "·"]
        return Str(" ".join(rng.choice(words) for _ in range(rng.choice([0, 1, 2, 3, 5, 30]))))
    n = rng.randint(0, 6)
    if kind == "call":
        return CallExpr(
            rng.choice(["Sample", "TensorArg", "f"]),
            tuple((rng.choice([None, "shape", "reason", "location"]), _random_expr(rng, depth + 1)) for _ in range(n)),
        )
    if kind == "dict":
        return Dict(tuple((Str(f"test_gradcheck[cpu-float64-{i}]"), _random_expr(rng, depth + 1)) for i in range(n)))
    return Seq(tuple(_random_expr(rng, depth + 1) for _ in range(n)), brackets="()" if kind == "tuple" else "[]")


def _keywords_after_positionals(expr) -> bool:
    if isinstance(expr, CallExpr):
        keys = [k for k, _ in expr.args]
        return (
            keys == sorted(keys, key=lambda k: k is not None)
            and len({k for k in keys if k}) == len([k for k in keys if k])
            and all(_keywords_after_positionals(v) for _, v in expr.args)
        )
    if isinstance(expr, Seq):
        return all(_keywords_after_positionals(v) for v in expr.items)
    if isinstance(expr, Dict):
        return all(_keywords_after_positionals(v) for _, v in expr.items)
    return True


def test_random_expressions_are_laid_out_as_ruff_formats_them(tmp_path):
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed")
    rng = random.Random(20240613)
    exprs = [e for e in (_random_expr(rng) for _ in range(1500)) if _keywords_after_positionals(e)]
    statements = ["\n".join(lines(expr, prefix=f"x{i} = ")) for i, expr in enumerate(exprs)]
    assert sum(text.count("\n") > 0 for text in statements) > 100  # most are broken over lines
    for i, (expr, text) in enumerate(zip(exprs, statements)):  # each is still the flat form's value
        assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(f"x{i} = {expr.flat}"))
    module = tmp_path / "laid_out.py"
    module.write_text("\n".join(statements) + "\n", encoding="utf-8")
    result = subprocess.run(
        [ruff, "format", "--diff", *STRICT_FORMAT, "--no-cache", str(module)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
