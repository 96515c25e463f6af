"""A failure names the input as the spec does (`args[3]`, `kwargs.weight`), after the engine's
own words (input N among the tensors that require grad)."""

from dataclasses import replace

import named_ops  # noqa: F401  (the specs below name it)
import pytest

import opcheck
from opcheck.runtime import run_check
from opcheck.runtime.input_names import gradcheck_input_names, spec_names_line, with_spec_names
from opcheck.spec.model import GradcheckFlags, GradgradcheckFlags, Location, OpSpec, Sample, TensorArg


def spec(op, sample):
    return OpSpec(
        name="x",
        op=op,
        source="op_specs/x.yaml",
        sha256="0",
        samples=(sample,),
        gradcheck=GradcheckFlags(check_batched_grad=False),
        gradgradcheck=GradgradcheckFlags(enabled=False),
    )


def test_a_failure_names_args_3_where_the_engine_says_input_1():
    sample = Sample(
        "s", args=(TensorArg(shape=(4,)), None, 2.0, TensorArg(shape=(4,))), location=Location("op_specs/x.yaml", 3, 5)
    )
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(spec("named_ops:scaled_product", sample), "gradcheck", "cpu", "float64", "s")
    text = str(info.value)
    assert "Jacobian mismatch for output 0 with respect to input 1," in text  # torch's words kept
    assert "Jacobian mismatch for output 0 with respect to input 1,\n(input 1 is args[3] in the spec)\n" in text


def test_a_keyword_argument_is_named_by_its_keyword():
    sample = Sample(
        "s",
        args=(TensorArg(shape=(4,)),),
        kwargs=(("weight", TensorArg(shape=(4,))),),
        location=Location("op_specs/x.yaml", 3, 5),
    )
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(spec("named_ops:keyword_weight", sample), "gradcheck", "cpu", "float64", "s")
    assert "(input 1 is kwargs.weight in the spec)" in str(info.value)


def test_names_follow_gradchecks_order_and_only_differences_are_said():
    import torch

    x, w = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    index = torch.tensor([0, 1])
    names = gradcheck_input_names([x, index, [w, x]], {"bias": w, "dim": 0})
    assert names == ["args[0]", "args[2][0]", "args[2][1]", "kwargs.bias"]
    assert spec_names_line([0], names) is None  # args[0] is input 0: nothing to add
    assert spec_names_line([3, 0, 3], names) == "(input 0 is args[0], input 3 is kwargs.bias in the spec)"
    assert with_spec_names("first\nsecond", [1], names) == "first\n(input 1 is args[2][0] in the spec)\nsecond"
    assert with_spec_names("one line", [1], names) == "one line\n(input 1 is args[2][0] in the spec)"
    assert with_spec_names("input 9 only", [9], names) == "input 9 only"  # not one of these: left alone
    assert with_spec_names("input 1, by its words", [], names) == "input 1, by its words"  # the facts decide


def test_a_low_precision_failure_names_the_gradient_s_input_as_the_spec_does():
    sample = Sample(
        "s", args=(TensorArg(shape=(4,)), None, 2.0, TensorArg(shape=(4,))), location=Location("op_specs/x.yaml", 3, 5)
    )
    lowprec = replace(
        spec("named_ops:scaled_product", sample),
        lowprec_dtypes=("float32",),
        reference="named_ops:scaled_product_reference",
    )
    with pytest.raises(AssertionError) as info:
        run_check(lowprec, "lowprec", "cpu", "float32", "s")
    text = str(info.value)
    assert "VJP: gradient of input 1" in text and "(input 0 is args[0], input 1 is args[3] in the spec)" in text, text
