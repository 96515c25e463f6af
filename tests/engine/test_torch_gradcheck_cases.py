"""PyTorch's own tests of gradcheck, run against torch.autograd.gradcheck and opcheck.gradcheck.

Every case is an adaptation of a test in PyTorch's test/test_autograd.py (pytorch/pytorch at
5c322af10e52e4d236104ceefd542f34e6dcf20a); the comment above each names the original. Each runs
twice, through the `impl` fixture: impl="torch" binds gradcheck/gradgradcheck to
torch.autograd.gradcheck/gradgradcheck, impl="opcheck" to opcheck.gradcheck/gradgradcheck. The
assertions are torch's (the specification of the drop-in), with self.assertRaisesRegex and friends
turned into pytest.raises/pytest.warns and plain asserts. Errors are caught as torch's
GradcheckError, which opcheck.GradcheckError subclasses.

The originals call the test suite's wrappers from torch.testing._internal.common_utils, which
default check_batched_grad and fast_mode to True (an explicit value, None excepted, wins);
`Impl.gradcheck`/`Impl.gradgradcheck` apply the same defaults to either implementation, and
`Impl.raw_gradcheck` is the unwrapped function, for the originals that call
torch.autograd.gradcheck directly.

Skipped for impl="opcheck" (they call torch's private helpers, which opcheck has no counterpart
of; they still run for impl="torch"):

- test_gradcheck_get_numerical_jacobian: calls torch.autograd.gradcheck.get_numerical_jacobian
- test_gradcheck_get_analytical_jacobian: calls torch.autograd.gradcheck.get_analytical_jacobian

Not ported:

- test_gradcheck_default_device_placement_context, test_gradcheck_input_output_different_device:
  CUDA only.
- Tests that use gradcheck merely as a tool to check an op or an autograd feature
  (test_custom_function_non_tensor_inputs_outputs, test_return_duplicate(_inplace),
  test_select_sum, test_custom_autograd_no_early_free, test_lobpcg, test_autograd_simple_views_python,
  test_where_*, test_inplace_on_view_*, test_scatter_index_reduce_*, test_sparse_ctor_getter_backward,
  test_mv_grad_stride_0, test_pow_real_negative_base_complex_exponent, test_cat_stack_r_to_c, ...).

Besides the test_gradcheck_* methods, a few tests whose verdict is gradcheck's own are ported:
test_unrelated_inputs, the custom-Function forward-mode tests that check what gradcheck(...,
check_forward_ad=True) reports (test_custom_function_forward_mode_*, test_custom_function_save_for_forward),
TestAutogradForwardModeBatchedGrad.test_out_of_place_basic and the gradcheck part of
TestAutogradForwardMode.test_metadata_check_checks_ignores_size_zero.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import product

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd import Function
from torch.autograd.gradcheck import GradcheckError

import opcheck

_IMPLS = {
    "torch": (torch.autograd.gradcheck, torch.autograd.gradgradcheck),
    "opcheck": (opcheck.gradcheck, opcheck.gradgradcheck),
}

# The defaults of torch.testing._internal.common_utils.gradcheck/gradgradcheck.
_SUITE_DEFAULTS = {"check_batched_grad": True, "fast_mode": True}


def _with_suite_defaults(kwargs: dict) -> dict:
    out = dict(kwargs)
    for key, value in _SUITE_DEFAULTS.items():
        if out.get(key) is None:
            out[key] = value
    return out


@dataclass(frozen=True)
class Impl:
    name: str
    raw_gradcheck: Callable
    raw_gradgradcheck: Callable

    def gradcheck(self, fn, inputs, **kwargs):
        return self.raw_gradcheck(fn, inputs, **_with_suite_defaults(kwargs))

    def gradgradcheck(self, fn, inputs, grad_outputs=None, **kwargs):
        return self.raw_gradgradcheck(fn, inputs, grad_outputs, **_with_suite_defaults(kwargs))


@pytest.fixture(params=list(_IMPLS))
def impl(request) -> Impl:
    return Impl(request.param, *_IMPLS[request.param])


@pytest.fixture(autouse=True)
def _seed():
    # The originals draw their inputs unseeded; seeding makes every case reproducible.
    torch.manual_seed(0)


def _torch_only(impl: Impl, helper: str) -> None:
    if impl.name == "opcheck":
        pytest.skip(f"calls torch's private helper {helper}")


requires_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="MKL-DNN build is disabled")

_NOT_DOUBLE = "Input #0 requires gradient and is not a double precision"


class NonDetFunc(Function):
    """Shared by test_gradcheck_nondeterministic and test_gradcheck_get_analytical_jacobian."""

    @staticmethod
    def forward(ctx, x, jitter=0.0):
        ctx._jitter = jitter
        return x

    @staticmethod
    def backward(ctx, grad_out):
        return NonDetFunc.apply(grad_out, ctx._jitter) * (1 + torch.rand_like(grad_out) * ctx._jitter), None


# ------------------------------------------------------------------ TestAutograd.test_gradcheck_*


# test_gradcheck_single_input
def test_gradcheck_single_input(impl):
    def f(inp):
        return inp.mul(5)

    for fast_mode in (True, False):
        impl.gradcheck(f, torch.rand(10, dtype=torch.float64, requires_grad=True), fast_mode=fast_mode)
        impl.gradgradcheck(f, torch.rand(10, dtype=torch.float64, requires_grad=True), fast_mode=fast_mode)


# test_gradcheck_input (parametrized over layout; upstream's instances are test_gradcheck_input_layout0..4)
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(torch.sparse_coo, id="layout0_sparse_coo"),
        pytest.param(torch.sparse_csr, id="layout1_sparse_csr"),
        pytest.param(torch.sparse_csc, id="layout2_sparse_csc"),
        pytest.param(torch.sparse_bsr, id="layout3_sparse_bsr"),
        pytest.param(torch.sparse_bsc, id="layout4_sparse_bsc"),
    ],
)
def test_gradcheck_input(impl, layout):
    if layout in {torch.sparse_bsr, torch.sparse_bsc}:
        blocksize, size = (2, 2), (4, 8)
    else:
        blocksize, size = None, (2, 2)

    def fn(sparse):
        return torch.sum(sparse)

    for fast_mode, masked in product((True, False), repeat=2):
        impl.gradcheck(
            fn,
            torch.rand(size, dtype=torch.double).to_sparse(layout=layout, blocksize=blocksize).requires_grad_(),
            masked=masked,
            check_batched_grad=False,
            fast_mode=fast_mode,
        )


# test_gradcheck_nondeterministic
def test_gradcheck_nondeterministic(impl):
    for fast_mode in (True, False):
        inp = torch.randn(5, 5, dtype=torch.double, requires_grad=True)
        impl.gradcheck(lambda x: NonDetFunc.apply(x, 0.0), inp, check_batched_grad=False, fast_mode=fast_mode)
        with pytest.raises(RuntimeError, match="Backward is not reentrant"):
            impl.gradcheck(lambda x: NonDetFunc.apply(x, 1e-6), inp, check_batched_grad=False, fast_mode=fast_mode)
        with pytest.raises(RuntimeError, match="Backward is not reentrant"):
            impl.gradgradcheck(lambda x: NonDetFunc.apply(x, 1e-12), inp, check_batched_grad=False, fast_mode=fast_mode)
        impl.gradcheck(
            lambda x: NonDetFunc.apply(x, 0.0), inp, nondet_tol=1e-5, check_batched_grad=False, fast_mode=fast_mode
        )
        impl.gradcheck(
            lambda x: NonDetFunc.apply(x, 1e-6), inp, nondet_tol=1e-5, check_batched_grad=False, fast_mode=fast_mode
        )
        impl.gradgradcheck(
            lambda x: NonDetFunc.apply(x, 1e-12), inp, nondet_tol=1e-5, check_batched_grad=False, fast_mode=fast_mode
        )


# test_gradcheck_validates_inputs
def test_gradcheck_validates_inputs(impl):
    for fast_mode in (True, False):
        x = torch.rand(10, requires_grad=True).to_sparse()
        assert impl.gradcheck(
            lambda x: x.to_dense(), (x,), check_batched_grad=False, atol=1e-1, fast_mode=fast_mode, masked=True
        )
        assert not impl.gradcheck(
            lambda x: x.to_dense(),
            (x,),
            masked=False,
            check_batched_grad=False,
            raise_exception=False,
            fast_mode=fast_mode,
        )
        assert impl.gradcheck(
            lambda x: x.to_dense(masked_grad=False),
            (x,),
            masked=False,
            atol=1e-1,
            check_batched_grad=False,
            raise_exception=False,
            fast_mode=fast_mode,
        )

        # when none of the inputs require grad (always raises even if raise_exception=False)
        x = torch.rand(10, requires_grad=False)
        with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
            impl.gradcheck(lambda x: x, (x,), raise_exception=False, fast_mode=fast_mode)

        # (warning) when inputs are not double precision
        x = torch.ones(1, dtype=torch.float32, requires_grad=True)
        with pytest.warns(UserWarning, match=_NOT_DOUBLE):
            assert impl.gradcheck(lambda x: x, (x,), atol=1e-1, fast_mode=fast_mode)

        # when layout is not mkldnn (aka has strides) and input has a dimension with stride 0
        # (always raises even if raise_exception=False)
        x = torch.ones(1, dtype=torch.float64, requires_grad=True)
        x = x.expand((2, 2))
        with pytest.raises(RuntimeError, match="The 0th input has a dimension with stride 0"):
            impl.gradcheck(lambda x: x, (x,), raise_exception=False, fast_mode=fast_mode)


# test_gradcheck_validates_input_mkldnn
@requires_mkldnn
def test_gradcheck_validates_input_mkldnn(impl):
    # mkldnn inputs: forward mode testing is not allowed. The tolerances let the gradients match
    # in single precision; the warning assert hides the float32 warning.
    x = torch.ones(1).to_mkldnn().requires_grad_()
    for fast_mode in (False, True):
        with pytest.warns(UserWarning, match=_NOT_DOUBLE):
            # torch 2.14 fixed the wording ("not supported"); earlier releases say "not support"
            with pytest.raises(ValueError, match="MKLDNN inputs are not support(ed)? for forward AD gradcheck."):
                impl.gradcheck(
                    lambda x: x.to_dense(),
                    (x,),
                    raise_exception=False,
                    fast_mode=fast_mode,
                    check_forward_ad=True,
                    atol=1e-1,
                    rtol=1e-1,
                )


# test_gradcheck_test_outputs (upstream skips it without MKL-DNN)
@requires_mkldnn
def test_gradcheck_test_outputs(impl):
    for fast_mode in (True, False):
        # sparse outputs (always raise even if raise_exception=False)
        x = torch.rand(10, requires_grad=True).to_sparse()
        with pytest.raises(ValueError, match="Sparse output is not supported at gradcheck yet"):
            impl.gradcheck(
                lambda x: x, (x,), masked=True, check_batched_grad=False, raise_exception=False, fast_mode=fast_mode
            )

        # mkldnn outputs (always raise even if raise_exception=False)
        root = torch.randn(4, 5, dtype=torch.float32, requires_grad=True)
        with pytest.raises(ValueError, match="MKLDNN output is not supported at gradcheck yet"):
            impl.gradcheck(
                lambda x: x.to_mkldnn(), (root,), check_batched_grad=False, raise_exception=False, fast_mode=fast_mode
            )


# test_gradcheck_check_no_differentiable_outputs
def test_gradcheck_check_no_differentiable_outputs(impl):
    for fast_mode in (True, False):
        # none of the outputs are differentiable, but the numerical gradient is not zero
        x = torch.ones((1,), requires_grad=True)
        with pytest.raises(RuntimeError, match="Numerical gradient for function expected to be zero"):
            impl.gradcheck(lambda x: torch.tensor([x]), x)
        assert not impl.gradcheck(lambda x: torch.tensor([x]), x, raise_exception=False, fast_mode=fast_mode)

        # succeed when no outputs at all
        assert impl.gradcheck(lambda x: (), (x,), fast_mode=fast_mode)


# test_gradcheck_check_batched_grad
def test_gradcheck_check_batched_grad(impl):
    for fast_mode in (True, False):
        x = torch.rand(10, dtype=torch.double, requires_grad=True).to_sparse()
        # runtime error while computing the batched grad (prints a big error)
        with pytest.raises(RuntimeError, match="gradcheck or gradgradcheck failed while testing batched gradient"):
            impl.gradcheck(lambda x: x.to_dense(), (x,), masked=True, check_batched_grad=True, fast_mode=fast_mode)
        assert not impl.gradcheck(
            lambda x: x.to_dense(),
            (x,),
            masked=True,
            check_batched_grad=True,
            raise_exception=False,
            fast_mode=fast_mode,
        )


# test_gradcheck_backward_mul_by_grad_output
def test_gradcheck_backward_mul_by_grad_output(impl):
    for fast_mode in (True, False):
        # grad_input is sparse and has incorrect sparse_dim/dense_dim
        def fn(x):
            def hook(grad):
                if grad is not None:
                    return grad.to_dense().to_sparse(1)
                return grad

            y = x.clone()
            y.register_hook(hook)
            return y.to_dense()

        x = torch.ones((2, 2), dtype=torch.double, requires_grad=True).to_sparse()
        with pytest.raises(RuntimeError, match="grad is sparse tensor, but has incorrect sparse_dim"):
            impl.gradcheck(fn, (x,), atol=1e-1, masked=True, check_batched_grad=False, fast_mode=fast_mode)
        assert not impl.gradcheck(
            fn, (x,), atol=1e-1, masked=True, check_batched_grad=False, raise_exception=False, fast_mode=fast_mode
        )

        # backward not multiplied by grad_output (non-sparse case)
        def fn2(x):
            y = x.clone()
            y.register_hook(lambda x: x + 1e-2)
            return y

        x = torch.ones(1, dtype=torch.double, requires_grad=True)
        with pytest.raises(RuntimeError, match="backward not multiplied by grad_output"):
            impl.gradcheck(fn2, (x,), atol=1e-1, fast_mode=fast_mode)
        assert not impl.gradcheck(fn2, (x,), atol=1e-1, raise_exception=False, fast_mode=fast_mode)

        # backward not multiplied by grad_output (sparse case)
        def fn3(x):
            y = x.clone().to_dense()
            y.register_hook(lambda x: x + 1e-2)
            return y

        x = torch.ones(1, dtype=torch.double, requires_grad=True).to_sparse()
        with pytest.raises(RuntimeError, match="backward not multiplied by grad_output"):
            impl.gradcheck(fn3, (x,), atol=1e-1, masked=True, check_batched_grad=False, fast_mode=fast_mode)
        assert not impl.gradcheck(
            fn3, (x,), atol=1e-1, masked=True, check_batched_grad=False, raise_exception=False, fast_mode=fast_mode
        )

        # the layout of grad_input is not the same as the input's
        class Test(Function):
            @staticmethod
            def forward(ctx, x):
                return x

            @staticmethod
            def backward(ctx, x):
                return x.to_sparse()

        x = torch.ones(1, dtype=torch.double, requires_grad=True)
        with pytest.raises(RuntimeError, match="grad is incorrect layout"):
            impl.gradcheck(Test.apply, (x,), check_batched_grad=False, fast_mode=fast_mode)
        assert not impl.gradcheck(
            Test.apply, (x,), check_batched_grad=False, raise_exception=False, fast_mode=fast_mode
        )


# test_gradcheck_undefined_grad
def test_gradcheck_undefined_grad(impl):
    for fast_mode in (True, False):
        # a runtime error while running backward
        def fn(x):
            def hook(x):
                if x is None:
                    raise RuntimeError("x is undefined")

            y = x.clone()
            y.register_hook(hook)
            return y

        x = torch.ones(1, dtype=torch.double, requires_grad=True)
        msg = "Backwards compatibility: New undefined gradient support checking feature"
        with pytest.warns(UserWarning, match=msg):
            with pytest.raises(RuntimeError, match="Expected backward function to handle undefined output grads"):
                impl.gradcheck(fn, (x,), fast_mode=fast_mode)
            assert not impl.gradcheck(fn, (x,), raise_exception=False, fast_mode=fast_mode)


# test_gradcheck_jacobian_mismatch
def test_gradcheck_jacobian_mismatch(impl):
    for fast_mode in (True, False):

        def fn(x):  # R -> R, C -> C
            y = x.clone()
            y.register_hook(lambda x: x + 1e-2)
            return y

        x = torch.ones(2, 2, requires_grad=True)
        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            impl.gradcheck(fn, (x,), fast_mode=fast_mode)
        assert not impl.gradcheck(fn, (x,), raise_exception=False, fast_mode=fast_mode)

        x_c = torch.ones(2, 2, requires_grad=True, dtype=torch.complex128)
        with pytest.raises(RuntimeError, match="While considering the imaginary part of complex outputs only"):
            impl.gradcheck(fn, (x_c,), fast_mode=False)
        assert not impl.gradcheck(fn, (x_c,), raise_exception=False, fast_mode=False)

        def fn2(x):  # R -> C
            y = torch.complex(x, x)
            y.register_hook(lambda x: x + 1e-2)
            return y

        x = torch.ones(2, 2, requires_grad=True)
        with pytest.raises(RuntimeError, match="While considering the imaginary part of complex outputs only"):
            impl.gradcheck(fn2, (x,), fast_mode=False)
        assert not impl.gradcheck(fn2, (x,), raise_exception=False, fast_mode=False)

        def fn3(x):  # C -> R
            y = torch.real(x)
            y.register_hook(lambda x: x + 1e-2)
            return y

        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            impl.gradcheck(fn3, (x_c,), fast_mode=False)
        assert not impl.gradcheck(fn3, (x_c,), raise_exception=False, fast_mode=False)


# test_gradcheck_dense_and_sparse_inputs
def test_gradcheck_dense_and_sparse_inputs(impl):
    def fn(x, y):
        return x * y.coalesce().to_dense()

    for fast_mode in (True, False):
        a = torch.rand(2, 2, dtype=torch.double, requires_grad=True)
        b = torch.rand(2, 2, dtype=torch.double).to_sparse().requires_grad_(True)
        assert impl.gradcheck(fn, (a, b), masked=True, check_batched_grad=False, fast_mode=fast_mode)


# test_gradcheck_multiple_mkldnn_inputs
@requires_mkldnn
def test_gradcheck_multiple_mkldnn_inputs(impl):
    def fn(x, y):
        return x + y.to_dense()

    for fast_mode in (True, False):
        a = torch.rand(10, requires_grad=True)
        b = torch.rand(10, dtype=torch.float32).to_mkldnn().requires_grad_(True)
        assert impl.gradcheck(fn, (a, b), atol=1e-1, check_batched_grad=False, fast_mode=fast_mode)

        # (upstream defines fn2(x, y) = x.to_dense() + y.to_dense() here but calls fn again)
        c = torch.rand(10, dtype=torch.float32).to_mkldnn().requires_grad_(True)
        assert impl.gradcheck(fn, (a, c), atol=1e-1, check_batched_grad=False, fast_mode=fast_mode)


# test_gradcheck_output_shape_or_dtype_depend_on_values
def test_gradcheck_output_shape_or_dtype_depend_on_values(impl):
    def fn(x):
        if torch.all(x >= 1):
            return torch.cat([x, x])
        return x

    def fn2(x):
        if torch.all(x >= 1):
            return x.to(torch.float32)
        return x

    for fast_mode in (True, False):
        a = torch.ones(1, dtype=torch.double, requires_grad=True)
        with pytest.raises(AssertionError, match="return outputs with the same shape when inputs are perturbed"):
            assert impl.gradcheck(fn, (a,), fast_mode=fast_mode)
        with pytest.raises(AssertionError, match="return outputs with the same dtype when inputs are perturbed"):
            assert impl.gradcheck(fn2, (a,), fast_mode=fast_mode)


# test_gradcheck_complex_non_complex_outputs
def test_gradcheck_complex_non_complex_outputs(impl):
    def fn(x, y):
        z = torch.complex(x, y)
        return z, x + 1

    a = torch.ones(2, 2, requires_grad=True, dtype=torch.float64)
    b = torch.ones(2, 2, requires_grad=True, dtype=torch.float64)
    assert impl.gradcheck(fn, (a, b))

    def fn2(z):
        return z, torch.real(z)

    c = torch.ones(2, 2, requires_grad=True, dtype=torch.complex128)
    assert impl.gradcheck(fn2, (c))


# test_gradcheck_adjusted_atol_complex_inputs (upstream: CPU-only; regression test for
# pytorch/pytorch#166385, fast gradcheck failing where slow passes through a wrong atol for complex inputs)
def test_gradcheck_adjusted_atol_complex_inputs(impl):
    # this seed makes torch's fast mode draw an input projection u in [0,1)^d for which
    # v^T(j_n - j_a)u is interesting
    torch.manual_seed(97)

    def sample_func(z):
        return 1.0 / torch.norm(z)

    # the input needs at least 2 elements for gradcheck's projection u not to be all ones; the
    # eps distance from the origin gives some numerical vs analytical discrepancy
    eps = 10e-3
    z = eps * torch.rand(2, dtype=torch.complex128, requires_grad=True)
    atol, rtol = 8.3e-6, 1e-9
    assert impl.gradcheck(sample_func, (z,), fast_mode=True, atol=atol, rtol=rtol)
    assert impl.gradcheck(sample_func, (z,), fast_mode=False, atol=atol, rtol=rtol)


# test_gradcheck_get_numerical_jacobian (get_numerical_jacobian is deprecated, unused by gradcheck)
def test_gradcheck_get_numerical_jacobian(impl):
    _torch_only(impl, "torch.autograd.gradcheck.get_numerical_jacobian")
    from torch.autograd.gradcheck import get_numerical_jacobian

    def fn(inputs):
        # takes the inputs as a tuple; the jacobian is wrt the first output
        x, y = inputs[0], inputs[1]
        return 2 * x + y, x + 2 * y

    a = torch.rand(2, 2, requires_grad=True, dtype=torch.float64)
    b = torch.rand(2, 2, requires_grad=True, dtype=torch.float64)
    eye = torch.eye(4, dtype=torch.double)
    msg = "`get_numerical_jacobian` was part of PyTorch's private API"

    with pytest.warns(FutureWarning, match=msg):
        jacobian = get_numerical_jacobian(fn, (a, b), target=a, eps=1e-6)
    torch.testing.assert_close(jacobian[0], 2 * eye)

    with pytest.warns(FutureWarning, match=msg):
        jacobian = get_numerical_jacobian(fn, (a, b), eps=1e-6)
    torch.testing.assert_close(jacobian[0], 2 * eye)
    torch.testing.assert_close(jacobian[1], 1 * eye)

    with pytest.raises(ValueError, match="Expected grad_out to be 1.0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            get_numerical_jacobian(fn, (a, b), eps=1e-6, grad_out=2.0)


# test_gradcheck_get_analytical_jacobian
def test_gradcheck_get_analytical_jacobian(impl):
    _torch_only(impl, "torch.autograd.gradcheck.get_analytical_jacobian")
    from torch.autograd.gradcheck import get_analytical_jacobian

    def fn(x, y):
        return 2 * x + y, x + 2 * y

    a = torch.rand(2, 2, requires_grad=True, dtype=torch.float64)
    b = torch.rand(2, 2, requires_grad=True, dtype=torch.float64)
    eye = torch.eye(4, dtype=torch.double)
    msg = "`get_analytical_jacobian` was part of PyTorch's private API"

    outputs = fn(a, b)
    with pytest.warns(FutureWarning, match=msg):
        jacobians, reentrant, _correct_grad_sizes, _correct_grad_types = get_analytical_jacobian((a, b), outputs[0])
    torch.testing.assert_close(jacobians[0], 2 * eye)
    torch.testing.assert_close(jacobians[1], 1 * eye)
    assert reentrant

    outputs = NonDetFunc.apply(a, 1e-6)
    with pytest.warns(FutureWarning, match=msg):
        jacobians, reentrant, _correct_grad_sizes, _correct_grad_types = get_analytical_jacobian((a,), outputs)
    assert not reentrant

    with pytest.raises(ValueError, match="Expected grad_out to be 1.0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            get_analytical_jacobian((a,), outputs, grad_out=2.0)


# test_gradcheck_custom_error
def test_gradcheck_custom_error(impl):
    def fn(x):
        y = x.clone()
        y.register_hook(lambda x: x + 1e-2)
        return y

    def fn2(x):
        raise RuntimeError("Not a GradcheckError!")

    for fast_mode in (True, False):
        x = torch.ones(2, 2, requires_grad=True)
        with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
            impl.gradcheck(fn, (x,), fast_mode=fast_mode)
        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            impl.gradcheck(fn, (x,), fast_mode=fast_mode)
        assert not impl.gradcheck(fn, (x,), raise_exception=False, fast_mode=fast_mode)

        # with raise_exception=False, errors other than GradcheckError are not caught by gradcheck
        with pytest.raises(RuntimeError, match="Not a GradcheckError!"):
            impl.gradcheck(fn2, (x,), fast_mode=fast_mode, raise_exception=False)


# test_gradcheck_forward_ad
def test_gradcheck_forward_ad(impl):
    def fn(x, y):
        return x + y, y

    def bad_fn(x, y):
        # a hacky way to tell whether we are inside a forward AD level
        if fwAD._current_level >= 0:
            y_p, y_d = fwAD.unpack_dual(y)
            y = fwAD.make_dual(y_p, y_d * 1.1)
        return x + y, y

    def basic_mul(x):
        return torch.view_as_real(torch.resolve_conj(x * 1j))

    err_msg = "Jacobian computed with forward mode mismatch for output 0 with respect to input 1"

    for fast_mode in (True, False):
        # all inputs and outputs real
        x = torch.rand(2, dtype=torch.double, requires_grad=True)
        y = torch.rand(2, dtype=torch.double, requires_grad=True)
        impl.gradcheck(fn, (x, y), check_forward_ad=True, fast_mode=fast_mode)
        with pytest.raises(RuntimeError, match=err_msg):
            impl.gradcheck(bad_fn, (x, y), check_forward_ad=True, fast_mode=fast_mode)
        impl.gradcheck(basic_mul, x, check_forward_ad=True, fast_mode=fast_mode)

        # one input and one output complex
        x = torch.rand(2, dtype=torch.cdouble, requires_grad=True)
        impl.gradcheck(fn, (x, y), check_forward_ad=True, fast_mode=fast_mode)
        with pytest.raises(RuntimeError, match=err_msg):
            impl.gradcheck(bad_fn, (x, y), check_forward_ad=True, fast_mode=fast_mode)

        # all inputs and outputs complex
        y = torch.rand(2, dtype=torch.cdouble, requires_grad=True)
        impl.gradcheck(fn, (x, y), check_forward_ad=True, fast_mode=fast_mode)
        with pytest.raises(RuntimeError, match=err_msg):
            impl.gradcheck(bad_fn, (x, y), check_forward_ad=True, fast_mode=fast_mode)


# test_gradcheck_forward_ad_runs_with_no_requires_grad
def test_gradcheck_forward_ad_runs_with_no_requires_grad(impl):
    # requires_grad tells gradcheck which inputs are differentiable, but the inputs the function
    # receives under forward AD must not require grad
    class UserFn(Function):
        @staticmethod
        def forward(ctx, x, y):
            if fwAD._current_level >= 0:
                assert not x.requires_grad
                assert not y.requires_grad
            return x.clone(), y.clone()

        @staticmethod
        def jvp(ctx, x_t, y_t):
            return x_t, y_t

    x = torch.rand(2, dtype=torch.double, requires_grad=True)
    y = torch.rand(2, dtype=torch.double, requires_grad=True)
    common = dict(check_forward_ad=True, check_backward_ad=False, check_batched_grad=False)
    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=False, check_batched_forward_grad=False, **common)
    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=False, **common)
    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=True, **common)

    x = torch.rand(2, dtype=torch.double, requires_grad=True)
    y = torch.rand(2, dtype=torch.double, requires_grad=False)
    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=True, **common)


# test_gradcheck_forward_ad_respects_requires_grad
def test_gradcheck_forward_ad_respects_requires_grad(impl):
    jvp_count = [0]

    class UserFn(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x.clone(), y.clone()

        @staticmethod
        def jvp(ctx, x_t, y_t):
            jvp_count[0] += 1
            return x_t, y_t

    common = dict(check_forward_ad=True, check_backward_ad=False, check_batched_grad=False)

    # slow gradcheck loops numel times, so numel = 1 gives fast and slow mode the same counts
    x = torch.rand(1, dtype=torch.double, requires_grad=True)
    y = torch.rand(1, dtype=torch.double, requires_grad=True)
    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=False, check_batched_forward_grad=False, **common)
    assert jvp_count[0] == 2  # once per input
    jvp_count[0] = 0

    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=False, **common)
    assert jvp_count[0] == 6  # +4: once with a normal zero tangent, once with an efficient one, per input
    jvp_count[0] = 0

    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=True, **common)
    assert jvp_count[0] == 12  # +6: a batch of 2 with vmap (+1) and with a loop (+2), per input
    jvp_count[0] = 0

    # the same with one input not requiring grad: the undefined forward-mode test is +1 (not +2)
    # for a single differentiable input, the other counts are halved
    x = torch.rand(1, dtype=torch.double, requires_grad=True)
    y = torch.rand(1, dtype=torch.double, requires_grad=False)
    impl.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=True, **common)
    assert jvp_count[0] == 5  # 1 + 1 + 3


# test_gradcheck_check_forward_or_backward_only
def test_gradcheck_check_forward_or_backward_only(impl):
    """Depending on check_forward_ad and check_backward_ad, the right code paths are reached (or not)."""
    fwd_fail_err_msg = "FAIL FWD"
    bwd_fail_err_msg = "FAIL BWD"

    class UserFn(Function):
        @staticmethod
        def forward(ctx, foo, fwd_bad, bwd_bad):
            ctx.fwd_bad = fwd_bad
            ctx.bwd_bad = bwd_bad
            return foo * 2

        @staticmethod
        def vjp(ctx, gO):
            if ctx.bwd_bad:
                raise RuntimeError(bwd_fail_err_msg)
            return 2 * gO, None, None

        @staticmethod
        def jvp(ctx, gI, _1, _2):
            if ctx.fwd_bad:
                raise RuntimeError(fwd_fail_err_msg)
            return 2 * gI

    for fast_mode, check_forward_ad, check_backward_ad, fwd_bad, bwd_bad in product((True, False), repeat=5):
        fwd_should_fail = fwd_bad and check_forward_ad
        bwd_should_fail = bwd_bad and check_backward_ad
        x = torch.rand(2, dtype=torch.double, requires_grad=True)

        run = partial(
            impl.gradcheck,
            UserFn.apply,
            (x, fwd_bad, bwd_bad),
            check_forward_ad=check_forward_ad,
            check_backward_ad=check_backward_ad,
            check_undefined_grad=check_backward_ad,
            check_batched_grad=check_backward_ad,
            fast_mode=fast_mode,
        )

        if not check_forward_ad and not check_backward_ad:
            with pytest.raises(AssertionError, match="Expected at least one of"):
                run()
            continue

        if not fwd_should_fail and not bwd_should_fail:
            run()
        else:
            # if both fail, the backward AD failure "hides" the forward AD one
            fail_msg = bwd_fail_err_msg if bwd_should_fail else fwd_fail_err_msg
            with pytest.raises(RuntimeError, match=fail_msg):
                run()


# test_gradcheck_forward_ad_batched_grad
def test_gradcheck_forward_ad_batched_grad(impl):
    x = torch.rand(2, dtype=torch.double, requires_grad=True)
    common = dict(
        check_forward_ad=True,
        check_backward_ad=False,
        check_batched_grad=False,
        check_undefined_grad=False,
        check_batched_forward_grad=True,
    )

    # multiple inputs and outputs, with non-tensor inputs
    def fn1(a: torch.Tensor, b: int):
        return a.clone(), a + 1

    impl.gradcheck(fn1, (x, 1), **common)

    # unrelated inputs: the tangent for c is None
    def fn2(a: torch.Tensor, c: torch.Tensor):
        return a.clone()

    impl.gradcheck(fn2, (x, x.clone()), **common)

    class Fn(Function):
        @staticmethod
        def forward(ctx, foo):
            return foo * 2

        @staticmethod
        def vjp(ctx, gO):
            return gO * 2

        @staticmethod
        def jvp(ctx, gI):
            torch.randn_like(gI)
            return gI * 2

    msg = "vmap: We do not yet support calling random operations inside of vmap"
    with pytest.raises(RuntimeError, match=msg):
        impl.gradcheck(Fn.apply, (x,), check_forward_ad=True, check_batched_forward_grad=True)


# --------------------------------------------------- other tests whose verdict is gradcheck's own


# test_unrelated_inputs: grad(grad)check runs even with an unrelated (but differentiable) input
def test_unrelated_inputs(impl):
    def my_function(x, y):
        return x * x

    x = torch.rand(10, dtype=torch.double, requires_grad=True)
    y = torch.rand(10, dtype=torch.double, requires_grad=True)
    impl.gradcheck(my_function, (x, y))
    impl.gradgradcheck(my_function, (x, y))


# test_custom_function_forward_mode_view_checks
def test_custom_function_forward_mode_view_checks(impl):
    flag_to_error = {
        "ok": None,
        "not_a_view": "jvp is not returning a view",
        "not_a_view_of_inp": "jvp is not returning a view of the given",
        "not_a_view_of_inp_base": "jvp is not returning a view of the same base",
    }

    class ViewFn(Function):
        @staticmethod
        def forward(ctx, foo, flag):
            ctx.flag = flag
            ctx.size = foo.size()
            return foo.narrow(0, 0, 2)

        @staticmethod
        def vjp(ctx, gO):
            gI = gO.new_zeros(ctx.size)
            gI.narrow(0, 0, 2).copy_(gO)
            return gI, None

        @staticmethod
        def jvp(ctx, gI, _):
            res = gI.narrow(0, 0, 2)
            if ctx.flag != "ok":
                res = res.clone()  # break the view in the gradients
            if ctx.flag in ["not_a_view_of_inp", "not_a_view_of_inp_base"]:
                res = res.view_as(res)  # a view, of the wrong thing
            return res

    inp = torch.rand(4, 4, dtype=torch.double, requires_grad=True)
    for flag, msg in flag_to_error.items():

        def test_fn(inp, flag=flag):
            if flag == "not_a_view_of_inp_base":
                inp = inp.view_as(inp)
            return ViewFn.apply(inp, flag)

        if msg is None:
            impl.gradcheck(test_fn, inp, check_forward_ad=True)
        else:
            with pytest.raises(RuntimeError, match=msg):
                impl.gradcheck(test_fn, inp, check_forward_ad=True)


# test_custom_function_forward_mode_inplace_checks
def test_custom_function_forward_mode_inplace_checks(impl):
    class InplaceFn(Function):
        @staticmethod
        def forward(ctx, foo, flag):
            ctx.mark_dirty(foo)
            ctx.flag = flag
            foo.mul_(2)
            return foo

        @staticmethod
        def vjp(ctx, gO):
            return 2 * gO, None

        @staticmethod
        def jvp(ctx, gI, _):
            if ctx.flag:
                return 2 * gI  # not in place
            gI.mul_(2)
            return gI

    inp = torch.rand(4, 4, dtype=torch.double, requires_grad=True)

    def test_fn(inp, flag):
        inp = inp.clone()
        return InplaceFn.apply(inp, flag)

    impl.gradcheck(test_fn, (inp, False), check_forward_ad=True)
    with pytest.raises(
        RuntimeError, match="inplace custom Function is not modifying the forward mode gradients inplace"
    ):
        impl.gradcheck(test_fn, (inp, True), check_forward_ad=True)


# test_custom_function_forward_mode_wrong_formula
def test_custom_function_forward_mode_wrong_formula(impl):
    class UserFn(Function):
        @staticmethod
        def forward(ctx, foo, should_fail):
            ctx.should_fail = should_fail
            return foo * 2

        @staticmethod
        def vjp(ctx, gO):
            return 2 * gO, None

        @staticmethod
        def jvp(ctx, gI, _):
            return 3 * gI if ctx.should_fail else 2 * gI  # 3 * gI: a wrong formula

    inp = torch.rand(10, dtype=torch.double, requires_grad=True)
    impl.gradcheck(UserFn.apply, (inp, False), check_forward_ad=True)
    with pytest.raises(RuntimeError, match="Jacobian computed with forward mode mismatch for output 0"):
        impl.gradcheck(UserFn.apply, (inp, True), check_forward_ad=True)


# test_custom_function_forward_mode_non_tensor_before_tensor_args (its gradcheck part; the
# direct fwAD call before it does not involve gradcheck)
def test_custom_function_forward_mode_non_tensor_before_tensor_args(impl):
    class MyFn(Function):
        @staticmethod
        def forward(ctx, nt, x, nt2, y):
            return x * 2 + y * 3

        @staticmethod
        def jvp(ctx, nt, x_t, nt2, y_t):
            assert nt is None
            assert nt2 is None
            return x_t * 2 + y_t * 3

    x = torch.tensor(1.0, dtype=torch.double)
    y = torch.tensor(1.0, dtype=torch.double)
    impl.gradcheck(
        MyFn.apply,
        (1, x.requires_grad_(True), 1, y.requires_grad_(True)),
        check_forward_ad=True,
        check_backward_ad=False,
        check_batched_grad=False,
    )


# test_custom_function_forward_mode_forward_is_no_op (its gradcheck part)
def test_custom_function_forward_mode_forward_is_no_op(impl):
    error_regex = "A custom Function's forward is returning a view \\(or an input as-is\\)"
    return_lambdas = {
        # returning an input as-is in forward is treated as self.view_as(self): a jvp returning
        # x.view_as(x) is OK
        "view_as": lambda x: x.view_as(x),
        # these raise
        "self": lambda x: x,
        "mul_by_2": lambda x: x * 2,
    }
    for k, fn in return_lambdas.items():

        class MyFn(Function):
            @staticmethod
            def forward(ctx, x, y):
                return x + y, x

            @staticmethod
            def vjp(ctx, gO1, gO2):
                return gO1 + gO2, gO1

            @staticmethod
            def jvp(ctx, x_t, y_t):
                return x_t + y_t, fn(x_t)  # noqa: B023 (the class is used in this iteration only)

        a = torch.tensor(1.0, dtype=torch.double, requires_grad=True)
        c = torch.tensor(1.0, dtype=torch.double)
        if k == "view_as":
            impl.gradcheck(MyFn.apply, (a, c), check_forward_ad=True)
        else:
            with pytest.raises(RuntimeError, match=error_regex):
                impl.gradcheck(MyFn.apply, (a, c), check_forward_ad=True)


# test_custom_function_save_for_forward (its gradcheck parts)
def test_custom_function_save_for_forward(impl):
    class Func(Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor, y: torch.Tensor, z: int):
            ctx.save_for_backward(x, y)
            ctx.save_for_forward(x, y)
            ctx.z = z
            ctx.prod = x * y
            return z * ctx.prod

        @staticmethod
        def jvp(ctx, x_t, y_t, _):
            x_p, y_p = ctx.saved_tensors
            return ctx.z * (y_p * x_t + x_p * y_t)

        @staticmethod
        def vjp(ctx, grad_out):
            x, y = ctx.saved_tensors
            return ctx.z * grad_out * y, ctx.z * grad_out * x, None

    a = torch.tensor(1.0, requires_grad=True, dtype=torch.double)
    b = torch.tensor(2.0, requires_grad=True, dtype=torch.double)
    impl.gradcheck(Func.apply, (a, b, 4), check_forward_ad=True)

    # saved for backward, but not for forward
    class Func2(Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor):
            ctx.save_for_backward(x)
            return x.clone()

        @staticmethod
        def jvp(ctx, x_t):
            assert len(ctx.saved_tensors) == 0
            return x_t

        @staticmethod
        def vjp(ctx, grad_out):
            (x,) = ctx.saved_tensors
            assert len(ctx.saved_tensors) == 1
            return grad_out

    impl.gradcheck(Func2.apply, (a,), check_forward_ad=True)


# TestAutogradForwardModeBatchedGrad.test_out_of_place_basic
def test_out_of_place_basic(impl):
    a = torch.rand(4, 4, dtype=torch.double, requires_grad=True)
    b = torch.rand(4, 4, dtype=torch.double, requires_grad=True)
    flags = dict(check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True)
    assert impl.gradcheck(torch.sin, a, **flags)
    assert impl.gradcheck(torch.add, (a, b), **flags)


# TestAutogradForwardMode.test_metadata_check_checks_ignores_size_zero (its gradcheck part, which
# calls torch.autograd.gradcheck itself, without the suite's defaults)
def test_metadata_check_checks_ignores_size_zero(impl):
    inp = torch.rand([0, 1], dtype=torch.complex128, requires_grad=True)
    func = partial(torch.diagonal, offset=0)
    impl.raw_gradcheck(func, (inp,), check_forward_ad=True)
