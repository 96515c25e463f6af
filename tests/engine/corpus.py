"""A corpus of gradient-checker test cases with their verdicts under torch 2.13.

Each :class:`Case` bundles a function, a factory for fresh inputs, the checker
to run (``gradcheck`` or ``gradgradcheck``), extra keyword flags and the
verdict that ``torch.autograd.gradcheck``/``gradgradcheck`` really returns.
``tests/engine/test_differential.py`` runs every case through torch *and*
opcheck and asserts the verdicts agree with each other and with this file, so
the expectations below document torch's actual behaviour (including a few
surprises, which the comments point out).

A verdict is one of

* ``True``   -- the checker passed (returned True);
* ``False``  -- the checker failed with ``GradcheckError`` (or returned False
  when ``raise_exception=False``);
* a string   -- the class name of any other exception the checker let escape
  (``"RuntimeError"``, ``"TypeError"``, ``"AssertionError"``, ...).

Rules for cases: inputs are built from a local ``torch.Generator`` with a
fixed seed (never the global RNG), every ``make_inputs()`` call returns brand
new tensors, and inputs stay tiny (at most ~64 elements, except the one 32x32
case) so the differential test runs in seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from tests.broken_ops import (
    COS,
    EXP,
    SIN,
    Elementwise,
    assumes_grad_sin_when_grad_cos_is_undefined,
    broadcast_mul,
    conj_missing,
    function,
    ignores_grad_output,
    noisy_derivative,
    plus_noise,
    rescaled,
    returned_as,
    save_inputs,
    scaled,
    sin_cos,
    stacks_defined_terms,
    summed_over_dim0,
    summed_over_dim0_transposed,
    with_backward_function,
    written_into_zeros,
)

Verdict = bool | str
MODES = ("slow", "fast")


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    make_inputs: Callable[[], Any]
    func: Callable[..., Any]
    # Verdict in slow mode, and in fast mode unless ``expected_fast`` is given.
    expected: Verdict
    checker: str = "gradcheck"  # or "gradgradcheck"
    flags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Only when torch's fast mode disagrees with its slow mode.
    expected_fast: Verdict | None = None
    # gradgradcheck only: factory for explicit grad_outputs (None: let the checker draw them).
    make_grad_outputs: Callable[[], Any] | None = None
    # Set to a reason to skip fast mode for this case.
    slow_only: str | None = None
    # Warning category both checkers must emit (e.g. for float32 inputs).
    warns: type[Warning] | None = None

    def __post_init__(self):
        # Freeze the flags too, so a test cannot mutate a shared case by accident.
        object.__setattr__(self, "flags", MappingProxyType(dict(self.flags)))
        if self.checker not in ("gradcheck", "gradgradcheck"):
            raise ValueError(f"{self.id}: unknown checker {self.checker!r}")

    def expected_for(self, mode: str) -> Verdict:
        if mode == "fast" and self.expected_fast is not None:
            return self.expected_fast
        return self.expected

    def modes(self) -> tuple[str, ...]:
        return ("slow",) if self.slow_only else MODES


# --------------------------------------------------------------------------
# Input helpers: every call makes new tensors from a private, seeded generator.
# --------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int, dtype=torch.float64, requires_grad=True) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed), dtype=dtype).requires_grad_(requires_grad)


def _rand(*shape, seed: int, low=0.0, high=1.0, dtype=torch.float64, requires_grad=True):
    t = torch.rand(shape, generator=_gen(seed), dtype=dtype) * (high - low) + low
    return t.requires_grad_(requires_grad)


def _complex(*shape, seed: int, requires_grad=True) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed), dtype=torch.complex128).requires_grad_(requires_grad)


def _sparse(
    *shape,
    seed: int,
    layout=torch.sparse_coo,
    density=0.5,
    blocksize=None,
    dense_dim=0,
    dtype=torch.float64,
    requires_grad=True,
) -> torch.Tensor:
    """A sparse tensor of the layout whose specified values are random (about `density` of them)."""
    g = _gen(seed)
    values = torch.randn(shape, generator=g, dtype=dtype)
    keep = torch.rand(shape[: len(shape) - dense_dim], generator=g) < density
    dense = values * keep.reshape(keep.shape + (1,) * dense_dim)
    if layout == torch.sparse_coo:
        t = dense.to_sparse(len(shape) - dense_dim)
    else:
        t = dense.to_sparse(layout=layout, blocksize=blocksize, dense_dim=dense_dim or None)
    return t.requires_grad_(requires_grad)


def has_layout_input(case: Case) -> bool:
    """Whether a case has a sparse or MKLDNN input (checked through dense stand-ins, in loops)."""
    inputs = case.make_inputs()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in inputs)


def _uncoalesced_coo(seed: int) -> torch.Tensor:
    values = torch.randn(5, generator=_gen(seed), dtype=torch.float64)
    indices = torch.tensor([[0, 1, 0, 2, 1], [1, 2, 1, 0, 2]])  # (0, 1) and (1, 2) twice
    return torch.sparse_coo_tensor(indices, values, (3, 3)).requires_grad_()


def _mkldnn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed)).to_mkldnn().requires_grad_()


_MKLDNN_TOLERANCES = dict(atol=4e-1, rtol=1e-2)


# --------------------------------------------------------------------------
# Correct custom autograd.Functions (built from the parts in tests/broken_ops.py).
# --------------------------------------------------------------------------

# Correct modern-style Function with backward, jvp and an auto vmap rule.
CubeWithJvpAndVmap = Elementwise(lambda x: x**3, lambda x: 3 * x * x).function(
    "CubeWithJvpAndVmap", jvp=True, vmap=True
)


def _three_times_by_items(ctx, grad):
    flat = grad.reshape(-1)
    out = torch.empty_like(flat)
    for i in range(flat.numel()):
        out[i] = flat[i].item() * 3
    return out.view_as(grad)


# Correct, but the backward walks the gradient with a Python loop and .item(). Fine for ordinary
# autograd; vmap (check_batched_grad) cannot batch aten::item.
ScaleByThreeItemLoop = function("ScaleByThreeItemLoop", lambda x: x * 3, _three_times_by_items)

TIMES_THREE = Elementwise(lambda x: x * 3, lambda x: torch.full_like(x, 3.0))

# Correct, but backward writes the gradient in place into a fresh plain tensor. Under vmap the
# gradient is batched while the destination is not, which the legacy vmap used by check_batched_grad
# rejects.
ScaleByThreeInplaceIntoFresh = TIMES_THREE.function("ScaleByThreeInplaceIntoFresh", bug=written_into_zeros("add_"))

# z -> z*z. PyTorch's convention needs grad * conj(2z).
COMPLEX_SQUARE = Elementwise(lambda z: z * z, lambda z: (2 * z).conj())

# The fixed version of ComplexSquareMissingConj (control case).
ComplexSquareCorrect = COMPLEX_SQUARE.function("ComplexSquareCorrect")


# --------------------------------------------------------------------------
# Deliberately broken custom autograd.Functions.
# --------------------------------------------------------------------------

# Modern style; backward forgets a factor (returns half the derivative).
SinMissingFactor = SIN.function("SinMissingFactor", bug=scaled(0.5))
# Old style (forward(ctx, x)); d/dx cos x = -sin x but backward returns +sin x.
CosSignFlipOldStyle = COS.function("CosSignFlipOldStyle", old_style=True, bug=scaled(-1))
# Backward is right except one input-gradient entry ([0, 3], flat index 3) is doubled.
SinOneWrongEntry = SIN.function("SinOneWrongEntry", bug=scaled(2.0, at=(0, 3)))
# Like SinOneWrongEntry but the entry is only 1% off: slow mode sees it, fast mode may not.
SinOneSlightlyWrongEntry = SIN.function("SinOneSlightlyWrongEntry", bug=scaled(1.01, at=(0, 3)))
# z -> z*z whose backward returns grad * 2z.
ComplexSquareMissingConj = COMPLEX_SQUARE.function("ComplexSquareMissingConj", bug=conj_missing())
# 2x, right values, but backward returns a sparse gradient for a dense input.
DoubleWithSparseGrad = Elementwise(lambda x: x * 2, 2).function(
    "DoubleWithSparseGrad", old_style=True, bug=returned_as(torch.Tensor.to_sparse)
)


def _three_times_one_value_wrong(ctx, g):
    (s,) = ctx.saved_tensors
    s = s.coalesce()
    values = rescaled(g[tuple(s.indices())] * 3, 1.5, at=-1)  # the last specified element's gradient is off
    return torch.sparse_coo_tensor(s.indices(), values, s.shape)


# 3x the values of a sparse COO input, densified; backward is wrong on one specified value.
SparseScaleOneValueWrong = function(
    "SparseScaleOneValueWrong",
    lambda s: s.to_dense() * 3,
    _three_times_one_value_wrong,
    setup=save_inputs,
    old_style=True,
)
# 3x a sparse input, densified; backward returns a dense gradient (right at every position).
SparseScaleDenseGrad = Elementwise(lambda s: s.to_dense() * 3, 3).function("SparseScaleDenseGrad", old_style=True)
# 2x an MKLDNN input, densified; backward returns 3x.
MkldnnDoubleWrongBackward = Elementwise(lambda m: m.to_dense() * 2, 3).function(
    "MkldnnDoubleWrongBackward", old_style=True, bug=returned_as(torch.Tensor.to_mkldnn)
)


def _mixed_dtype_wrong_backward(ctx, g):
    x, y = ctx.saved_tensors
    return g * y.double(), (g * x * 1.5).float()


# x (float64) * y (float32); y's gradient is 1.5 times too large.
MixedDtypeWrongBackward = function(
    "MixedDtypeWrongBackward",
    lambda x, y: x * y.double(),
    _mixed_dtype_wrong_backward,
    setup=save_inputs,
    old_style=True,
)
# Backward is correct; the forward-mode jvp is off by a factor of 2.
ExpWrongJvp = EXP.function("ExpWrongJvp", jvp=True, jvp_bug=scaled(2))
# Mirror image of ExpWrongJvp: jvp right, backward off by a factor of 2.
ExpWrongBackwardRightJvp = EXP.function("ExpWrongBackwardRightJvp", jvp=True, bug=scaled(2))
# Real function whose jvp returns a complex tangent (a dtype bug).
ExpComplexJvp = EXP.function("ExpComplexJvp", jvp=True, jvp_bug=returned_as(lambda t: t.to(torch.complex128)))
# Its backward computes grad * cos(x) (right) but differentiates it wrongly (sign of -sin lost).
SinWrongDoubleBackward = with_backward_function(SIN, "SinWrongDoubleBackward", input_bug=scaled(-1))
# Old style with @once_differentiable: the backward itself is not differentiable.
SinOnceDifferentiable = SIN.function("SinOnceDifferentiable", old_style=True, once_differentiable=True)
# Two outputs, grads not materialized. Copes with one None grad, but when both are None it
# stacks an empty list -> RuntimeError inside backward.
SinCosStackCrashesOnAllUndefined = sin_cos("SinCosStackCrashesOnAllUndefined", stacks_defined_terms)
# Same idea, but the all-undefined path does None * Tensor -> TypeError, which is not a
# RuntimeError, so torch does not convert it to GradcheckError.
SinCosNoneArithmeticOnAllUndefined = sin_cos(
    "SinCosNoneArithmeticOnAllUndefined", assumes_grad_sin_when_grad_cos_is_undefined
)

_NOISE_GENERATOR = torch.Generator().manual_seed(1234)


def _noise_like(x):
    return torch.rand(x.shape, generator=_NOISE_GENERATOR, dtype=x.dtype) * 1e-8


# Old style; the derivative carries ~1e-8 of fresh noise on every backward call (nondeterminism),
# still scaled by grad_output so a zero grad gives a zero grad.
SinNoisyBackwardOldStyle = SIN.function("SinNoisyBackwardOldStyle", old_style=True, bug=noisy_derivative(_noise_like))
# Like SinNoisyBackwardOldStyle but the noise is added *after* scaling by grad_output, so a zero
# grad_output yields a (tiny) non-zero input grad.
SinAdditiveNoiseBackwardOldStyle = SIN.function(
    "SinAdditiveNoiseBackwardOldStyle", old_style=True, bug=plus_noise(_noise_like)
)
# (3,1) * (3,4): grad of the first operand summed over dim 0 instead of dim 1. With keepdim the
# bogus grad has shape (1,4), which the autograd engine itself rejects as not broadcast-compatible
# with (3,1).
BroadcastMulWrongDimOldStyle = broadcast_mul("BroadcastMulWrongDimOldStyle", summed_over_dim0, old_style=True)
# (4,1) * (4,4): same wrong reduction, transposed back to (4,1) so shapes are valid and only the
# values are wrong.
BroadcastMulWrongDimSquare = broadcast_mul("BroadcastMulWrongDimSquare", summed_over_dim0_transposed)
# x @ A with square A; backward returns grad @ A instead of grad @ A.T.
MatmulTransposedJacobianOldStyle = function(
    "MatmulTransposedJacobianOldStyle",
    lambda x, a: x @ a,
    lambda ctx, grad: (grad @ ctx.saved_tensors[0], None),
    setup=lambda ctx, inputs, output: ctx.save_for_backward(inputs[1]),
    old_style=True,
)
# Backward ignores grad_output and always returns cos(x).
SinNotMultipliedByGradOldStyle = SIN.function("SinNotMultipliedByGradOldStyle", old_style=True, bug=ignores_grad_output)
# Backward returns a float32 gradient for a float64 input.
SinFloat32Grad = SIN.function("SinFloat32Grad", bug=returned_as(torch.Tensor.float))


def _under_legacy_vmap(t):
    """Whether t is batched by the legacy vmap, as torch's batched-gradient checks batch it."""
    return torch._C._functorch.is_legacy_batchedtensor(t)


