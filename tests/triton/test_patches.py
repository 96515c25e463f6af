"""Each interpreter patch against a kernel that fails without it: the patch is undone for the test
(monkeypatch puts the interpreter's own function back, and puts the patch back after), the kernel
fails, raises or is wrong, and with the patch it is right. The patches were applied in this process
by opcheck's plugin before any kernel was defined."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is not installed: the `triton` extra installs it on Linux x86_64")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import autotuner, interpreter  # noqa: E402

import opcheck.triton  # noqa: E402
from opcheck.triton import autotune, bfloat16, devices, loops  # noqa: E402
from opcheck.triton._patch import run_patch  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreting")


def _kernels():
    from tests.triton import thirdparty_kernels

    return thirdparty_kernels


def _unpatch(monkeypatch: pytest.MonkeyPatch, owner, *names: str) -> None:
    for name in names:
        monkeypatch.setattr(owner, name, getattr(owner, name).__wrapped__)


def _fresh_rewrites(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter caches each kernel's rewritten source: rewrite again under what the test set."""
    monkeypatch.setattr(interpreter.InterpretedFunction, "rewritten_fn", {})


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_setup_reports_every_patch_applied_on_this_triton(interpreting):
    assert interpreting is opcheck.triton.setup()  # idempotent
    assert [p.name for p in interpreting.patches] == [p.name for p in opcheck.triton.all_patches()]
    assert interpreting.not_applied == ()
    text = interpreting.describe()
    assert text.startswith("Triton interpreter on: TRITON_INTERPRET=1")
    assert "loop indices: `for i in range(...)`" in text


# ------------------------------------------------------------------------------------ autotune
def _matmul_inputs():
    gen = _gen()
    return torch.randn(20, 24, generator=gen), torch.randn(24, 18, generator=gen)


def test_autotuned_kernels_need_a_gpu_driver_without_the_patch(monkeypatch):
    k = _kernels()
    _unpatch(monkeypatch, autotuner.Autotuner, "__init__", "prune_configs", "_bench")
    tuned = k.matmul_kernel
    with pytest.raises(RuntimeError, match="0 active drivers"):  # decorating (triton 3.2) or launching
        again = triton.autotune(configs=tuned.configs, key=tuned.keys)(tuned.fn)
        monkeypatch.setattr(k, "matmul_kernel", again)
        k.matmul(*_matmul_inputs())


def test_autotuned_kernels_run_the_first_config_that_survives_pruning(monkeypatch):
    k = _kernels()
    monkeypatch.setattr(k.matmul_kernel, "cache", {})
    a, b = _matmul_inputs()
    torch.testing.assert_close(k.matmul(a, b), a @ b)
    assert k.matmul_kernel.best_config.kwargs == {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}


@pytest.mark.parametrize("index, block", [(1, 32), (-1, 64), (7, 64)])
def test_an_autotune_config_can_be_named_by_its_index(monkeypatch, index, block):
    k = _kernels()
    monkeypatch.setattr(k.matmul_kernel, "cache", {})
    monkeypatch.setattr(autotune, "_choice", [0])
    opcheck.triton.setup(autotune_config=index)
    a, b = _matmul_inputs()
    torch.testing.assert_close(k.matmul(a, b), a @ b)
    assert k.matmul_kernel.best_config.kwargs["BLOCK_M"] == block


def test_the_config_index_comes_from_the_environment(monkeypatch):
    monkeypatch.setattr(autotune, "_choice", [0])
    monkeypatch.setenv(autotune.CONFIG_ENV, "2")
    assert autotune.choose(None) == 2 and autotune.chosen(["a", "b", "c"]) == ["c"]
    monkeypatch.setenv(autotune.CONFIG_ENV, "last")
    with pytest.raises(ValueError, match=f"{autotune.CONFIG_ENV}='last': expected a config index"):
        autotune.choose(None)


# ------------------------------------------------------------------------------------ bfloat16
def _bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(torch.bfloat16)


def test_bfloat16_arithmetic_runs_on_bit_patterns_without_the_patch(monkeypatch):
    k = _kernels()
    x, y = _bf16(100), _bf16(100, seed=1)
    assert torch.equal(k.mul_add(x, y), x * y + x)  # a GPU's roundings: each op in float32, rounded to bfloat16
    _unpatch(monkeypatch, interpreter.InterpreterBuilder, "binary_op", "ternary_op", "unary_op", "create_fma")
    wrong = k.mul_add(x, y)
    assert not torch.allclose(wrong.float(), (x * y + x).float(), atol=1, rtol=0.1)


def test_float32_to_bfloat16_casts_truncate_without_the_patch(monkeypatch):
    from tests.triton import probes

    x = torch.randn(1000, generator=_gen())
    assert torch.equal(probes.to_bfloat16(x), x.to(torch.bfloat16))  # torch rounds to nearest even
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3895e38, -0.0])
    assert torch.equal(probes.to_bfloat16(specials).isnan(), specials.isnan())
    torch.testing.assert_close(probes.to_bfloat16(specials)[1:], specials[1:].to(torch.bfloat16))
    _unpatch(monkeypatch, interpreter.InterpreterBuilder, "cast_impl", "create_fp_to_fp")
    truncated = probes.to_bfloat16(x)
    assert not torch.equal(truncated, x.to(torch.bfloat16))
    toward_zero = (truncated.float().abs() <= x.abs()).all()
    assert toward_zero


