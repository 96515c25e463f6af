"""forward_ad_unsupported on a torch.library custom op, and the hint for a zero JVP.

A custom op with register_autograd and no jvp does not make forward AD raise: its outputs carry
no tangent, which a gradient check reads as an all-zero JVP. `supports_forward_ad: false` must
pass on it and say so; `check_forward_ad: true` must fail with a hint that names the missing
forward-mode formula, not a detached output, while a backward-mode zero keeps the detach hint.
"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import opcheck
from opcheck.runtime import Settings, UnsupportedButWorks, run_check
from opcheck.runtime.context import ItemContext, current_item
from opcheck.runtime.declared import Tolerance, UnsupportedCase, forward_ad_outcome
from opcheck.spec.model import GradcheckFlags, Location, OpSpec, Sample, TensorArg

# torch scripts its forward-AD decompositions on first use, warning once per function; run_check
# silences it, the engine calls here do not.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

VEC = Sample("vec", args=(TensorArg(shape=(5,)),), location=Location("op_specs/x.yaml", 7, 5))
CUSTOM_SIN = "torch.ops.opcheck_fwad_test.sin.default"


@torch.library.custom_op("opcheck_fwad_test::sin", mutates_args=())
def custom_sin(x: torch.Tensor) -> torch.Tensor:
    """sin with a right backward (register_autograd) and, as every torch.library custom op, no jvp."""
    return torch.sin(x)


@custom_sin.register_fake
def _(x):
    return torch.empty_like(x)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x)


custom_sin.register_autograd(_sin_backward, setup_context=_save_input)


class _SinRaisingJvp(torch.autograd.Function):
    """sin without a jvp: torch raises NotImplementedError under forward AD."""

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)


def _sin_with_jvp(factor: float):
    """sin whose jvp is present and `factor` times the right one."""

    class SinScaledJvp(_SinRaisingJvp):
        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def jvp(ctx, tangent):
            (x,) = ctx.saved_tensors
            return factor * tangent * torch.cos(x)

    return SinScaledJvp.apply


sin_wrong_jvp = _sin_with_jvp(2.0)


def spec(op, **kw):
    return OpSpec(name="x", op=op, source="op_specs/x.yaml", sha256="0", samples=(VEC,), **kw)


def _reported(s: OpSpec) -> str:
    """Run forward_ad_unsupported under an item, as the plugin does, and return what it reported."""
    nodeid = "generated_tests/test_x.py::test_forward_ad_unsupported[cpu-float64-vec]"
    item = ItemContext(nodeid=nodeid, rerun=f"pytest '{nodeid}'", settings=Settings())
    token = current_item.set(item)
    try:
        run_check(s, "forward_ad_unsupported", "cpu", "float64", "vec")
    finally:
        current_item.reset(token)
    (text,) = [value for name, value in item.user_properties if name == "opcheck_unsupported"]
    return text


def _x():
    return torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()


def _forward_outcome(fn, x):
    """What forward_ad_unsupported decides for `fn` at `x`, at float64's gradient tolerances."""
    return forward_ad_outcome(fn, (x,), Tolerance(eps=1e-6, atol=1e-5, rtol=1e-3), torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------ the premise
def test_the_custom_op_gives_no_tangent_and_a_right_backward():
    """What the rest relies on: torch neither raises nor computes a tangent, and backward is right."""
    x = _x()
    with fwAD.dual_level():
        out = custom_sin(fwAD.make_dual(x.detach(), torch.ones_like(x)))
        assert fwAD.unpack_dual(out).tangent is None
    assert opcheck.gradcheck(custom_sin, (x,))


# ------------------------------------------------------------------------------------ which case held
@pytest.mark.parametrize(
    "fn, expected",
    [
        (_SinRaisingJvp.apply, UnsupportedCase.RAISED),
        (custom_sin, UnsupportedCase.ALL_ZERO),
        (sin_wrong_jvp, UnsupportedCase.WRONG),
        (torch.sin, UnsupportedCase.WORKS),
    ],
    ids=["raises", "custom_op_no_tangent", "wrong_jvp", "works"],
)
def test_unsupported_outcome_tells_the_cases_apart(fn, expected):
    outcome = _forward_outcome(fn, _x())
    assert outcome.case is expected
    if expected is UnsupportedCase.RAISED:
        assert outcome.detail.startswith("NotImplementedError: You must implement the jvp function")
    if expected is UnsupportedCase.ALL_ZERO:
        assert "all zero (the outputs carry no tangent, or a zero one)" in outcome.detail


def test_a_small_but_present_jvp_is_wrong_not_all_zero():
    """ALL_ZERO means zero within atol: a JVP a thousand times too small (still above atol) is there."""
    outcome = _forward_outcome(_sin_with_jvp(1e-3), _x())
    assert outcome.case is UnsupportedCase.WRONG
    below_atol = _forward_outcome(_sin_with_jvp(1e-7), _x())
    assert below_atol.case is UnsupportedCase.ALL_ZERO


def test_custom_op_declared_unsupported_passes_and_reports_no_tangent(capsys):
    text = _reported(spec(CUSTOM_SIN, supports_forward_ad=False))
    assert text.startswith("all zero: the JVP of output 0 along a random direction is all zero (the outputs carry no")
    assert "opcheck forward_ad_unsupported: all zero:" in capsys.readouterr().out


def test_raising_op_declared_unsupported_reports_that_it_raised():
    text = _reported(spec("runtime_ops:sin_without_jvp", supports_forward_ad=False))
    assert text.startswith("raised: NotImplementedError")


def test_wrong_jvp_declared_unsupported_still_passes():
    """The declaration takes forward AD out of scope: a present but wrong JVP passes (FORMAT.md)."""
    text = _reported(spec("runtime_ops:square_wrong_jvp", supports_forward_ad=False))
    assert text.startswith("wrong: the JVP is present but disagrees with finite differences along a random direction")


def test_working_forward_ad_declared_unsupported_fails_and_says_what_it_tried():
    with pytest.raises(UnsupportedButWorks) as info:
        run_check(spec("torch.sin", supports_forward_ad=False), "forward_ad_unsupported", "cpu", "float64", "vec")
    text = str(info.value)
    assert "declares `supports_forward_ad: false`, but forward-mode AD (JVP) of torch.sin works" in text
    assert "neither raised nor left the outputs without a tangent, and it agrees with finite differences" in text
    assert "one random direction against central differences" in text


# ------------------------------------------------------------------------------------ the zero-JVP hint
def _hints(info) -> list[str]:
    return [line for line in str(info.value).splitlines() if line.startswith("hint: ")]


@pytest.mark.parametrize("fast_mode", ["auto", "true", "false"])
def test_check_forward_ad_on_a_custom_op_names_the_missing_forward_formula(fast_mode):
    s = spec(CUSTOM_SIN, gradcheck=GradcheckFlags(fast_mode=fast_mode, check_forward_ad=True))
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(s, "forward_ad", "cpu", "float64", "vec")
    text = str(info.value)
    engine_report = text.split("engine report:\n", 1)[1]
    assert engine_report.startswith("Jacobian computed with forward mode mismatch for output 0 with respect to input 0")
    hints = _hints(info)
    assert any("the JVP is all zero" in h and "no forward-mode formula" in h for h in hints), hints
    assert any("registers no jvp" in h and "supports_forward_ad: false" in h for h in hints), hints
    assert not any(".detach()" in h or "backward returns" in h for h in hints), hints


def _detached_mul(x, y):
    return x.detach() * y


def test_a_detached_output_in_backward_mode_keeps_the_detach_hint():
    """The twin: the same all-zero block from backward names .detach(), not a forward formula."""
    x, y = _x(), _x().detach().add(1).requires_grad_()
    with pytest.raises(opcheck.GradcheckError) as info:
        opcheck.gradcheck(_detached_mul, (x, y), check_batched_grad=False)
    assert str(info.value).startswith("Jacobian mismatch for output 0 with respect to input 0")
    hints = info.value.mismatch.hints
    assert any("all zero" in h and ".detach()" in h for h in hints), hints
    assert not any("forward-mode formula" in h for h in hints), hints


def test_the_same_detached_output_in_forward_mode_gets_the_jvp_hint():
    x, y = _x(), _x().detach().add(1).requires_grad_()
    with pytest.raises(opcheck.GradcheckError) as info:
        opcheck.gradcheck(
            _detached_mul, (x, y), check_forward_ad=True, check_backward_ad=False, check_batched_grad=False
        )
    assert str(info.value).startswith(
        "Jacobian computed with forward mode mismatch for output 0 with respect to input 0"
    )
    hints = info.value.mismatch.hints
    assert any("the JVP is all zero" in h for h in hints) and not any(".detach()" in h for h in hints), hints
