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
from opcheck.triton._patch import is_patched, run_patch  # noqa: E402

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
    # triton 3.1's Autotuner takes no benchmark function: its __init__ is left as it is
    patched = [name for name in ("__init__", "prune_configs", "_bench") if is_patched(vars(autotuner.Autotuner)[name])]
    _unpatch(monkeypatch, autotuner.Autotuner, *patched)
    tuned = k.matmul_kernel
    # decorating (triton 3.2) or launching; triton 3.1 benchmarks through torch.cuda itself
    no_gpu = "0 active drivers|Found no NVIDIA driver|Torch not compiled with CUDA"
    with pytest.raises((RuntimeError, AssertionError), match=no_gpu):
        keys = getattr(tuned, "keys", None) or [tuned.arg_names[i] for i in tuned.key_idx]  # triton 3.1: key_idx
        again = triton.autotune(configs=tuned.configs, key=keys)(tuned.fn)
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


def _scans_widen_bfloat16_themselves() -> bool:
    """triton 3.1-3.2's tl.cumsum and tl.cumprod widen bfloat16 to float32 themselves: no bit
    patterns reach the interpreter's scan there."""
    import inspect

    import triton.language as tl

    return "_promote_bfloat16_to_float32" in inspect.getsource(tl.standard.cumsum.fn)


