"""Failures must say which check broke, which entries are wrong, and what the pattern suggests."""

from __future__ import annotations

import math
import re

import corpus
import pytest
import torch
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

import opcheck
from opcheck import GradcheckError
from opcheck.engine.reporting.diagnostics import BlockLabel, find_mismatch
from tests import broken_ops
from tests.broken_ops import square_writing_into_input


def _x(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()


def _fail(check, func, inputs, **kwargs) -> GradcheckError:
    with pytest.raises(GradcheckError) as info:
        check(func, inputs, **kwargs)
    return info.value


def _torch_first_line(check, func, inputs, **kwargs) -> str:
    with pytest.raises(TorchGradcheckError) as info:
        check(func, inputs, **kwargs)
    return str(info.value).splitlines()[0]


@pytest.mark.parametrize("fast_mode", [False, True])
def test_missing_factor_is_named(fast_mode):
    x = _x(3, 4)
    err = _fail(opcheck.gradcheck, corpus.SinMissingFactor.apply, (x,), fast_mode=fast_mode)
    m = err.mismatch
    assert err.check == "backward" and err.path == "VJP"
    assert (m.output_idx, m.input_idx) == (0, 0)
    assert m.mismatched == 12 and m.total == 144  # the diagonal of a 12x12 block
    assert any("0.5 × numerical" in h for h in m.hints)
    for e in m.worst:
        assert e.output_index == e.input_index  # elementwise op: only diagonal entries are wrong
        assert e.analytical == pytest.approx(0.5 * e.numerical, rel=1e-4)
    assert m.analytical.shape == m.numerical.shape == (12, 12)
    first = _torch_first_line(torch.autograd.gradcheck, corpus.SinMissingFactor.apply, (x,), fast_mode=fast_mode)
    assert str(err).splitlines()[0] == first
    if fast_mode:
        assert "fast mode: projected v^T J u" in str(err)


def test_sign_flip_hint():
    err = _fail(opcheck.gradcheck, corpus.CosSignFlipOldStyle.apply, (_x(5),))
    assert any("sign is flipped" in h for h in err.mismatch.hints)


def test_one_wrong_entry_on_32x32_is_located_where_fast_mode_misses_it():
    x = _x(32, 32, seed=3)
    # torch's fast mode passes this broken backward; the full check finds the single entry.
    assert torch.autograd.gradcheck(corpus.SinOneWrongEntry.apply, (x,), fast_mode=True)
    err = _fail(opcheck.gradcheck, corpus.SinOneWrongEntry.apply, (x,))
    m = err.mismatch
    assert m.mismatched == 1 and m.total == 1024 * 1024
    (entry,) = m.worst
    assert entry.input_index == entry.output_index == (0, 3)  # flat index 3 of a 32x32 input
    assert entry.analytical == pytest.approx(2 * entry.numerical, rel=1e-4)
    assert any("only one entry differs" in h for h in m.hints)
    assert len(str(err)) < 2000, "the message must not print the Jacobian"


def test_missing_conj_hint():
    z = torch.randn(4, dtype=torch.complex128, generator=torch.Generator().manual_seed(1)).requires_grad_()
    err = _fail(opcheck.gradcheck, corpus.ComplexSquareMissingConj.apply, (z,))
    assert any("conj" in h for h in err.mismatch.hints)
    assert err.mismatch.analytical.is_complex()


def test_transposed_jacobian_hint():
    x, a = _x(3, 3, seed=1), _x(3, 3, seed=2).detach()
    err = _fail(opcheck.gradcheck, lambda x: corpus.MatmulTransposedJacobianOldStyle.apply(x, a), (x,))
    assert any("transpose" in h for h in err.mismatch.hints)


def test_detached_gradient_hint():
    class Detached(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x * 2

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, grad):
            return torch.zeros_like(grad)

    err = _fail(opcheck.gradcheck, Detached.apply, (_x(4),))
    assert any("all zero" in h for h in err.mismatch.hints)


def test_broadcast_reduced_on_wrong_dim_hint():
    a, b = _x(4, 1, seed=1), _x(4, 4, seed=2)
    err = _fail(opcheck.gradcheck, corpus.BroadcastMulWrongDimSquare.apply, (a, b))
    m = err.mismatch
    assert m.input_idx == 0 and m.input_shape == (4, 1) and m.output_shape == (4, 4)
    assert any("broadcast along output dim(s) 1" in h for h in m.hints)


def test_wrong_jvp_names_forward_ad():
    x = _x(4)
    assert opcheck.gradcheck(corpus.ExpWrongJvp.apply, (x,))
    err = _fail(opcheck.gradcheck, corpus.ExpWrongJvp.apply, (x,), check_forward_ad=True)
    assert err.check == "forward AD" and err.path == "JVP"
    assert str(err).startswith("Jacobian computed with forward mode mismatch for output 0 with respect to input 0,")


def test_wrong_double_backward_names_vjp_of_vjp():
    x = _x(4)
    assert opcheck.gradcheck(corpus.SinWrongDoubleBackward.apply, (x,))
    err = _fail(opcheck.gradgradcheck, corpus.SinWrongDoubleBackward.apply, (x,))
    assert err.path == "VJP of VJP"
    assert "VJP of VJP" in str(err)
    assert err.mismatch.output_name == "grad of input 0"
    assert err.mismatch.input_name in {"input 0", "grad_output 0"}


def test_fwd_over_rev_path_is_named():
    class WrongSecondJvp(torch.autograd.Function):
        """exp with a correct backward built from ops, whose forward-over-reverse we break."""

        @staticmethod
        def forward(x):
            return x.exp()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output)
            ctx.save_for_forward(output)

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return _HalfJvpMul.apply(grad, y)

        @staticmethod
        def jvp(ctx, t):
            (y,) = ctx.saved_tensors
            return t * y

    x = _x(3)
    assert opcheck.gradcheck(WrongSecondJvp.apply, (x,))
    err = _fail(
        opcheck.gradgradcheck,
        WrongSecondJvp.apply,
        (x,),
        check_fwd_over_rev=True,
        check_rev_over_rev=False,
        check_undefined_grad=False,
    )
    assert err.path == "JVP of VJP" and err.check == "forward AD"


