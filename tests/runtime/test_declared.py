"""Declared-unsupported derivatives decided in a few calls (opcheck.runtime.declared): each of the
four cases on ops built to show it, real and complex; the same case as the engine's full check on
every declaration of the catalog; and the op calls counted, on the catalog and on a backward-only
convolution of realistic size."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch.autograd.function import once_differentiable

from opcheck.runtime import run_check
from opcheck.runtime.checks import engine_call, unsupported_outcome
from opcheck.runtime.declared import Tolerance, UnsupportedCase, forward_ad_outcome, gradgrad_outcome
from opcheck.runtime.policy import Policy
from opcheck.runtime.report import Case
from opcheck.runtime.samples import build_calls
from opcheck.runtime.tolerances import resolve_tolerances
from opcheck.spec.loader import load_specs
from opcheck.spec.model import FORWARD_AD_UNSUPPORTED, GRADGRAD_UNSUPPORTED, Location, OpSpec, Sample, TensorArg

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")

REPO = Path(__file__).resolve().parents[2]
TOL = Tolerance(eps=1e-6, atol=1e-5, rtol=1e-3)


def _x(dtype=torch.float64, shape=(4, 3)):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()


def _gen():
    return torch.Generator().manual_seed(7)


def _conv(x):
    from runtime_ops import backward_only_conv

    return backward_only_conv(x, torch.ones(2, 2, 3, 3, dtype=x.dtype) / 9)


def _cube(name: str, gradient):
    """x³ as an autograd.Function whose backward is `gradient(g, x)`."""

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return gradient(g, x)

    return type(
        name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    )


def _without_grad(g, x):
    with torch.no_grad():
        return 3 * g * x**2


# once-differentiable: double backward reaches no input; without a graph: the result requires no
# grad; with x detached: differentiable in the cotangent only, wrong in x.
_CubeOnce = _cube("_CubeOnce", once_differentiable(lambda g, x: 3 * g * x**2))
_CubeNoGrad = _cube("_CubeNoGrad", _without_grad)
_CubeDetached = _cube("_CubeDetached", lambda g, x: 3 * g * x.detach() ** 2)


@pytest.mark.parametrize(
    "fn, expected, detail",
    [
        (_conv, UnsupportedCase.RAISED, "RuntimeError: Trying to backward through opcheck_runtime_tests.conv_backward"),
        (_CubeOnce.apply, UnsupportedCase.ALL_ZERO, "the VJP of VJP along a random direction is all zero"),
        (_CubeNoGrad.apply, UnsupportedCase.ALL_ZERO, "the VJP of VJP along a random direction is all zero"),
        (_CubeDetached.apply, UnsupportedCase.WRONG, "the VJP of VJP is present but disagrees"),
        (torch.sin, UnsupportedCase.WORKS, "the VJP of VJP agrees with finite differences"),
    ],
    ids=["backward_kernel_without_autograd", "once_differentiable", "no_grad_backward", "detached_backward", "works"],
)
def test_gradgrad_outcome_tells_the_cases_apart(fn, expected, detail):
    """As torch's gradgradcheck sees them: a once-differentiable backward gives an all-zero second
    derivative there too (its error node reaches no input)."""
    outcome = gradgrad_outcome(fn, (_x(shape=(1, 2, 4, 4)),), TOL, _gen())
    assert outcome.case is expected and outcome.detail.startswith(detail), outcome


@pytest.mark.parametrize(
    "fn", [torch.sin, torch.exp, lambda z: z * z.conj(), torch.abs], ids=["sin", "exp", "abs2", "abs"]
)
def test_complex_derivatives_that_work_are_found_to_work(fn):
    """The conjugate conventions: torch's JVP is the R-linear pushforward, its VJP of a real scalar
    the gradient with dS = Re<grad, dz>, so both agree with central differences along a complex u."""
    z = _x(torch.complex128)
    assert forward_ad_outcome(fn, (z,), TOL, _gen()).case is UnsupportedCase.WORKS
    assert gradgrad_outcome(fn, (z,), TOL, _gen()).case is UnsupportedCase.WORKS


def test_a_complex_second_derivative_that_is_wrong_is_wrong():
    z = _x(torch.complex128)
    assert gradgrad_outcome(_CubeDetached.apply, (z,), TOL, _gen()).case is UnsupportedCase.WRONG
    assert gradgrad_outcome(_CubeNoGrad.apply, (z,), TOL, _gen()).case is UnsupportedCase.ALL_ZERO


def test_several_inputs_and_outputs_and_an_unused_input():
    def fn(a, b, c):
        return a * b, torch.sin(a), b.sum() * 0 + b

    inputs = (_x(), _x(shape=(4, 3)) + 1, _x(shape=(2,)))
    assert forward_ad_outcome(fn, inputs, TOL, _gen()).case is UnsupportedCase.WORKS
    assert gradgrad_outcome(fn, inputs, TOL, _gen()).case is UnsupportedCase.WORKS


class _Counted:
    """fn, counting its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@pytest.mark.parametrize("probe", [forward_ad_outcome, gradgrad_outcome], ids=["forward_ad", "gradgrad"])