class SinBackwardDoubledUnderVmap(torch.autograd.Function):
    """sin, whose backward is right one grad_output at a time and doubled under the legacy vmap."""

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos() * (2 if _under_legacy_vmap(g) else 1)


class ExpJvpDoubledUnderVmap(torch.autograd.Function):
    """exp, whose jvp is right one tangent at a time and doubled under the legacy vmap."""

    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(output)
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0]

    @staticmethod
    def jvp(ctx, t):
        return t * ctx.saved_tensors[0] * (2 if _under_legacy_vmap(t) else 1)


class ExpItemInJvp(torch.autograd.Function):
    """exp, whose jvp reads its tangent's values (.item() per element): vmap over it raises."""

    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(output)
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0]

    @staticmethod
    def jvp(ctx, t):
        scale = torch.tensor([v.item() for v in t.reshape(-1)], dtype=t.dtype).reshape(t.shape)
        return scale * ctx.saved_tensors[0]


class SinNonzeroForUndefinedGrad(torch.autograd.Function):
    """sin, whose backward returns cos(x) for an undefined grad_output (as if it were ones)."""

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return x.cos() if g is None else g * x.cos()


class AddJvpDoublesWhenOneTangentUndefined(torch.autograd.Function):
    """x + y, whose jvp doubles x's tangent when y's is undefined (a zero tangent gives x's)."""

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
        return 2 * tx if ty is None else tx + ty


