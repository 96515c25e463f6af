"""opcheck.lowprec_report / lowprec_check: the calibrated criterion's parts, its knobs, and the
kernels that write into their inputs."""

import math

import pytest
import torch

from opcheck import LowPrecisionError, lowprec_check, lowprec_report
from opcheck.engine.lowprec import LOWPREC_FLOORS, Criterion, RoundedTo, judge


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _rows(dtype=torch.float16, shape=(8, 100)):
    return torch.randn(*shape, generator=_gen(), dtype=torch.float64).to(dtype).requires_grad_()


def test_a_correct_op_passes_every_part_and_reports_them():
    report = lowprec_report(lambda x: torch.softmax(x, -1), _rows(), check_forward_ad=True)
    assert report.passed and report.error is None
    assert [p.what for p in report.parts] == ["output 0", "VJP: gradient of input 0", "JVP: tangent of output 0"]
    assert all(p.exceeding == 0 and p.max_ratio < 1 for p in report.parts)
    assert lowprec_check(lambda x: torch.softmax(x, -1), _rows()) is True


def test_dtype_casts_the_inputs_and_the_reference_gets_float64():
    seen = []

    def ref(x):
        seen.append(x.dtype)
        return torch.sin(x)

    x = torch.rand(50, dtype=torch.float64, requires_grad=True)
    assert lowprec_report(torch.sin, x, dtype=torch.bfloat16, reference=ref).passed
    assert seen and set(seen) == {torch.float64}


def _small_entries_off(x):
    """3x, computed in float32, 1% high on the entries below 0.17 (of values up to 1); its
    gradient is right."""
    y = x.float() * 3
    return (y + torch.where(x < 0.17, y * 0.01, 0).detach()).to(x.dtype)


def _triple(x):
    return x * 3


def _spread():
    return torch.linspace(0.1, 1, 64, dtype=torch.float64).to(torch.float16).requires_grad_()


def test_keep_dtype_leaves_an_input_as_it_is_and_judges_at_dtype():
    # A float32 gate first, bfloat16 activations second: judged at the gate's dtype (the first
    # input's), the kernel's bfloat16 output fails; kept and judged at bfloat16, it passes.
    def gated(gate, x):
        return (x.float() * torch.sigmoid(gate.float())).to(x.dtype)

    def reference(gate, x):
        return x * torch.sigmoid(gate)

    gate = torch.randn(33, generator=_gen()).requires_grad_()
    x = torch.randn(4, 33, generator=_gen(1), dtype=torch.float64).requires_grad_()
    seen = []

    def op(g, y):
        seen.append((g.dtype, y.dtype))
        return gated(g, y)

    assert not lowprec_report(op, (gate, x.detach().bfloat16().requires_grad_()), reference=reference).passed
    seen.clear()
    report = lowprec_report(op, (gate, x), reference=reference, dtype=torch.bfloat16, keep_dtype=(0,))
    assert report.passed, report.message
    assert set(seen) == {(torch.float32, torch.bfloat16)}


def test_a_relative_error_on_small_entries_fails_where_the_table_passes():
    # The table allows atol * max(1, max|ref|) = 6e-3 anywhere: a 1% error on the entries of 0.3-0.5
    # hides under it. The calibrated bound there is about 1.5e-3.
    x = _spread()
    assert lowprec_report(_small_entries_off, x, reference=_triple, criterion="table").passed
    report = lowprec_report(_small_entries_off, x, reference=_triple)
    failing = report.first_failure
    assert failing.what == "output 0" and 0 < failing.exceeding <= int((x < 0.17).sum())
    worst = failing.worst[0]
    assert worst.index[0] < int((x < 0.17).sum()) and worst.ratio > 1.5 and worst.error / worst.baseline > 10
    assert "op error" in report.message and "baseline error" in report.message
    assert "within the bound: VJP: gradient of input 0" in report.message


