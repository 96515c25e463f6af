"""Ops that write into their inputs. A backward that overwrites its saved input fails the gradient
check as not reentrant, saying what differs and what to do, with no warning of opcheck's own; the
low-precision check names the input, and passes with `clone_inputs: true`. A forward that writes
into its input passes every check with `clone_inputs: true`, which gives every call fresh copies."""

import warnings
from dataclasses import replace

import pytest

from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.runtime.checks import CheckFailed
from opcheck.spec.model import OpSpec, Sample, TensorArg

SPEC = OpSpec(
    name="writes",
    op="runtime_ops:square_writing_into_input",
    source="op_specs/writes.yaml",
    sha256="0",
    samples=(Sample("vec", args=(TensorArg(shape=(6,)),)),),
    lowprec_dtypes=("float32",),
)


@pytest.mark.parametrize("fast_mode", ["auto", "true", "false"])
def test_the_reentrancy_failure_says_what_differs_without_a_warning_of_its_own(fast_mode):
    from opcheck.spec.model import GradcheckFlags

    spec = replace(SPEC, gradcheck=GradcheckFlags(fast_mode=fast_mode))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckFailed) as info:
            run_check(spec, "gradcheck", "cpu", "float64", "vec")
    text = str(info.value)
    assert "Backward is not reentrant" in text
    assert "two identical backward passes differ by up to" in text and "first pass" in text
    assert "clone_inputs: true" in text
    ours = [w for w in caught if "/opcheck/" in w.filename.replace("\\", "/")]
    assert not ours, [str(w.message) for w in ours]

    assert "can run once per forward only" in text and "lowprec_dtypes and reference" in text
    run_check(replace(SPEC, clone_inputs=True), "lowprec", "cpu", "float32", "vec")


def test_a_forward_writing_into_its_input_passes_every_check_with_clone_inputs():
    spec = replace(SPEC, op="runtime_ops:double_writing_into_input", clone_inputs=True)
    for check in ("gradcheck", "gradgradcheck"):
        run_check(spec, check, "cpu", "float64", "vec")
    run_check(spec, "lowprec", "cpu", "float32", "vec")
    with pytest.raises(CheckFailed, match="Jacobian mismatch"):
        run_check(replace(spec, clone_inputs=False), "gradcheck", "cpu", "float64", "vec")
    with pytest.raises(LowPrecisionMismatch, match="wrote into its input 0 .* during its call"):
        run_check(replace(spec, clone_inputs=False), "lowprec", "cpu", "float32", "vec")


def test_without_clone_inputs_the_low_precision_check_names_the_input():
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(SPEC, "lowprec", "cpu", "float32", "vec")
    first = str(info.value).splitlines()[0]
    assert "the op wrote into an input" in first
    assert "wrote into its input 0 (Tensor[6] float32): 6 of 6 entries changed by value during its backward (VJP)" in (
        str(info.value)
    )