def test_bfloat16_reductions_reduce_bit_patterns_without_the_patch(monkeypatch):
    from tests.triton import probes

    x = _bf16(40)
    expected = torch.stack([x.float().sum(), x.float().max()]).to(torch.bfloat16)  # float32, rounded once
    assert torch.equal(probes.sum_and_max(x), expected)
    import inspect

    import triton.language as tl

    if "_promote_bfloat16_to_float32" in inspect.getsource(tl.standard.sum.fn):
        return  # triton 3.2's tl.sum widens bfloat16 itself: no bit patterns reach the reduction there
    _unpatch(monkeypatch, interpreter.ReduceOps, "sum", "min_max")
    assert not torch.equal(probes.sum_and_max(x), expected)


def test_bfloat16_dot_multiplies_bit_patterns_without_the_patch(monkeypatch):
    k = _kernels()
    a, b = (t.to(torch.bfloat16) for t in _matmul_inputs())
    exact = (a.float() @ b.float()).to(torch.bfloat16)  # float32 accumulation, rounded once
    torch.testing.assert_close(k.matmul(a, b), exact, rtol=0, atol=0)
    _unpatch(monkeypatch, interpreter.InterpreterBuilder, "create_dot")
    assert not torch.allclose(k.matmul(a, b).float(), exact.float(), atol=1, rtol=0.1)


def test_bfloat16_helpers_round_to_nearest_even():
    values = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, float("nan"), float("inf"), -2.5])
    got = bfloat16.to_bfloat16(values.numpy())
    assert torch.equal(torch.from_numpy(got.view("int16")).view(torch.bfloat16)[:3], values[:3].to(torch.bfloat16))
    back = bfloat16.to_float32(got)
    assert back[3] != back[3] and back[4] == float("inf") and back[5] == -2.5


# ------------------------------------------------------------------------------------ loops
def test_loop_indices_are_python_ints_without_the_patch(monkeypatch):
    k = _kernels()
    x = torch.randn(3, 50, generator=_gen())
    torch.testing.assert_close(k.row_sumsq(x), (x * x).sum(-1))
    monkeypatch.delattr(interpreter.ASTTransformer, "visit_For")
    _fresh_rewrites(monkeypatch)
    # triton 3.2 with numpy 2 fails one step earlier: a kernel's int argument as a range bound
    with pytest.raises(Exception, match="'int' object has no attribute 'to'|only 0-dimensional arrays"):
        k.row_sumsq(x)


def test_static_range_indices_stay_python_ints():
    import ast

    tree = ast.parse("for i in tl.static_range(3):\n    pass\nfor j in tl.range(3):\n    pass\n")
    loops_seen = interpreter.ASTTransformer().visit(tree).body
    assert ast.unparse(loops_seen[0].iter) == "tl.static_range(3)"
    assert ast.unparse(loops_seen[1].iter) == f"{loops.INDICES}(tl.range({loops.BOUND}(3)))"


# ------------------------------------------------------------------------------------ devices
def _rms_norm_grads(op):
    gen = _gen()
    x = torch.randn(6, 40, generator=gen, requires_grad=True)
    w = (torch.rand(40, generator=gen) + 0.5).requires_grad_()
    return torch.autograd.grad(op(x, w).sum(), [x, w])


def test_device_guards_and_queries_raise_for_cpu_tensors_without_the_patch(monkeypatch):
    k = _kernels()
    x = torch.ones(2, 4)
    with torch.cuda.device(x.device.index), torch.cuda.device(x.device):
        pass
    assert torch.cuda.get_device_properties(x.device).multi_processor_count == devices.SM_COUNT
    monkeypatch.setattr(torch.cuda, "device", torch.cuda.device.__mro__[1])
    # A CPU build raises TypeError and AssertionError ("Torch not compiled with CUDA"); a CUDA build
    # on a machine without a GPU raises RuntimeError from the device guard and the driver query.
    with pytest.raises((TypeError, RuntimeError)):
        k.rms_norm(x, torch.ones(4))
    _unpatch(monkeypatch, torch.cuda, "get_device_properties")
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.get_device_properties(x.device)


def test_several_programs_share_a_reduction_so_its_bug_shows(monkeypatch):
    """The weight gradient is summed over one partial per SM: with one SM (what a single-program
    answer would give) the twin that keeps only the first partial is right by accident."""
    k = _kernels()
    reference = _rms_norm_grads(k.rms_norm_reference)
    torch.testing.assert_close(_rms_norm_grads(k.rms_norm), reference)
    assert not torch.allclose(_rms_norm_grads(k.rms_norm_bug)[1], reference[1])
    monkeypatch.setattr(devices.CpuDeviceProperties, "__init__", _one_sm)
    torch.testing.assert_close(_rms_norm_grads(k.rms_norm_bug), reference)


def _one_sm(self, multi_processor_count=1, **kwargs):
    object.__setattr__(self, "multi_processor_count", 1)


# ------------------------------------------------------------------------------------ guards
def test_a_patch_whose_target_changed_shape_is_not_applied_and_says_why(monkeypatch):
    def binary_op(self, a, b):  # another release's shape
        raise AssertionError("not called")

    ternary = interpreter.InterpreterBuilder.ternary_op
    monkeypatch.setattr(interpreter.InterpreterBuilder, "binary_op", binary_op)
    (arithmetic,) = (p for p in bfloat16.PATCHES if p.name == "bfloat16 arithmetic")
    result = run_patch(arithmetic)
    assert not result.applied
    import triton

    assert result.reason == (
        f"triton {triton.__version__}: InterpreterBuilder.binary_op takes (self, a, b), not (self, lhs, rhs, op)"
    )
    assert result.describe().startswith("bfloat16 arithmetic: NOT applied (triton ")
    assert interpreter.InterpreterBuilder.binary_op is binary_op
    assert interpreter.InterpreterBuilder.ternary_op is ternary  # all of a patch, or none of it
