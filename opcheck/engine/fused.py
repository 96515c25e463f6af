"""fast_mode="auto"'s full check and its side checks folded into few calls.

It runs up to core.FULL_CHECK_ELEMENTS input and output elements, and within the budget after a
projection pass (fused_projected.py) that did not pass the call.

Run step by step (core.full_check, then aux_checks), one gradcheck call costs about a dozen
separate evaluations: the vmapped finite differences and a plain probe call, two batched passes of
VJP rows (the second only to test reentrancy) and a plain probe, a vmapped and two plain VJPs for
the batched-gradient check, a VJP with zero grad_outputs, the undefined-grad_output pass. On
small inputs each costs more in Python than in kernels, so the step-by-step full check costs
more than torch's fast mode although both compute little. The fused pass computes the same
entries with fewer calls:

- **Finite differences**: every column of every input in one vmapped call (per input beyond
  batching.FUSE_MAX_COLUMNS columns), plus one unperturbed row compared with the plain output
  already computed; no plain probe call. With forward AD checked, the same call also gives the
  JVP columns (rows x ± eps e_k carry zero tangents, rows x the tangent e_k), and one plain JVP
  along a dense random direction must agree with the same combination of the columns.
- **VJP rows**: one batched backward over all outputs at once. Its cotangents are the one-hot rows
  of every output element (the Jacobian), then, per output, the first random cotangent of the
  step-by-step batched-gradient check, then an all-zero row. From FUNCTORCH_ROWS rows on it is
  torch.func's vmapped pullback (batching rules for backward kernels the legacy vmap runs row by
  row), else the legacy batched backward (is_grads_batched); with the batched-gradient check on
  and torch.func's rows, one more legacy call over the random rows keeps that check about the
  legacy vmap. Rows whose random row disagrees with the plain backward are not trusted: torch.func's
  give way to the legacy ones (torch 2.13's vmap over cdist's backward is wrong where rows
  differ), the legacy ones to the step-by-step check.
- **Plain VJPs**, two per output, along that random cotangent: the two must be identical up to
  nondet_tol (reentrancy, as torch's fast mode tests it), and equal to its batched row
  (torch.allclose's defaults, as the batched-gradient check compares; with that check off, up to
  reassociation). A random cotangent weighs every row, so a plain backward that differs from the
  batched one anywhere shows, where a one-hot probe sees one row.
- **Zero grad_output**: the all-zero batched row must be zero (exactly, or allclose when masked).
- **Undefined grad_output**: the outputs already computed are wrapped in UndefinedGrad instead of
  calling the function again (with several outputs, the per-output passes call it as torch does).
- **Forward AD's side checks**: the batched forward-AD check compares its vmapped JVPs with the
  fused columns instead of one plain JVP per tangent; the undefined-tangent check runs as in the
  step-by-step check, except with one differentiable input, where its undefined-tangent call has
  no dual input, so no output has a tangent to compare and the check cannot fail.

Every Jacobian entry is compared with its finite difference at the full check's tolerance, as in
the step-by-step check. The pass decides only a pass: when anything in it disagrees, raises, or
does not apply (complex or sparse inputs, non-tensor outputs, an output that does not require
grad, more rows than fit the memory budget, batching off), the call runs the step-by-step check
from the start, so a failure, its wording and its order are the step-by-step check's; where a
batched result disagreed with a plain call, that rerun does without that batching (Fallback's
`distrust`), so torch's one-at-a-time algorithm decides. What the fused pass tests differently: reentrancy on one
random combination of rows per output (torch's fast mode does the same; the step-by-step full
check compares two batched passes of every row), and the zero-grad_output test on the batched
backward (a plain backward that differs from the batched one disagrees with its batched row and
sends the call to the step-by-step check).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine import aux_checks
from opcheck.engine._util import as_tuple, diff_input_indices, exception_line, is_float_or_complex, requires_grad
from opcheck.engine.auto import COTANGENTS, DIRECTIONS
from opcheck.engine.batching import FUSE_MAX_COLUMNS, _close, combination_close
from opcheck.engine.core import CheckContext, allclose_promoted, analytical_jvp_jacobian, numerical_jacobian
from opcheck.engine.errors import GradcheckError

__all__ = ["Fallback", "fused_check"]


class Fallback(Exception):
    """The fused pass cannot vouch for this call: the step-by-step check decides.

    `distrust` names the kind of batching (an Evaluator kind: "vjp", "forward", "jvp_func") whose
    batched result disagreed with a plain call: the step-by-step check then runs without it.
    `loops`: the function cannot be evaluated in batches as the pass needs (no vmap support, or
    batching is off), so a check of its every column and row would run them one call at a time.
    """

    def __init__(self, message: str, distrust: tuple[str, ...] = (), loops: bool = False):
        super().__init__(message)
        self.distrust = distrust
        self.loops = loops


def fused_check(ctx: CheckContext, func, func_out, inputs: tuple, outputs: tuple, *, check_backward_ad: bool,
                check_forward_ad: bool, check_undefined_grad: bool, check_batched_grad: bool,
                check_batched_forward_grad: bool, masked) -> None:
    """Every check of one gradcheck call, fused; returns when all pass, raises Fallback otherwise.

    Complex outputs are checked as torch.view_as_real (..., 2): the Jacobian of that view holds the
    step-by-step check's real-part and imaginary-part blocks side by side.
    """
    func_out = as_tuple(func_out)
    has_complex = any(isinstance(o, torch.Tensor) and o.is_complex() for o in func_out)
    real_func, real_out = (_real_outputs(func), _as_real(func_out)) if has_complex else (func, func_out)
    real_outputs = tuple(o for o in real_out if o.requires_grad)
    _applies(ctx, real_out, inputs, real_outputs, check_backward_ad)
    ev = ctx.evaluator
    ev.center_probe = True
    try:
        with only_a_pass():
            batched_forward_checked = False
            if check_forward_ad and not check_batched_forward_grad and _fits_one_call(inputs):
                numerical, analytical = _forward_jacobians(ctx, real_func, inputs, real_out)
            else:
                numerical = numerical_jacobian(ctx, real_func, inputs, real_out)  # [input][output] (n_j, m_i)
                analytical = None
                if check_forward_ad:
                    # With the batched forward-AD check on, the columns come from the legacy vmap, that
                    # check's own machinery, probed by a plain JVP along a dense direction: vmapped
                    # against one at a time is then tested, on every column.
                    ev.legacy_jvp_first = check_batched_forward_grad
                    analytical = analytical_jvp_jacobian(ctx, real_func, inputs, real_out)
                    batched_forward_checked = ev.jvp_kind_used == "jvp"
            if check_backward_ad:
                _backward(ctx, real_func, real_out, inputs, real_outputs, numerical, check_batched_grad, masked)
                ev.stats.auto_paths.append("full")
            if check_forward_ad:
                for j, per_output in enumerate(numerical):
                    for i, n in enumerate(per_output):
                        if not allclose_promoted(analytical[j][i], n, ctx.rtol, ctx.atol):
                            raise Fallback(f"forward AD: output {i}, input {j} disagrees with finite differences")
                ev.stats.auto_paths.append("full")
                if check_undefined_grad and len(diff_input_indices(inputs)) > 1:
                    # With one differentiable input the undefined-tangent call has no dual input, so no
                    # output has a tangent to compare: the check cannot fail, and is not run.
                    zero_tangent = None if has_complex else _zero_tangent_jvps(analytical)
                    aux_checks.test_undefined_forward_mode(ctx, func, outputs, inputs, zero_tangent)
            if check_batched_forward_grad and not batched_forward_checked:
                expected = None if has_complex else _expected_jvps(inputs, func_out, analytical)
                aux_checks.test_batched_grad_forward_ad(ctx, func, inputs, expected)
            if check_backward_ad and check_undefined_grad:
                aux_checks.test_undefined_backward_mode(ctx, _outputs_once(func, func_out), outputs, inputs)
    finally:
        ev.center_probe = ev.legacy_jvp_first = False
    ev.stats.fused = True


@contextlib.contextmanager
def only_a_pass():
    """A fused pass vouches only for a call it passes: whatever else happens inside is a Fallback,
    and the step-by-step check (or the next pass) decides what the user sees."""
    try:
        yield
    except GradcheckError as e:
        raise Fallback(f"{getattr(e, 'check', None) or 'check'} failed") from e
    except Fallback:
        raise
    except Exception as e:
        raise Fallback(exception_line(e)) from e


def _as_real(outs) -> tuple:
    return tuple(torch.view_as_real(o.resolve_conj()) if isinstance(o, torch.Tensor) and o.is_complex() else o
                 for o in as_tuple(outs))


def _real_outputs(func):
    """func with its complex outputs seen through torch.view_as_real."""

    def on_real(*args):
        return _as_real(func(*args))

    if hasattr(func, "vmap_form"):
        on_real.vmap_form = lambda *args: _as_real(func.vmap_form(*args))  # type: ignore[attr-defined]
    return on_real


def _applies(ctx: CheckContext, func_out, inputs: tuple, outputs: tuple, check_backward_ad: bool,
             projected: bool = False) -> None:
    ev = ctx.evaluator
    if not (ev.batch_forward and ev.batch_vjp):
        raise Fallback("batching is off", loops=True)
    outs = as_tuple(func_out)
    diff = diff_input_indices(inputs)
    for j in diff:
        x = inputs[j]
        if x.layout != torch.strided or not x.is_floating_point():
            raise Fallback(f"input {j} is not a real strided tensor")
    seen_other = False
    for p, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise Fallback(f"output {p} is not a tensor")
        if not o.is_floating_point():
            if o.is_complex():
                raise Fallback(f"output {p} is complex")
            seen_other = True
            continue
        if seen_other or o.layout != torch.strided or not o.requires_grad:
            raise Fallback(f"output {p} is not a real strided output that requires grad")
    if not outputs:
        raise Fallback("no differentiable outputs")
    n = sum(inputs[j].numel() for j in diff)
    m = sum(o.numel() for o in outputs)
    if not projected and n * m > ctx.jacobian_budget:
        raise Fallback("beyond the Jacobian budget")
    itemsize = max(inputs[j].element_size() for j in diff)
    if projected:  # see fused_projected: its forward and backward rows
        rows = (COTANGENTS + 1) * len(outputs) + 1 if check_backward_ad else 0
        forward = (3 * DIRECTIONS + 1) * len(diff)
    else:
        rows = m + len(outputs) + 1 if check_backward_ad else 0
        forward = 2 * n + 1
    if max(rows * (m + n), forward * (n + m)) * itemsize > ev.memory_budget:
        raise Fallback("more rows than fit the memory budget")


def _outputs_once(func, func_out):
    """func, except that its first call returns the outputs already computed (graph and all)."""
    pending = [func_out]

    def call(*args):
        return pending.pop() if pending else func(*args)

    return call


def _fits_one_call(inputs: tuple) -> bool:
    return 0 < sum(inputs[j].numel() for j in diff_input_indices(inputs)) <= FUSE_MAX_COLUMNS


def _forward_jacobians(ctx: CheckContext, func, inputs: tuple, func_out: tuple):
    """Finite differences and forward-AD columns from one vmapped torch.func.jvp.

    Rows x - eps e_k and x + eps e_k carry zero tangents (their primals give the central differences),
    rows x carry the tangent e_k (their tangents give the columns J e_k). One plain JVP along a dense
    random direction must agree with the same combination of the batched columns, and the plain
    output with the first unperturbed row. Returns ([input][output] numerical, same analytical).
    """
    ev = ctx.evaluator
    diff = diff_input_indices(inputs)
    base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
    sizes = [inputs[j].numel() for j in diff]
    n = sum(sizes)
    of_x = _of_diff_inputs(getattr(func, "vmap_form", func), base, diff)
    # Per input, the rows' perturbations (-eps, then +eps, on the diagonal of its block of columns;
    # x + (-eps) is x - eps exactly) and tangents.
    deltas, tangents = [], []
    offset = 0
    for j, size in zip(diff, sizes):
        d = base[j].new_zeros((3 * n, size))
        t = base[j].new_zeros((3 * n, size))
        d[offset:offset + size].diagonal().fill_(-ctx.eps)
        d[n + offset:n + offset + size].diagonal().fill_(ctx.eps)
        t[2 * n + offset:2 * n + offset + size].diagonal().fill_(1)
        deltas.append(d.view(3 * n, *base[j].shape))
        tangents.append(t.view(3 * n, *base[j].shape))
        offset += size

    def one_row(*dt):
        return torch.func.jvp(of_x, tuple(base[j] + d for j, d in zip(diff, dt[:len(diff)])), dt[len(diff):])

    ev.stats.batched_jvp_calls += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs, touts = ev._vmap(one_row, *deltas, *tangents)
    floats = [o for o in func_out if is_float_or_complex(o)]
    if len(outs) != len(floats):
        raise Fallback("number of outputs changed under vmap")
    numerical, analytical = [[] for _ in diff], [[] for _ in diff]
    g = torch.Generator().manual_seed(aux_checks._SEED)
    u = torch.randn(n, generator=g, dtype=torch.float64).to(dtype=base[diff[0]].dtype)
    plain = _plain_jvp(ev, func, inputs, diff, sizes, u)
    for o, ref, to, po in zip(outs, floats, touts, plain):
        if o.shape[1:] != ref.shape or o.dtype != ref.dtype or to.shape != o.shape or to.dtype != o.dtype:
            raise Fallback("output shape or dtype changed under vmap")
        if not _close(o[2 * n], ref.detach()):
            raise Fallback("vmapped evaluation at the unperturbed point differs from the plain call", ("forward",))
        fd = torch.sub(o[n:2 * n], o[:n]).div_(2 * ctx.eps).reshape(n, ref.numel())
        cols = to[2 * n:].reshape(n, ref.numel())
        if not combination_close(u, cols, po):
            raise Fallback("batched JVP differs from the plain JVP", ("jvp_func", "jvp"))
        offset = 0
        for jj, size in enumerate(sizes):
            numerical[jj].append(fd[offset:offset + size])
            analytical[jj].append(cols[offset:offset + size])
            offset += size
    return numerical, analytical


def _expected_jvps(inputs: tuple, func_out: tuple, analytical):
    """The batched forward-AD check's one-at-a-time JVPs, from the fused pass's columns.

    Those columns agree with a plain JVP along a dense direction up to rounding; an output without
    a tangent, and a non-float one, has zeros, as that check's JVP function returns.
    """
    position = {j: jj for jj, j in enumerate(diff_input_indices(inputs))}

    def expected(input_idx, tangents):
        t = torch.stack(tangents).reshape(len(tangents), -1)
        cols = analytical[position[input_idx]]
        result = []
        for i, o in enumerate(func_out):
            if i < len(cols):
                result.append((t.to(cols[i].dtype) @ cols[i]).reshape(len(tangents), *o.shape))
            else:
                result.append(torch.zeros((len(tangents), *o.shape), dtype=o.dtype, device=o.device))
        return result

    return expected


def _zero_tangent_jvps(analytical):
    """The undefined-tangent check's zero-tangent JVPs, from the fused pass's columns: J·u with the
    k-th input's part of u zeroed, per float output (flat)."""

    def jvps(k, all_u):
        n_out = len(analytical[0]) if analytical else 0
        return [sum(all_u[jj].to(analytical[jj][i].dtype) @ analytical[jj][i]
                    for jj in range(len(all_u)) if jj != k) for i in range(n_out)]

    return jvps