class _HalfJvpMul(torch.autograd.Function):
    """a * b with a correct backward and a jvp that halves a's tangent contribution."""

    @staticmethod
    def forward(a, b):
        return a * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * b, g * a

    @staticmethod
    def jvp(ctx, ta, tb):
        a, b = ctx.saved_tensors
        return 0.5 * ta * b + a * tb


def test_nondeterministic_backward_is_reentrancy():
    err = _fail(opcheck.gradcheck, corpus.SinNoisyBackwardOldStyle.apply, (_x(4),))
    assert err.check == "reentrancy"
    assert str(err).startswith("Backward is not reentrant")
    assert "nondet_tol" in str(err)


@pytest.mark.parametrize("fast_mode", [False, True, "auto"])
def test_a_backward_writing_into_its_input_says_where_the_passes_differ_and_why(fast_mode):
    err = _fail(opcheck.gradcheck, square_writing_into_input, (_x(4),), fast_mode=fast_mode)
    text = str(err)
    assert err.check == "reentrancy" and text.startswith("Backward is not reentrant")
    lines = text.splitlines()
    assert "two identical backward passes differ by up to" in lines[1] and "compared only after" in lines[1]
    assert "first pass" in lines[2] and "second pass" in lines[2]
    assert "writes into its inputs or its saved tensors" in text and "clone_inputs: true" in text


def test_undefined_grad_crash():
    err = _fail(opcheck.gradcheck, corpus.SinCosStackCrashesOnAllUndefined.apply, (_x(4),))
    assert err.check == "undefined grad_output"
    assert str(err).startswith("Expected backward function to handle undefined output grads.")


