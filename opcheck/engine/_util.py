"""Small tensor helpers shared by the engine's modules."""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.overrides import has_torch_function, is_tensor_like

from opcheck.engine.margins import MarginRecorder, current_recorder, ratio_of, worst_ratio
from opcheck.engine.reporting import torch_words

Func = Callable[..., Any]
"""A function under check: tensors (and other arguments) in, a tensor or a tuple of outputs out."""
Inputs = tuple[Any, ...]
"""A call's arguments: tensors, some requiring grad, and anything else the function takes."""

Vmap = Callable[..., Callable[..., Any]]
"""vmap(func) -> the batched func."""


def _legacy(name: str) -> Vmap | None:
    try:
        internals = importlib.import_module("torch._vmap_internals")
    except ImportError:  # pragma: no cover - depends on the torch release
        return None
    found: Vmap | None = getattr(internals, name, None)
    return found


# The legacy vmap is what torch's own gradcheck uses for its batched checks; `vmap` warns that it
# is deprecated, `_vmap` does not.
legacy_vmap = _legacy("_vmap")
legacy_vmap_warning: Vmap = _legacy("vmap") or torch.func.vmap


def _flat_vmap() -> Callable[..., Any] | None:
    """torch.func.vmap's own steps for tensors batched along their first dimension, or None where this
    torch lacks one of them: the nesting level (torch._C._functorch's _vmap_increment_nesting and
    _vmap_decrement_nesting), a batch dimension on each argument (_add_batch_dim), the call, and the
    batch dimension off each output (_remove_batch_dim; an output that is not a tensor or a plain
    tuple of tensors goes through torch._functorch.vmap's _unwrap_batched, which says what is wrong with it)."""
    try:
        module = importlib.import_module("torch._functorch.vmap")
    except ImportError:  # pragma: no cover - depends on the torch release
        return None
    functorch = torch._C._functorch
    names = ("_vmap_increment_nesting", "_vmap_decrement_nesting", "_add_batch_dim", "_remove_batch_dim")
    found = [getattr(functorch, name, None) for name in names]
    unwrap, load = getattr(module, "_unwrap_batched", None), getattr(module, "lazy_load_decompositions", None)
    if None in found or unwrap is None or load is None:
        return None  # pragma: no cover - depends on the torch release
    steps: list[Callable[..., Any]] = [step for step in found if step is not None]
    expected = ["batched_outputs", "out_dims", "vmap_level", "batch_size", "func"]  # torch 2.0 to 2.14
    if list(inspect.signature(unwrap).parameters) != expected:
        return None  # pragma: no cover - depends on the torch release
    increment, decrement, add, remove = steps
    loaded: list[bool] = []

    def call(func: Func, args: Sequence[torch.Tensor], randomness: str) -> Any:
        if not loaded:  # what torch.func.vmap does first: its decompositions, registered once per process
            load()
            loaded.append(True)
        batch = args[0].shape[0]
        level = increment(batch, randomness)
        try:
            outputs = func(*[add(a, 0, level) for a in args])
            if isinstance(outputs, torch.Tensor):
                return remove(outputs, level, batch, 0)
            if type(outputs) is tuple and all(isinstance(o, torch.Tensor) for o in outputs):
                return tuple(remove(o, level, batch, 0) for o in outputs)
            return unwrap(outputs, 0, level, batch, func)
        finally:
            decrement()

    return call


_FLAT_VMAP = _flat_vmap()


def vmap_rows(func: Func, args: Sequence[Any], randomness: str = "error") -> Any:
    """torch.func.vmap(func, randomness=randomness)(*args) for tensors batched along their first
    dimension: the same steps (_flat_vmap), without flattening the arguments and outputs into trees
    and back, where they are tensors of one batch size (torch.sin on 5 rows of 11: 7 us against
    torch.func.vmap's 50-80 us, and a tenth of fast_mode="auto"'s time on 5 elements). Anything
    else goes through torch.func.vmap itself, which says what is wrong with it."""
    if _FLAT_VMAP is not None and args:
        first = args[0]
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            batch = first.shape[0]
            if all(isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch for a in args):
                return _FLAT_VMAP(func, args, randomness)
    return torch.func.vmap(func, randomness=randomness)(*args)