def _of_diff_inputs(fn, base, diff):
    def of_x(*xs):
        args = list(base)
        for j, x in zip(diff, xs):
            args[j] = x
        return tuple(o for o in as_tuple(fn(*args)) if is_float_or_complex(o))
    return of_x


def _plain_jvp(ev, func, inputs, diff, sizes, u):
    """Tangents of func's float outputs (flattened) for the input direction u, with dual tensors."""
    ev.stats.jvp_calls += 1
    with fwAD.dual_level():
        args = list(inputs)
        offset = 0
        for j, size in zip(diff, sizes):
            x = inputs[j]
            args[j] = fwAD.make_dual(x.detach(), u[offset:offset + size].reshape(x.shape).to(x.dtype))
            offset += size
        result = []
        for o in as_tuple(func(*args)):
            if not is_float_or_complex(o):
                continue
            primal, tangent = fwAD.unpack_dual(o)
            result.append(tangent.reshape(-1).clone() if tangent is not None else primal.new_zeros(primal.numel()))
        return result


FUNCTORCH_ROWS = 64
"""From this many Jacobian rows the fused backward takes them from torch.func (a vmapped pullback),
whose batching rules cover backward kernels that the legacy vmap runs one row at a time (conv's:
15x faster at 128 rows); below, the legacy batched backward's lower overhead wins."""