def test_batched_grad_failure():
    err = _fail(opcheck.gradcheck, corpus.ScaleByThreeItemLoop.apply, (_x(4),), check_batched_grad=True)
    assert err.check == "batched backward"
    assert str(err).startswith("While computing batched gradients")


def test_not_multiplied_by_grad_output():
    err = _fail(opcheck.gradcheck, corpus.SinNotMultipliedByGradOldStyle.apply, (_x(4),))
    assert err.check in {"backward", "zero grad_output"}


def test_report_value():
    good = opcheck.gradcheck_report(torch.sin, (_x(3, 3),))
    assert good.passed and good.error is None and good.mismatch is None and good.message == ""
    assert good.stats.batched_calls >= 1
    bad = opcheck.gradcheck_report(corpus.SinMissingFactor.apply, (_x(3),))
    assert not bad.passed and bad.check == "backward" and bad.mismatch is not None
    assert bad.message.startswith("Jacobian mismatch for output 0 with respect to input 0,")
    gg = opcheck.gradgradcheck_report(corpus.SinWrongDoubleBackward.apply, (_x(3),))
    assert not gg.passed and gg.path == "VJP of VJP"


def test_raise_exception_false_returns_false():
    assert opcheck.gradcheck(corpus.SinMissingFactor.apply, (_x(3),), raise_exception=False) is False
    assert opcheck.gradgradcheck(corpus.SinWrongDoubleBackward.apply, (_x(3),), raise_exception=False) is False


def test_error_is_torch_gradcheck_error():
    assert issubclass(GradcheckError, TorchGradcheckError)
    with pytest.raises(TorchGradcheckError, match="Jacobian mismatch for output 0"):
        opcheck.gradcheck(corpus.SinMissingFactor.apply, (_x(3),))


def test_float32_warning_says_what_to_do():
    x = _x(3, dtype=torch.float32)
    with pytest.warns(UserWarning, match=re.escape("not a double precision")) as record:
        opcheck.gradcheck(torch.sin, (x,), atol=1e-2, rtol=1e-2, eps=1e-3)
    text = " ".join(str(w.message) for w in record)
    assert "float64" in text and "low-precision" in text.lower() or "consistency check" in text


def test_input_validation_messages():
    with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
        opcheck.gradcheck(torch.sin, (torch.zeros(3, dtype=torch.double),))
    expanded = torch.zeros(3, 1, dtype=torch.double).expand(3, 4).requires_grad_()
    with pytest.raises(RuntimeError, match="stride 0"):
        opcheck.gradcheck(torch.sin, (expanded,))
    # of a sparse input, its values' strides count
    values = torch.ones(1, dtype=torch.double).expand(3)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2]]), values, (3,)).requires_grad_()
    for check in (opcheck.gradcheck, torch.autograd.gradcheck):
        with pytest.raises(RuntimeError, match="The 0th input has a dimension with stride 0"):
            check(lambda s: s.to_dense(), (sparse,))


def test_backward_ignoring_grad_output_hint():
    x = _x(4)
    report = opcheck.gradcheck_report(corpus.SinNotMultipliedByGradOldStyle.apply, (x,))
    assert not report.passed and report.mismatch is not None
    assert any("ignores grad_output" in h for h in report.mismatch.hints)