def _legacy_batching() -> tuple[Callable[..., Any], ...] | None:
    """The legacy vmap's steps (torch._vmap_internals), or None where this torch lacks one of them."""
    found = (
        getattr(torch._C, "_vmapmode_increment_nesting", None),
        getattr(torch._C, "_vmapmode_decrement_nesting", None),
        getattr(torch, "_add_batch_dim", None),
        getattr(torch, "_remove_batch_dim", None),
    )
    steps = tuple(step for step in found if step is not None)
    return steps if len(steps) == len(found) else None


_LEGACY_BATCHING = _legacy_batching()


def _engine_backward() -> Callable[..., Any] | None:
    """torch.autograd.grad's own call into the autograd engine (torch.autograd.graph's
    _engine_run_backward: the engine's run, with its debug logging and its compiler context), or
    None where this torch lacks it or takes other arguments."""
    run: Callable[..., Any] | None = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if run is None:
        return None  # pragma: no cover - depends on the torch release
    try:
        parameters = list(inspect.signature(run).parameters)
    except (TypeError, ValueError):  # pragma: no cover - depends on the torch release
        return None
    return run if parameters == ["t_outputs", "args", "kwargs"] else None  # torch 2.3 to 2.14


_ENGINE_BACKWARD = _engine_backward()


def autograd_grad(
    outputs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_outputs: Sequence[torch.Tensor],
    *,
    retain_graph: bool | None = None,
    create_graph: bool = False,
) -> tuple[torch.Tensor | None, ...]:
    """torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=..., create_graph=...,
    allow_unused=True) for the engine's own backward passes: where every output and input is a
    plain tensor (no __torch_function__) and every grad_output a tensor of its output's shape and of
    its output's kind (complex or not), torch.autograd.grad's checks and tuple-building would pass
    them through unchanged, so its engine call is made directly (torch.sin of 5 elements: 17 us a
    backward against 26 us); anything else goes through torch.autograd.grad, whose errors say
    what is wrong."""
    if (
        _ENGINE_BACKWARD is None
        or not inputs
        or len(grad_outputs) != len(outputs)
        or has_torch_function((*outputs, *inputs))
        or not all(
            isinstance(g, torch.Tensor)
            and not o.is_nested
            and g.shape == o.shape
            and g.dtype.is_complex == o.dtype.is_complex
            for o, g in zip(outputs, grad_outputs)
        )
    ):
        return torch.autograd.grad(
            outputs, inputs, grad_outputs, retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
        )
    return tuple(
        _ENGINE_BACKWARD(
            tuple(outputs),
            tuple(grad_outputs),
            create_graph if retain_graph is None else retain_graph,
            create_graph,
            tuple(inputs),
            True,
            accumulate_grad=False,
        )
    )


def batched_grad(
    outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor]
) -> tuple[torch.Tensor | None, ...]:
    """torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True,
    is_grads_batched=True): the same backward under the same legacy vmap, its steps taken here
    (a nesting level, a batch dimension on each grad_output, one backward, the batch dimension off
    each gradient) instead of through torch._vmap_internals' tree-flattening wrapper (torch.sin of 5
    elements, 7 rows: 41 us against 114 us)."""
    batch = grad_outputs[0].shape[0] if grad_outputs else 0
    if _LEGACY_BATCHING is None or any(g.dim() == 0 or g.shape[0] != batch for g in grad_outputs):
        return torch.autograd.grad(
            outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True, is_grads_batched=True
        )
    increment, decrement, add, remove = _LEGACY_BATCHING
    level = increment()
    try:
        grads = autograd_grad(outputs, inputs, [add(g, 0, level) for g in grad_outputs], retain_graph=True)
        return tuple(None if g is None else remove(g, level, batch, 0) for g in grads)
    finally:
        decrement()


def as_tuple(x: Any) -> tuple[Any, ...]:
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def _is_tensor_like(obj: Any) -> bool:
    return bool(is_tensor_like(obj))  # type: ignore[no-untyped-call]


