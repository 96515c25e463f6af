"""Low-precision check: correct float32/float16/bfloat16/complex64 kernels pass, wrong ones fail."""

from dataclasses import replace

import pytest
import torch

from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.runtime.lowprec import compare, upcast
from opcheck.runtime.tolerances import Tolerances
from opcheck.spec.model import GradcheckFlags, OpSpec, Sample, TensorArg

# Below 2048 elements on purpose: see test_sizes_are_below_mkl_vml_chunking.
SAMPLES = (
    Sample("vec", args=(TensorArg(shape=(40,)),)),
    Sample("rows", args=(TensorArg(shape=(6, 9), noncontiguous=True),), kwargs=(("dim", -1),)),
    Sample("mm", args=(TensorArg(shape=(8, 33)), TensorArg(shape=(33, 5)))),
)


def spec(op, *samples, forward_ad=False, lowprec=("float32", "float16", "bfloat16", "complex64")):
    return OpSpec(
        name="lp",
        op=op,
        source="op_specs/lp.yaml",
        sha256="0",
        samples=samples or SAMPLES,
        lowprec_dtypes=lowprec,
        gradcheck=GradcheckFlags(check_forward_ad=forward_ad),
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "op, sample", [("torch.sin", "vec"), ("torch.nn.functional.softmax", "rows"), ("torch.matmul", "mm")]
)
def test_correct_kernels_pass(op, sample, dtype):
    run_check(spec(op, forward_ad=True), "lowprec", "cpu", dtype, sample)


@pytest.mark.parametrize("op, sample", [("torch.sin", "vec"), ("torch.matmul", "mm")])
def test_complex64_against_complex128(op, sample):
    run_check(spec(op, forward_ad=True), "lowprec", "cpu", "complex64", sample)


def test_a_float32_only_backward_bug_is_caught_and_localized():
    s = spec("runtime_ops:sin_wrong_in_float32", Sample("vec", args=(TensorArg(shape=(40,)),)))
    run_check(s, "gradcheck", "cpu", "float64", "vec")  # the float64 path is right
    run_check(s, "lowprec", "cpu", "bfloat16", "vec")  # and 1% hides in bfloat16's own rounding
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(s, "lowprec", "cpu", "float32", "vec")
    text = str(info.value)
    assert "VJP: gradient of differentiable input 0 differs from the float64 run" in text
    assert "check path:  VJP at float32 against the float64 reference" in text
    assert "tolerances:  atol=1e-05, rtol=0.0001 (low-precision table for float32)" in text
    assert "entries differ beyond atol=1e-05" in text and "worst entries:" in text
    assert "float32 against float64" in text


def test_a_float32_forward_bug_fails_on_the_output():
    s = spec("runtime_ops:exp_float32_forward_off", Sample("vec", args=(TensorArg(shape=(10,)),)))
    with pytest.raises(LowPrecisionMismatch, match="output 0 differs from the float64 run"):
        run_check(s, "lowprec", "cpu", "float32", "vec")


def test_jvp_is_compared_when_the_spec_checks_forward_ad():
    s_vec = Sample("vec", args=(TensorArg(shape=(10,)),))
    run_check(spec("runtime_ops:square_wrong_jvp_in_float32", s_vec), "lowprec", "cpu", "float32", "vec")
    with pytest.raises(LowPrecisionMismatch, match="JVP: tangent of output 0 differs"):
        run_check(
            spec("runtime_ops:square_wrong_jvp_in_float32", s_vec, forward_ad=True), "lowprec", "cpu", "float32", "vec"
        )


def test_compare_formula_scales_atol_and_keeps_integers_exact():
    tol = Tolerances(eps=1e-6, atol=1e-3, rtol=1e-2, nondet_tol=0.0)
    ref = torch.tensor([100.0, 0.0, 1.0], dtype=torch.float64)
    assert compare(ref + torch.tensor([0.0, 0.09, 0.01]), ref, tol, "x") is None  # 1e-3 * 100 + 1e-2 * |ref|
    report = compare(ref + torch.tensor([0.0, 0.11, 0.0]), ref, tol, "x")
    assert report.startswith("x: 1 of 3 entries differ") and "[1]: float64 0.11, float64 0" in report
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float64)
    assert compare(nan.clone(), nan, tol, "x") is None
    assert "1 of 2" in compare(torch.tensor([0.0, 1.0], dtype=torch.float64), nan, tol, "x")
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2]), tol, "i") is None
    assert "must match exactly" in compare(torch.tensor([1, 3]), torch.tensor([1, 2]), tol, "i")


def test_upcast_keeps_values_strides_and_requires_grad():
    base = torch.rand(4, 12, dtype=torch.bfloat16)[:, ::2].requires_grad_()
    up = upcast(base, "cpu")
    assert up.dtype == torch.float64 and up.stride() == base.stride() and up.requires_grad and up.is_leaf
    assert torch.equal(up.detach().to(torch.bfloat16), base.detach())


def test_sizes_are_below_mkl_vml_chunking():
    # On MKL CPU builds, a float32 torch.sin over more than 2048 elements sometimes (first call in a
    # process, other threads) comes out with errors of 1.5e-4: a real low-precision difference,
    # and a flaky one. The samples here stay below it so these tests only test opcheck.
    assert all(torch.Size(a.shape).numel() < 2048 for s in SAMPLES for a in s.args)


def test_a_kernel_without_float64_path_is_checked_against_the_reference():
    vec = Sample("vec", args=(TensorArg(shape=(40,)),))
    good = OpSpec(
        name="f32",
        op="examples.ops:fused_gelu_f32",
        source="op_specs/f32.yaml",
        sha256="0",
        samples=(vec,),
        dtypes=(),
        lowprec_dtypes=("float32",),
        reference="examples.ops:gelu_reference",
    )
    assert good.checks() == ("lowprec",)
    run_check(good, "lowprec", "cpu", "float32", "vec")
    bad = replace(good, op="runtime_ops:gelu_f32_wrong_backward")
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(bad, "lowprec", "cpu", "float32", "vec")
    assert "differs from the float64 reference examples.ops:gelu_reference" in str(info.value)
    assert "VJP" in str(info.value)