def _backward(ctx: CheckContext, func, func_out: tuple, inputs: tuple, outputs: tuple, numerical,
              check_batched_grad: bool, masked) -> None:
    """The Jacobian rows (one-hot cotangents) and the side checks, in one batched backward."""
    flat = batched_backward(ctx, func, func_out, inputs, outputs, [None] * len(outputs), check_batched_grad, masked)
    for j, f in enumerate(flat):
        offset = 0
        for i, o in enumerate(outputs):
            size = o.numel()
            if not allclose_promoted(f[offset:offset + size].t(), numerical[j][i], ctx.rtol, ctx.atol):
                raise Fallback(f"backward: output {i}, input {j} disagrees with finite differences")
            offset += size


def batched_backward(ctx: CheckContext, func, func_out: tuple, inputs: tuple, outputs: tuple, leading: list,
                     check_batched_grad: bool, masked) -> list[torch.Tensor]:
    """One batched backward for `leading` cotangents, with the side checks of the backward riding along.

    `leading` holds per output its (r_i, *shape) cotangents, or None for its one-hot rows (the
    Jacobian's). Appended to them: per output, the step-by-step batched-gradient check's first
    random cotangent (tied to two plain backward passes: reentrancy and batched against plain),
    and one all-zero row (the zero-grad_output check). Returns per differentiable input its
    (Σ r_i, numel) gradients along the leading rows, output by output; raises Fallback when a
    side check does not pass.
    """
    ev = ctx.evaluator
    diff_inputs = [a for a in inputs if requires_grad(a)]
    sizes = [o.numel() if lead is None else lead.shape[0] for o, lead in zip(outputs, leading)]
    m = sum(sizes)
    rows = m + len(outputs) + 1  # the leading rows, one random cotangent per output, one zero row
    randoms = []  # per output, the first random cotangent of the step-by-step batched-gradient check
    cotangents = []
    offset = 0
    for i, (o, lead) in enumerate(zip(outputs, leading)):
        randoms.append(aux_checks._randn_like(o, torch.Generator().manual_seed(aux_checks._SEED + i)))
        c = o.new_zeros((rows, o.numel()))
        if lead is None:
            c[offset:offset + sizes[i]].fill_diagonal_(1)
        else:
            c[offset:offset + sizes[i]] = lead.reshape(sizes[i], -1)
        c[m + i] = randoms[i].reshape(-1)
        cotangents.append(c.view(rows, *o.shape))
        offset += sizes[i]
    plain = [_plain_gradients(ctx, o, i, diff_inputs, randoms[i]) for i, o in enumerate(outputs)]

    def tied(flat) -> bool:
        # Each random cotangent's batched row against the plain gradient: torch.allclose's defaults,
        # as the batched-gradient check compares; with that check off, agreement up to reassociation.
        for i in range(len(outputs)):
            for j, p in enumerate(plain[i]):
                same = allclose_promoted(flat[j][m + i], p, 1e-5, 1e-8) if check_batched_grad else _close(
                    flat[j][m + i], p, extra_atol=ctx.nondet_tol)
                if not same:
                    return False
        return True

    flat = None
    if m >= FUNCTORCH_ROWS:
        flat = _flat_rows(_functorch_rows(func, func_out, inputs, cotangents), diff_inputs, rows)
        if flat is not None and not tied(flat):  # torch.func's batching rule disagrees: try the legacy one
            ev.stats.fallbacks.append("fused: torch.func's batched backward differs from the plain one")
            flat = None
        legacy_checked = False
    if flat is None:
        ev.stats.batched_vjp_calls += 1
        flat = _flat_rows(_legacy_rows(outputs, diff_inputs, cotangents), diff_inputs, rows)
        if flat is None:
            raise Fallback("the batched gradient has an unexpected shape, dtype or layout")
        if not tied(flat):
            raise Fallback("batched and plain gradients differ", ("vjp",))
        legacy_checked = True
    else:
        ev.stats.batched_vjp_calls += 1
    if check_batched_grad and not legacy_checked:
        # The batched-gradient check is about the legacy vmap (is_grads_batched): its row of each
        # random cotangent against the plain gradient.
        ev.stats.batched_vjp_calls += 1
        legacy = _flat_rows(_legacy_rows(outputs, diff_inputs, [c[m:m + len(outputs)] for c in cotangents]),
                            diff_inputs, len(outputs))
        if legacy is None or not all(allclose_promoted(legacy[j][i], p, 1e-5, 1e-8)
                                     for i in range(len(outputs)) for j, p in enumerate(plain[i])):
            raise Fallback("the legacy batched gradient differs from the plain one")

    for j, f in enumerate(flat):
        zero = f[rows - 1]
        if bool(zero.any()) and not (masked and torch.allclose(zero, torch.zeros_like(zero))):
            raise Fallback(f"gradient of input {j} is nonzero for a zero grad_output")
    return [f[:m] for f in flat]