def is_float_or_complex(obj: Any) -> bool:
    return _is_tensor_like(obj) and bool(obj.is_floating_point() or obj.is_complex())


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, a fast path before a difference is computed; False for the dtypes it does not
    implement (complex32), whose difference then decides, as in torch's own checks."""
    try:
        return bool(torch.equal(a, b))
    except NotImplementedError:
        return False


def requires_grad(obj: Any) -> bool:
    return _is_tensor_like(obj) and bool(obj.requires_grad)


def differentiable_outputs(x: Any) -> tuple[torch.Tensor, ...]:
    # Same filter as torch: a non-tensor output raises AttributeError here, as it does there.
    return tuple(o for o in as_tuple(x) if o.requires_grad)


def float_outputs(outputs: Sequence[Any]) -> list[torch.Tensor]:
    """The float and complex tensors among a call's outputs, in order."""
    return [o for o in outputs if is_float_or_complex(o)]


def diff_input_indices(inputs: Sequence[Any]) -> list[int]:
    return [i for i, a in enumerate(inputs) if requires_grad(a)]


def jacobian_sides(inputs: Sequence[Any], outputs: tuple[Any, ...]) -> tuple[int, int]:
    """(n, m): the elements of the differentiable inputs and of the float/complex outputs."""
    n = sum(inputs[j].numel() for j in diff_input_indices(inputs))
    return n, sum(o.numel() for o in float_outputs(as_tuple(outputs)))


def detached(inputs: Sequence[Any]) -> list[Any]:
    """The inputs with every tensor detached (the point a vmapped call is built around)."""
    return [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]


def zeros_like_shape(t: torch.Tensor) -> torch.Tensor:
    """A zero of t's dtype and device expanded to t's shape: the tangent or gradient of an unused one."""
    return torch.zeros([], dtype=t.dtype, device=t.device).expand(t.shape)


def vmap_form(fn: Func) -> Func:
    """The form of fn that composes with torch.func.vmap: gradgradcheck's first derivative carries one
    (see second_order.py); any other function is its own."""
    form: Func = getattr(fn, "vmap_form", fn)
    return form


def mapped(
    fn: Func,
    *,
    args: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
    outputs: Callable[[Any], tuple[Any, ...]] | None = None,
) -> Func:
    """fn with its arguments mapped by `args` before the call and its outputs by `outputs` after,
    and so its vmap form (when fn has one of its own)."""

    def wrap(f: Func) -> Func:
        def call(*xs: Any) -> Any:
            out = f(*(args(xs) if args is not None else xs))
            return outputs(out) if outputs is not None else out

        return call

    wrapped = wrap(fn)
    if hasattr(fn, "vmap_form"):
        wrapped.vmap_form = wrap(fn.vmap_form)  # type: ignore[attr-defined]
    return wrapped


def of_inputs(
    fn: Func,
    base: Sequence[Any],
    indices: Sequence[int],
    pick: Callable[[tuple[Any, ...]], tuple[Any, ...]] = tuple,
) -> Callable[..., tuple[Any, ...]]:
    """fn as a function of the arguments at `indices` alone, the others fixed at `base`; `pick`
    chooses the outputs it returns (all of them by default)."""

    def call(*xs: Any) -> tuple[Any, ...]:
        args = list(base)
        for i, x in zip(indices, xs):
            args[i] = x
        return pick(as_tuple(fn(*args)))

    return call


