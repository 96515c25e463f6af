"""A float64 check of an op that computes in float32 says so and what to write, instead of
re-drawing the sample and advising `avoid:` for kinks it does not have."""

import re

import float32_ops
import pytest

import opcheck
from opcheck.runtime import run_check
from opcheck.spec.model import GradcheckFlags, GradgradcheckFlags, Location, OpSpec, Sample, TensorArg

ROWS = Sample("rows", args=(TensorArg(shape=(3, 5)),), location=Location("op_specs/x.yaml", 7, 5))


def spec(op):
    return OpSpec(
        name="x",
        op=op,
        source="op_specs/x.yaml",
        sha256="0",
        samples=(ROWS,),
        gradcheck=GradcheckFlags(check_batched_grad=False),
        gradgradcheck=GradgradcheckFlags(enabled=False),
    )


@pytest.mark.parametrize(
    "op, evidence",
    [
        ("float32_ops:softmax_in_float32", "its float64 outputs are float32 values"),
        ("float32_ops:Softmax32.apply", "its float64 outputs are float32 values"),
        (
            "float32_ops:softmax_in_float32_then_scaled",
            "its float64 outputs do not change when its inputs are rounded to float32",
        ),
    ],
)
def test_an_op_computing_in_float32_is_diagnosed_once_without_redraws(op, evidence, monkeypatch):
    calls = []
    real = float32_ops.softmax_in_float32
    monkeypatch.setattr(float32_ops, "softmax_in_float32", lambda x: calls.append(1) or real(x))
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(spec(op), "gradcheck", "cpu", "float64", "rows")
    text = str(info.value)
    assert f"the op seems to compute in float32: {evidence}" in text
    assert "`dtypes: []`" in text and "`lowprec_dtypes: [float32, bfloat16, float16]`" in text
    assert "`reference:`" in text
    assert "non-differentiable" not in text and "`avoid:`" not in text and not re.search(r"re-draw \d", text)
    if op.endswith(":softmax_in_float32"):
        # one draw: no eps/2 kink probe and no re-draws (3 more draws, each a full check)
        assert len(calls) < 20, len(calls)  # 41 with the kink probe and 3 re-draws


def test_a_float64_op_with_a_wrong_gradient_gets_no_float32_note():
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", "rows")
    assert "compute in float32" not in str(info.value) and "float32 values" not in str(info.value)
