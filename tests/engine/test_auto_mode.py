"""fast_mode="auto": full check within the budget, entrywise projections beyond (opcheck/engine/auto/stepwise.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import corpus
import pytest
import scale_mutants
import test_differential
import torch
from test_fused import _sin_wrong_tail
from torch.autograd.function import once_differentiable

import opcheck
from opcheck.engine import route
from opcheck.engine.auto import projection_check, stepwise
from opcheck.engine.auto import projections as auto_mod
from opcheck.engine.auto.projections import ProjectionMismatch
from opcheck.engine.batching import vmap_batching
from opcheck.engine.reporting.diagnostics import JacobianMismatch
from tests.broken_ops import SIN, scaled

MUTANTS = {m.id: m for m in scale_mutants.MUTANTS}
FIRST_LINE = (
    r"^(While considering .* only, )?Jacobian (computed with forward mode )?mismatch for output \d+ with respect to "
    r"input \d+,"
)


def _report(m, fn, **kw):
    return getattr(opcheck, f"{m.checker}_report")(fn, m.make_inputs(), fast_mode="auto", **m.flags, **kw)


@pytest.mark.parametrize("m", scale_mutants.MUTANTS, ids=lambda m: m.id)
def test_auto_catches_the_mutant_and_passes_its_twin(m):
    wrong = _report(m, m.wrong)
    assert not wrong.passed
    assert re.match(FIRST_LINE, wrong.message.splitlines()[0]), wrong.message
    assert "auto: " in wrong.message
    right = _report(m, m.right)
    assert right.passed, right.message
    assert right.stats.auto_paths and all(p.startswith("projected") for p in right.stats.auto_paths)


@pytest.mark.parametrize("m", [m for m in scale_mutants.MUTANTS if m.torch_fast_misses], ids=lambda m: m.id)
def test_torch_fast_mode_misses_the_mutant(m):
    check = getattr(torch.autograd, m.checker)
    assert check(m.wrong, m.make_inputs(), fast_mode=True, **m.flags)


def test_auto_raises_gradcheck_error_with_torch_wording():
    m = MUTANTS["sin_64x64_tail7"]
    with pytest.raises(opcheck.GradcheckError, match=FIRST_LINE) as info:
        opcheck.gradcheck(m.wrong, m.make_inputs(), fast_mode="auto")
    assert "check: backward (VJP), auto: VJP against JVP projections" in str(info.value)
    assert opcheck.gradcheck(m.wrong, m.make_inputs(), fast_mode="auto", raise_exception=False) is False


def test_beyond_budget_failure_names_projection_entries():
    m = MUTANTS["sin_128x128_tail7_nojvp"]
    r = _report(m, m.wrong)
    assert isinstance(r.mismatch, ProjectionMismatch)
    assert "not recomputed in full" in r.message
    assert r.mismatch.comparison == auto_mod.JVP_STAGE
    # the 7 wrong elements are the last 7 of the last row, each wrong along every direction
    assert r.mismatch.mismatched == 7 * route.DIRECTIONS
    assert {e.output_index for e in r.mismatch.worst} <= {(127, c) for c in range(121, 128)}


def test_vjp_stage_failure_names_cotangent_direction_pairs():
    m = MUTANTS["exp_96x96_one_entry"]
    r = _report(m, m.wrong)
    assert isinstance(r.mismatch, ProjectionMismatch) and r.mismatch.comparison == auto_mod.VJP_STAGE
    assert r.mismatch.mismatched == route.COTANGENTS * route.DIRECTIONS  # ±δ in every pair
    assert "v_" in r.message and "J u_" in r.message


def test_block_within_budget_is_recomputed_in_full_only_where_that_is_cheap():
    # 3 inputs of 1024 and one output of 1024: beyond 2**20 in all, each block within it. The kernel
    # has no vmap rule: recomputing the block would take a backward per output element and two calls
    # per input element, so the projections' report stands (a failure costs about what a pass does).
    m = MUTANTS["attention_2x32x16_head"]
    r = _report(m, m.wrong)
    assert isinstance(r.mismatch, ProjectionMismatch) and "within the budget, but the op cannot be batched" in r.message
    assert r.mismatch.input_idx == 0 and all(e.output_index[0] == 1 for e in r.mismatch.worst)  # head 1


@pytest.mark.parametrize("m", [m for m in scale_mutants.MUTANTS if m.id.startswith("csin_")], ids=lambda m: m.id)
def test_complex_beyond_budget_is_projected_on_real_views(m):
    wrong, right = _report(m, m.wrong), _report(m, m.right)
    assert isinstance(wrong.mismatch, ProjectionMismatch), wrong.message
    assert "checked as torch.view_as_real" in wrong.message
    assert wrong.stats.auto_paths and all(
        p.startswith("projected") and p.endswith("; complex as view_as_real)") for p in wrong.stats.auto_paths
    ), wrong.stats.auto_paths
    # A twin that torch.func.vmap can run passes on the projections' fused pass, its complex input
    # seen through view_as_real; one that it cannot (no vmap rule) on the step-by-step projections.
    assert right.passed
    if m.id == "csin_64x64_tail7_no_conj":  # its autograd.Function has no vmap support
        assert not right.stats.fused and all(p.endswith("; complex as view_as_real)") for p in right.stats.auto_paths)
    else:
        assert right.stats.fused and all(p.endswith(", fused)") for p in right.stats.auto_paths), right.stats
    # the wrong elements are the last 7 of the last row, whichever part shows them
    entries = [e.output_index for e in wrong.mismatch.worst if e.output_index is not None]
    assert all(e[:2] in {(63, c) for c in range(57, 64)} for e in entries), entries


def test_complex_within_budget_runs_the_full_check():
    z = torch.randn(8, 8, dtype=torch.complex128, requires_grad=True)
    wrong = scale_mutants.complex_sin(conj_missing=True)
    r = opcheck.gradcheck_report(wrong, (z,), fast_mode="auto")
    assert r.stats.auto_paths == ["full"]  # the imaginary part of the output fails first
    assert isinstance(r.mismatch, JacobianMismatch)
    assert r.message == opcheck.gradcheck_report(wrong, (z,)).message
    right = opcheck.gradcheck_report(scale_mutants.complex_sin(), (z,), fast_mode="auto")
    assert right.passed and right.stats.auto_paths == ["full", "full"]  # imaginary, then real parts


@pytest.mark.parametrize("mid", ["sin_128x128_tail7_nojvp", "csin_64x64_tail7_no_conj", "csin_64x64_jvp_tail7_1pct"])
def test_no_full_jacobian_beyond_budget(monkeypatch, mid):
    calls = []

    def forbidden(name):
        def f(*a, **k):
            calls.append(name)
            raise AssertionError(f"{name} called beyond the budget")

        return f

    for name in ("numerical_jacobian", "analytical_vjp_jacobian", "analytical_jvp_jacobian"):
        monkeypatch.setattr(projection_check, name, forbidden(name))
    monkeypatch.setattr(stepwise, "full_check", forbidden("full_check"))
    m = MUTANTS[mid]
    for fn in (m.right, torch.sin):  # the complex mutants' inputs are complex: torch.sin takes them too
        r = _report(m, fn)
        assert r.passed, r.message
        assert r.stats.auto_paths[0].startswith("projected")
    assert not _report(m, m.wrong).passed
    assert calls == []


def test_size_chooses_the_path():
    small = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)  # 4096 entries: the full check
    assert opcheck.gradcheck_report(torch.sin, (small,), fast_mode="auto").stats.auto_paths == ["full"]
    x = torch.randn(32, 32, dtype=torch.float64, requires_grad=True)  # within the budget, beyond the full check's size
    r = opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto")
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["projected (J·U from forward AD, fused)"]
    r = opcheck.gradcheck_report(torch.sin, (small,), fast_mode="auto", jacobian_budget=0)
    assert r.passed and r.stats.auto_paths == ["projected (J·U from forward AD, fused)"]
    with vmap_batching(False):  # no fused pass: the step-by-step projection check
        r = opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto", jacobian_budget=0)
    assert r.passed and not r.stats.fused and r.stats.auto_paths == ["projected (J·U from forward AD)"]
    # explicit True/False keep torch's meaning: no auto path at all
    assert opcheck.gradcheck_report(torch.sin, (x,), fast_mode=True).stats.auto_paths == []


# sin whose forward AD is 1% off in its last element, under torch.func's vmap too (backward right)
SinJvpWrongTail = _sin_wrong_tail("SinJvpWrongTail", jvp_wrong=lambda t: True, vmappable=True)


def test_forward_ad_alone_takes_the_projections_beyond_32_columns():
    """A call that checks forward AD alone runs the full check first up to FORWARD_FULL_COLUMNS input
    elements; beyond them its projections (3·8 rows per input, where the full check's rows are 3n),
    even where n + m <= FULL_CHECK_ELEMENTS. Backward calls of the same size keep the full check."""
    forward_only = dict(fast_mode="auto", check_forward_ad=True, check_backward_ad=False)
    projected = "projected (J·U from forward AD, fused)"
    for n, path in [(32, "full"), (33, projected), (60, projected)]:
        x = torch.randn(n, dtype=torch.float64, requires_grad=True)
        r = opcheck.gradcheck_report(torch.sin, (x,), **forward_only)
        assert r.passed and r.stats.fused and r.stats.auto_paths == [path], (n, r.stats)
        assert opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto").stats.auto_paths == ["full"]
    # a wrong forward-AD entry that the projections see goes on to the full check, which names it
    x = torch.randn(60, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradcheck_report(SinJvpWrongTail.apply, (x,), **forward_only)
    assert not r.passed and r.stats.auto_paths == ["full"], r.stats
    assert any(f.startswith("projected: J·U from forward AD disagrees") for f in r.stats.fallbacks), r.stats
    assert r.mismatch is not None and "59" in r.message, r.message


def test_bad_arguments():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="fast_mode"):
        opcheck.gradcheck(torch.sin, (x,), fast_mode="fast")
    with pytest.raises(ValueError, match="jacobian_budget"):
        opcheck.gradcheck(torch.sin, (x,), fast_mode="auto", jacobian_budget=-1)


def _sin_once_differentiable(factor):
    class Sin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos() * scale_mutants._tail_scale(tuple(x.shape), 3, factor)

    return Sin.apply


def test_no_jvp_and_no_double_backward_falls_back_to_vjp_rows():
    x = torch.randn(40, 40, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradcheck_report(_sin_once_differentiable(1.0), (x,), fast_mode="auto", jacobian_budget=0)
    assert r.passed, r.message
    assert r.stats.auto_paths == ["projected (J·U from VJP rows)"]
    assert any("VJP of the VJP" in f for f in r.stats.fallbacks)
    r = opcheck.gradcheck_report(_sin_once_differentiable(1.1), (x,), fast_mode="auto", jacobian_budget=0)
    assert not r.passed and "J·U from VJP rows" in r.message


_SIN_WRONG_JVP = SIN.function("SinWrongJvp", jvp=True, jvp_bug=scaled(1.1), vmap=True)
"""sin with a vmap rule and a right backward, its jvp 10% off."""


def test_wrong_jvp_does_not_fail_the_backward_check():
    # check_forward_ad is off: the jvp is only a tool; when it disagrees, J·U comes from elsewhere.
    x = torch.randn(40, 40, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradcheck_report(_SIN_WRONG_JVP.apply, (x,), fast_mode="auto", jacobian_budget=0)
    assert r.passed, r.message
    assert any("forward AD: disagrees" in f for f in r.stats.fallbacks), r.stats.fallbacks
    # JVPs that do not batch (no vmap rule) are not taken one by one where backward batches
    m = MUTANTS["jvp_64x64_tail7"]
    r = opcheck.gradcheck_report(m.wrong, m.make_inputs(), fast_mode="auto")
    assert r.passed, r.message
    assert r.stats.auto_paths == ["projected (J·U from the VJP of the VJP)"], r.stats
    assert r.stats.jvp_calls == 0 and any("its JVPs do not batch" in f for f in r.stats.fallbacks)


def _noisy_sin(noise):
    g = torch.Generator().manual_seed(0)

    class NoisySin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * (x.cos() + noise * torch.rand(x.shape, generator=g, dtype=x.dtype))

    return NoisySin.apply


def test_nondeterministic_backward_is_not_reentrant():
    x = torch.randn(40, 40, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradcheck_report(_noisy_sin(1e-9), (x,), fast_mode="auto", jacobian_budget=0)
    assert not r.passed and r.check == "reentrancy"
    assert opcheck.gradcheck(_noisy_sin(1e-9), (x,), fast_mode="auto", jacobian_budget=0, nondet_tol=1e-7)


def test_gradgradcheck_auto_on_builtin():
    x = torch.randn(48, 48, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradgradcheck_report(torch.tanh, (x,), fast_mode="auto")
    assert r.passed, r.message
    assert r.stats.auto_paths[0].startswith("projected")


# ------------------------------------------------------------------ below the budget: the full check
AUTO = SimpleNamespace(
    name="opcheck auto",
    gradcheck=lambda *a, fast_mode=None, **k: opcheck.gradcheck(*a, fast_mode="auto", **k),
    gradgradcheck=lambda *a, fast_mode=None, **k: opcheck.gradgradcheck(*a, fast_mode="auto", **k),
)


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.id)
def test_auto_below_budget_has_the_full_modes_verdict(case):
    auto = test_differential.run_case(AUTO, case, "slow")
    full = test_differential.run_case(test_differential.OPCHECK, case, "slow")
    assert auto.verdict == full.verdict == case.expected_for("slow"), (auto.detail, full.detail)


class _CountedCube(torch.autograd.Function):
    """x**3 as a kernel is: no vmap rule, no forward AD, a backward of its own (`tail` scales the
    gradient's last entry); counting its forward calls. `coupled` adds coupled * sum(x) to every
    output: a dense Jacobian, where the cube's is diagonal."""

    forward_calls = 0
    tail = 1.0
    coupled = 0.0

    @staticmethod
    def forward(ctx, x):
        _CountedCube.forward_calls += 1
        ctx.save_for_backward(x)
        return x**3 + _CountedCube.coupled * x.sum()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        grad = 3 * x**2 * g + _CountedCube.coupled * g.sum()
        grad.reshape(-1)[-1:] *= _CountedCube.tail
        return grad


@pytest.mark.parametrize(
    "size, coupled, path",
    [
        (16, 0.1, "full"),
        (40, 0.1, "projected"),
        (16, 0.0, "full (grouped finite differences)"),
        (40, 0.0, "full (grouped finite differences)"),
    ],
)
def test_an_op_that_cannot_be_vmapped_loops_over_its_columns_only_while_the_projections_cost_more(size, coupled, path):
    from opcheck.engine.route import DIRECTIONS, GROUP_WEIGHTINGS, LOOP_COLUMNS_PER_INPUT

    assert 16 <= LOOP_COLUMNS_PER_INPUT < 40  # the sizes below sit on either side of it
    x = torch.linspace(0.5, 1.5, size, dtype=torch.float64).requires_grad_()
    _CountedCube.tail, _CountedCube.coupled, _CountedCube.forward_calls = 1.0, coupled, 0
    try:
        r = opcheck.gradcheck_report(_CountedCube.apply, (x,), fast_mode="auto")
        taken = r.stats.auto_paths[0]
        assert r.passed and (taken.startswith(path) if path == "projected" else taken == path), r.stats
        if path == "full":  # two calls a column: within LOOP_COLUMNS_PER_INPUT columns, no more than the projections
            assert any("vmap" in f for f in r.stats.fallbacks) and r.stats.fused, r.stats
        elif coupled:  # a call pair per direction, where the loop would take 2 * size + 1
            assert _CountedCube.forward_calls <= 2 * DIRECTIONS + 4 < 2 * size + 1, _CountedCube.forward_calls
        else:  # a diagonal Jacobian's columns in one group: a call pair per weighting
            assert r.stats.fused and _CountedCube.forward_calls == 1 + 2 * GROUP_WEIGHTINGS, _CountedCube.forward_calls
        _CountedCube.tail = 1.5
        wrong = opcheck.gradcheck_report(_CountedCube.apply, (x,), fast_mode="auto")
        assert not wrong.passed, wrong.message
        if size <= LOOP_COLUMNS_PER_INPUT or not coupled:  # the full check's report, in its words
            assert isinstance(wrong.mismatch, JacobianMismatch)
            assert wrong.message == opcheck.gradcheck_report(_CountedCube.apply, (x,)).message
            assert wrong.mismatch.worst[0].input_index == (size - 1,)
        else:  # the projections' report, with the Jacobian entry the full check fails
            assert isinstance(wrong.mismatch, ProjectionMismatch) and "the full check fails it" in wrong.message
            assert wrong.mismatch.pinned[0].input_index == (size - 1,)
    finally:
        _CountedCube.tail, _CountedCube.coupled = 1.0, 0.0


def test_a_failing_check_does_not_repeat_the_plain_calls_of_its_fused_pass():
    """Without vmap support the fused pass takes its columns by plain call pairs; where its
    comparison fails, the step-by-step check that decides as torch's slow mode does reads those
    columns (computed by the same calls) instead of making them again: the call itself, the call
    pairs, and the step-by-step check's fresh call."""
    size = 6
    x = torch.linspace(0.5, 1.5, size, dtype=torch.float64).requires_grad_()
    _CountedCube.tail, _CountedCube.coupled, _CountedCube.forward_calls = 1.5, 0.1, 0
    try:
        wrong = opcheck.gradcheck_report(_CountedCube.apply, (x,), fast_mode="auto")
        assert not wrong.passed and any(f.startswith("fused: backward") for f in wrong.stats.fallbacks), wrong.stats
        assert _CountedCube.forward_calls == 1 + 2 * size + 1, _CountedCube.forward_calls
        assert isinstance(wrong.mismatch, JacobianMismatch) and wrong.mismatch.worst[0].input_index == (size - 1,)
        with pytest.raises(RuntimeError) as theirs:  # torch.autograd.gradcheck.GradcheckError
            torch.autograd.gradcheck(_CountedCube.apply, (x,))
        assert wrong.message.splitlines()[0] == str(theirs.value).splitlines()[0]
    finally:
        _CountedCube.tail, _CountedCube.coupled = 1.0, 0.0
