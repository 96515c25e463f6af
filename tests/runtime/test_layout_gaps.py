"""A sample laid out with `strides` that leave gaps between its elements: the gaps hold NaN, so an op
reading them shows; a failure made of that NaN is reported as the op reading outside the input's
elements (with the verdict of the check run with 0 there), never as the op's own NaN."""

import warnings

import pytest
import torch

from opcheck.runtime import run_check
from opcheck.runtime.checks import CheckFailed, OpcheckGapsWarning
from opcheck.runtime.samples import build_tensor
from opcheck.spec.model import OpSpec, Sample, TensorArg

STEPPED = TensorArg(shape=(3, 4), strides=(8, 2))  # x[:, ::2] of a 3x8


def spec_of(op: str, arg: TensorArg = STEPPED) -> OpSpec:
    return OpSpec(name="gaps", op=op, source="op_specs/gaps.yaml", sha256="0", samples=(Sample("s", args=(arg,)),))


def test_a_stepped_layout_is_built_with_nan_between_its_elements():
    t = build_tensor(STEPPED, "cpu", "float64", torch.Generator().manual_seed(0))
    assert t.stride() == (8, 2) and t.is_leaf and t.requires_grad
    flat = t.detach().as_strided((t.untyped_storage().nbytes() // 8,), (1,), 0)
    assert flat.isnan().sum() == flat.numel() - t.numel() and not t.isnan().any()


@pytest.mark.parametrize("fast_mode", ["auto", "true", "false"])
def test_an_op_ignoring_strides_fails_as_reading_between_the_elements_not_as_a_nan(fast_mode):
    from dataclasses import replace

    from opcheck.spec.model import GradcheckFlags

    spec = replace(spec_of("layout_ops:row_sums_as_contiguous"), gradcheck=GradcheckFlags(fast_mode=fast_mode))
    with pytest.raises(CheckFailed) as info:
        run_check(spec, "gradcheck", "cpu", "float64", "s")
    text = str(info.value)
    assert "with NaN in the memory between the elements of args[0]" in text
    assert "does not follow the input's strides" in text
    assert "the engine report below is of the check run again with 0 there" in text
    assert "nan" not in text.split("engine report:")[1].lower(), text
    assert "divides by zero" not in text and "undefined" not in text


def test_an_op_reading_between_the_elements_without_using_it_passes_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_check(spec_of("layout_ops:sum_masked_read"), "gradcheck", "cpu", "float64", "s")
    (gaps,) = [w for w in caught if issubclass(w.category, OpcheckGapsWarning)]
    assert "run again with 0 there, the check passes" in str(gaps.message)


def test_a_permuted_layout_has_no_gaps_and_the_op_ignoring_strides_fails_on_values():
    spec = spec_of("layout_ops:row_sums_as_contiguous", TensorArg(shape=(3, 4), strides=(1, 3)))
    with pytest.raises(CheckFailed) as info:
        run_check(spec, "gradcheck", "cpu", "float64", "s")
    assert "Jacobian mismatch" in str(info.value) and "memory between" not in str(info.value)


def test_the_low_precision_check_decides_with_0_between_the_elements_too():
    from dataclasses import replace

    from opcheck.runtime import LowPrecisionMismatch

    masked = replace(spec_of("layout_ops:sum_masked_read"), lowprec_dtypes=("float32",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_check(masked, "lowprec", "cpu", "float32", "s")
    (gaps,) = [w for w in caught if issubclass(w.category, OpcheckGapsWarning)]
    assert "run again with 0 there, the check passes" in str(gaps.message)

    # against plain torch: with the op as its own reference, both runs read the same memory
    strided = replace(
        spec_of("layout_ops:row_sums_as_contiguous"), lowprec_dtypes=("float32",), reference="layout_ops:row_sums"
    )
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(strided, "lowprec", "cpu", "float32", "s")
    assert "run with 0 in the memory between the elements of args[0]" in str(info.value)


def test_views_of_one_buffer_are_not_taken_for_gaps():
    from opcheck.runtime.gaps import nan_gaps

    stepped = build_tensor(STEPPED, "cpu", "float64", torch.Generator().manual_seed(0))
    assert [name for name, _ in nan_gaps([stepped], {})] == ["args[0]"]
    buffer = torch.randn(8, dtype=torch.float64)
    buffer[1::2] = float("nan")  # the other view's elements, not memory between elements
    assert nan_gaps([buffer[::2], buffer[1::2]], {}) == []
    assert nan_gaps([torch.randn(3, 4).t()], {}) == []  # a transpose has no gaps
