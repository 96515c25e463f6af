"""fast_mode="auto" within the budget: the fused pass (opcheck/engine/auto/fused.py).

The fused pass only ever decides a pass; everything else goes to the step-by-step check. So on
every case of the differential corpus it must give the step-by-step check's verdict and first
line, and the bugs that only its own comparisons see (a plain backward that differs from the
batched one) must still fail.
"""

from __future__ import annotations

from types import SimpleNamespace

import corpus
import pytest
import test_differential
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck
from opcheck.engine.auto import fused, fused_backward
from opcheck.engine.auto.passes import output_refusal
from tests import broken_ops

AUTO = SimpleNamespace(
    name="opcheck auto",
    gradcheck=lambda *a, fast_mode=None, **k: opcheck.gradcheck(*a, fast_mode="auto", **k),
    gradgradcheck=lambda *a, fast_mode=None, **k: opcheck.gradgradcheck(*a, fast_mode="auto", **k),
)


def _without_fused_pass(monkeypatch):
    def refuse(*args, **kwargs):
        raise fused.Fallback("turned off by the test")

    monkeypatch.setattr("opcheck.engine.auto.fused_check", refuse)


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.id)
def test_fused_pass_keeps_the_step_by_step_verdict_and_first_line(case, monkeypatch):
    with_fused = test_differential.run_case(AUTO, case, "slow")
    _without_fused_pass(monkeypatch)
    step_by_step = test_differential.run_case(AUTO, case, "slow")
    assert (with_fused.verdict, with_fused.detail) == (step_by_step.verdict, step_by_step.detail)


def passing_corpus_reports():
    """auto's reports on the corpus's gradcheck cases that torch's slow mode passes; each must pass."""
    for case in corpus.CASES:
        if case.checker != "gradcheck" or case.expected_for("slow") is not True or corpus.has_layout_input(case):
            continue  # sparse and MKLDNN inputs never take the fused passes (they cannot be vmapped)
        kwargs = {k: v for k, v in case.flags.items() if k != "raise_exception"}
        r = opcheck.gradcheck_report(case.func, case.make_inputs(), fast_mode="auto", **kwargs)
        assert r.passed, r.message
        yield r


def test_corpus_passes_mostly_take_the_fused_pass():
    taken = [r.stats.fused for r in passing_corpus_reports()]
    assert len(taken) >= 10 and sum(taken) >= len(taken) // 2, taken


