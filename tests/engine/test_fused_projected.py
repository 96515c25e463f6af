"""fast_mode="auto" beyond the full check's size: the projections' fused pass (opcheck/engine/auto/fused_projected.py).

Within the Jacobian budget the pass only decides a pass, and the full check decides the rest, so
on every case of the differential corpus, forced onto the pass, auto must keep the full check's
verdict and first line; each bug that only one of its comparisons sees must still fail.
"""

from __future__ import annotations

import corpus
import pytest
import test_differential
import torch
from test_fused import AUTO, AddWrongWithUndefinedTangent, _is_batched, _sin_wrong_tail, _x, passing_corpus_reports
from torch.autograd.gradcheck import GradcheckError

import opcheck
from opcheck.engine import aux_checks, route
from opcheck.engine.auto import fused
from tests.clocks import Spans

# The batching mutants of test_fused, with torch.func.vmap support (the pass's vmapped calls need it).
SinPlainBackwardWrongTail = _sin_wrong_tail(
    "SinPlainBackwardWrongTail", backward_wrong=lambda g: not _is_batched(g), vmappable=True
)
SinBatchedBackwardWrongTail = _sin_wrong_tail("SinBatchedBackwardWrongTail", backward_wrong=_is_batched, vmappable=True)
SinJvpWrongTailUnderLegacyVmap = _sin_wrong_tail(
    "SinJvpWrongTailUnderLegacyVmap", vmappable=True, jvp_wrong=torch._C._functorch.is_legacy_batchedtensor
)


@pytest.fixture
def projections_everywhere(monkeypatch):
    """Every auto call within the budget takes the projections' pass first."""
    monkeypatch.setattr(route, "FULL_CHECK_ELEMENTS", 0)


def _without_fused_passes(monkeypatch):
    def refuse(*args, **kwargs):
        raise fused.Fallback("turned off by the test")

    monkeypatch.setattr("opcheck.engine.auto.fused_check", refuse)
    monkeypatch.setattr("opcheck.engine.auto.fused_projected.projected_check", refuse)


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.id)
def test_projected_pass_keeps_the_full_checks_verdict_and_first_line(case, monkeypatch, projections_everywhere):
    with_pass = test_differential.run_case(AUTO, case, "slow")
    _without_fused_passes(monkeypatch)
    full = test_differential.run_case(AUTO, case, "slow")
    assert (with_pass.verdict, with_pass.detail) == (full.verdict, full.detail)


def test_corpus_passes_mostly_take_the_projected_pass(projections_everywhere):
    taken = [r.stats.fused and all(p.endswith("fused)") for p in r.stats.auto_paths) for r in passing_corpus_reports()]
    assert len(taken) >= 10 and sum(taken) >= len(taken) // 2, taken