class ComplexSquareWrongJvp(torch.autograd.Function):
    """z * z on a complex input: backward right, jvp 3 z t instead of 2 z t."""

    @staticmethod
    def forward(z):
        return z * z

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(*inputs)
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return g * (2 * z).conj()

    @staticmethod
    def jvp(ctx, t):
        (z,) = ctx.saved_tensors
        return 3 * z * t


# --------------------------------------------------------------------------
# Plain functions used by the cases.
# --------------------------------------------------------------------------


def _constant_then_wrong_jvp(x):
    return torch.zeros_like(x), ExpWrongJvp.apply(x)


def _lstsq_gelsy(a, b):
    # outputs: solution, residuals (empty), rank (int64), singular values (empty)
    return torch.linalg.lstsq(a, b, driver="gelsy")


def _sparse_matmul(s, w):
    return s @ w


def _hybrid_sum_sq(s):
    return (s.to_dense(masked_grad=False) ** 2).sum(-1)


def _dense_times_sparse(d, s):
    return d * s.to_dense(masked_grad=False) + torch.sin(d)


def _sparse_to_dense_sq(s):
    return s.to_dense(masked_grad=False) ** 2


def _exp_times_x(x):
    return torch.exp(x) * x


def _broadcast_add_mul(a, b):
    return a + b, a * b


def _max_with_indices(x):
    # torch.return_types.max is a tuple subclass: (values, integer indices).
    return torch.max(x, dim=1)


def _tuple_outputs(x, y):
    return (x * y, x + y.sin())


def _list_outputs(x, y):
    return [x.exp(), (x * y).sum()]


def _nontensor_args(x, n, maybe, mode, y):
    # n: int, maybe: None, mode: str -- all passed through untouched.
    assert maybe is None
    out = x.pow(n) + y
    return out.sum(1) if mode == "sum" else out