def _x(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def test_one_batched_backward_and_no_plain_forward_probe():
    r = opcheck.gradcheck_report(torch.sin, (_x(5, 5),), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["full"]
    # The Jacobian rows, the batched-gradient and the zero-grad_output rows in one batched backward;
    # the random cotangent twice in a plain one (reentrancy, and the tie to the batched row).
    assert r.stats.batched_vjp_calls == 1 and r.stats.vjp_calls == 2
    assert r.stats.batched_calls == 1 and r.stats.calls == 0  # finite differences: one vmapped call


def test_forward_ad_columns_and_finite_differences_share_one_call():
    r = opcheck.gradcheck_report(
        torch.sin, (_x(4, 3),), fast_mode="auto", check_forward_ad=True, check_backward_ad=False
    )
    assert r.passed and r.stats.fused
    assert r.stats.batched_jvp_calls == 1 and r.stats.jvp_calls == 1 and r.stats.batched_calls == 0


def test_forward_ad_columns_come_from_dual_tensors_under_vmap(monkeypatch):
    # The rows enter torch.func.vmap as dual tensors: torch.func.jvp is not called at all.
    def not_called(*args, **kwargs):
        raise AssertionError("torch.func.jvp")

    monkeypatch.setattr(torch.func, "jvp", not_called)
    flags = dict(check_forward_ad=True, check_backward_ad=False)
    r = opcheck.gradcheck_report(torch.cumsum, (_x(4, 3), 1), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["full"], r.stats
    assert r.stats.batched_jvp_calls == 1 and r.stats.jvp_calls == 1


def _sin_batched_without_forward_ad(name: str, jvp_off_at_tail: bool):
    """sin with a jvp and a vmap rule whose batched kernel has no forward-AD formula (an
    autograd.Function without one): dual tensors cannot go through the rule, torch.func's jvp can."""

    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(inputs[0])
        ctx.save_for_backward(inputs[0])

    def jvp(ctx, t):
        return _one_percent_off_at_the_tail(t * ctx.saved_tensors[0].cos(), jvp_off_at_tail)

    plain = dict(
        forward=lambda x: x.sin(),
        setup_context=setup_context,
        backward=lambda ctx, g: g * ctx.saved_tensors[0].cos(),
    )
    kernel = type(f"{name}Kernel", (torch.autograd.Function,), {k: staticmethod(f) for k, f in plain.items()})
    methods = dict(plain, jvp=jvp, vmap=lambda info, in_dims, x: (kernel.apply(x.movedim(in_dims[0], 0)), 0))
    return type(name, (torch.autograd.Function,), {k: staticmethod(f) for k, f in methods.items()})


def test_columns_dual_tensors_cannot_batch_come_from_torch_func_in_the_same_pass(monkeypatch):
    jvp, rows = torch.func.jvp, []
    monkeypatch.setattr(torch.func, "jvp", lambda *args, **kwargs: rows.append(1) or jvp(*args, **kwargs))
    flags = dict(check_forward_ad=True, check_backward_ad=False)
    right = _sin_batched_without_forward_ad("SinRight", jvp_off_at_tail=False)
    r = opcheck.gradcheck_report(right.apply, (_x(4, 3),), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["full"], r.stats
    assert rows == [1] and r.stats.batched_jvp_calls == 1  # one vmapped torch.func.jvp, counted once
    wrong = _sin_batched_without_forward_ad("SinJvpWrongTail", jvp_off_at_tail=True)
    with pytest.raises(GradcheckError, match="forward mode mismatch"):
        torch.autograd.gradcheck(wrong.apply, (_x(4, 3),), fast_mode=True, **flags)
    r = opcheck.gradcheck_report(wrong.apply, (_x(4, 3),), fast_mode="auto", **flags)
    assert not r.passed and "forward mode mismatch for output 0 with respect to input 0" in r.message, r.message


def test_forward_ad_of_an_empty_output_takes_the_fused_pass():
    # Columns of no element: the plain JVP's combination has nothing to round (x.repeat(0) of a
    # scalar, as OpInfo's repeat samples; gather and linear have such samples too).
    flags = dict(check_forward_ad=True, check_backward_ad=False)
    for fn, x in [(lambda a: a.repeat(0), _x(())), (lambda a: a[:, :0] * 2, _x(3, 4))]:
        r = opcheck.gradcheck_report(fn, (x,), fast_mode="auto", **flags)
        assert r.passed and r.stats.fused and not r.stats.fallbacks, r.stats
        assert torch.autograd.gradcheck(fn, (x,), **flags)


def test_a_jacobian_zero_up_to_rounding_ties_its_rows_to_the_plain_jvp():
    # normalize along a dimension of size 1 is x / |x|: its Jacobian is zero, its columns and the
    # plain JVP rounding noise of different sums, which the tie's floor (a millionth of atol) covers.
    x = _x(1, 3, 4, 5)
    fn = lambda a: torch.nn.functional.normalize(a, p=0.5, dim=0)  # noqa: E731
    flags = dict(check_forward_ad=True, check_backward_ad=False)
    r = opcheck.gradcheck_report(fn, (x,), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused and not r.stats.fallbacks, r.stats
    assert torch.autograd.gradcheck(fn, (x,), **flags)


def test_batched_forward_check_is_the_legacy_columns_probed_densely(monkeypatch):
    from opcheck.engine import aux_checks

    def not_needed(*args, **kwargs):
        raise AssertionError("the legacy-vmap columns already compared vmapped and one-at-a-time JVPs")

    monkeypatch.setattr(aux_checks, "check_batched_grad_forward_ad", not_needed)
    r = opcheck.gradcheck_report(
        torch.sin,
        (_x(4, 3),),
        fast_mode="auto",
        check_forward_ad=True,
        check_backward_ad=False,
        check_batched_forward_grad=True,
    )
    assert r.passed and r.stats.fused, r.stats.fallbacks
    assert r.stats.batched_calls == 1 and r.stats.batched_jvp_calls == 1 and r.stats.jvp_calls == 1


def _raises_under_the_legacy_vmap(tangent, derivative):
    if torch._C._functorch.is_legacy_batchedtensor(tangent):
        raise RuntimeError("no batching rule for this jvp under the legacy vmap")
    return broken_ops.right(tangent, derivative)


# sin whose jvp raises under the legacy vmap (torch.func.vmap batches it: generate_vmap_rule)
_SinNoLegacyJvp = broken_ops.SIN.function("SinNoLegacyJvp", jvp=True, jvp_bug=_raises_under_the_legacy_vmap, vmap=True)


def test_a_jvp_the_legacy_vmap_cannot_batch_fails_the_batched_forward_check_as_torchs():
    # the fused pass's columns come from torch.func's jvp after the legacy vmap raised; the
    # batched forward-AD check is the legacy vmap's, in torch as here
    x = _x(8)
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)
    with pytest.raises(GradcheckError, match="batched"):
        torch.autograd.gradcheck(_SinNoLegacyJvp.apply, (x,), **flags)
    r = opcheck.gradcheck_report(_SinNoLegacyJvp.apply, (x,), fast_mode="auto", **flags)
    assert not r.passed and r.check == "batched forward AD", r.message
    assert any(f.startswith("jvp: ") for f in r.stats.fallbacks), r.stats.fallbacks
    flags["check_batched_forward_grad"] = False  # the columns alone: one torch.func call
    r = opcheck.gradcheck_report(_SinNoLegacyJvp.apply, (x,), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused and r.stats.fallbacks == [] and r.stats.batched_jvp_calls == 1, r.stats


@pytest.mark.parametrize("op", [torch.sin, torch.exp, torch.reciprocal], ids=["sin", "exp", "reciprocal"])
def test_complex_tangents_that_are_conjugate_views_batch_under_the_legacy_vmap(op):
    # the fused pass sees complex outputs through view_as_real, which refuses a tangent that is a
    # conjugate view (sin, exp, reciprocal on complex inputs under make_dual and the legacy vmap): a
    # copy resolves it, and the columns come from the legacy vmap in one call, as torch's do
    x = torch.randn(8, dtype=torch.complex128, requires_grad=True, generator=torch.Generator().manual_seed(0))
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)
    r = opcheck.gradcheck_report(op, (x,), fast_mode="auto", **flags)
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["full"], r.stats
    assert r.stats.fallbacks == [] and r.stats.batched_jvp_calls == 1 and r.stats.jvp_calls == 1, r.stats
    assert torch.autograd.gradcheck(op, (x,), **flags)


def test_a_wrong_jvp_of_complex_inputs_still_fails_the_fused_forward_check():
    x = torch.randn(8, dtype=torch.complex128, requires_grad=True, generator=torch.Generator().manual_seed(0))
    wrong = broken_ops.EXP.function("ComplexExpWrongJvp", jvp=True, jvp_bug=broken_ops.scaled(1.01, at=-1), vmap=True)
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)
    with pytest.raises(GradcheckError) as torch_error:
        torch.autograd.gradcheck(wrong.apply, (x,), **flags)
    with pytest.raises(GradcheckError) as ours:
        opcheck.gradcheck(wrong.apply, (x,), fast_mode="auto", **flags)
    assert str(ours.value).splitlines()[0] == str(torch_error.value).splitlines()[0]


def _is_batched(t):
    return torch._C._functorch.is_legacy_batchedtensor(t) or torch._C._functorch.is_batchedtensor(t)


def _one_percent_off_at_the_tail(t: torch.Tensor, wrong: bool) -> torch.Tensor:
    if not wrong:
        return t
    scale = torch.ones(t.shape, dtype=t.dtype)  # the per-example shape, under vmap too
    scale.view(-1)[-1] = 1.01
    return t * scale


def _sin_wrong_tail(name: str, *, backward_wrong=lambda g: False, jvp_wrong=lambda t: False, vmappable=False):
    """sin whose backward (or jvp) is 1% wrong on the last element where the predicate on its
    grad_output (or tangent) holds: a batching rule's kernel that differs from the plain one.
    vmappable: torch.func.vmap may run it (generate_vmap_rule)."""

    def forward(x):
        return x.sin()

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.x = inputs[0]

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _one_percent_off_at_the_tail(g * x.cos(), backward_wrong(g))

    def jvp(ctx, t):
        return _one_percent_off_at_the_tail(t * ctx.x.cos(), jvp_wrong(t))

    methods = dict(forward=forward, setup_context=setup_context, backward=backward, jvp=jvp)
    return type(
        name,
        (torch.autograd.Function,),
        {"generate_vmap_rule": vmappable, **{k: staticmethod(f) for k, f in methods.items()}},
    )


SinPlainBackwardWrongTail = _sin_wrong_tail("SinPlainBackwardWrongTail", backward_wrong=lambda g: not _is_batched(g))
SinBatchedBackwardWrongTail = _sin_wrong_tail("SinBatchedBackwardWrongTail", backward_wrong=_is_batched)
# Right one tangent at a time and under torch.func.vmap; wrong under the legacy vmap.
SinJvpWrongTailUnderLegacyVmap = _sin_wrong_tail(
    "SinJvpWrongTailUnderLegacyVmap", jvp_wrong=torch._C._functorch.is_legacy_batchedtensor
)


def test_a_jvp_wrong_under_the_legacy_vmap_fails_the_batched_forward_check():
    x = _x(4, 3)
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)
    with pytest.raises(GradcheckError, match="batched"):
        torch.autograd.gradcheck(SinJvpWrongTailUnderLegacyVmap.apply, (x,), **flags)
    r = opcheck.gradcheck_report(SinJvpWrongTailUnderLegacyVmap.apply, (x,), fast_mode="auto", **flags)
    assert not r.passed and r.check == "batched forward AD", r.message
    flags["check_batched_forward_grad"] = False
    assert opcheck.gradcheck_report(SinJvpWrongTailUnderLegacyVmap.apply, (x,), fast_mode="auto", **flags).passed


def test_both_modes_in_one_call_share_the_finite_differences():
    r = opcheck.gradcheck_report(
        torch.mul, (_x(3, 4), _x(3, 4, seed=1)), fast_mode="auto", check_forward_ad=True, check_batched_grad=True
    )
    assert r.passed and r.stats.fused and r.stats.auto_paths == ["full", "full"]
    assert r.stats.batched_calls == 0 and r.stats.batched_jvp_calls == 1


def test_a_plain_backward_bug_that_batching_hides_is_caught():
    # The step-by-step check probes the batched rows on one row only, where this bug is 0. The op
    # cannot be vmapped: at 16 elements the fused pass still loops over its columns (at most
    # LOOP_COLUMNS_PER_INPUT), and its batched rows are tied to the plain ones.
    x = _x(4, 4)
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(SinPlainBackwardWrongTail.apply, (x,), fast_mode=False)
    r = opcheck.gradcheck_report(SinPlainBackwardWrongTail.apply, (x,), fast_mode="auto")
    assert not r.passed and r.check == "backward", r.message
    assert r.message.startswith("Jacobian mismatch for output 0 with respect to input 0,")
    assert any("batched and plain gradients differ" in f for f in r.stats.fallbacks), r.stats.fallbacks
    assert r.mismatch.worst[0].input_index == (3, 3)


def test_a_batched_only_backward_bug_fails_the_batched_gradient_check_only():
    x = _x(6, 6)
    assert torch.autograd.gradcheck(SinBatchedBackwardWrongTail.apply, (x,), fast_mode=False)
    r = opcheck.gradcheck_report(SinBatchedBackwardWrongTail.apply, (x,), fast_mode="auto")
    assert r.passed and not r.stats.fused, r.stats.fallbacks  # the loop decides: no false alarm
    with pytest.raises(GradcheckError, match="testing batched gradient computation"):
        torch.autograd.gradcheck(SinBatchedBackwardWrongTail.apply, (x,), check_batched_grad=True)
    r = opcheck.gradcheck_report(SinBatchedBackwardWrongTail.apply, (x,), fast_mode="auto", check_batched_grad=True)
    assert not r.passed and r.check == "batched backward", r.message


@pytest.mark.parametrize(
    "make",
    [
        # a conjugate view: torch.view_as_real, through which the passes see complex inputs, refuses it
        lambda: (torch.complex(_x(3), _x(3, seed=1)).conj().requires_grad_(),),
        lambda: (_x(0, 3),),  # empty
    ],
)
def test_what_the_fused_pass_does_not_take_runs_step_by_step(make):
    f = (lambda z: (z * z).real) if make()[0].is_complex() else torch.sin
    r = opcheck.gradcheck_report(f, make(), fast_mode="auto", check_forward_ad=True)
    assert r.passed
    if make()[0].is_complex():
        assert not r.stats.fused and any(f.startswith("fused:") for f in r.stats.fallbacks)
    else:
        assert r.stats.fused


@pytest.mark.parametrize("mutant", [SinPlainBackwardWrongTail, SinBatchedBackwardWrongTail], ids=lambda m: m.__name__)
def test_full_mode_keeps_torchs_verdict_when_batched_and_plain_backward_differ(mutant):
    # The batched rows' probe is a dense combination of rows, so the one-at-a-time backward (torch's
    # algorithm) decides wherever the two differ.
    x = _x(6, 6)
    try:
        want = torch.autograd.gradcheck(mutant.apply, (x,), fast_mode=False)
    except GradcheckError:
        want = False
    assert opcheck.gradcheck_report(mutant.apply, (x,), fast_mode=False).passed is want


def test_complex_outputs_are_checked_through_their_real_views():
    x = _x(4, 3)
    for kwargs in (dict(check_batched_grad=True), dict(check_forward_ad=True, check_backward_ad=False)):
        r = opcheck.gradcheck_report(torch.fft.fft, (x,), fast_mode="auto", **kwargs)
        assert r.passed and r.stats.fused, r.stats.fallbacks

    class FftWrongImagTail(torch.autograd.Function):  # backward drops the last element's imaginary part
        @staticmethod
        def forward(ctx, x):
            return torch.fft.fft(x)

        @staticmethod
        def backward(ctx, g):
            keep = torch.ones_like(g)
            keep.view(-1)[-1] = 0.5
            return torch.fft.ifft(torch.complex(g.real, g.imag * keep.real), norm="forward").real

    r = opcheck.gradcheck_report(FftWrongImagTail.apply, (x,), fast_mode="auto")
    assert not r.passed and not r.stats.fused
    assert r.message.startswith("While considering the imaginary part of complex outputs only, Jacobian mismatch")


class StatThenSin(torch.autograd.Function):
    """(mean of x, sin x), the mean a float output that does not require grad (as native_layer_norm's
    mean and rstd), before the output that does; `scale` multiplies backward (1: right)."""

    generate_vmap_rule = True
    scale = 1.0

    @staticmethod
    def forward(x):
        return x.mean(), torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[0])
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g_stat, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x) * StatThenSin.scale


