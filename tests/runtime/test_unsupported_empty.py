"""A declared-unsupported derivative on a sample with no element to differentiate: the test skips,
saying why, instead of reporting that the derivative "works" (an empty derivative agrees with
anything)."""

import pytest
import torch

from opcheck.runtime import run_check
from opcheck.runtime.checks import UnsupportedButWorks
from opcheck.runtime.outcomes import CheckSkipped
from opcheck.spec.model import OpSpec, Sample, TensorArg


def _spec(op, *, gradgrad=True, forward_ad=True):
    return OpSpec(
        name="empty",
        op=op,
        source="op_specs/empty.yaml",
        sha256="0",
        samples=(
            Sample("empty_batch", args=(TensorArg(shape=(0, 3)),)),
            Sample("rows", args=(TensorArg(shape=(2, 3)),)),
        ),
        supports_gradgrad=gradgrad,
        supports_forward_ad=forward_ad,
    )


@pytest.mark.parametrize(
    "op, check, flags",
    [
        ("runtime_ops:no_double_backward", "gradgrad_unsupported", {"gradgrad": False}),
        ("runtime_ops:sin_without_jvp", "forward_ad_unsupported", {"forward_ad": False}),
    ],
)
def test_an_empty_sample_skips_and_a_real_one_still_decides(op, check, flags):
    spec = _spec(op, **flags)
    with pytest.raises(CheckSkipped, match="'empty_batch' cannot show whether .* its inputs that require grad have"):
        run_check(spec, check, "cpu", "float64", "empty_batch")
    run_check(spec, check, "cpu", "float64", "rows")  # raises or fails, as declared: passes


def test_empty_outputs_skip_too_and_a_working_derivative_still_fails():
    # narrow(x, 0, 0, length): no rows of x reach the output when length is 0
    spec = OpSpec(
        name="narrow",
        op="torch.narrow",
        source="op_specs/narrow.yaml",
        sha256="0",
        samples=(
            Sample("none_kept", args=(TensorArg(shape=(2, 3)), 0, 0, 0)),
            Sample("one_kept", args=(TensorArg(shape=(2, 3)), 0, 0, 1)),
        ),
        supports_gradgrad=False,
    )
    assert torch.narrow(torch.zeros(2, 3), 0, 0, 0).numel() == 0
    with pytest.raises(CheckSkipped, match="'none_kept' cannot show .*: its outputs have no elements"):
        run_check(spec, "gradgrad_unsupported", "cpu", "float64", "none_kept")
    with pytest.raises(UnsupportedButWorks):  # narrow's double backward exists: the declaration is stale
        run_check(spec, "gradgrad_unsupported", "cpu", "float64", "one_kept")
