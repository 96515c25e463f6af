"""fast_mode=False through the full check's fused pass (route.full_mode_fused): it only ever
decides a pass; a call it does not pass goes to the step-by-step full check, whose verdicts, first
lines and warnings are torch's slow mode's (test_differential.py holds them against torch)."""

from __future__ import annotations

from types import SimpleNamespace

import corpus
import pytest
import test_differential
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck
from opcheck.engine import route
from tests.runtime.test_cost import COUNTS, KernelCube

FULL = SimpleNamespace(name="opcheck full", gradcheck=opcheck.gradcheck, gradgradcheck=opcheck.gradgradcheck)


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.id)
def test_the_fused_pass_keeps_the_step_by_step_verdict_and_first_line(case, monkeypatch):
    with_fused = test_differential.run_case(FULL, case, "slow")
    monkeypatch.setattr(route, "full_mode_fused", lambda sizes: False)
    step_by_step = test_differential.run_case(FULL, case, "slow")
    assert (with_fused.verdict, with_fused.detail) == (step_by_step.verdict, step_by_step.detail)
    assert with_fused.warning_lines == step_by_step.warning_lines


def _x(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def test_a_passing_call_takes_one_vmapped_and_one_batched_backward_call():
    r = opcheck.gradcheck_report(torch.sin, (_x(6, 7),), check_batched_grad=True)
    assert r.passed and r.stats.fused, r.stats
    # every column's differences in one vmapped call, every row (with the batched-gradient and the
    # zero-grad_output rows) in one batched backward, the random cotangent twice in a plain one
    assert (r.stats.batched_calls, r.stats.calls) == (1, 0), r.stats
    assert (r.stats.batched_vjp_calls, r.stats.vjp_calls) == (1, 2), r.stats


def test_a_function_that_cannot_be_vmapped_leaves_the_pass_before_looping_over_its_columns():
    x = _x(5, 4)
    COUNTS.clear()
    r = opcheck.gradcheck_report(KernelCube.apply, (x,))  # x³ as a kernel outside torch: no vmap rule
    assert r.passed and not r.stats.fused
    assert any(f.startswith("fused: finite differences cannot be batched") for f in r.stats.fallbacks), r.stats
    # the call, its fresh start, the step-by-step check's two calls per column and its
    # zero- and undefined-grad_output calls: the columns are looped over once, not twice
    assert COUNTS["forward"] <= 2 * x.numel() + 4, COUNTS


@pytest.mark.parametrize("fn", [torch.sin, KernelCube.apply], ids=["vmappable", "kernel"])
def test_columns_too_few_for_a_vmapped_call_loop_inside_the_pass(fn):
    # Below FUSED_MIN_COLUMNS the loop is the cheaper choice, vmap support or not: the pass keeps
    # the call, and its two rows come from plain backward passes (route.plain_backward_rows).
    x = _x(2)
    COUNTS.clear()
    r = opcheck.gradcheck_report(fn, (x,))
    assert r.passed and r.stats.fused and not r.stats.fallbacks, r.stats
    assert (r.stats.calls, r.stats.batched_calls) == (4, 0), r.stats
    assert (r.stats.vjp_calls, r.stats.batched_vjp_calls) == (4, 0), r.stats


class _WrongOnlyForZeroGrad(torch.autograd.Function):
    """sin whose backward is right for every grad_output but an all-zero one (then it returns ones)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if bool((g == 0).all()):
            return torch.ones_like(x)
        return g * x.cos()


def test_a_backward_wrong_only_for_a_zero_grad_output_fails_as_torchs_slow_mode_does():
    x = _x(3, 4)
    with pytest.raises(GradcheckError) as theirs:
        torch.autograd.gradcheck(_WrongOnlyForZeroGrad.apply, (x,))
    with pytest.raises(GradcheckError) as ours:
        opcheck.gradcheck(_WrongOnlyForZeroGrad.apply, (x,))
    assert str(ours.value).splitlines()[0] == str(theirs.value).splitlines()[0]
    assert "grad_output" in str(theirs.value).splitlines()[0]