def floats(outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """of_inputs' pick for the float and complex outputs."""
    return tuple(float_outputs(outputs))


def at_positions(positions: Sequence[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """of_inputs' pick for the outputs at these positions."""

    def pick(outputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(outputs[p] for p in positions)

    return pick


SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
MKLDNN = torch._mkldnn  # type: ignore[attr-defined]


def is_layout_input(t: Any) -> bool:
    """A tensor that gradcheck checks through a dense stand-in (sparse or MKLDNN: layouts.py)."""
    return isinstance(t, torch.Tensor) and (t.layout in SPARSE_LAYOUTS or t.layout == MKLDNN)


def _strided_content(inp: torch.Tensor) -> torch.Tensor | None:
    """What torch's stride-0 test looks at: the values of a sparse input, nothing of an MKLDNN one."""
    if inp.layout == MKLDNN:
        return None
    if inp.layout == torch.sparse_coo:
        return inp._values()
    if inp.layout in SPARSE_LAYOUTS:
        return inp.values()
    return inp


def check_inputs(inputs: Inputs) -> None:
    """Validate gradcheck inputs the way torch does, with advice where torch has none.

    Of a sparse input torch looks at its values' strides, of an MKLDNN input at none.
    """
    found = False
    for idx, inp in enumerate(inputs):
        if not requires_grad(inp):
            continue
        if inp.dtype not in (torch.float64, torch.complex128):
            warnings.warn(
                f"{torch_words.not_double_warning(idx)}\n"
                f"(It is {inp.dtype}: finite differences with eps=1e-6 lose most of its digits. "
                "Check gradients in float64/complex128, and cover the low-precision kernel with a "
                "consistency check against the float64 result instead.)",
                stacklevel=4,
            )
        content = _strided_content(inp)
        found = True
        if content is None:
            continue
        if not all(st > 0 or sz <= 1 for st, sz in zip(content.stride(), content.size())):
            raise RuntimeError(
                f"{torch_words.stride_zero(idx)}\n(Perturbing one element of a tensor with strides "
                f"{tuple(content.stride())} moves every element that shares its memory.)"
            )
        if has_internal_overlap(content):
            raise RuntimeError(
                f"The {idx}th input has overlapping memory (shape {tuple(content.shape)}, strides "
                f"{tuple(content.stride())}): perturbing one element would move others too. "
                "Call .contiguous() on it before passing it to gradcheck."
            )
    if not found:
        raise ValueError(torch_words.no_input_requires_grad())


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True when two different indices of a strided tensor certainly address the same memory."""
    # torch's own test (used to refuse in-place writes): 0 = no overlap, 1 = overlap, 2 = too hard to tell.
    return t.numel() > 1 and torch._debug_has_internal_overlap(t) == 1


def exception_line(e: BaseException) -> str:
    """`TypeName: first line of the message`, for one-line reasons."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def check_outputs(outputs: tuple[Any, ...]) -> None:
    """torch's output check (sparse first, then MKLDNN, with its words); other layouts after it."""
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    if any(t.layout in SPARSE_LAYOUTS for t in tensors):
        raise ValueError(torch_words.sparse_output())
    if any(t.layout == MKLDNN for t in tensors):
        raise ValueError(torch_words.mkldnn_output())
    for t in tensors:
        if t.layout != torch.strided:  # torch has no words for these: its sparse ones, of this layout
            raise ValueError(torch_words.sparse_output().replace("Sparse output", f"Output with layout {t.layout}", 1))


def unravel(k: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Multi-index of flat (row-major) position k in a tensor of this shape."""
    out = []
    for size in reversed(tuple(shape)):
        out.append(k % size)
        k //= size
    return tuple(reversed(out))


def make_duals(inputs: Sequence[Any]) -> tuple[list[Any], dict[int, torch.Tensor]]:
    """Dual copies of the inputs that require grad, with zero tangents to write into.

    Call inside fwAD.dual_level(). Returns the argument list and {input index: tangent}.
    """
    duals, tangents = [], {}
    for i, a in enumerate(inputs):
        if requires_grad(a):
            a = make_dual(a.detach(), torch.zeros_like(a))
            # A differentiable view may not keep the tangent object given to make_dual: read it back.
            tangent = unpack_dual(a)[1]
            if tangent is not None:
                tangents[i] = tangent
        duals.append(a)
    return duals, tangents


# torch.autograd.forward_ad has no annotations: these are its two calls, typed.
def make_dual(primal: torch.Tensor, tangent: torch.Tensor) -> torch.Tensor:
    """fwAD.make_dual: a dual tensor of this primal and tangent (inside fwAD.dual_level()).

    Without what fwAD.make_dual does first: load torch's forward-AD decompositions, TorchScript
    compiled on first use (about 0.2 s, once per process), which only a few ops' forward AD needs
    (trace, log_sigmoid, the backward ops of the norms and losses, for forward over reverse). A
    check of forward AD loads them first (load_forward_ad_decompositions), as torch's gradcheck
    does; the engine's own use of forward AD in other checks does without, and where an op's
    forward AD then raises, goes the way it goes for an op without forward AD.
    """
    level = fwAD._current_level
    if level < 0 or not _floating(primal) or not _floating(tangent):
        dual: torch.Tensor = fwAD.make_dual(primal, tangent)  # type: ignore[no-untyped-call]
        return dual  # or torch's own error, in its words
    made: torch.Tensor = torch._make_dual(primal, tangent, level=level)
    return made


def _floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


@functools.cache
def load_forward_ad_decompositions() -> None:
    """What fwAD.make_dual loads on its first call (see make_dual), loaded now, once per process.
    torch scripts them with one warning per function (torch.jit.script is deprecated: a
    DeprecationWarning, a FutureWarning from torch 2.14), noise that is not the user's code."""
    load = getattr(fwAD, "_maybe_load_decompositions", None)
    if load is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            load()


def unpack_dual(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fwAD.unpack_dual: (primal, tangent) of a dual tensor; the tangent is None where it has none."""
    primal, tangent = fwAD.unpack_dual(t)  # type: ignore[no-untyped-call]
    return primal, tangent


_COMPARE_CHUNK = 1 << 16
"""Elements compared per step on the fast path: small enough for the temporaries to stay in cache."""


def allclose_promoted(
    a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, where: Callable[[], str] | None = None
) -> bool:
    """torch.allclose after type promotion, with one reduction per band of rows on the way to a pass.

    `where` names the comparison for an open margin recorder (opcheck.engine.margins): a pass then
    notes its worst |a - b| / (atol + rtol * |b|). Without one (or without `where`) nothing more is
    computed."""
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(dtype=dtype), b.to(dtype=dtype)
    recorder = current_recorder() if where is not None else None
    if recorder is None and a.numel() <= _COMPARE_CHUNK:
        return bool(torch.allclose(a, b, rtol, atol))  # small: torch's verdict in one call
    if a.shape == b.shape and a.numel() and a.dim() <= 2:
        # isclose's own formula, |a - b| <= atol + rtol * |b|, as max(|a - b| - allowance) <= 0: for
        # finite values the rounded difference has the exact difference's sign, so a band passes
        # here exactly when torch.allclose passes it. NaN and inf (in a or in b) never pass here;
        # torch.allclose decides those and every mismatch. Bands keep the temporaries in cache.
        a2 = a.detach().reshape(a.shape[0] if a.dim() == 2 else 1, -1)
        b2 = b.detach().reshape(b.shape[0] if b.dim() == 2 else 1, -1)
        step = max(1, _COMPARE_CHUNK // max(1, a2.shape[1]))
        worst = 0.0
        for r in range(0, a2.shape[0], step):
            ac, bc = a2[r : r + step], b2[r : r + step]
            if recorder is None:
                excess = torch.sub(ac, bc).abs().sub_(bc.abs().mul_(rtol).add_(atol)).max()
            else:  # the same differences and allowances, kept for the band's ratio
                diff, allowed = torch.sub(ac, bc).abs(), bc.abs().mul_(rtol).add_(atol)
                excess = torch.sub(diff, allowed).max()
            if not float(excess) <= 0:
                return _allclose_noted(a, b, rtol, atol, recorder, where)
            if recorder is not None:
                worst = max(worst, ratio_of(diff, allowed))
        if recorder is not None and where is not None:
            recorder.note(worst, where)
        return True
    return _allclose_noted(a, b, rtol, atol, recorder, where)


def _allclose_noted(
    a: torch.Tensor,
    b: torch.Tensor,
    rtol: float,
    atol: float,
    recorder: MarginRecorder | None,
    where: Callable[[], str] | None,
) -> bool:
    """torch.allclose's verdict; a pass noted with its ratio where a recorder is open."""
    passed = bool(torch.allclose(a, b, rtol, atol))
    if passed and recorder is not None and where is not None:
        recorder.note(worst_ratio(a.detach(), b.detach(), rtol, atol), where)
    return passed