def _plain_gradients(ctx: CheckContext, output, i: int, diff_inputs, v) -> list[torch.Tensor]:
    """The plain backward along v, run twice (reentrancy): per input, its flat gradient."""
    first = _plain_vjp(ctx.evaluator, output, diff_inputs, v)
    again = _plain_vjp(ctx.evaluator, output, diff_inputs, v)
    result = []
    for j, x in enumerate(diff_inputs):
        if (first[j] is None) != (again[j] is None):
            raise Fallback(f"output {i}: two plain backward passes disagree on whether input {j} is used")
        a = first[j].detach() if first[j] is not None else torch.zeros_like(x)
        b = again[j].detach() if again[j] is not None else a
        if a.dtype != x.dtype or a.shape != x.shape or a.layout != torch.strided:
            raise Fallback(f"output {i}: the plain gradient of input {j} has an unexpected dtype or shape")
        if not torch.equal(a, b) and (a.numel() == 0 or float((a - b).abs().max()) > ctx.nondet_tol):
            raise Fallback(f"two plain backward passes of output {i} differ (reentrancy)")
        result.append(a.reshape(-1))
    return result


def _flat_rows(batched, diff_inputs, rows: int):
    """Per input, its (rows, numel) batched gradients (zeros where undefined); None if any is malformed."""
    if batched is None:
        return None
    flat = []
    for gr, x in zip(batched, diff_inputs):
        if gr is None:
            gr = x.new_zeros((rows, *x.shape))
        elif tuple(gr.shape) != (rows, *x.shape) or gr.dtype != x.dtype or gr.layout != torch.strided:
            return None
        flat.append(gr.detach().reshape(rows, x.numel()))
    return flat