def _norm_ord_3_5(x):
    return torch.linalg.norm(x, 3.5)


def _argmax_only(x):
    return torch.argmax(x, dim=0)


def _argmax_only_rows(x):
    return torch.argmax(x, dim=1)


def _inputs_with_argmax_tie():
    # Row 0 has an exact tie between columns 0 and 1.
    x = torch.tensor([[0.3, 0.3, -1.0], [0.5, 0.1, 0.2]], dtype=torch.float64)
    return (x.requires_grad_(),)


def _detached_double(x):
    return x.detach() * 2


def _unused_second_input(x, y):
    return x.sin()


_THRESHOLD = 0.5


def _select_above_threshold(x):
    # x[2] == _THRESHOLD exactly, so perturbing x[2] upward adds an element.
    return x[x > _THRESHOLD]


def _single_above_threshold(x):
    # x[2] == _THRESHOLD exactly, so perturbing x[2] upward changes the output's dtype.
    return (2 * x).float() if bool(x[2] > _THRESHOLD) else 2 * x


def _inputs_with_element_at_threshold():
    x = _randn(6, seed=61, requires_grad=False)
    x[2] = _THRESHOLD
    return (x.requires_grad_(),)


# --------------------------------------------------------------------------
# The corpus.
# --------------------------------------------------------------------------

_SLOW_ONLY_PROBE_DEPENDENT = (
    "fast mode's verdict hinges on torch's private random probe vectors u, v; an "
    "independent engine may legitimately draw other ones"
)