def test_floor_and_factor_override_the_defaults():
    x = _spread()
    assert not lowprec_report(_small_entries_off, x, reference=_triple).passed
    assert lowprec_report(_small_entries_off, x, reference=_triple, floor=64.0).passed  # 64 roundings of max|ref|
    assert lowprec_report(_small_entries_off, x, reference=_triple, factor=100.0).passed
    with pytest.raises(ValueError, match="factor must be > 0"):
        lowprec_report(_triple, x, factor=0.0)
    with pytest.raises(ValueError, match="criterion must be one of baseline, table"):
        lowprec_report(_triple, x, criterion="strict")


def test_default_floors_are_per_dtype():
    assert Criterion().floor_for(torch.bfloat16) == LOWPREC_FLOORS[torch.bfloat16] == 0.5
    assert Criterion().floor_for(torch.float32) == 256
    assert Criterion(floor=3.0).floor_for(torch.float16) == 3.0


def test_a_non_finite_result_fails_and_equal_infinities_pass():
    ref = torch.tensor([1.0, math.inf, 2.0], dtype=torch.float64)
    assert judge(torch.tensor([1.0, math.inf, 2.0]), ref).passed
    bad = judge(torch.tensor([1.0, math.inf, math.nan]), ref)
    assert bad.exceeding == 1 and bad.worst[0].index == (2,)


def test_rounded_to_rounds_every_step_and_keeps_autograd():
    x = torch.tensor([1.0 + 2**-12, 3.0], dtype=torch.float64, requires_grad=True)
    with RoundedTo(torch.bfloat16):
        y = x * 1.0
        z = (y * y).sum()
        (g,) = torch.autograd.grad(z, x)
    assert torch.equal(y.detach(), x.detach().to(torch.bfloat16).to(torch.float64))
    assert y.dtype == torch.float64 and g.dtype == torch.float64
    assert torch.equal(g, (2 * y.detach()).to(torch.bfloat16).to(torch.float64))
    with RoundedTo(torch.bfloat16):
        v = x.detach().clone()[::1].view(2)  # a view of a rounded base is left alone
        v.add_(2**-12)  # an in-place result is rounded where it is
    assert v[0].item() == float(torch.tensor(1.0 + 2**-11, dtype=torch.bfloat16).item())


class _WritesIntoInput(torch.autograd.Function):
    """Doubles x and leaves 2x in x's own memory, as a kernel writing through a pointer does."""

    @staticmethod
    def forward(ctx, x):
        out = x * 2
        x.data.copy_(out)  # past autograd's version counter
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _OverwritesSavedInput(torch.autograd.Function):
    """x * y, whose backward writes its gradient into the saved x (a SwiGLU backward does)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * y
        x.data.copy_(g * x)
        return gx, x


def test_an_op_that_writes_into_its_input_fails_with_the_input_named_and_the_fix():
    x = torch.rand(20, dtype=torch.float32, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(LowPrecisionError) as info:
        lowprec_check(_WritesIntoInput.apply, x, reference=lambda x: 2 * x)
    text = str(info.value)
    assert text.startswith("the op wrote into its input 0 (Tensor[20] float32): 20 of 20 entries changed")
    assert "during its call" in text and "clone_inputs: true" in text and "clone_inputs=True" in text
    assert info.value.report is not None and not info.value.report.passed and info.value.report.inputs_written
    assert not torch.equal(x.detach(), before)  # what the check found: the caller's tensor was written


def test_clone_inputs_gives_every_call_fresh_copies():
    x = torch.rand(20, dtype=torch.float32, requires_grad=True)
    before = x.detach().clone()
    assert lowprec_check(_WritesIntoInput.apply, x, reference=lambda x: 2 * x, clone_inputs=True)
    assert torch.equal(x.detach(), before)


def test_a_backward_that_overwrites_a_saved_input_is_caught_after_the_vjp():
    x, y = (torch.rand(10, dtype=torch.float16, requires_grad=True) for _ in range(2))
    report = lowprec_report(_OverwritesSavedInput.apply, (x, y), reference=lambda x, y: x * y)
    assert "wrote into its input 0" in report.message and "during its backward (VJP)" in report.message
    assert report.inputs_written
    ok = lowprec_report(_OverwritesSavedInput.apply, (x, y), reference=lambda x, y: x * y, clone_inputs=True)
    assert "wrote into" not in ok.message and not ok.inputs_written