def test_no_grad_backward_hint_names_once_differentiable():
    class NoGradBackward(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x.sin()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with torch.no_grad():
                return g * x.cos()

    x = _x(4)
    assert opcheck.gradcheck(NoGradBackward.apply, (x,))
    err = _fail(opcheck.gradgradcheck, NoGradBackward.apply, (x,))
    assert err.check == "no differentiable outputs" and err.path == "VJP of VJP"
    assert str(err).startswith("Numerical gradient for function expected to be zero")
    assert "once_differentiable" in str(err) and "supports_gradgrad: false" in str(err)


def _hint_with(text, hints):
    return [h for h in hints if text in h]


def test_error_along_one_column_of_the_input_is_named():
    x = _x(4, 5, seed=4)
    assert opcheck.gradcheck(broken_ops.SinColumnThreeRight.apply, (x,))
    err = _fail(opcheck.gradcheck, broken_ops.SinColumnThreeWrong.apply, (x,))
    first = _torch_first_line(torch.autograd.gradcheck, broken_ops.SinColumnThreeWrong.apply, (x,))
    assert str(err).splitlines()[0] == first
    (hint,) = _hint_with("every wrong entry has", err.mismatch.hints)
    assert "input index [:, 3] (column 3 of input 0)" in hint
    assert "output index [:, 3] (column 3 of output 0)" in hint
    assert not _hint_with("one entry", err.mismatch.hints)
    assert f"hint: {hint}" in str(err)


def test_error_in_one_output_element_names_it_and_the_input_row():
    x = _x(4, 5, seed=5)
    assert opcheck.gradcheck(broken_ops.RowSumOneRowRight.apply, (x,))
    err = _fail(opcheck.gradcheck, broken_ops.RowSumOneRowWrong.apply, (x,))
    assert str(err).splitlines()[0] == _torch_first_line(
        torch.autograd.gradcheck, broken_ops.RowSumOneRowWrong.apply, (x,)
    )
    hints = err.mismatch.hints
    assert "all wrong entries belong to output element [2]" in hints
    assert "every wrong entry has input index [2, :] (row 2 of input 0)" in hints


@pytest.mark.parametrize("fast_mode", [False, True])
def test_wrong_everywhere_names_no_index(fast_mode):
    err = _fail(opcheck.gradcheck, corpus.SinMissingFactor.apply, (_x(4, 5),), fast_mode=fast_mode)
    hints = err.mismatch.hints
    assert not _hint_with("every wrong entry has", hints) and not _hint_with("belong to", hints)
    assert not _hint_with("swapped", hints)


def _block(f, inputs, j):
    """d f / d inputs[j] laid out as gradcheck lays it out: one row per input element."""
    jac = torch.autograd.functional.jacobian(f, tuple(x.detach() for x in inputs))[j]
    return jac.reshape(-1, inputs[j].numel()).t()


def _label(input_idx):
    return BlockLabel("backward", "VJP", 0, input_idx, "output 0", f"input {input_idx}", None)


def test_swapped_gradients_are_named_given_every_inputs_numerical_block():
    a, b = _x(3, 4, seed=6), _x(3, 4, seed=7)
    assert opcheck.gradcheck(broken_ops.MulGradients.apply, (a, b))
    err = _fail(opcheck.gradcheck, broken_ops.MulSwappedGradients.apply, (a, b))
    assert str(err).splitlines()[0] == _torch_first_line(
        torch.autograd.gradcheck, broken_ops.MulSwappedGradients.apply, (a, b)
    )
    numerical = [_block(torch.mul, (a, b), j) for j in (0, 1)]
    for j in (0, 1):
        analytical = _block(broken_ops.MulSwappedGradients.apply, (a, b), j)
        m = find_mismatch(
            analytical,
            numerical[j],
            rtol=1e-3,
            atol=1e-5,
            label=_label(j),
            shapes=((3, 4), (3, 4)),
            numerical_of_inputs=numerical,
        )
        assert m.hints == (
            f"the gradient for input {j} matches input {1 - j}'s numerical gradient: are the returned "
            "gradients swapped?",
        )


def test_a_wrong_gradient_is_not_called_swapped():
    a, b = _x(3, 4, seed=6), _x(3, 4, seed=7)
    numerical = [_block(torch.mul, (a, b), j) for j in (0, 1)]
    wrong = 0.5 * numerical[0]
    m = find_mismatch(
        wrong,
        numerical[0],
        rtol=1e-3,
        atol=1e-5,
        label=_label(0),
        shapes=((3, 4), (3, 4)),
        numerical_of_inputs=numerical,
    )
    assert not _hint_with("swapped", m.hints) and _hint_with("0.5 × numerical", m.hints)
    # an input the output does not depend on (all-zero numerical block) matches nothing
    zero = torch.zeros_like(numerical[0])
    m = find_mismatch(
        zero,
        numerical[0],
        rtol=1e-3,
        atol=1e-5,
        label=_label(0),
        shapes=((3, 4), (3, 4)),
        numerical_of_inputs=[numerical[0], zero],
    )
    assert not _hint_with("swapped", m.hints) and _hint_with("all zero", m.hints)


def test_swapped_gradients_are_named_by_gradcheck():
    a, b = _x(3, 4, seed=6), _x(3, 4, seed=7)
    err = _fail(opcheck.gradcheck, broken_ops.MulSwappedGradients.apply, (a, b))
    assert _hint_with("are the returned gradients swapped?", err.mismatch.hints)


@pytest.mark.parametrize("probe", [64, 0])  # 0: every hypothesis is tried on the whole block only
def test_a_hypothesis_that_holds_on_the_failing_entries_only_gives_no_hint(probe, monkeypatch):
    from opcheck.engine.reporting import hints as block_hints

    monkeypatch.setattr(block_hints, "PROBE_ENTRIES", probe)
    n = _x(10, 10, seed=8).detach()

    def hints(a):
        return find_mismatch(a, n, rtol=1e-3, atol=1e-5, label=_label(0), shapes=((10,), (10,))).hints

    assert _hint_with("2 × numerical everywhere", hints(2 * n))
    row_doubled = n.clone()
    row_doubled[3] *= 2  # every failing entry is twice the numerical one, the other rows are right
    assert not _hint_with("× numerical everywhere", hints(row_doubled))
    assert _hint_with("all wrong entries belong to input element [3]", hints(row_doubled))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("side", ["analytical", "numerical"])
def test_a_nonfinite_entry_is_the_one_listed_and_named_on_its_side(dtype, value, side):
    n = _x(6, 5, seed=9, dtype=dtype).detach()
    a = n.clone()
    (a if side == "analytical" else n)[4, 2] = value
    m = find_mismatch(a, n, rtol=1e-3, atol=1e-5, label=_label(0), shapes=((6,), (5,)))
    assert m.mismatched == 1 and [(e.input_index, e.output_index) for e in m.worst] == [((4,), (2,))]
    assert m.mismatched == int((~torch.isclose(a, n, rtol=1e-3, atol=1e-5)).sum())
    assert m.hints[0].startswith(f"the {side} Jacobian has NaN or inf entries"), m.hints


def test_an_inf_matched_by_the_same_inf_is_not_a_mismatch():
    n = _x(6, 5, seed=10).detach()
    n[1, 1] = math.inf
    a = n.clone()
    a[0, 0] += 1.0
    m = find_mismatch(a, n, rtol=1e-3, atol=1e-5, label=_label(0), shapes=((6,), (5,)))
    assert m.mismatched == 1 and [(e.input_index, e.output_index) for e in m.worst] == [((0,), (0,))]


@pytest.mark.parametrize("view", ["expanded column", "transposed"])
def test_hypotheses_about_views_are_probed_without_copying_them(view, monkeypatch):
    # close() indexes a view by row and column on the failing entries; the hint is the same
    from opcheck.engine.reporting import hints as block_hints

    n = _x(40, 40, seed=11).detach()
    a = n[:, :1].expand_as(n).clone() if view == "expanded column" else n.t().clone()
    hints = {}
    for probe in (64, 0):
        monkeypatch.setattr(block_hints, "PROBE_ENTRIES", probe)
        hints[probe] = find_mismatch(a, n, rtol=1e-3, atol=1e-5, label=_label(0), shapes=((40,), (40,))).hints
    assert hints[64] == hints[0]
    assert _hint_with("ignores grad_output" if view == "expanded column" else "transpose", hints[64])