def test_a_torch_fast_mode_sized_handful_of_calls():
    r = opcheck.gradcheck_report(torch.sin, (_x(32, 32),), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["projected (J·U from forward AD, fused)"]
    # Finite differences in one vmapped call and J·U in one vmapped JVP; V, the batched-gradient and
    # the zero rows in one batched backward; the random cotangent twice in a plain one. No plain
    # forward call.
    assert (r.stats.batched_calls, r.stats.batched_jvp_calls) == (1, 1)
    assert (r.stats.batched_vjp_calls, r.stats.vjp_calls) == (1, 2)
    assert r.stats.calls == r.stats.jvp_calls == 0
    r = opcheck.gradcheck_report(
        torch.sin, (_x(32, 32),), fast_mode="auto", check_forward_ad=True, check_backward_ad=False
    )
    assert r.passed and r.stats.fused  # forward AD checked: one plain JVP ties the batched rows
    assert (r.stats.batched_calls, r.stats.batched_jvp_calls, r.stats.jvp_calls, r.stats.vjp_calls) == (1, 1, 1, 0)


def test_the_batched_forward_check_is_the_legacy_rows_probed_densely(monkeypatch):
    def not_needed(*args, **kwargs):
        raise AssertionError("the legacy-vmap rows already compared vmapped and one-at-a-time JVPs")

    monkeypatch.setattr(aux_checks, "check_batched_grad_forward_ad", not_needed)
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)
    r = opcheck.gradcheck_report(torch.sin, (_x(32, 32),), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused, r.stats.fallbacks
    assert (r.stats.batched_calls, r.stats.batched_jvp_calls, r.stats.jvp_calls) == (1, 1, 1)


SinRight = _sin_wrong_tail("SinRight", vmappable=True)  # the twin of the mutants
SinBackwardWrongTail = _sin_wrong_tail("SinBackwardWrongTail", backward_wrong=lambda g: True, vmappable=True)
SinJvpWrongTail = _sin_wrong_tail("SinJvpWrongTail", jvp_wrong=lambda t: True, vmappable=True)


@pytest.mark.parametrize(
    "mutant, flags, check, fallback",
    [
        # backward wrong, jvp right: the VJP stage; within the budget the full check then names the entry
        (SinBackwardWrongTail, {}, "backward", "VJP stage"),
        # jvp wrong: the JVP stage, entrywise against finite differences
        (SinJvpWrongTail, dict(check_forward_ad=True, check_backward_ad=False), "forward AD", "J·U"),
        # a plain backward that batching hides: its random row disagrees with the plain backward
        (SinPlainBackwardWrongTail, {}, "backward", "batched and plain gradients differ"),
        (SinBatchedBackwardWrongTail, dict(check_batched_grad=True), "batched backward", "batched and plain"),
        (
            SinJvpWrongTailUnderLegacyVmap,
            dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True),
            "batched forward AD",
            "batched JVP",
        ),
    ],
    ids=["vjp", "jvp", "plain-backward", "batched-backward", "legacy-vmap-jvp"],
)
def test_each_comparison_catches_its_bug_and_the_full_check_reports_it(mutant, flags, check, fallback):
    x = _x(16, 16)  # 65536 entries: the projections' pass first, the full check within the budget
    r = opcheck.gradcheck_report(mutant.apply, (x,), fast_mode="auto", **flags)
    assert not r.passed and r.check == check, r.message
    assert any(f.startswith("projected: ") and fallback in f for f in r.stats.fallbacks), r.stats.fallbacks
    if check in ("backward", "forward AD"):
        kind = "Jacobian mismatch" if check == "backward" else "Jacobian computed with forward mode mismatch"
        assert r.message.startswith(f"{kind} for output 0 with respect to input 0,"), r.message
        assert r.mismatch.worst[0].input_index == (15, 15)
    with pytest.raises(GradcheckError):  # torch's slow mode agrees
        torch.autograd.gradcheck(mutant.apply, (x,), fast_mode=False, **flags)