def test_three_calls_of_the_op_decide(probe):
    for fn in (torch.sin, _CubeNoGrad.apply, _CubeDetached.apply):
        counted = _Counted(fn)
        probe(counted, (_x(shape=(64, 64)),), TOL, _gen())
        assert counted.calls <= 3, (fn, counted.calls)


def test_the_catalog_declarations_get_the_engines_case_in_a_few_calls():
    """Differential: on every declaration of the catalog, the few-call probe reaches the case the
    engine's fast-mode check (what the test ran before) reaches, calling the op at most 3 times."""
    compared = 0
    for spec in load_specs([REPO / "op_specs"], root=REPO):
        for check in (FORWARD_AD_UNSUPPORTED, GRADGRAD_UNSUPPORTED):
            if check not in spec.checks() or spec.requires:
                continue
            for dtype in spec.dtypes:
                for sample in spec.samples:
                    compared += _compare(spec, check, dtype, sample.name)
    assert compared >= 8  # every strided, non-empty sample of the catalog's declarations


def _compare(spec: OpSpec, check: str, dtype: str, sample: str) -> int:
    case = Case.of(spec, check, "cpu", dtype, sample)
    tol = resolve_tolerances(spec, check, "cpu", dtype, sample)
    probe = forward_ad_outcome if check == FORWARD_AD_UNSUPPORTED else gradgrad_outcome
    path = "JVP" if check == FORWARD_AD_UNSUPPORTED else "VJP of VJP"
    compared = 0
    for call in build_calls(spec, spec.sample(sample), "cpu", dtype, case.seed):
        fn, inputs = call.as_function(), call.gradcheck_inputs()
        if not inputs or any(x.layout != torch.strided for x in inputs) or sum(x.numel() for x in inputs) == 0:
            continue
        counted = _Counted(fn)
        generator = torch.Generator().manual_seed(case.seed)
        outcome = probe(counted, inputs, Tolerance(tol.eps, tol.atol, tol.rtol), generator)
        assert counted.calls <= 3, (case.id, counted.calls)
        check_fn, kwargs = engine_call(case, tol, Policy(True, "fast"))
        expected = unsupported_outcome(functools.partial(check_fn, fn, inputs, **kwargs), path)
        assert outcome.case is expected.case, (case.id, outcome, expected)
        compared += 1
    return compared


# A backward-only convolution (runtime_ops.backward_only_conv: a custom op with no forward AD, no
# double backward, no vmap rule) on a realistic sample: the declaration tests take a few calls.
CONV = OpSpec(
    name="conv",
    op="runtime_ops:backward_only_conv",
    source="op_specs/conv.yaml",
    sha256="0",
    samples=(
        Sample(
            "realistic",
            args=(TensorArg(shape=(2, 8, 16, 16)), TensorArg(shape=(8, 8, 3, 3))),
            location=Location("op_specs/conv.yaml", 5, 5),
        ),
    ),
    supports_forward_ad=False,
    supports_gradgrad=False,
)


@pytest.mark.parametrize("check", [FORWARD_AD_UNSUPPORTED, GRADGRAD_UNSUPPORTED])
def test_a_backward_only_kernel_declaration_takes_a_few_calls(check, capsys):
    import runtime_ops

    runtime_ops.CONV_CALLS[0] = 0
    run_check(CONV, check, "cpu", "float64", "realistic")
    # one call to see that the sample has a derivative to show, three to decide
    assert runtime_ops.CONV_CALLS[0] <= 4, runtime_ops.CONV_CALLS[0]
    said = capsys.readouterr().out
    expected = "all zero" if check == FORWARD_AD_UNSUPPORTED else "raised"
    assert f"opcheck {check}: {expected}:" in said, said
