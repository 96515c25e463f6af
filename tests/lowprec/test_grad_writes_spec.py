"""`writes_grad_outputs:` from YAML to the generated test: read into the model, checked where it is
written, and passed to the low-precision check, whose test fails on an undeclared write into
grad_output (naming it) and passes on a declared one, reporting it. A `reference:` computing in
float32 fails the float32 test and says so."""

import re
from dataclasses import replace

import pytest

from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.spec import SpecError
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import GradcheckFlags, OpSpec, Sample, TensorArg

ROPE = """\
op: tests.lowprec.grad_writers:rope_writing_grad_output
lowprec_dtypes: [float32]
writes_grad_outputs: true
samples:
  - name: rows
    args: [{shape: [6, 8]}]
"""

SPEC = OpSpec(
    name="rope_writing_grad_output",
    op="tests.lowprec.grad_writers:rope_writing_grad_output",
    source="op_specs/rope.yaml",
    sha256="0",
    samples=(Sample("rows", args=(TensorArg(shape=(6, 8)),)),),
    dtypes=(),
    lowprec_dtypes=("float32", "bfloat16"),
    reference="tests.lowprec.grad_writers:rope_reference",
)


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, source="op_specs/k.yaml")
    return [str(p) for p in info.value.problems]


def test_the_key_is_read_into_the_model_and_defaults_to_false():
    (spec,) = load_spec_text(ROPE, source="op_specs/k.yaml")
    assert spec.writes_grad_outputs is True
    (plain,) = load_spec_text(ROPE.replace("writes_grad_outputs: true\n", ""), source="op_specs/k.yaml")
    assert plain.writes_grad_outputs is False


def test_a_value_that_is_not_a_bool_is_an_error_where_it_is_written():
    problems = _problems(ROPE.replace("writes_grad_outputs: true", "writes_grad_outputs: yes"))
    assert len(problems) == 1 and problems[0].startswith("op_specs/k.yaml:3:"), problems
    assert "writes_grad_outputs" in problems[0]


def test_the_key_without_lowprec_dtypes_is_an_error_saying_why():
    problems = _problems(ROPE.replace("lowprec_dtypes: [float32]\n", ""))
    assert problems == [
        "op_specs/k.yaml:2:1: writes_grad_outputs: the low-precision check is the one that finds a write into "
        "grad_output, and it does not run without lowprec_dtypes; add them"
    ]
    # false says nothing to check: no error
    load_spec_text(ROPE.replace("lowprec_dtypes: [float32]\n", "").replace(": true", ": false"), source="x.yaml")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_undeclared_write_fails_the_test_naming_the_output(dtype):
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(SPEC, "lowprec", "cpu", dtype, "rows")
    text = str(info.value)
    assert text.splitlines()[0].endswith("the op wrote into its grad_output or tangent")
    assert re.search(r"the grad_output of output 0 \(\d+ of 48 entries changed\)", text)
    assert "`writes_grad_outputs: true` in the spec" in text


def test_a_declared_write_passes_and_shows_in_the_output(capsys):
    run_check(replace(SPEC, writes_grad_outputs=True), "lowprec", "cpu", "float32", "rows")
    out = capsys.readouterr().out
    assert "opcheck lowprec: the op writes into what autograd hands it: the grad_output of output 0" in out


def test_a_tangent_written_into_fails_the_test_with_forward_ad():
    spec = replace(
        SPEC,
        op="tests.lowprec.grad_writers:rope_writing_tangent",
        gradcheck=GradcheckFlags(check_forward_ad=True),
    )
    with pytest.raises(LowPrecisionMismatch, match="the tangent of input 0"):
        run_check(spec, "lowprec", "cpu", "float32", "rows")
    run_check(replace(spec, writes_grad_outputs=True), "lowprec", "cpu", "float32", "rows")


def test_a_reference_computing_in_float32_fails_the_float32_test():
    spec = replace(
        SPEC,
        op="tests.lowprec.grad_writers:rope_reference",
        reference="tests.lowprec.grad_writers:rope_reference_in_float32",
    )
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(spec, "lowprec", "cpu", "float32", "rows")
    text = str(info.value)
    assert text.splitlines()[0].endswith("the reference does not compute in float64")
    assert "fix: make the reference compute in float64" in text
    run_check(replace(spec, reference="tests.lowprec.grad_writers:rope_reference"), "lowprec", "cpu", "float32", "rows")


def test_the_schema_documents_the_key_with_the_model_default():
    import json
    from importlib.resources import files

    schema = json.loads(files("opcheck.spec").joinpath("op_spec.schema.json").read_text())
    key = schema["$defs"]["writes_grad_outputs"]
    assert key["type"] == "boolean" and key["default"] is OpSpec.__dataclass_fields__["writes_grad_outputs"].default
    for where in (
        schema["$defs"]["opSpec"],
        schema["$defs"]["familyOp"],
        schema["$defs"]["family"]["properties"]["defaults"],
    ):
        assert where["properties"]["writes_grad_outputs"] == {"$ref": "#/$defs/writes_grad_outputs"}