def test_float_outputs_that_do_not_require_grad_stay_in_the_fused_pass_of_backward(monkeypatch):
    """torch's slow mode drops their numerical Jacobian; the fused pass computes their differences
    and compares backward's rows with the outputs that require grad only, numbered as torch does."""
    x = _x(2, 3)
    w, b = _x(3, seed=1), _x(3, seed=2)
    layer_norm = lambda x, w, b: torch.native_layer_norm(x, [3], w, b, 1e-5)  # noqa: E731
    r = opcheck.gradcheck_report(layer_norm, (x, w, b), fast_mode="auto")
    assert r.passed and r.stats.fused, r.stats.fallbacks
    _fused_and_failing_as_torch(monkeypatch, StatThenSin, x)


def _fused_and_failing_as_torch(monkeypatch, function, x):
    """`function` (with a `scale` on its backward) passes through the fused pass; scaled wrong, it
    fails with torch's verdict and first line."""
    r = opcheck.gradcheck_report(function.apply, (x,), fast_mode="auto")
    assert r.passed and r.stats.fused, r.stats.fallbacks
    monkeypatch.setattr(function, "scale", 1.1)
    with pytest.raises(GradcheckError) as theirs:
        torch.autograd.gradcheck(function.apply, (x,))
    r = opcheck.gradcheck_report(function.apply, (x,), fast_mode="auto")
    assert not r.passed and r.message.splitlines()[0] == str(theirs.value).splitlines()[0]


