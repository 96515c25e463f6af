"""Jacobian comparisons: the full check (every entry) and the fast check (random projections).

The control flow, order of checks and tolerance arithmetic follow torch.autograd.gradcheck 2.13 so
that verdicts agree; what differs is how the Jacobians are computed (batched, see batching.py) and
what a failure says (diagnostics.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine._util import as_tuple, diff_input_indices, is_float_or_complex, make_duals, requires_grad
from opcheck.engine.batching import Evaluator
from opcheck.engine.diagnostics import JacobianMismatch, find_mismatch
from opcheck.engine.errors import FAILED_NONDET_NOTE, FAST_FAIL_SLOW_OK_NOTE, GradcheckError


DEFAULT_JACOBIAN_BUDGET = 1 << 20
"""Jacobian entries (Σ numel_in * numel_out) up to which fast_mode="auto" lets the full check decide
a call that its projection checks do not pass."""

FULL_CHECK_ELEMENTS = 128
"""fast_mode="auto" runs the full check first while the differentiable input elements n and the
float output elements m number at most this many together (so n·m <= 4096). Its cost grows with
(n + m)²: 2n + 1 evaluations and m backward rows, each of n + m elements. The projections' grows
with n + m only, and below this size the two cost about the same (fused.py, fused_projected.py)."""


@dataclass
class CheckContext:
    """Settings and state shared by every comparison of one gradcheck call."""

    eps: float
    atol: float
    rtol: float
    nondet_tol: float
    check_grad_dtypes: bool
    evaluator: Evaluator
    backward_path: str = "VJP"
    forward_path: str = "JVP"
    output_name: Callable[[int], str] = lambda i: f"output {i}"
    input_name: Callable[[int], str] = lambda j: f"input {j}"
    numerical_cache: dict = field(default_factory=dict)
    jacobian_budget: int = DEFAULT_JACOBIAN_BUDGET  # fast_mode="auto" only
    # fast_mode="auto", step by step: the projection checks first, also within the budget (the
    # function cannot be vmapped: their loops cost less than the full check's)
    projections_first: bool = False
    # sparse and MKLDNN inputs' dense stand-ins (layouts.LayoutInputs), or None: torch's fast-mode
    # directions for them (random_vector), the positions the numerical Jacobian perturbs
    # (numerical_positions) and a hint for their mismatches (hint)
    layouts: Any = None

    def full_first(self, n: int, m: int) -> bool:
        """fast_mode="auto": whether the full check runs first for a Jacobian of m rows and n columns
        (see FULL_CHECK_ELEMENTS; never beyond the budget)."""
        return n + m <= FULL_CHECK_ELEMENTS and n * m <= self.jacobian_budget

    def fail(self, message: str, *, check: str, path: str = "", mismatch: JacobianMismatch | None = None):
        raise GradcheckError(message, check=check, path=path, mismatch=mismatch)


# --------------------------------------------------------------------------- numerical Jacobian
def _nbhd_check(eps):
    def check(output1, output2, idx=None):
        on_index = f"on index {idx} " if idx is not None else ""
        if output1.shape != output2.shape:
            raise AssertionError(
                f"Expected `func` to return outputs with the same shape when inputs are perturbed "
                f"{on_index}by {eps}, but got: shapes {output1.shape} and {output2.shape}."
            )
        if output1.dtype != output2.dtype:
            raise AssertionError(
                f"Expected `func` to return outputs with the same dtype when inputs are perturbed "
                f"{on_index}by {eps}, but got: dtypes {output1.dtype} and {output2.dtype}."
            )
    return check


def _numerical_key(fn, inputs, outputs) -> tuple:
    # The outputs count: blocks are matched with them by position (see below).
    return (fn, tuple(id(a) for a in inputs), tuple(id(o) for o in outputs))


def numerical_jacobian(ctx: CheckContext, fn, inputs: tuple, outputs: tuple, *, is_forward_ad: bool = False):
    """Per input requiring grad, a tuple of (numel_in, numel_out) blocks, one per float/complex output."""
    key = _numerical_key(fn, inputs, outputs)
    cached = ctx.numerical_cache.get(key)
    if cached is not None:
        return cached
    if not is_forward_ad and any(o.is_complex() for o in outputs):
        raise ValueError("Expected output to be non-complex. get_numerical_jacobian no longer supports "
                         "functions that return complex outputs.")
    float_outputs = [o for o in outputs if is_float_or_complex(o)]
    diff = diff_input_indices(inputs)
    segments = [(idx, p) for idx in diff if inputs[idx].numel()
                for p in ((1, 1j) if inputs[idx].is_complex() else (1,))]
    positions = None
    if ctx.layouts is not None:
        positions = {idx: ctx.layouts.numerical_positions(inputs[idx]) for idx in diff}
        positions = {idx: pos for idx, pos in positions.items() if pos is not None}
    columns = ctx.evaluator.numerical_columns(fn, inputs, segments, ctx.eps, _nbhd_check(ctx.eps), outputs,
                                              positions)
    per_segment = dict(zip(segments, columns))
    result = []
    for idx in diff:
        x = inputs[idx]
        n = x.numel()
        if n == 0:
            cols = [o.new_zeros((0, o.numel())) for o in outputs]
        elif x.is_complex():
            cols = []
            for ds_dx, ds_dy in zip(per_segment[(idx, 1)], per_segment[(idx, 1j)]):
                if ds_dx.is_complex() and not is_forward_ad:
                    raise AssertionError("Expected ds_dx to be real-valued, not complex")
                cols.append(ds_dx + ds_dy * 1j)
        else:
            cols = per_segment[(idx, 1)]
        blocks = []
        # Matched by position, like torch: float output i gets column i of all outputs, so after a
        # non-float output (an int rank, indices) the columns shift; and each column is copied
        # into its row with broadcasting. Both are torch quirks, kept so that verdicts agree.
        for i, o in enumerate(float_outputs):
            dtype = x.dtype if x.is_complex() else o.dtype
            if cols[i].numel() == n * o.numel():
                blocks.append(cols[i].reshape(n, o.numel()).to(dtype=dtype))
                continue
            block = torch.zeros((n, o.numel()), dtype=dtype, device=o.device)
            rows = cols[i].reshape(n, -1)
            for k in range(n):  # torch's row copy: a one-element column broadcasts, others raise its error
                block[k] = rows[k]
            blocks.append(block)
        result.append(tuple(blocks))
    ctx.numerical_cache[key] = result
    ctx.numerical_cache[("batched",) + key] = ctx.evaluator.numerical_batched
    ctx.numerical_cache.setdefault("_keep", []).append(fn)  # keep ids valid while cached
    return result


SETTLE_BAND = 1e3
"""Vmapped and plain evaluations may differ by up to SETTLE_BAND * eps_dtype * max|output| (the
batched forward probe's allowance, batching.py), so a central difference by up to that over eps."""


def settle_rows(ctx: CheckContext, fn, inputs: tuple, outputs: tuple, analytical, numerical, output_idx: int,
                input_idx: int, *, is_forward_ad: bool):
    """Make a block's verdict the one torch's plain calls give, when vmapped calls computed it.

    A vmapped evaluation rounds differently from a plain one; where the function's values are large
    (a product near 1e8) that moves a central difference by more than the tolerance's margin of some
    entry, and batching would change the verdict. The rows of the block (input elements) with an
    entry that close to the tolerance are recomputed with plain calls, in every output's block.
    """
    key = _numerical_key(fn, inputs, outputs)
    if not ctx.numerical_cache.get(("batched",) + key):
        return numerical
    float_outputs = [o for o in outputs if is_float_or_complex(o)]
    if output_idx >= len(float_outputs) or numerical.numel() == 0:
        return numerical
    out = float_outputs[output_idx].detach()
    scale = float(out.abs().nan_to_num(0.0, 0.0, 0.0).max()) if out.numel() else 0.0
    band = SETTLE_BAND * torch.finfo(out.real.dtype if out.is_complex() else out.dtype).eps * scale / ctx.eps
    if not band > 0:
        return numerical
    dtype = torch.promote_types(analytical.dtype, numerical.dtype)
    a, n = analytical.detach().to(dtype=dtype, device="cpu"), numerical.detach().to(dtype=dtype, device="cpu")
    margin = (a - n).abs() - (ctx.atol + ctx.rtol * n.abs())
    near = (margin.abs() <= band).any(dim=1)
    settled = ctx.numerical_cache.setdefault(("settled",) + key, {}).setdefault(input_idx, set())
    rows = [int(r) for r in torch.nonzero(near).flatten() if int(r) not in settled]
    if not rows:
        return numerical
    idx = diff_input_indices(inputs)[input_idx]
    x = inputs[idx]
    blocks = ctx.numerical_cache[key][input_idx]
    nbhd = _nbhd_check(ctx.eps)
    for r in rows:
        cols = ctx.evaluator.plain_column(fn, inputs, idx, r, ctx.eps, nbhd)
        if x.is_complex():
            cols = [dx + dy * 1j for dx, dy in zip(cols, ctx.evaluator.plain_column(fn, inputs, idx, r, ctx.eps,
                                                                                    nbhd, 1j))]
        for block, col in zip(blocks, cols):
            if col.numel() != block.shape[1]:
                return numerical  # torch's broadcasting copy (see numerical_jacobian): left as it is
            block[r] = col.to(block.dtype)
        settled.add(r)
    ctx.evaluator.stats.fallbacks.append(f"settled {len(rows)} numerical rows of input {idx} by plain calls")
    return numerical


# -------------------------------------------------------------------------- analytical Jacobians
def analytical_vjp_jacobian(ctx: CheckContext, inputs: tuple, output: torch.Tensor, *, nondet_tol: float):
    """Per input requiring grad, its (numel_in, numel_out) block from VJPs, checked for reentrancy."""
    diff_inputs = [a for a in inputs if requires_grad(a)]
    m = output.numel()
    rows1 = ctx.evaluator.vjp_rows(output, diff_inputs, nondet_tol)
    # The second pass repeats the first one's path even if batching was dropped meanwhile:
    # batched and looped rows may differ in the last bit, which is not nondeterminism.
    first_batched = any(isinstance(r, torch.Tensor) for r in rows1)
    rows2 = ctx.evaluator.vjp_rows(output, diff_inputs, nondet_tol, batched=first_batched)
    jac1, types_ok = _stack_rows(rows1, diff_inputs, m)
    jac2, _ = _stack_rows(rows2, diff_inputs, m)
    if not types_ok:
        # torch reports this as "Analytical gradient has incorrect size", whatever check_grad_dtypes is.
        ctx.fail("Gradient has dtype mismatch: backward returned a gradient whose dtype differs from "
                 "its input's", check="gradient dtype", path=ctx.backward_path)
    for a, b in zip(jac1, jac2):
        if a.numel() != 0 and not torch.equal(a, b) and (a - b).abs().max() > nondet_tol:
            worst = float((a - b).abs().max())
            ctx.fail(
                "Backward is not reentrant, i.e., running backward with same input and grad_output "
                "multiple times gives different values, although analytical gradient matches numerical "
                f"gradient.The tolerance for nondeterminism was {nondet_tol}.\n"
                f"check: reentrancy ({ctx.backward_path}); two identical backward passes differ by up to "
                f"{worst:.4g}.\n{FAILED_NONDET_NOTE}",
                check="reentrancy", path=ctx.backward_path,
            )
    return jac1


def _stack_rows(rows_per_input, diff_inputs, m):
    jacobians = []
    types_ok = True
    for inp, rows in zip(diff_inputs, rows_per_input):
        if isinstance(rows, torch.Tensor):  # batched: (m, *inp.shape); a transposed view, no copy
            if rows.dtype != inp.dtype:
                types_ok = False
            jacobians.append(rows.reshape(m, -1).t())
            continue
        jac = inp.new_zeros((inp.numel(), m), layout=torch.strided)
        if rows is not None:
            for j, g in enumerate(rows):
                if g is None:
                    continue
                if g.size() != inp.size():
                    raise AssertionError(
                        f"Expected out_jacobian column to have {inp.numel()} elements, but got {g.numel()}"
                        f" (backward returned a gradient of shape {tuple(g.shape)} for an input of shape "
                        f"{tuple(inp.shape)})")
                if g.dtype != inp.dtype:
                    types_ok = False
                jac[:, j] = g.to_dense().reshape(-1) if g.layout != torch.strided else g.reshape(-1)
        jacobians.append(jac)
    return jacobians, types_ok


def analytical_jvp_jacobian(ctx: CheckContext, fn, inputs: tuple, outputs: tuple):
    """[input][output] blocks (numel_in, numel_out) from forward-mode AD, column by column."""
    diff = diff_input_indices(inputs)
    if any(inputs[i].is_complex() for i in diff):
        raise ValueError("Expected inputs to be non-complex for _get_analytical_jacobian_forward_ad.")
    float_outputs = [o for o in outputs if is_float_or_complex(o)]

    def check_dtype(primal, tangent):
        if ctx.check_grad_dtypes and primal.is_complex() != tangent.is_complex():
            ctx.fail("Forward AD gradient has dtype mismatch.", check="forward AD dtype", path=ctx.forward_path)

    nonempty = [idx for idx in diff if inputs[idx].numel()]
    columns = dict(zip(nonempty, ctx.evaluator.jvp_columns(fn, inputs, nonempty, check_dtype, outputs)
                       if nonempty else []))
    result = []
    for idx in diff:
        x = inputs[idx]
        cols = columns.get(idx)
        if cols and all(c.shape == (x.numel(), o.numel()) and c.dtype == o.dtype for c, o in zip(cols, float_outputs)):
            result.append(tuple(cols[:len(float_outputs)]))
            continue
        blocks = [o.new_zeros((x.numel(), o.numel()), layout=torch.strided) for o in float_outputs]
        for block, c in zip(blocks, cols or []):
            block.copy_(c)
        result.append(tuple(blocks))
    return result


# ---------------------------------------------------------------------------------- comparisons
_COMPARE_CHUNK = 1 << 16
"""Elements compared per step on the fast path: small enough for the temporaries to stay in cache."""


def allclose_promoted(a, b, rtol, atol) -> bool:
    """torch.allclose after type promotion, with one reduction per band of rows on the way to a pass."""
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(dtype=dtype), b.to(dtype=dtype)
    if a.shape == b.shape and a.numel() and a.dim() <= 2:
        # isclose's own formula, |a - b| <= atol + rtol * |b|, as max(|a - b| - allowance) <= 0: for
        # finite values the rounded difference has the exact difference's sign, so a band passes
        # here exactly when torch.allclose passes it. NaN and inf (in a or in b) never pass here;
        # torch.allclose decides those and every mismatch. Bands keep the temporaries in cache.
        a2, b2 = a.detach().reshape(a.shape[0] if a.dim() == 2 else 1, -1), b.detach().reshape(
            b.shape[0] if b.dim() == 2 else 1, -1)
        step = max(1, _COMPARE_CHUNK // max(1, a2.shape[1]))
        for r in range(0, a2.shape[0], step):
            ac, bc = a2[r:r + step], b2[r:r + step]
            excess = torch.sub(ac, bc).abs().sub_(bc.abs().mul_(rtol).add_(atol)).max()
            if not float(excess) <= 0:
                return bool(torch.allclose(a, b, rtol, atol))
        return True
    return bool(torch.allclose(a, b, rtol, atol))


def _first_line(output_idx, input_idx, complex_indices, test_imag, is_forward_ad) -> str:
    out_is_complex = (not is_forward_ad) and complex_indices and output_idx in complex_indices
    inp_is_complex = is_forward_ad and complex_indices and input_idx in complex_indices
    part = "imaginary" if test_imag else "real"
    element = "inputs" if is_forward_ad else "outputs"
    prefix = f"While considering the {part} part of complex {element} only, " if (out_is_complex or inp_is_complex) else ""
    mode = "computed with forward mode " if is_forward_ad else ""
    return f"{prefix}Jacobian {mode}mismatch for output {output_idx:d} with respect to input {input_idx:d},"


def _report(ctx, a, n, *, output_idx, input_idx, inputs, outputs, complex_indices, test_imag, is_forward_ad,
            atol=None) -> JacobianMismatch:
    diff = diff_input_indices(inputs)
    float_outputs = [o for o in outputs if is_float_or_complex(o)]
    part = None
    if complex_indices and ((not is_forward_ad and output_idx in complex_indices)
                            or (is_forward_ad and input_idx in complex_indices)):
        part = "imaginary" if test_imag else "real"
    mismatch = find_mismatch(
        a, n, rtol=ctx.rtol, atol=ctx.atol if atol is None else atol,
        input_shape=tuple(inputs[diff[input_idx]].shape),
        output_shape=tuple(float_outputs[output_idx].shape) if output_idx < len(float_outputs) else (a.shape[1],),
        check="forward AD" if is_forward_ad else "backward",
        path=ctx.forward_path if is_forward_ad else ctx.backward_path,
        output_idx=output_idx, input_idx=input_idx,
        output_name=ctx.output_name(output_idx), input_name=ctx.input_name(input_idx), part=part,
    )
    hint = ctx.layouts.hint(inputs[diff[input_idx]], mismatch) if ctx.layouts is not None else None
    return replace(mismatch, hints=mismatch.hints + (hint,)) if hint else mismatch


def _raise_mismatch(ctx, mismatch: JacobianMismatch, first_line: str, extra: str = ""):
    ctx.fail(f"{first_line}\n{mismatch.describe()}{extra}", check=mismatch.check, path=mismatch.path,
             mismatch=mismatch)


def full_check(ctx: CheckContext, func, func_out, inputs, outputs, *, use_forward_ad=False,
               complex_indices=None, test_imag=False):
    """Every Jacobian entry, numerical against analytical (torch's slow mode)."""
    func_out = as_tuple(func_out)
    if not outputs:
        return check_no_differentiable_outputs(ctx, func, inputs, func_out, is_forward_ad=use_forward_ad)
    numerical = list(zip(*numerical_jacobian(ctx, func, inputs, func_out, is_forward_ad=use_forward_ad)))
    numerical = [nj for o, nj in zip(func_out, numerical) if o.requires_grad]
    if use_forward_ad:
        analytical = analytical_jvp_jacobian(ctx, func, inputs, func_out)
        for i, n_per_out in enumerate(numerical):
            for j, n in enumerate(n_per_out):
                a = analytical[j][i]
                n = settle_rows(ctx, func, inputs, func_out, a, n, i, j, is_forward_ad=True)
                if not allclose_promoted(a, n.to(a.device), ctx.rtol, ctx.atol):
                    m = _report(ctx, a, n, output_idx=i, input_idx=j, inputs=inputs, outputs=func_out,
                                complex_indices=complex_indices, test_imag=test_imag, is_forward_ad=True)
                    _raise_mismatch(ctx, m, _first_line(i, j, complex_indices, test_imag, True))
    else:
        for i, o in enumerate(outputs):
            analytical = analytical_vjp_jacobian(ctx, inputs, o, nondet_tol=ctx.nondet_tol)
            for j, (a, n) in enumerate(zip(analytical, numerical[i])):
                n = settle_rows(ctx, func, inputs, func_out, a, n, i, j, is_forward_ad=False)
                if not allclose_promoted(a, n.to(a.device), ctx.rtol, ctx.atol):
                    m = _report(ctx, a, n, output_idx=i, input_idx=j, inputs=inputs, outputs=outputs,
                                complex_indices=complex_indices, test_imag=test_imag, is_forward_ad=False)
                    _raise_mismatch(ctx, m, _first_line(i, j, complex_indices, test_imag, False))
    return True


def _second_order_hint(ctx) -> str:
    if "of" not in ctx.backward_path:  # only gradgradcheck's first-derivative function
        return ""
    return ("\nhint: the first derivative does not require grad, so backward is not differentiable: it "
            "runs under torch.no_grad(), detaches, or is @once_differentiable. If that is intended, "
            "declare it (supports_gradgrad: false in an op spec); otherwise build backward from "
            "differentiable ops.")


def check_no_differentiable_outputs(ctx, func, inputs, func_out, *, is_forward_ad):
    for per_input in numerical_jacobian(ctx, func, inputs, func_out, is_forward_ad=is_forward_ad):
        for jac in per_input:
            if torch.ne(jac, 0).sum() > 0:
                ctx.fail("Numerical gradient for function expected to be zero\n"
                         "check: no differentiable outputs; the function's outputs do not require grad, yet "
                         f"they change when input elements are perturbed (max |d| = {float(jac.abs().max()):.4g})"
                         + _second_order_hint(ctx), check="no differentiable outputs", path=ctx.backward_path)
    return True


# ------------------------------------------------------------------------------------- fast mode
def _vec_from_tensor(x, generator, downcast_complex=False):
    dtype = x.dtype
    if downcast_complex:
        dtype = {torch.complex128: torch.float64, torch.complex64: torch.float32}.get(dtype, dtype)
    vec = torch.rand(x.numel(), generator=generator, device="cpu").to(dtype=dtype, device=x.device)
    vec /= vec.norm()
    return vec


def make_vectors(inp_tensors, outputs, *, use_forward_ad, layout_vector=None):
    # A fresh default-seeded generator, as torch uses: same projections, same verdicts.
    g = torch.Generator()

    def direction(inp):
        vec = layout_vector(inp, g, True) if layout_vector is not None else None
        return _vec_from_tensor(inp, g, True) if vec is None else vec

    all_u = []
    for inp in inp_tensors:
        ur = direction(inp)
        all_u.append((ur, direction(inp)) if inp.is_complex() else ur)
    all_v = None if use_forward_ad else [_vec_from_tensor(out, g) for out in outputs]
    return all_v, all_u


def _numerical_jvp(ctx, fn, inputs, idx, u):
    """Directional central difference along u (real) or (ur, ui) (complex) for every output."""
    x = inputs[idx]
    entry = x.data
    nbhd = _nbhd_check(ctx.eps)

    def directional(v):
        orig = entry.clone()
        entry.copy_(orig - v)
        outa = ctx.evaluator._call_cloned(fn, inputs)
        entry.copy_(orig + v)
        outb = ctx.evaluator._call_cloned(fn, inputs)
        entry.copy_(orig)
        res = []
        for a, b in zip(outa, outb):
            nbhd(a, b)
            res.append(((b - a) / (2 * ctx.eps)).detach().reshape(-1))
        return res

    if isinstance(u, tuple):
        ds_dx = directional(u[0].reshape(x.shape) * ctx.eps)
        ds_dy = directional(u[1].reshape(x.shape) * ctx.eps * 1j)
        return [dx + dy * 1j for dx, dy in zip(ds_dx, ds_dy)]
    return directional(u.reshape(x.shape) * ctx.eps)


def _adjusted_atol(atol, u, v):
    sum_v = 1.0 if v is None else float(v.sum())
    if isinstance(u, tuple):
        return atol * (float(u[0].sum()) + float(u[1].sum())) * sum_v
    return atol * float(u.sum()) * sum_v


def fast_check(ctx: CheckContext, func, func_out, inputs, outputs, *, use_forward_ad=False,
               complex_indices=None, test_imag=False):
    """v^T J u, numerical against analytical, for random u and v (torch's fast mode)."""
    inp_idx = diff_input_indices(inputs)
    inp_tensors = [inputs[i] for i in inp_idx]
    all_v, all_u = make_vectors(inp_tensors, outputs, use_forward_ad=use_forward_ad,
                                layout_vector=ctx.layouts.random_vector if ctx.layouts is not None else None)
    func_out_t = as_tuple(func_out)

    numerical = []
    for idx, u in zip(inp_idx, all_u):
        all_ju = _numerical_jvp(ctx, func, inputs, idx, u)
        filtered = [ju for ju, o in zip(all_ju, func_out_t) if is_float_or_complex(o)]
        if all_v is not None:
            numerical.append([(v * ju).sum() for v, ju in zip(all_v, filtered)])
        else:
            numerical.append(filtered)

    if use_forward_ad:
        analytical = _analytical_fast_forward(ctx, func, inputs, func_out_t, all_u)
    else:
        if not outputs:
            _check_no_differentiable_outputs_fast(ctx, func, inputs, inp_idx, all_u)
        analytical = []
        for o, v in zip(outputs, all_v):
            vjs = _analytical_fast_backward(ctx, inputs, o, v)
            scalars = []
            for vj, u in zip(vjs, all_u):
                if vj.is_complex():
                    tv = torch.view_as_real(vj.resolve_conj())
                    scalars.append(tv.select(-1, 0).dot(u[0]) + 1j * tv.select(-1, 1).dot(u[1]))
                else:
                    scalars.append(vj.dot(u))
            analytical.append(scalars)

    for i, n_for_input in enumerate(numerical):
        for j, n in enumerate(n_for_input):
            a = analytical[i][j] if use_forward_ad else analytical[j][i]
            n = n.to(device=a.device)
            atol = _adjusted_atol(ctx.atol, all_u[i], all_v[j] if all_v else None)
            if not allclose_promoted(a, n, ctx.rtol, atol):
                _localize_fast_failure(ctx, func, func_out_t, inputs, outputs, i, j, a, n, atol,
                                       complex_indices, test_imag, use_forward_ad)
    return True


def _analytical_fast_backward(ctx, inputs, output, v):
    diff_inputs = [a for a in inputs if requires_grad(a)]
    go = v.reshape(output.shape)

    def once():
        ctx.evaluator.stats.vjp_calls += 1
        grads = torch.autograd.grad(output, diff_inputs, go, retain_graph=True, allow_unused=True)
        return [[g.clone() if isinstance(g, torch.Tensor) else None] for g in grads]

    jac1, types_ok = _stack_rows(once(), diff_inputs, 1)
    jac2, _ = _stack_rows(once(), diff_inputs, 1)
    if not types_ok:
        ctx.fail("Gradient has dtype mismatch: backward returned a gradient whose dtype differs from its "
                 "input's", check="gradient dtype", path=ctx.backward_path)
    for a, b in zip(jac1, jac2):
        if a.numel() != 0 and (a - b).abs().max() > ctx.nondet_tol:
            ctx.fail(
                "Backward is not reentrant, i.e., running backward with same input and grad_output "
                "multiple times gives different values, although analytical gradient matches numerical "
                f"gradient.The tolerance for nondeterminism was {ctx.nondet_tol}.\n{FAILED_NONDET_NOTE}",
                check="reentrancy", path=ctx.backward_path)
    return [j.t().squeeze(0) for j in jac1]


def _analytical_fast_forward(ctx, func, inputs, func_out, all_u):
    float_outputs = [o for o in func_out if is_float_or_complex(o)]
    diff = diff_input_indices(inputs)
    result = [[o.new_zeros((o.numel(),), layout=torch.strided) for o in float_outputs] for _ in diff]
    with fwAD.dual_level():
        duals, tangents = make_duals(inputs)
        for i, (t, u) in enumerate(zip(tangents.values(), all_u)):
            t.copy_(u.view_as(t))
            ctx.evaluator.stats.jvp_calls += 1
            outs = [o for o in as_tuple(func(*duals)) if is_float_or_complex(o)]
            for k, o in enumerate(outs):
                primal, tangent = fwAD.unpack_dual(o)
                if ctx.check_grad_dtypes and tangent is not None and primal.is_complex() != tangent.is_complex():
                    ctx.fail("Forward AD gradient has dtype mismatch.", check="forward AD dtype",
                             path=ctx.forward_path)
                if tangent is None:
                    result[i][k].zero_()
                else:
                    result[i][k].copy_(tangent.reshape(-1))
            t.zero_()
    return result


def _check_no_differentiable_outputs_fast(ctx, func, inputs, inp_idx, all_u):
    for idx, u in zip(inp_idx, all_u):
        for jvp in _numerical_jvp(ctx, func, inputs, idx, u):
            if jvp.numel() == 0:
                continue
            if jvp.abs().max() > ctx.nondet_tol:
                ctx.fail("Numerical gradient for function expected to be zero\ncheck: no differentiable "
                         "outputs; the outputs do not require grad, yet they change when inputs are perturbed"
                         + _second_order_hint(ctx), check="no differentiable outputs", path=ctx.backward_path)


def _localize_fast_failure(ctx, func, func_out, inputs, outputs, input_i, output_j, a, n, atol,
                           complex_indices, test_imag, is_forward_ad):
    """Fast mode saw a mismatch in v^T J u: recompute this block in full to say where it is."""
    first = _first_line(output_j, input_i, complex_indices, test_imag, is_forward_ad)
    head = (f"\nfast mode: projected {'J u' if is_forward_ad else 'v^T J u'} analytical "
            f"{_fmt(a)}, numerical {_fmt(n)}, tolerance atol={atol:.4g} (atol scaled by the projections) + "
            f"rtol={ctx.rtol:g}; recomputed the full Jacobian block:\n")
    # As torch does, to say where: what fails there fails the call as it fails torch's.
    # torch recomputes with the differentiable outputs only, though the fast check ran over every
    # float output: past them its index raises (IndexError), and so does this one.
    num_all = numerical_jacobian(ctx, func, inputs, outputs, is_forward_ad=is_forward_ad)
    numerical = num_all[input_i][output_j]
    if is_forward_ad:
        analytical = analytical_jvp_jacobian(ctx, func, inputs, func_out)[input_i][output_j]
    else:
        analytical = analytical_vjp_jacobian(ctx, inputs, outputs[output_j], nondet_tol=float("inf"))[input_i]
    if analytical.dtype != numerical.dtype:
        # torch compares the two blocks with torch.allclose, which refuses mixed dtypes
        # ("Float did not match Double": an input whose dtype is not its output's).
        torch.allclose(analytical, numerical.to(analytical.device), ctx.rtol, ctx.atol)
    mismatch = _report(ctx, analytical, numerical, output_idx=output_j, input_idx=input_i, inputs=inputs,
                       outputs=func_out if is_forward_ad else outputs, complex_indices=complex_indices,
                       test_imag=test_imag, is_forward_ad=is_forward_ad)
    extra = ""
    if allclose_promoted(analytical, numerical.to(analytical.device), ctx.rtol, ctx.atol):
        extra = "\n" + FAST_FAIL_SLOW_OK_NOTE
        diff = (analytical - numerical.to(analytical.device)).abs()
        extra += f" (max element-wise difference {float(diff.max()) if diff.numel() else 0.0:.4g})"
    ctx.fail(f"{first}{head}{mismatch.describe()}{extra}", check=mismatch.check, path=mismatch.path,
             mismatch=mismatch)


def _fmt(t: torch.Tensor) -> str:
    v = t.item() if t.numel() == 1 else None
    if v is None:
        return f"<tensor of {t.numel()} values, max |.| {float(t.abs().max()) if t.numel() else 0.0:.6g}>"
    return f"{v.real:.6g}{v.imag:+.6g}j" if isinstance(v, complex) else f"{v:.6g}"
