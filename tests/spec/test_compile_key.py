"""The `compile:` key: true, false, a mapping, or absent (the project's setting decides)."""

from __future__ import annotations

from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import CompileFlags

HEAD = "op: torch.sin\nlowprec_dtypes: [float32]\nsamples: [{name: a, args: [{shape: [3]}]}]\n"


def _spec(tail: str = ""):
    return load_spec_text(HEAD + tail, source="op_specs/x.yaml")[0]


def test_without_the_key_the_spec_says_nothing_and_has_no_compile_test():
    spec = _spec()
    assert spec.compile is None and "compile" not in spec.checks()


def test_true_is_the_defaults_and_false_is_off():
    on, off = _spec("compile: true\n"), _spec("compile: false\n")
    assert on.compile == CompileFlags() and on.checks()[-1] == "compile"
    assert on.dtypes_for("compile") == ("float64", "float32")  # the spec's dtypes, then its lowprec ones
    assert off.compile == CompileFlags(enabled=False) and "compile" not in off.checks()


def test_a_mapping_sets_backends_dtypes_fullgraph_and_the_cases_off_with_their_reasons():
    spec = _spec(
        "compile:\n  backends: [inductor]\n  dtypes: [float32]\n  fullgraph: true\n"
        "  cases_off: {aliased: distinct buffers only, dynamic: one size}\n"
    )
    assert spec.compile == CompileFlags(
        backends=("inductor",),
        dtypes=("float32",),
        fullgraph=True,
        cases_off=(("aliased", "distinct buffers only"), ("dynamic", "one size")),
    )
    assert spec.dtypes_for("compile") == ("float32",)