class SinIndexStat(torch.autograd.Function):
    """(sin x, argmax of x, mean of x): an integer output, then a float one that does not require
    grad (as linalg.lstsq's rank and singular values); `scale` multiplies backward (1: right)."""

    generate_vmap_rule = True
    scale = 1.0

    @staticmethod
    def forward(x):
        return torch.sin(x), x.argmax(), x.mean()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g, g_index, g_stat):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x) * SinIndexStat.scale


def test_an_integer_output_before_float_outputs_without_grad_stays_in_the_fused_pass(monkeypatch):
    """torch's slow mode pairs the k-th float output's differences with output k: right while every
    output that requires grad comes before the integer ones."""
    a, b = _x(2, 3), _x(2, 3, seed=1)
    r = opcheck.gradcheck_report(torch.linalg.lstsq, (a, b), fast_mode="auto")
    assert r.passed and r.stats.fused, r.stats.fallbacks
    x = _x(2, 3)
    _fused_and_failing_as_torch(monkeypatch, SinIndexStat, x)
    # an output that requires grad after an integer one is left to the step-by-step check, which
    # pairs them as torch's slow mode does (and so fails as it does)
    index_then_sin = lambda x: (x.argmax(), torch.sin(x))  # noqa: E731
    with pytest.raises(IndexError):
        torch.autograd.gradcheck(index_then_sin, (x,))
    with pytest.raises(IndexError):
        opcheck.gradcheck(index_then_sin, (x,), fast_mode="auto")
    # a float output after an integer one with other sizes: torch's slow mode fills its differences
    # with the integer output's and raises, and so do both modes; the fused pass is not tried
    sizes_differ = lambda x: (torch.sin(x), x.argmax(dim=1), x.detach().sum(dim=0))  # noqa: E731
    assert output_refusal(sizes_differ(x), all_require_grad=False).startswith("output 2 after an output")
    assert output_refusal(torch.linalg.lstsq(a, b), all_require_grad=False) is None
    with pytest.raises(RuntimeError) as theirs:
        torch.autograd.gradcheck(sizes_differ, (x,))
    for mode in (False, "auto"):
        with pytest.raises(RuntimeError) as ours:
            opcheck.gradcheck(sizes_differ, (x,), fast_mode=mode)
        assert str(ours.value) == str(theirs.value)