def test_bfloat16_cumsum_scans_bit_patterns_without_the_patch(monkeypatch):
    from tests.triton import probes

    k = _kernels()
    x = _bf16(3, 50).requires_grad_()
    dy = _bf16(3, 50, seed=1)
    y = k.cumsum(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert torch.equal(y, x.detach().float().cumsum(-1).to(torch.bfloat16))  # float32, each output rounded once
    assert torch.equal(dx, dy.float().flip(-1).cumsum(-1).flip(-1).to(torch.bfloat16))
    factors = (torch.rand(20, generator=_gen()) + 0.5).to(torch.bfloat16)
    assert torch.equal(probes.cumprod(factors), factors.float().cumprod(0).to(torch.bfloat16))
    if _scans_widen_bfloat16_themselves():
        return
    _unpatch(monkeypatch, interpreter.ScanOps, "cumsum", "cumprod")
    assert not torch.allclose(k.cumsum(x.detach()).float(), y.detach().float(), atol=1, rtol=0.1)
    assert not torch.allclose(probes.cumprod(factors).float(), factors.float().cumprod(0), atol=1, rtol=0.1)


def _added_in_program_order(indices: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The weight gradient a GPU's atomics give when the programs add in launch order: each add in
    float32, rounded to the dtype."""
    dw = torch.zeros(int(indices.max()) + 1, dy.shape[1], dtype=dy.dtype)
    for row, index in enumerate(indices.tolist()):
        dw[index] = (dw[index].float() + dy[row].float()).to(dy.dtype)
    return dw


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_atomic_adds_are_refused_without_the_patch(monkeypatch, dtype):
    """Rows sharing an index add into one weight row. The interpreter refused bfloat16 atomics
    ("Unsupported data type"), and float16 ones on triton 3.1; later ones add float16 themselves."""
    k = _kernels()
    indices = torch.tensor([0, 2, 0, 1, 2, 0, 3, 0])
    weight = torch.randn(4, 24, generator=_gen()).to(dtype).requires_grad_()
    dy = torch.randn(8, 24, generator=_gen(1)).to(dtype)
    try:
        (dw,) = torch.autograd.grad(k.embedding(indices, weight), weight, dy)
    except Exception as e:
        if "atomic_add does not support bf16" not in str(e):
            raise
        pytest.skip(f"triton {triton.__version__}'s language refuses a bfloat16 atomic_add, on a GPU too")
    assert torch.equal(dw, _added_in_program_order(indices, dy))
    (dw_bug,) = torch.autograd.grad(k.embedding_bug(indices, weight), weight, dy)
    assert not torch.allclose(dw_bug.float(), dw.float(), atol=0.1)
    _unpatch(monkeypatch, interpreter.InterpreterBuilder, "create_atomic_rmw")
    try:
        (unpatched,) = torch.autograd.grad(k.embedding(indices, weight), weight, dy)
    except Exception as e:
        assert "Unsupported data type" in str(e)
        return
    assert dtype is torch.float16 and torch.equal(unpatched, dw)


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


# ------------------------------------------------------------------------------------ constexpr annotations
def test_string_constexpr_annotations_were_tensors_in_triton_3_1s_interpreter(monkeypatch):
    """The corpus's module has `from __future__ import annotations`: `BLOCK: tl.constexpr` is a string."""
    k = _kernels()
    x, y = _bf16(100), _bf16(100, seed=1)
    assert torch.equal(k.mul_add(x, y), x * y + x)
    if not is_patched(interpreter.GridExecutor.__init__):
        from triton.runtime import jit

        assert jit._normalize_ty("tl.constexpr") == "constexpr"  # this interpreter reads the string itself
        return
    _unpatch(monkeypatch, interpreter.GridExecutor, "__init__")
    if hasattr(interpreter, "ASTTransformer"):  # triton 3.2 compiles each kernel again, evaluating them
        assert torch.equal(k.mul_add(x, y), x * y + x)
        return
    with pytest.raises(Exception, match="arange's arguments must be of type tl.constexpr"):
        k.mul_add(x, y)


# ------------------------------------------------------------------------------------ loops
def test_loop_indices_are_python_ints_without_the_patch(monkeypatch):
    k = _kernels()
    x = torch.randn(3, 50, generator=_gen())
    torch.testing.assert_close(k.row_sumsq(x), (x * x).sum(-1))
    if hasattr(interpreter, "ASTTransformer"):
        monkeypatch.delattr(interpreter.ASTTransformer, "visit_For")
        _fresh_rewrites(monkeypatch)
    else:  # triton 3.1: the kernels were compiled again from their source, their own functions kept
        for kernel in (k._row_sumsq_fwd, k._row_sumsq_bwd):
            monkeypatch.setattr(kernel, "fn", kernel.fn.__wrapped__)
    # triton 3.2 with numpy 2 fails one step earlier: a kernel's int argument as a range bound
    with pytest.raises(Exception, match="'int' object has no attribute 'to'|only 0-dimensional arrays"):
        k.row_sumsq(x)


def test_static_range_indices_stay_python_ints():
    import ast

    tree = ast.parse("for i in tl.static_range(3):\n    pass\nfor j in tl.range(3):\n    pass\n")
    rewriter = getattr(interpreter, "ASTTransformer", loops.LoopRewriter)  # triton 3.1 has none of its own
    loops_seen = rewriter().visit(tree).body
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


def _no_triton_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """triton.runtime.driver as Triton leaves it without a GPU: making the active driver raises."""
    config = triton.runtime.driver
    if isinstance(getattr(type(config), "active", None), property):  # triton 3.2 and later
        monkeypatch.setattr(config, "_active", None)
    else:  # triton 3.1: a proxy that makes the driver on first use
        monkeypatch.setattr(config, "active", config.default)


def _unpatch_torch_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    _unpatch(monkeypatch, torch.cuda, "get_device_properties", "current_device")


@pytest.mark.parametrize("query", ["triton_driver", "current_triton_device", "current_torch_device", "cuda"])
def test_the_sm_count_public_kernels_ask_for_raises_without_the_patches(monkeypatch, query):
    """Each way public launchers ask the SM count (see SM_COUNT_QUERIES) is answered, SM_COUNT, so
    the persistent kernel runs several programs and its bug twin's dropped tail rows show."""
    k = _kernels()
    x = torch.randn(10, 30, generator=_gen())
    assert k.SM_COUNT_QUERIES[query](x) == devices.SM_COUNT
    torch.testing.assert_close(k.softmax_persistent(x, query), torch.softmax(x, -1))
    assert not torch.allclose(k.softmax_persistent_bug(x, query)[8:], torch.softmax(x, -1)[8:])
    _no_triton_driver(monkeypatch)
    _unpatch_torch_queries(monkeypatch)
    # A CPU build raises AssertionError ("Torch not compiled with CUDA"), a CUDA build without a
    # GPU RuntimeError; Triton raises RuntimeError ("0 active drivers").
    with pytest.raises((AssertionError, RuntimeError)):
        k.softmax_persistent(x, query)


def test_only_the_interpreters_device_is_answered():
    """ "cuda:1" or index 1 names a device that is not there: torch and the driver still say so."""
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.get_device_properties(1)
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.get_device_properties("cuda:1")
    with pytest.raises(RuntimeError, match="no device 1: Triton's interpreter runs kernels on one device"):
        triton.runtime.driver.active.utils.get_device_properties(1)
    for device in (None, -1, 0, "cpu", "cuda", "cuda:0", torch.device("cuda"), torch.device("cpu")):
        assert torch.cuda.get_device_properties(device).multi_processor_count == devices.SM_COUNT, device
        assert triton.runtime.driver.active.utils.get_device_properties(device) == devices.driver_properties()
    assert torch.cuda.current_device() == triton.runtime.driver.active.get_current_device() == 0
    with torch.cuda.device(torch.cuda.current_device()), torch.cuda.device("cuda"):
        pass


def test_what_needs_a_gpu_driver_still_says_so(monkeypatch):
    """The driver answers device queries only: the target, the benchmarker and a compiled launch
    raise what they raised. Kernels asking `tl.target_info.is_cuda()` still get False (no target)."""
    import triton.backends.driver as backend_driver
    import triton.language as tl

    active = triton.runtime.driver.active
    with pytest.raises(RuntimeError, match="0 active drivers"):
        active.get_current_target()
    with pytest.raises(RuntimeError, match="0 active drivers"):
        active.utils.load_binary  # noqa: B018
    if hasattr(backend_driver.DriverBase, "get_active_torch_device"):  # triton 3.2 and later
        assert active.get_active_torch_device() == torch.device("cpu")
    else:
        with pytest.raises(RuntimeError, match="0 active drivers"):
            active.get_active_torch_device()
    if hasattr(tl, "target_info"):  # it took "no driver" for no target; now a driver answers
        assert tl.target_info.current_target() is None
        assert not tl.target_info.is_cuda()
        monkeypatch.setattr(tl.target_info, "current_target", tl.target_info.current_target.__wrapped__)
        with pytest.raises(RuntimeError, match="0 active drivers"):
            tl.target_info.is_cuda()


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