def _legacy_rows(outputs, diff_inputs, cotangents):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.autograd.grad(outputs, diff_inputs, cotangents, retain_graph=True, allow_unused=True,
                                   is_grads_batched=True)


def _functorch_rows(func, func_out: tuple, inputs: tuple, cotangents):
    """The rows from torch.func.vjp's pullback under torch.func.vmap, or None where it does not work.

    Its forward pass is torch.func's own; the plain backward of the user's graph is tied to these
    rows by the caller (its random cotangent's row).
    """
    diff = diff_input_indices(inputs)
    positions = [p for p, o in enumerate(func_out) if isinstance(o, torch.Tensor) and o.requires_grad]
    base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
    fn = getattr(func, "vmap_form", func)

    def of_x(*xs):
        args = list(base)
        for j, x in zip(diff, xs):
            args[j] = x
        outs = as_tuple(fn(*args))
        return tuple(outs[p] for p in positions)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, pullback = torch.func.vjp(of_x, *[base[j] for j in diff])
            return tuple(torch.func.vmap(pullback)(tuple(cotangents)))
    except Exception:  # no torch.func support (an old-style Function, .item(), ...): the legacy rows
        return None


def _plain_vjp(ev, output, diff_inputs, v):
    ev.stats.vjp_calls += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.autograd.grad(output, diff_inputs, v, retain_graph=True, allow_unused=True)