class SinDetachedBackward(torch.autograd.Function):
    """sin whose backward uses x detached: right first derivative, second derivative missing its x term."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x.detach()).conj()


def test_complex_inputs_of_gradgradcheck_are_batched_through_the_first_derivatives_vmap_form():
    """The real views of complex inputs keep the first derivative's vmap form (torch.func's vjp):
    its columns come from one vmapped call, not a call pair each; a wrong second derivative still
    fails with torch's first line."""
    x = torch.randn(3, 4, dtype=torch.complex128, requires_grad=True, generator=torch.Generator().manual_seed(0))
    r = opcheck.gradgradcheck_report(torch.sin, (x,), fast_mode="auto")
    assert r.passed and r.stats.fused and r.stats.calls == 0 and r.stats.batched_calls == 1, r.stats
    y = x.detach()[:, :2].requires_grad_()
    with pytest.raises(GradcheckError) as theirs:
        torch.autograd.gradgradcheck(SinDetachedBackward.apply, (y,), fast_mode=True)
    r = opcheck.gradgradcheck_report(SinDetachedBackward.apply, (y,), fast_mode="auto")
    assert not r.passed
    assert r.message.splitlines()[0] == str(theirs.value).splitlines()[0]


class AddWrongWithUndefinedTangent(torch.autograd.Function):
    """x + y whose jvp is wrong when y's tangent is undefined (None)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, y):
        return x + y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        return g, g

    @staticmethod
    def jvp(ctx, tx, ty):
        if tx is None:
            return ty
        if ty is None:
            return 2 * tx
        return tx + ty


def test_undefined_tangent_check_uses_the_fused_columns_and_still_fails():
    args = (_x(3, 2), _x(3, 2, seed=1))
    r = opcheck.gradcheck_report(
        AddWrongWithUndefinedTangent.apply, args, fast_mode="auto", check_forward_ad=True, check_backward_ad=False
    )
    with pytest.raises(GradcheckError) as torch_error:
        torch.autograd.gradcheck(
            AddWrongWithUndefinedTangent.apply, args, check_forward_ad=True, check_backward_ad=False
        )
    first, second = r.message.splitlines()[:2]
    assert not r.passed and first == str(torch_error.value).splitlines()[0], r.message
    assert "output 0's tangent when input 1 has an undefined tangent" in second, r.message
    assert any(f.startswith("fused: undefined tangent") for f in r.stats.fallbacks), r.stats.fallbacks
    right = opcheck.gradcheck_report(torch.add, args, fast_mode="auto", check_forward_ad=True, check_backward_ad=False)
    assert right.passed and right.stats.fused


def test_many_rows_come_from_torch_func_and_a_wrong_batching_rule_is_not_trusted(monkeypatch):
    legacy_calls = []
    real_legacy, real_functorch = fused_backward.legacy_rows, fused_backward.functorch_rows
    monkeypatch.setattr(fused_backward, "legacy_rows", lambda *a: legacy_calls.append(1) or real_legacy(*a))
    x = _x(8, 8)  # 64 rows >= FUNCTORCH_ROWS, 4096 entries: the full check
    r = opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto")
    assert r.passed and r.stats.fused and not legacy_calls

    # A batching rule that is off (torch.func's vmap over cdist's backward is, where rows differ):
    # the plain gradient disagrees with its row, and the legacy rows decide.
    monkeypatch.setattr(fused_backward, "functorch_rows", lambda *a: tuple(g + 1e-3 for g in real_functorch(*a)))
    r = opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto")
    assert r.passed and r.stats.fused and legacy_calls
    assert "fused: torch.func's batched backward differs from the plain one" in r.stats.fallbacks

    # With the batched-gradient check on, the legacy vmap is still what that check tests.
    legacy_calls.clear()
    monkeypatch.setattr(fused_backward, "functorch_rows", real_functorch)
    r = opcheck.gradcheck_report(torch.sin, (x,), fast_mode="auto", check_batched_grad=True)
    assert r.passed and r.stats.fused and len(legacy_calls) == 1