FLAG_SETS = [
    {},
    dict(check_batched_grad=True),
    dict(check_forward_ad=True, check_batched_forward_grad=True),
    dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True),
]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: ",".join(f) or "default")
def test_the_twin_passes_on_the_pass(flags):
    r = opcheck.gradcheck_report(SinRight.apply, (_x(16, 16),), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused and r.stats.auto_paths[0].endswith("fused)"), r.stats.fallbacks


def test_a_batching_bug_fails_only_the_check_that_asks_for_batching():
    x = _x(16, 16)
    assert opcheck.gradcheck_report(SinBatchedBackwardWrongTail.apply, (x,), fast_mode="auto").passed
    assert opcheck.gradcheck_report(
        SinJvpWrongTailUnderLegacyVmap.apply, (x,), fast_mode="auto", check_forward_ad=True
    ).passed


def test_beyond_the_budget_the_step_by_step_projections_decide():
    x = _x(16, 16)
    r = opcheck.gradcheck_report(SinBackwardWrongTail.apply, (x,), fast_mode="auto", jacobian_budget=1000)
    assert not r.passed and r.check == "backward"
    assert "auto: VJP against JVP projections (J·U from forward AD)" in r.message.splitlines()[1], r.message
    assert opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto", jacobian_budget=1000).stats.fused


def test_undefined_tangent_rows_ride_in_the_vmapped_call():
    args = (_x(16, 16), _x(16, 16, seed=1))
    flags = dict(check_forward_ad=True, check_backward_ad=False)
    r = opcheck.gradcheck_report(AddWrongWithUndefinedTangent.apply, args, fast_mode="auto", **flags)
    # torch's first line: its GradcheckError's arguments, words and values alternating, as a tuple
    assert not r.passed and r.message.startswith(
        "('Mismatch in tangent values for output with index: ', 0, ' when input: ', tensor("
    ), r.message
    assert "output 0's tangent when input 1 has an undefined tangent" in r.message.splitlines()[1], r.message
    assert any(f.startswith("projected: undefined tangent") for f in r.stats.fallbacks), r.stats.fallbacks
    right = opcheck.gradcheck_report(torch.add, args, fast_mode="auto", **flags)
    assert right.passed and right.stats.fused and right.stats.jvp_calls == 1  # the tie; no undefined-tangent call


def test_zero_grad_output_and_reentrancy_fall_to_the_full_check():
    class NotMultipliedByGradOutput(SinRight):
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos() + 1e-3 * x  # nonzero for a zero grad_output

    calls = []

    class Nondeterministic(SinRight):  # each backward call a little different
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            calls.append(1)
            return g * x.cos() * (1 + 1e-9 * len(calls))

    x = _x(16, 16)
    r = opcheck.gradcheck_report(NotMultipliedByGradOutput.apply, (x,), fast_mode="auto")
    assert not r.passed and any(f.startswith("projected: ") for f in r.stats.fallbacks)
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(NotMultipliedByGradOutput.apply, (x,))
    r = opcheck.gradcheck_report(Nondeterministic.apply, (x,), fast_mode="auto")
    assert not r.passed and r.check == "reentrancy", r.message
    assert any("reentrancy" in f for f in r.stats.fallbacks), r.stats.fallbacks
    assert opcheck.gradcheck_report(Nondeterministic.apply, (x,), fast_mode="auto", nondet_tol=1e-6).passed


def test_complex_outputs_through_their_real_views():
    x = _x(16, 16)
    for kwargs in (dict(check_batched_grad=True), dict(check_forward_ad=True, check_backward_ad=False)):
        r = opcheck.gradcheck_report(torch.fft.fft, (x,), fast_mode="auto", **kwargs)
        assert r.passed and r.stats.fused and r.stats.auto_paths[0].endswith("fused)"), r.stats.fallbacks


def test_a_function_without_vmap_support_takes_the_step_by_step_projections():
    no_vmap = _sin_wrong_tail("SinNoVmap")
    x = _x(32, 32)
    r = opcheck.gradcheck_report(no_vmap.apply, (x,), fast_mode="auto")
    # its JVPs do not batch, its backward does: J·U from the VJP of the VJP (a batched call), not a JVP each
    assert r.passed and r.stats.auto_paths == ["projected (J·U from the VJP of the VJP)"], r.stats.auto_paths
    assert r.stats.calls <= 2 * 8 + 2  # the finite differences' loop: 2 calls per direction, not per column
    assert r.stats.jvp_calls == 0
    x = _x(16, 16)
    wrong = _sin_wrong_tail("SinNoVmapWrongTail", backward_wrong=lambda g: True)
    r = opcheck.gradcheck_report(wrong.apply, (x,), fast_mode="auto")
    assert not r.passed and r.message.startswith("Jacobian mismatch for output 0 with respect to input 0,")
    # Within the budget the verdict is the full check's: the failure names an entry it fails.
    assert r.stats.auto_paths == [
        "projected (J·U from the VJP of the VJP, which backward's rows match where they were taken)"
    ], r.stats.auto_paths
    assert [(e.output_index, e.input_index) for e in r.mismatch.pinned] == [((15, 15), (15, 15))]
    full = opcheck.gradcheck_report(wrong.apply, (x,), fast_mode=False)
    assert full.mismatch.worst[0].input_index == (15, 15) and r.stats.calls < full.stats.calls / 4


@pytest.mark.parametrize("name", ["detached_float_output", "complex_jvp_for_real_output_check_dtypes"])
def test_the_projections_alone_keep_torchs_verdict(name):
    # Beyond the budget the projections decide: a float output that does not require grad must not
    # move, and a real output's tangent must be real.
    case = next(c for c in corpus.CASES if c.id == name)
    kwargs = {k: v for k, v in case.flags.items() if k != "raise_exception"}
    with pytest.raises(GradcheckError) as torch_error:
        torch.autograd.gradcheck(case.func, case.make_inputs(), **kwargs)
    r = opcheck.gradcheck_report(case.func, case.make_inputs(), fast_mode="auto", jacobian_budget=0, **kwargs)
    assert not r.passed and r.message.splitlines()[0] == str(torch_error.value).splitlines()[0], r.message


def test_a_scalar_loss_takes_the_projections_at_4096_entries():
    # n·m = 4096, but n + m = 4097: the full check would make 8,193 evaluations of a 4,096-element input.
    x = _x(64, 64)
    r = opcheck.gradcheck_report(lambda t: (t.sin() ** 2).sum(), (x,), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["projected (J·U from forward AD, fused)"]
    small = _x(8, 8)  # n + m = 128: the full check
    assert opcheck.gradcheck_report(torch.sin, (small,), fast_mode="auto").stats.auto_paths == ["full"]


def _backward_only_row_loss(name: str, wrong_at: tuple[int, int] | None = None):
    """(x.sin() ** 2).sum(1) as a kernel registered with a backward alone: no jvp, a backward that is
    not differentiable itself (once_differentiable), vmappable. `wrong_at`: its gradient is 1% off
    at that entry of x."""
    from torch.autograd.function import once_differentiable

    def forward(x):
        return (x.sin() ** 2).sum(1)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        grad = g.unsqueeze(-1) * (2 * x.sin() * x.cos())
        if wrong_at is not None:
            grad[..., wrong_at[0], wrong_at[1]] *= 1.01
        return grad

    methods = dict(forward=forward, setup_context=setup_context, backward=backward)
    body = {k: staticmethod(f) for k, f in methods.items()}
    return type(name, (torch.autograd.Function,), {"generate_vmap_rule": True, **body})


def test_a_backward_only_kernel_gets_j_u_from_its_rows():
    # No forward AD and no derivative of backward: J·U from backward's 64 rows (batched), against
    # finite differences along 8 directions, where the full check would evaluate the function at
    # 2 x 4,096 points. One wrong gradient entry fails it, at that entry, as torch's slow mode does.
    x = _x(64, 64)
    right = _backward_only_row_loss("RowLossBackwardOnly")
    r = opcheck.gradcheck_report(right.apply, (x,), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused, r.stats.fallbacks
    assert r.stats.auto_paths == ["projected (J·U from VJP rows, fused)"], r.stats.auto_paths
    assert any("J·U from the VJP of the VJP" in f for f in r.stats.fallbacks), r.stats.fallbacks
    assert r.stats.calls <= 4 and r.stats.batched_calls <= 2 and r.stats.vjp_calls <= 8, r.stats
    wrong = _backward_only_row_loss("RowLossBackwardOnlyWrongEntry", wrong_at=(37, 50))
    r = opcheck.gradcheck_report(wrong.apply, (x,), fast_mode="auto")
    assert not r.passed and r.check == "backward", r.message
    assert r.message.startswith("Jacobian mismatch for output 0 with respect to input 0,"), r.message
    assert (37, 50) in [w.input_index for w in r.mismatch.worst], r.mismatch.worst
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(wrong.apply, (x,), fast_mode=False)
    assert torch.autograd.gradcheck(right.apply, (x,), fast_mode=False)


def _backward_only_scan(name: str, wrong_tail: bool = False):
    """x.cumsum(-1) as a kernel registered with a backward alone (the reverse scan), whose backward
    the legacy vmap runs one row at a time (it has no batching rule for cumsum): vmappable forward,
    no jvp, no derivative of backward. `wrong_tail`: the gradient is 1% off at x's last entry."""
    from torch.autograd.function import once_differentiable

    def setup_context(ctx, inputs, output):
        pass

    @once_differentiable
    def backward(ctx, g):
        grad = g.flip(-1).cumsum(-1).flip(-1)
        if wrong_tail:
            grad[..., -1, -1] *= 1.01
        return grad

    methods = dict(forward=lambda x: x.cumsum(-1), setup_context=setup_context, backward=backward)
    body = {k: staticmethod(f) for k, f in methods.items()}
    return type(name, (torch.autograd.Function,), {"generate_vmap_rule": True, **body})


def test_a_backward_whose_rows_cost_more_is_checked_against_finite_difference_columns():
    # No forward AD and no derivative of backward: where backward's m rows cost more than the 2n
    # rows of the finite differences of every column (here pinned by the clock: a backward row 1 s,
    # an evaluated row 1 us), backward's JᵀV for 8 cotangents, from the batched backward the side
    # checks make anyway, is compared with those columns' JᵀV for every input element. One wrong
    # gradient entry fails it, at that entry, as torch's slow mode does.
    from opcheck.engine.batching import batching_clock

    x = _x(10, 12)
    right = _backward_only_scan("ScanBackwardOnly")
    with batching_clock(Spans(17e-6, 10.0)):
        r = opcheck.gradcheck_report(right.apply, (x,), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused, r.stats.fallbacks
    assert r.stats.auto_paths == ["projected (JᵀV against finite-difference columns, fused)"], r.stats.auto_paths
    # The VJP of the VJP's attempt and the side checks' batched backward; two plain backward passes
    # (reentrancy) and the attempt's first: no backward row on its own.
    assert (r.stats.batched_vjp_calls, r.stats.vjp_calls, r.stats.calls) == (2, 3, 0), r.stats
    wrong = _backward_only_scan("ScanBackwardOnlyWrongTail", wrong_tail=True)
    with batching_clock(Spans(17e-6, 10.0)):
        r = opcheck.gradcheck_report(wrong.apply, (x,), fast_mode="auto")
    assert not r.passed and r.check == "backward", r.message
    assert any(f.startswith("projected: JᵀV stage") for f in r.stats.fallbacks), r.stats.fallbacks
    assert r.message.startswith("Jacobian mismatch for output 0 with respect to input 0,"), r.message
    assert (9, 11) in [w.input_index for w in r.mismatch.worst], r.mismatch.worst
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(wrong.apply, (x,), fast_mode=False)
    assert torch.autograd.gradcheck(right.apply, (x,), fast_mode=False)
    # Where backward's rows cost less (a backward row 1 us, an evaluated row 1 s), they give J·U.
    with batching_clock(Spans(17.0, 10e-6)):
        r = opcheck.gradcheck_report(right.apply, (x,), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.auto_paths == ["projected (J·U from VJP rows, fused)"], r.stats.auto_paths


def test_complex_inputs_take_the_fused_passes_through_their_real_views():
    # A complex input seen through torch.view_as_real: a function of real inputs whose Jacobian holds
    # the real and imaginary columns side by side. Its fused passes take a handful of calls where the
    # full check would take two per column; what they do not pass, the full check decides.
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20, 20, dtype=torch.complex128, generator=g).requires_grad_()
    r = opcheck.gradcheck_report(torch.sin, (z,), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["projected (J·U from forward AD, fused)"]
    assert r.stats.calls + r.stats.batched_calls + r.stats.batched_jvp_calls <= 2, r.stats
    small = opcheck.gradcheck_report(torch.sin, (z[:4, :4].detach().requires_grad_(),), fast_mode="auto")
    assert small.passed and small.stats.fused and small.stats.auto_paths == ["full"]
    for x in (z, z[:4, :4].detach().requires_grad_()):
        wrong = _sin_wrong_tail("SinComplexWrongTail", backward_wrong=lambda g: True, vmappable=True)
        r = opcheck.gradcheck_report(wrong.apply, (x,), fast_mode="auto")
        assert not r.passed and r.check == "backward" and r.stats.auto_paths[-1] == "full", r.message
        assert any(f.startswith(("projected: ", "fused: ")) for f in r.stats.fallbacks), r.stats.fallbacks
        assert r.message == opcheck.gradcheck_report(wrong.apply, (x,)).message  # the full check's words
        with pytest.raises(GradcheckError):
            torch.autograd.gradcheck(wrong.apply, (x,), fast_mode=False)


def test_a_function_that_refuses_the_real_views_goes_step_by_step():
    # The passes hand the function torch.view_as_complex of a leaf that requires grad: writing into
    # it in place raises there, where the function as given writes into its own clone. The call then
    # goes step by step on the inputs as given, with the same verdict as torch's.
    def writes_into_a_view_of_its_input(z):
        if z._base is not None:
            z.mul_(1.0)  # a view of a leaf that requires grad: autograd refuses the in-place write
        return z.sin()

    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 4, dtype=torch.complex128, generator=g).requires_grad_()
    r = opcheck.gradcheck_report(writes_into_a_view_of_its_input, (z,), fast_mode="auto")
    assert r.passed and not r.stats.fused and r.stats.auto_paths == ["full", "full"], r.stats
    assert torch.autograd.gradcheck(writes_into_a_view_of_its_input, (z,))
