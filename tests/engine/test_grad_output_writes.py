"""A backward that writes into its grad_output (a rope kernel's), or a forward-AD rule that writes
into its tangent: right derivatives, one wrong habit. fast_mode=True/False keep torch's verdicts
and first lines, whatever they are (torch hands the same grad_output to its two fast-mode backward
passes, and the same tensors to its batched checks, so those fail); fast_mode="auto" gives every
call its own copy and passes, as torch's full check does, also beyond the budget where it decides
by projections alone (where the projections' reused cotangents once failed it)."""

import warnings

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck
from tests.lowprec.grad_writers import rope_writing_grad_output, rope_writing_tangent

SMALL = (6, 8)  # 48 elements: the full Jacobian decides
LARGE = (32, 40)  # 1280 elements: 1.6M Jacobian entries, beyond the budget: projections alone

CASES = [
    pytest.param(rope_writing_grad_output, {}, id="grad_output"),
    pytest.param(rope_writing_grad_output, {"check_batched_grad": True}, id="grad_output-batched"),
    pytest.param(rope_writing_grad_output, {"check_forward_ad": True}, id="grad_output-forward_ad"),
    pytest.param(rope_writing_tangent, {"check_forward_ad": True}, id="tangent"),
    pytest.param(
        rope_writing_tangent,
        {"check_forward_ad": True, "check_batched_forward_grad": True},
        id="tangent-batched",
    ),
]


def _verdict(check, fn, shape, fast_mode, flags):
    """(True, "") on a pass, (False, first line) on a GradcheckError."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return check(fn, (x,), fast_mode=fast_mode, **flags), ""
        except GradcheckError as e:
            return False, str(e).strip().splitlines()[0]


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize(("fn", "flags"), CASES)
def test_torch_modes_keep_torch_verdict_and_first_line(fn, flags, fast_mode):
    expected = _verdict(torch.autograd.gradcheck, fn, SMALL, fast_mode, flags)
    assert _verdict(opcheck.gradcheck, fn, SMALL, fast_mode, flags) == expected


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
@pytest.mark.parametrize(("fn", "flags"), CASES)
def test_auto_passes_a_write_that_torch_full_check_passes(fn, flags, shape):
    passes, line = _verdict(opcheck.gradcheck, fn, shape, "auto", flags)
    assert passes, line


def test_torch_passes_the_rope_kernel_in_full_mode_and_so_does_the_default():
    assert _verdict(torch.autograd.gradcheck, rope_writing_grad_output, SMALL, False, {}) == (True, "")
    x = torch.randn(*SMALL, dtype=torch.float64, requires_grad=True)
    assert opcheck.gradcheck(rope_writing_grad_output, (x,)) is True


def test_fast_mode_says_the_reentrancy_failure_comes_from_the_write():
    x = torch.randn(*SMALL, dtype=torch.float64, requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        opcheck.gradcheck(rope_writing_grad_output, (x,), fast_mode=True)
    text = str(info.value)
    assert text.startswith("Backward is not reentrant")
    assert "Here backward wrote into its grad_output" in text and "fast_mode='auto'" in text
    assert "An op that writes into its inputs" not in text  # the general causes give way to the known one
