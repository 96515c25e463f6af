"""`lowprec_dtype` on a tensor argument: its dtype in the low-precision tests (float32 gates beside
bfloat16 activations), the test's dtype in the gradient checks; checked where it is written."""

import lowprec_dtype_ops  # noqa: F401  (the specs below name it)
import pytest
import torch

from opcheck.codegen import render_module
from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.runtime.samples import build_calls
from opcheck.spec import SpecError
from opcheck.spec.loader import load_spec_text

GATED = """\
op: lowprec_dtype_ops:{op}
name: gated
dtypes: [float64]
lowprec_dtypes: [bfloat16, float16]
reference: lowprec_dtype_ops:gated_reference
devices: [cpu]
samples:
  - name: rows
    args: [{{shape: [4, 33]}}, {{shape: [33], lowprec_dtype: float32}}]
"""


def load(text: str):
    (spec,) = load_spec_text(text, source="op_specs/k.yaml")
    return spec


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, source="op_specs/k.yaml")
    return [str(p) for p in info.value.problems]


def test_the_argument_keeps_its_dtype_in_lowprec_tests_only():
    spec = load(GATED.format(op="gated"))
    assert spec.samples[0].args[1].lowprec_dtype == "float32"
    (low,) = build_calls(spec, spec.samples[0], "cpu", "bfloat16", 0)
    assert [t.dtype for t in low.args] == [torch.bfloat16, torch.float32]
    (wide,) = build_calls(spec, spec.samples[0], "cpu", "float64", 0)
    assert [t.dtype for t in wide.args] == [torch.float64, torch.float64]
    assert torch.equal(wide.args[1].float(), low.args[1])  # the same draw, kept at float32
    assert 'TensorArg(shape=(33,), lowprec_dtype="float32")' in render_module(spec)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_lowprec_check_runs_the_kernel_with_its_float32_gate_and_catches_its_gradient(dtype):
    run_check(load(GATED.format(op="gated")), "lowprec", "cpu", dtype, "rows")
    with pytest.raises(LowPrecisionMismatch, match="VJP: gradient of input 1 differs"):
        run_check(load(GATED.format(op="gated_wrong_gate_grad")), "lowprec", "cpu", dtype, "rows")


def test_the_gradient_check_gives_it_the_tests_float64():
    run_check(load(GATED.format(op="gated_reference")), "gradcheck", "cpu", "float64", "rows")


def sample(args: str) -> str:
    return GATED.format(op="gated").replace(
        "args: [{shape: [4, 33]}, {shape: [33], lowprec_dtype: float32}]", f"args: [{args}]"
    )


GATE_FIRST = """\
op: lowprec_dtype_ops:{op}
name: gate_first
dtypes: [float64]
lowprec_dtypes: [bfloat16, float16]
reference: lowprec_dtype_ops:gate_first_reference
devices: [cpu]
samples:
  - name: rows
    args: [{{shape: [33], lowprec_dtype: float32}}, {{shape: [4, 33]}}]
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_first_input_may_keep_its_dtype_and_entries_are_judged_at_the_tests(dtype):
    # Judged at the gate's float32, the kernel's bfloat16/float16 output would fail; at the test's dtype
    # it passes, and the wrong gate gradient (float32, 25% off) still fails.
    spec = load(GATE_FIRST.format(op="gate_first"))
    (low,) = build_calls(spec, spec.samples[0], "cpu", dtype, 0)
    assert [t.dtype for t in low.args] == [torch.float32, getattr(torch, dtype)]
    run_check(spec, "lowprec", "cpu", dtype, "rows")
    with pytest.raises(LowPrecisionMismatch, match="VJP: gradient of input 0 differs"):
        run_check(load(GATE_FIRST.format(op="gate_first_wrong_gate_grad")), "lowprec", "cpu", dtype, "rows")


def test_a_fixed_dtype_and_a_bad_name_are_reported_where_they_are_written():
    found = problems(sample("{shape: [4, 33]}, {shape: [33], dtype: float32, lowprec_dtype: float32}"))
    assert [p.split(": `dtype")[0] for p in found] == ["op_specs/k.yaml:9:60: samples[0].args[1].lowprec_dtype"]
    assert "`dtype: float32` fixes this tensor's dtype in every test" in found[0]
    (found,) = problems(sample("{shape: [4, 33]}, {shape: [33], lowprec_dtype: int64}"))
    assert found.startswith("op_specs/k.yaml:9:59: samples[0].args[1].lowprec_dtype: expected one of float64, float32")