# fmt: off
# One case a line or two, as a table reads.
CASES: tuple[Case, ...] = (
    # ---------------- correct functions: gradcheck passes ----------------
    Case("sin", lambda: (_randn(5, seed=1),), torch.sin, True),
    Case("exp_times_x", lambda: (_randn(2, 3, seed=2),), _exp_times_x, True),
    Case("matmul", lambda: (_randn(2, 3, seed=3), _randn(3, 4, seed=4)), torch.matmul, True),
    Case("softmax", lambda: (_randn(3, 4, seed=5),), lambda x: torch.softmax(x, dim=-1), True),
    # Every optional backward/forward check torch offers, on an op that supports them all.
    Case("softmax_all_checks", lambda: (_randn(3, 4, seed=5),), lambda x: torch.softmax(x, dim=-1), True,
         flags=dict(check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True,
                    check_grad_dtypes=True)),
    Case("sum_dim", lambda: (_randn(3, 4, seed=6),), lambda x: x.sum(dim=1), True),
    # (3,1) op (1,4) -> (3,4): grads must be reduced back to each operand's shape.
    Case("broadcast_add_mul", lambda: (_randn(3, 1, seed=7), _randn(1, 4, seed=8)), _broadcast_add_mul, True),
    # Multi-output with an integer (non-differentiable) output next to a float one.
    Case("max_dim_values_indices", lambda: (_randn(3, 4, seed=9),), _max_with_indices, True),
    Case("tuple_outputs", lambda: (_randn(4, seed=10), _randn(4, seed=11)), _tuple_outputs, True),
    Case("list_outputs", lambda: (_randn(4, seed=12), _randn(4, seed=13)), _list_outputs, True),
    # Non-tensor positional args (int, None, str) are passed through untouched.
    Case("nontensor_args", lambda: (_randn(2, 3, seed=14), 3, None, "sum", _randn(2, 3, seed=15)), _nontensor_args,
         True),
    # Also an integer tensor input (no grad) mixed in.
    Case("integer_tensor_input", lambda: (_randn(4, 3, seed=16), torch.tensor([2, 0, 1])),
         lambda x, idx: x.index_select(0, idx), True),
    # `inputs` given as a bare tensor rather than a tuple.
    Case("single_tensor_not_tuple", lambda: _randn(5, seed=17), torch.tanh, True),
    # complex -> complex, real-valued in content (z * conj z) but complex dtype.
    Case("complex_mul_conj", lambda: (_complex(4, seed=18),), lambda z: z * z.conj(), True),
    Case("complex_exp", lambda: (_complex(4, seed=19),), torch.exp, True),
    Case("complex_exp_forward_ad", lambda: (_complex(4, seed=19),), torch.exp, True, flags=dict(check_forward_ad=True)),
    # complex -> real (|z|; min |z| is ~0.07 >> eps, away from the kink at 0).
    Case("complex_abs", lambda: (_complex(5, seed=20),), torch.abs, True),
    # real -> complex.
    Case("real_to_complex_polar", lambda: (_rand(4, seed=21, low=0.5, high=2.0), _randn(4, seed=22)), torch.polar,
         True),
    Case("real_times_complex_const", lambda: (_randn(4, seed=23),), lambda x: x * (1 + 2j), True),
    # Only integer outputs: nothing is differentiable. torch then only checks that
    # the function is numerically constant (it is, away from ties) and passes.
    Case("argmax_only_integer_output", lambda: (_randn(3, 4, seed=24),), _argmax_only, True),
    # Surprise: with a tie, perturbing flips the argmax. Slow mode never looks at
    # integer outputs (its numerical Jacobian only has float/complex outputs), so it
    # passes; fast mode's "numerical JVP must be zero" check includes them and fails.
    Case("argmax_tie_integer_output", _inputs_with_argmax_tie, _argmax_only_rows, True, expected_fast=False),
    # A float output that does not require grad (detached) yet depends on the input:
    # no differentiable outputs, and the numerical Jacobian is not zero -> fail.
    Case("detached_float_output", lambda: (_randn(4, seed=35),), _detached_double, False),
    # An input that does not affect the output: its Jacobian is all zeros both ways.
    Case("unused_input", lambda: (_randn(4, seed=25), _randn(3, seed=26)), _unused_second_input, True),
    Case("zero_dim", lambda: (_randn(seed=27), _randn(seed=28)), lambda x, y: x.exp() * y, True),
    # Empty input: an empty Jacobian trivially matches.
    Case("empty_tensor", lambda: (_randn(0, 3, seed=29),), lambda x: x.sum(0) + 1, True),
    # Transposed and strided (sliced) leaf inputs.
    Case("noncontiguous_inputs",
         lambda: (_randn(4, 3, seed=30, requires_grad=False).t().requires_grad_(),
                  _randn(3, 8, seed=31, requires_grad=False)[:, ::2].requires_grad_()),
         lambda x, y: x * y.sin(), True),
    Case("custom_cube_jvp_vmap", lambda: (_randn(5, seed=32),), CubeWithJvpAndVmap.apply, True,
         flags=dict(check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True)),
    # Correct Function whose backward cannot be vmapped; fine without check_batched_grad.
    Case("custom_item_backward", lambda: (_randn(6, seed=33),), ScaleByThreeItemLoop.apply, True),
    Case("custom_complex_square_correct", lambda: (_complex(4, seed=34),), ComplexSquareCorrect.apply, True),
    # Layouts: a sparse gradient for a dense input fails the layout check (GradcheckError); a
    # sparse or MKLDNN output is refused with a ValueError before any check.
    Case("sparse_grad_for_dense_input", lambda: (_randn(3, 3, seed=80),), DoubleWithSparseGrad.apply, False,
         flags=dict(check_batched_grad=False)),
    Case("sparse_output", lambda: (_randn(3, 3, seed=81),), lambda x: (x * 2).to_sparse(), "ValueError"),
    *(
        [Case("mkldnn_output", lambda: (_randn(3, 3, seed=82),), lambda x: (x * 2).float().to_mkldnn(), "ValueError")]
        if torch.backends.mkldnn.is_available()
        else []
    ),
    # Sparse and MKLDNN inputs: the Jacobian has a column per dense position; masked=False
    # perturbs every position, masked=True only the specified ones (the others must get a zero
    # gradient). torch's fast mode draws its directions on the specified values only.
    Case("sparse_coo_to_dense", lambda: (_sparse(4, 5, seed=83),), lambda s: s.to_dense(masked_grad=False), True),
    # to_dense()'s gradient is masked unless masked_grad=False
    Case("sparse_coo_to_dense_default", lambda: (_sparse(4, 5, seed=83),), lambda s: s.to_dense(), False,
         expected_fast=True),
    # A gradient masked to the input's pattern is wrong at the unspecified positions that
    # masked=False counts; fast mode only perturbs specified values and passes.
    Case("sparse_coo_masked_grad_unmasked", lambda: (_sparse(4, 5, seed=84),), lambda s: s.to_dense(masked_grad=True),
         False, expected_fast=True),
    Case("sparse_coo_masked_grad_masked", lambda: (_sparse(4, 5, seed=84),), lambda s: s.to_dense(masked_grad=True),
         True, flags=dict(masked=True)),
    # and a dense gradient is wrong at the unspecified positions of masked=True
    Case("sparse_coo_dense_grad_masked", lambda: (_sparse(4, 5, seed=85),), lambda s: s.to_dense(masked_grad=False),
         False, flags=dict(masked=True), expected_fast=True),
    Case("sparse_coo_hybrid", lambda: (_sparse(3, 4, 2, seed=86, dense_dim=1),), _hybrid_sum_sq, True),
    Case("sparse_coo_uncoalesced", lambda: (_uncoalesced_coo(87),), _sparse_to_dense_sq, True),
    Case("sparse_coo_complex", lambda: (_sparse(3, 4, seed=88, dtype=torch.complex128),), _sparse_to_dense_sq, True),
    Case("sparse_csr_matmul", lambda: (_sparse(4, 5, seed=89, layout=torch.sparse_csr), _randn(5, 3, seed=90)),
         _sparse_matmul, True),
    Case("sparse_csc_to_dense", lambda: (_sparse(4, 5, seed=91, layout=torch.sparse_csc),), _sparse_to_dense_sq, True),
    Case("sparse_bsr_to_dense", lambda: (_sparse(4, 6, seed=92, layout=torch.sparse_bsr, blocksize=(2, 3)),),
         _sparse_to_dense_sq, True),
    Case("sparse_bsc_to_dense_masked", lambda: (_sparse(4, 6, seed=93, layout=torch.sparse_bsc, blocksize=(2, 2)),),
         lambda s: s.to_dense(masked_grad=True), True, flags=dict(masked=True)),
    Case("sparse_csr_hybrid", lambda: (_sparse(4, 3, 2, seed=94, layout=torch.sparse_csr, dense_dim=1, density=1.0),),
         _hybrid_sum_sq, True),
    Case("sparse_and_dense_inputs", lambda: (_randn(3, 4, seed=95), _sparse(3, 4, seed=96)), _dense_times_sparse, True),
    Case("sparse_one_value_wrong", lambda: (_sparse(4, 5, seed=97),), SparseScaleOneValueWrong.apply, False,
         flags=dict(masked=True)),
    Case("sparse_dense_grad_for_sparse_input", lambda: (_sparse(4, 5, seed=98),), SparseScaleDenseGrad.apply, True),
    # forward AD: make_dual does not take a sparse tensor; torch names MKLDNN inputs
    Case("sparse_forward_ad", lambda: (_sparse(3, 4, seed=99),), _sparse_to_dense_sq, "NotImplementedError",
         flags=dict(check_forward_ad=True)),
    # ...and first takes the imaginary part of a complex input, which a CSR tensor does not have
    Case("sparse_csr_complex_forward_ad",
         lambda: (_sparse(3, 4, seed=99, layout=torch.sparse_csr, dtype=torch.complex128),),
         lambda s: s.to_dense() * 2, "NotImplementedError",
         flags=dict(check_forward_ad=True, check_backward_ad=False)),
    Case("sparse_coo_complex_forward_ad", lambda: (_sparse(3, 4, seed=99, dtype=torch.complex128),),
         _sparse_to_dense_sq, "NotImplementedError", flags=dict(check_forward_ad=True, check_backward_ad=False)),
    # the batched-gradient check cannot vmap the gradient of a sparse input
    Case("sparse_batched_grad", lambda: (_sparse(3, 4, seed=100),), _sparse_to_dense_sq, False,
         flags=dict(check_batched_grad=True)),
    # gradgradcheck: the first derivative of a sparse input is sparse, an output gradcheck refuses
    Case("sparse_gradgradcheck", lambda: (_sparse(3, 4, seed=101),), _sparse_to_dense_sq, "ValueError",
         checker="gradgradcheck"),
    # MKLDNN tensors are float32: torch's own tests loosen the tolerances as below
    *(
        [
            Case("mkldnn_input", lambda: (_mkldnn(3, 4, seed=102),), lambda m: m.to_dense() * 2, True,
                 flags=_MKLDNN_TOLERANCES, warns=UserWarning),
            Case("mkldnn_and_dense_inputs",
                 lambda: (_mkldnn(3, 4, seed=103), _randn(3, 4, seed=104, dtype=torch.float32)),
                 lambda m, d: m.to_dense() * d, True, flags=_MKLDNN_TOLERANCES, warns=UserWarning),
            # fast mode's projection passes at these tolerances; then the undefined-grad check's
            # gi.eq(0) meets the MKLDNN gradient, which eq does not take
            Case("mkldnn_wrong_backward", lambda: (_mkldnn(3, 4, seed=106),), MkldnnDoubleWrongBackward.apply, False,
                 flags=_MKLDNN_TOLERANCES, expected_fast="RuntimeError", warns=UserWarning),
            Case("mkldnn_forward_ad", lambda: (_mkldnn(3, 4, seed=105),), lambda m: m.to_dense() * 2, "ValueError",
                 flags=dict(_MKLDNN_TOLERANCES, check_forward_ad=True), warns=UserWarning),
        ]
        if torch.backends.mkldnn.is_available()
        else []
    ),
    # Float output i is matched with column i of all outputs (here the int64 rank, one element,
    # which broadcasts into the empty singular values' rows): torch passes, and so must opcheck.
    Case("lstsq_int_rank_output", lambda: (_rand(2, 3, seed=107), _rand(2, 3, seed=108)), _lstsq_gelsy, True),
    # ---------------- broken functions ----------------
    # Fast mode recomputes the failing block in slow mode for its message and compares it with
    # torch.allclose, which refuses a float32 gradient against float64 numbers.
    Case("mixed_dtype_wrong_backward", lambda: (_randn(4, seed=109), _randn(4, seed=110, dtype=torch.float32)),
         MixedDtypeWrongBackward.apply, False, flags=dict(atol=1e-2), expected_fast="RuntimeError", warns=UserWarning),
    Case("missing_factor", lambda: (_randn(5, seed=40),), SinMissingFactor.apply, False),
    Case("sign_flip_old_style", lambda: (_randn(5, seed=41),), CosSignFlipOldStyle.apply, False),
    # One wrong Jacobian entry in 1024x1024: slow mode compares every entry and fails;
    # fast mode compares v^T J u for random unit u, v, where the error is ~|u_3 v_3|
    # ~ 1e-3 but the atol is scaled by sum(u)*sum(v) ~ 800 -> fast mode PASSES.
    Case("one_wrong_entry_32x32", lambda: (_randn(32, 32, seed=42),), SinOneWrongEntry.apply, False,
         expected_fast=True),
    Case("one_slightly_wrong_entry_4x4", lambda: (_randn(4, 4, seed=43),), SinOneSlightlyWrongEntry.apply, False,
         slow_only=_SLOW_ONLY_PROBE_DEPENDENT),
    Case("complex_missing_conj", lambda: (_complex(4, seed=44),), ComplexSquareMissingConj.apply, False),
    # Wrong jvp only matters when forward AD is checked.
    Case("wrong_jvp_forward_ad", lambda: (_randn(4, seed=45),), ExpWrongJvp.apply, False,
         flags=dict(check_forward_ad=True)),
    Case("wrong_jvp_backward_only", lambda: (_randn(4, seed=45),), ExpWrongJvp.apply, True),
    # Fast mode's forward check runs over every float output, its slow recomputation over the
    # differentiable ones only: the wrong tangent of output 1, behind an output that does not
    # require grad, is looked up past their end (torch's IndexError, as native_layer_norm's in OpInfo).
    Case("wrong_jvp_behind_a_constant_output", lambda: (_randn(4, seed=111),), _constant_then_wrong_jvp, False,
         flags=dict(check_forward_ad=True, check_backward_ad=False), expected_fast="IndexError"),
    # And a wrong backward goes unnoticed when only forward AD is checked.
    Case("wrong_backward_forward_ad_only", lambda: (_randn(4, seed=46),), ExpWrongBackwardRightJvp.apply, True,
         flags=dict(check_forward_ad=True, check_backward_ad=False)),
    Case("complex_jvp_for_real_output_check_dtypes", lambda: (_randn(4, seed=47),), ExpComplexJvp.apply, False,
         flags=dict(check_forward_ad=True, check_grad_dtypes=True)),
    # First derivative right -> gradcheck passes (the gradgradcheck twin fails below).
    Case("wrong_double_backward_gradcheck", lambda: (_randn(4, seed=48),), SinWrongDoubleBackward.apply, True),
    # Crash on all-undefined output grads: torch turns the RuntimeError into GradcheckError...
    Case("undefined_grad_crash", lambda: (_randn(4, seed=49),), SinCosStackCrashesOnAllUndefined.apply, False),
    Case("undefined_grad_crash_unchecked", lambda: (_randn(4, seed=49),), SinCosStackCrashesOnAllUndefined.apply, True,
         flags=dict(check_undefined_grad=False)),
    # ...but a TypeError escapes as is (torch only catches RuntimeError there).
    Case("undefined_grad_typeerror", lambda: (_randn(4, seed=50),), SinCosNoneArithmeticOnAllUndefined.apply,
         "TypeError"),
    Case("nondeterministic_backward", lambda: (_randn(5, seed=51),), SinNoisyBackwardOldStyle.apply, False),
    Case("nondeterministic_backward_tolerated", lambda: (_randn(5, seed=51),), SinNoisyBackwardOldStyle.apply, True,
         flags=dict(nondet_tol=1e-5)),
    # Surprise: nondet_tol does not help here. torch's "backward multiplied by
    # grad_output" check feeds zero grad_outputs and demands *exactly* zero input
    # grads, with no tolerance, so the additive 1e-8 noise fails it.
    Case("additive_noise_backward_tolerated", lambda: (_randn(5, seed=51),), SinAdditiveNoiseBackwardOldStyle.apply,
         False, flags=dict(nondet_tol=1e-5)),
    # The engine (not gradcheck) rejects the (1,4) grad for a (3,1) input: RuntimeError.
    Case("broadcast_wrong_dim", lambda: (_randn(3, 1, seed=52), _randn(3, 4, seed=53)),
         BroadcastMulWrongDimOldStyle.apply, "RuntimeError"),
    Case("broadcast_wrong_dim_square", lambda: (_randn(4, 1, seed=54), _randn(4, 4, seed=55)),
         BroadcastMulWrongDimSquare.apply, False),
    # A is a fixed (non-grad) square matrix so the transposed grad has the right shape.
    Case("transposed_jacobian_old_style", lambda: (_randn(3, 4, seed=56), _randn(4, 4, seed=57, requires_grad=False)),
         MatmulTransposedJacobianOldStyle.apply, False),
    Case("not_multiplied_by_grad_output", lambda: (_randn(5, seed=58),), SinNotMultipliedByGradOldStyle.apply, False),
    # The same four on one and two elements: a fused pass takes such rows by plain backward passes
    # (route.plain_backward_rows), the first twice for reentrancy, then a zero grad_output.
    *(
        Case(f"{name}_{n}", lambda n=n: (_randn(n, seed=59),), fn.apply, expected, flags=flags)
        for n in (1, 2)
        for name, fn, expected, flags in (
            ("nondeterministic_backward", SinNoisyBackwardOldStyle, False, {}),
            ("nondeterministic_backward_tolerated", SinNoisyBackwardOldStyle, True, dict(nondet_tol=1e-5)),
            ("additive_noise_backward_tolerated", SinAdditiveNoiseBackwardOldStyle, False, dict(nondet_tol=1e-5)),
            ("not_multiplied_by_grad_output", SinNotMultipliedByGradOldStyle, False, {}),
        )
    ),
    # Surprise: the autograd engine casts a backward's float32 grad back to the input's
    # float64 before gradcheck sees it, so even check_grad_dtypes=True passes.
    Case("float32_grad_check_grad_dtypes", lambda: (_randn(5, seed=59),), SinFloat32Grad.apply, True,
         flags=dict(check_grad_dtypes=True)),
    # vmap cannot batch .item() -> check_batched_grad fails.
    Case("item_backward_batched_grad", lambda: (_randn(6, seed=33),), ScaleByThreeItemLoop.apply, False,
         flags=dict(check_batched_grad=True)),
    Case("inplace_backward", lambda: (_randn(6, seed=60),), ScaleByThreeInplaceIntoFresh.apply, True),
    Case("inplace_backward_batched_grad", lambda: (_randn(6, seed=60),), ScaleByThreeInplaceIntoFresh.apply, False,
         flags=dict(check_batched_grad=True)),
    # Output shape depends on the input values: torch raises a plain AssertionError.
    Case("output_shape_changes_under_perturbation", _inputs_with_element_at_threshold, _select_above_threshold,
         "AssertionError"),
    Case("output_dtype_changes_under_perturbation", _inputs_with_element_at_threshold, _single_above_threshold,
         "AssertionError"),
    # ---------------- flags torch refuses (AssertionError before any call) ----------------
    Case("flags_neither_forward_nor_backward", lambda: (_randn(3, seed=80),), torch.sin, "AssertionError",
         flags=dict(check_forward_ad=False, check_backward_ad=False)),
    Case("flags_batched_grad_without_backward", lambda: (_randn(3, seed=80),), torch.sin, "AssertionError",
         flags=dict(check_batched_grad=True, check_forward_ad=True, check_backward_ad=False)),
    Case("flags_batched_forward_grad_without_forward", lambda: (_randn(3, seed=80),), torch.sin, "AssertionError",
         flags=dict(check_batched_forward_grad=True)),
    Case("gg_flags_neither_fwd_nor_rev", lambda: (_randn(3, seed=80),), torch.sin, "AssertionError",
         checker="gradgradcheck", flags=dict(check_fwd_over_rev=False, check_rev_over_rev=False)),
    Case("gg_flags_undefined_grad_without_rev", lambda: (_randn(3, seed=80),), torch.sin, "AssertionError",
         checker="gradgradcheck", flags=dict(check_fwd_over_rev=True, check_rev_over_rev=False)),
    Case("gg_flags_batched_grad_without_rev", lambda: (_randn(3, seed=80),), torch.sin, "AssertionError",
         checker="gradgradcheck",
         flags=dict(check_fwd_over_rev=True, check_rev_over_rev=False, check_undefined_grad=False,
                    check_batched_grad=True)),
    # ---------------- the checks beside the Jacobians, each failing on its own ----------------
    Case("batched_backward_differs_under_vmap", lambda: (_randn(4, seed=81),), SinBackwardDoubledUnderVmap.apply,
         False, flags=dict(check_batched_grad=True)),
    Case("batched_jvp_differs_under_vmap", lambda: (_randn(4, seed=82),), ExpJvpDoubledUnderVmap.apply, False,
         flags=dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)),
    Case("item_jvp_batched_forward_grad", lambda: (_randn(4, seed=83),), ExpItemInJvp.apply, False,
         flags=dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)),
    # torch warns (backwards compatibility) beside this failure.
    Case("undefined_grad_nonzero", lambda: (_randn(4, seed=84),), SinNonzeroForUndefinedGrad.apply, False,
         warns=UserWarning),
    # torch's message is its GradcheckError's nine arguments, words and tensors, as a tuple.
    Case("undefined_tangent_changes_jvp", lambda: (_randn(3, seed=85), _randn(3, seed=86)),
         AddJvpDoublesWhenOneTangentUndefined.apply, False, flags=dict(check_forward_ad=True, check_backward_ad=False)),
    Case("complex_input_wrong_jvp", lambda: (_complex(3, seed=87),), ComplexSquareWrongJvp.apply, False,
         flags=dict(check_forward_ad=True, check_backward_ad=False)),
    # ---------------- input validation ----------------
    Case("no_input_requires_grad", lambda: (_randn(4, seed=62, requires_grad=False),), torch.sin, "ValueError"),
    Case("stride0_expanded_input", lambda: (_randn(1, 4, seed=63).expand(3, 4),), torch.sin, "RuntimeError"),
    # float32: torch warns (UserWarning); with default eps the finite differences are
    # too coarse in single precision and the check fails...
    Case("float32_inputs", lambda: (_randn(5, seed=64, dtype=torch.float32),), torch.sin, False, warns=UserWarning),
    # ...and passes with loose tolerances, still warning.
    Case("float32_inputs_loose_tolerances", lambda: (_randn(5, seed=64, dtype=torch.float32),), torch.sin, True,
         flags=dict(eps=1e-3, atol=1e-2, rtol=1e-2), warns=UserWarning),
    # ---------------- gradgradcheck ----------------
    Case("gg_tanh", lambda: (_randn(5, seed=70),), torch.tanh, True, checker="gradgradcheck"),
    Case("gg_tanh_fwd_over_rev", lambda: (_randn(5, seed=70),), torch.tanh, True, checker="gradgradcheck",
         flags=dict(check_fwd_over_rev=True)),
    Case("gg_matmul", lambda: (_randn(2, 3, seed=71), _randn(3, 2, seed=72)), torch.matmul, True,
         checker="gradgradcheck"),
    Case("gg_matmul_batched_grad", lambda: (_randn(2, 3, seed=71), _randn(3, 2, seed=72)), torch.matmul, True,
         checker="gradgradcheck", flags=dict(check_batched_grad=True)),
    Case("gg_softmax", lambda: (_randn(2, 4, seed=73),), lambda x: torch.softmax(x, dim=1), True,
         checker="gradgradcheck"),
    Case("gg_softmax_fwd_over_rev", lambda: (_randn(2, 4, seed=73),), lambda x: torch.softmax(x, dim=1), True,
         checker="gradgradcheck", flags=dict(check_fwd_over_rev=True)),
    Case("gg_softmax_batched_grad", lambda: (_randn(2, 4, seed=73),), lambda x: torch.softmax(x, dim=1), True,
         checker="gradgradcheck", flags=dict(check_batched_grad=True)),
    # Explicit grad_outputs instead of checker-drawn ones.
    Case("gg_sin_explicit_grad_outputs", lambda: (_randn(4, seed=74),), torch.sin, True, checker="gradgradcheck",
         make_grad_outputs=lambda: (_randn(4, seed=75),)),
    Case("gg_exp_times_x_noncontig_grad_outputs", lambda: (_randn(3, 4, seed=76),), _exp_times_x, True,
         checker="gradgradcheck", flags=dict(gen_non_contig_grad_outputs=True)),
    Case("gg_complex_exp", lambda: (_complex(3, seed=77),), torch.exp, True, checker="gradgradcheck"),
    # The twin of wrong_double_backward_gradcheck: the wrong second derivative is caught.
    Case("gg_wrong_double_backward", lambda: (_randn(4, seed=48),), SinWrongDoubleBackward.apply, False,
         checker="gradgradcheck"),
    # @once_differentiable: the first-order grad is detached from the graph, so the
    # analytical second derivative is zero and mismatches the numerical one.
    Case("gg_once_differentiable", lambda: (_randn(4, seed=78),), SinOnceDifferentiable.apply, False,
         checker="gradgradcheck"),
    Case("gc_once_differentiable", lambda: (_randn(4, seed=78),), SinOnceDifferentiable.apply, True),
    # op_db's linalg.norm with ord=3.5 on an empty input: the fast check's projection of the second
    # derivative is nan against 0, and torch's full-block recomputation of a block with no entries
    # raises in max() before it can compare (slow mode: nan where the zero grad_output must give 0).
    Case("gg_norm_empty_input", lambda: (_randn(0, seed=79),), _norm_ord_3_5, False, checker="gradgradcheck",
         expected_fast="RuntimeError"),
)
# fmt: on
