"""fast_mode="auto": the full check while the Jacobian is small, entrywise projections beyond.

What it does
------------
Let the Jacobian's size be the sum over (differentiable input j, float output i) of
numel_in_j * numel_out_i = n·m, n the differentiable input elements and m the float output
elements. While n + m <= core.FULL_CHECK_ELEMENTS (128, so n·m <= 4096) `auto` runs the full check
(core.full_check, fused into few calls by fused.py), so its verdicts there are the full mode's.
Beyond it runs the projection check below, which never holds an n×m block; its checks cost a
handful of calls whatever the size (fused_projected.py), where the full check's cost grows with
(n + m)²: a scalar loss of a 64×64 input costs it 8,193 evaluations. Up to `jacobian_budget`
entries (default 2**20) a call that the projections do not pass is decided by the full check:
there `auto` fails exactly where the full check fails, and passes where the full check passes or
the projections do. Beyond the budget the projection check's own verdict stands (this module,
step by step, says what is wrong). A function that cannot be vmapped runs this module's
projection check first wherever the full check does not (its loops make 16 calls per input where
the full check's make two per column), and within the budget a call it does not pass still goes
to the full check. Per input j, with U_j a seeded Rademacher matrix of k = 8 directions (entries
±1), it checks

1. **J·U against finite differences** (the JVP stage). For every direction u_l the numerical
   directional derivative (f(x + eps u_l) - f(x - eps u_l)) / 2eps (2k evaluations, vmapped where
   the function allows) is compared *entrywise*, for every output element, with an analytical
   J·u_l, at torch's own tolerance atol + rtol * |numerical|: m*k comparisons per block. The
   analytical J·U comes from the first of these that works:
   forward AD (batched torch.func.jvp, else dual tensors one direction at a time); the VJP of the
   VJP (g(v) = Jᵀv is linear in v, and the VJP of g with cotangent u is J·u) when backward is
   differentiable; batched VJP rows eᵣᵀJ reduced against U on the fly (memory O((n + m) k) per
   chunk). In the backward check forward AD is only a tool: when it is not implemented, or its
   J·U disagrees with the finite differences (the jvp is not what is being checked), the next
   source is tried, and only a source built from backward itself (the rows) can fail the check
   at this stage. In the forward-AD check (check_forward_ad) the JVP is what is checked, so this
   stage is the whole check.
2. **VJP against the JVP** (backward check only). For k' = 8 Rademacher cotangents V_i, the
   batched VJP gives JᵀV; the identity (Jᵀv)·u = vᵀ(Ju) is checked entrywise on the k'×k matrix
   of pairs, comparing two analytical quantities, so the tolerance only has to cover rounding:

       |Vᵀ(JU) - (JᵀV)ᵀU| <= rho * (|V|ᵀ|JU| + |JᵀV|ᵀ|U|) + nondet_tol * n,
       rho = 1024 * eps_dtype * sqrt(n + m).

   A dot product of length L computed in floating point is off by at most ~L eps Σ|terms|, and
   typically by ~sqrt(L) eps Σ|terms|; |V|ᵀ|JU| underestimates Σ|v||J||u| by about the sqrt of a
   row's length when J·u sums terms of random sign, which the sqrt(n + m) factor covers, and the
   1024 leaves room for reassociation in batched kernels. nondet_tol bounds each entry of a
   nondeterministic backward, so n of them in (JᵀV)ᵀU. For float64 at n = m = 16384 rho is 4e-11:
   a backward error whose contribution is ~1e-9 of the scale |V|ᵀ|JU| is seen, which is far below
   what finite differences resolve. The VJP is also computed twice and compared (reentrancy).

What it guarantees, and what it can miss
----------------------------------------
Every Jacobian entry enters some entrywise comparison. A single wrong entry J_ab + d shows in
(JU)_al = Σ_b J_ab u_bl as +-d in *every* direction l (|u_bl| = 1), so the JVP stage catches it iff
|d| > atol + rtol * |num_al|, deterministically, not with some probability. |num_al| is a sum of
a row's entries with random signs: about |J| * sqrt(nnz of the row), so for dense rows (matmul:
sqrt(64) = 8 times an entry; attention, conv: the fan-in) the threshold grows with the fan-in,
and an error has to be about rtol * sqrt(fan-in) of an entry to be seen by finite differences;
elementwise ops keep torch's per-entry threshold. Errors in several entries of one row can cancel
in a direction; with k independent directions all k cancel with probability <= 2^-k (1/256),
and exactly only for errors that sum to zero under every sign pattern drawn.

The VJP stage sees a backward error E (any shape) through V_iᵀ E U_l; one wrong entry d gives
+-d in all k'×k pairs, so it is caught whenever |d| exceeds the rounding bound above, at any row
density: a wrong tail tile, row, column or head of a backward is seen at 1e-8 relative, not 1e-3.
Errors over many entries cancel in all k'k pairs with probability <= 2^-(k') per direction. It
catches a backward that is wrong where the JVP is right; when both come from the same formula
(no jvp, so J·U from the VJP of the VJP or the rows) the VJP stage only checks consistency, and
detection is the JVP stage's. Because it is stricter than finite differences, a backward that
agrees with the finite differences but disagrees with a (right or slightly wrong) jvp beyond
rounding fails the projection check where the full check might pass. Within the budget the full
check then decides the call; beyond it, a failing block that fits the budget is recomputed in full
and the report says whether the full check would pass it. torch's own ops do this: with the
projections forced onto every OpInfo sample (`benchmarks/bench_opinfo.py --mode auto --budget
0`), 12 of 2,731 samples fail this stage where torch's slow mode passes: layer_norm, group_norm,
batch_norm, normalize and cosine_similarity on pairs whose exact value cancels to 0 (1e-15
against 0), and logcumsumexp, whose backward and forward-AD formulas differ by up to 1e-4 of a
pair's value. At the default budget the full check decides those samples.

Complex inputs and outputs
--------------------------
The full check compares backward's grad of a complex input x = a + ib with ds/da + i ds/db (the
Jacobian with respect to the pair (a, b)); complex outputs reach it already split into real and
imaginary parts (api._real_imag), and the forward check splits complex inputs likewise. Beyond the
budget the stages run on the function seen through torch.view_as_real: every complex
differentiable input becomes a real (..., 2) leaf (view_as_complex'd before the call, so the
user's function and its backward see the complex tensor) and every complex output a real
(..., 2) view. Its Jacobian holds the same entries as the full check's, split into real and
imaginary parts, so a backward that drops a .conj() shows as a wrong sign of the imaginary
column; directions are real Rademacher on the view, and memory stays O((n + m) k). The entries
are compared part by part, where the full check compares complex entries by modulus.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine._util import (as_tuple, diff_input_indices, differentiable_outputs, exception_line,
                                  is_float_or_complex, make_duals, unravel)
from opcheck.engine.batching import _close, _Disagreement, _one_hot_rows
from opcheck.engine.core import (
    DEFAULT_JACOBIAN_BUDGET,
    CheckContext,
    _first_line,
    _nbhd_check,
    _report,
    allclose_promoted,
    analytical_jvp_jacobian,
    analytical_vjp_jacobian,
    full_check,
    numerical_jacobian,
)
from opcheck.engine.errors import FAILED_NONDET_NOTE, FAST_FAIL_SLOW_OK_NOTE

__all__ = ["DEFAULT_JACOBIAN_BUDGET", "DIRECTIONS", "COTANGENTS", "ProjectionMismatch", "auto_check",
           "jacobian_sides"]

DIRECTIONS = 8
"""k: random input directions per input (J·U has m*k entries per block)."""
COTANGENTS = 8
"""k': random output cotangents per output for the VJP stage."""
_SEED = 0x5EED_A070
WORST = 5

JVP_STAGE = "J·U projections against finite differences"
VJP_STAGE = "VJP against JVP projections"


@dataclass(frozen=True)
class ProjectionEntry:
    """One projection entry out of tolerance.

    In the JVP stage: (J u_direction)[output_index]; in the VJP stage: v_cotangentᵀ J u_direction.
    """

    output_index: tuple[int, ...] | None
    cotangent: int | None
    direction: int
    analytical: float
    numerical: float  # the reference: finite differences (JVP stage) or vᵀ(Ju) (VJP stage)
    abs_error: float
    allowed: float


@dataclass(frozen=True, eq=False)
class ProjectionMismatch:
    """A failed projection comparison of a block too large to recompute in full.

    `analytical` / `numerical` are (k, m) for the JVP stage (a row per direction, a column per
    output element) and (k', k) for the VJP stage ((JᵀV)ᵀU against Vᵀ(JU)).
    """

    check: str
    path: str
    comparison: str  # JVP_STAGE or VJP_STAGE
    source: str  # where J·U came from
    output_idx: int
    input_idx: int
    output_name: str
    input_name: str
    part: str | None
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    atol: float
    rtol: float
    mismatched: int
    total: int
    worst: tuple[ProjectionEntry, ...]
    hints: tuple[str, ...]
    analytical: torch.Tensor = field(repr=False)
    numerical: torch.Tensor = field(repr=False)

    def describe(self) -> str:
        entries = self.input_shape and math.prod(self.input_shape) * math.prod(self.output_shape)
        lines = [f"check: {self.check} ({self.path}), auto: {self.comparison} (J·U from {self.source}); "
                 f"d {self.output_name} / d {self.input_name}"]
        if self.comparison == JVP_STAGE:
            lines.append(f"{self.mismatched} of {self.total} projection entries (J u_l)[out] differ beyond "
                         f"atol={self.atol:g} + rtol={self.rtol:g} * |numerical| (input shape "
                         f"{tuple(self.input_shape)}, output shape {tuple(self.output_shape)})")
        else:
            lines.append(f"{self.mismatched} of {self.total} pairs v_iᵀ J u_l differ between the VJP and the "
                         "JVP beyond the rounding bound (input shape "
                         f"{tuple(self.input_shape)}, output shape {tuple(self.output_shape)})")
        lines.append(f"the block has {entries} Jacobian entries, beyond the budget: not recomputed in full; "
                     "these are projection entries, not Jacobian entries")
        if self.worst:
            lines.append("worst entries:")
            for e in self.worst:
                where = (f"(J u_{e.direction})[{', '.join(map(str, e.output_index))}]" if e.output_index is not None
                         else f"v_{e.cotangent}ᵀ J u_{e.direction}")
                ref = "numerical" if e.output_index is not None else "vᵀ(Ju) from JVP"
                got = "analytical" if e.output_index is not None else "(Jᵀv)ᵀu from VJP"
                lines.append(f"  {where}: {got} {e.analytical:.6g}, {ref} {e.numerical:.6g}, "
                             f"abs err {e.abs_error:.4g}, allowed {e.allowed:.4g}")
        lines += [f"hint: {h}" for h in self.hints]
        return "\n".join(lines)


def jacobian_sides(inputs: tuple, outputs: tuple) -> tuple[int, int]:
    """(n, m): the elements of the differentiable inputs and of the float/complex outputs."""
    n = sum(inputs[j].numel() for j in diff_input_indices(inputs))
    return n, sum(o.numel() for o in as_tuple(outputs) if is_float_or_complex(o))



class _Unavailable(Exception):
    """This source of J·U does not work for the function."""


class _Problem(Exception):
    """A source of J·U disagrees with finite differences."""

    def __init__(self, failure):
        super().__init__("J·U disagrees with finite differences")
        self.failure = failure


# ------------------------------------------------------------------------------- entry point
def auto_check(ctx: CheckContext, func, func_out, inputs, outputs, *, use_forward_ad=False,
               complex_indices=None, test_imag=False):
    """Step by step, once the fused passes have not passed the call: the full check within
    ctx.jacobian_budget, the projection check beyond (see the module doc)."""
    func_out_t = as_tuple(func_out)
    inputs = tuple(inputs)
    diff = diff_input_indices(inputs)
    n, m = jacobian_sides(inputs, func_out_t)
    size = n * m
    has_complex = any(inputs[j].is_complex() for j in diff) or any(
        o.is_complex() for o in func_out_t if is_float_or_complex(o))
    stats = ctx.evaluator.stats
    if size <= ctx.jacobian_budget and not (ctx.projections_first and not ctx.full_first(n, m)):
        stats.auto_paths.append("full")
        return full_check(ctx, func, func_out, inputs, outputs, use_forward_ad=use_forward_ad,
                          complex_indices=complex_indices, test_imag=test_imag)
    if size <= ctx.jacobian_budget:  # projections first; the full check decides what they do not pass
        mark = len(stats.auto_paths)
        try:
            return _projected(ctx, func, func_out_t, inputs, outputs, use_forward_ad, complex_indices, test_imag,
                              has_complex, diff, full_decides=True)
        except Exception as e:  # a GradcheckError, or what the full check will raise in its own words
            del stats.auto_paths[mark:]
            stats.fallbacks.append(f"auto projections: {exception_line(e)}; the full check decides")
            stats.auto_paths.append("full")
            return full_check(ctx, func, func_out, inputs, outputs, use_forward_ad=use_forward_ad,
                              complex_indices=complex_indices, test_imag=test_imag)
    return _projected(ctx, func, func_out_t, inputs, outputs, use_forward_ad, complex_indices, test_imag,
                      has_complex, diff)


def _projected(ctx, func, func_out_t, inputs, outputs, use_forward_ad, complex_indices, test_imag, has_complex,
               diff, full_decides=False):
    views = None
    if has_complex:
        func, inputs, views = _real_views(func, func_out_t, inputs, diff)
        func_out_t = as_tuple(func(*inputs))
        outputs = differentiable_outputs(func_out_t)
    return _Projected(ctx, func, func_out_t, inputs, tuple(outputs), use_forward_ad, complex_indices,
                      test_imag, views, full_decides).run()


@dataclass(frozen=True)
class _RealViews:
    """Which complex tensors the projection check sees as torch.view_as_real (shape (..., 2))."""

    inputs: tuple[int, ...]  # positions in the inputs
    outputs: tuple[int, ...]  # positions in func's outputs

    def hints(self, input_pos: int, output_pos: int) -> list[str]:
        said = [f"input {input_pos}"] if input_pos in self.inputs else []
        said += [f"output {output_pos}"] if output_pos in self.outputs else []
        if not said:
            return []
        return [f"complex {' and '.join(said)} checked as torch.view_as_real (shape (..., 2)): the last index "
                "is 0 for the real part, 1 for the imaginary part"]


def _real_views(func, func_out, inputs, diff):
    """func on real tensors: complex differentiable inputs and complex outputs as view_as_real.

    The full check compares backward's grad of a complex input x = a + ib with ds/da + i ds/db,
    i.e. the Jacobian with respect to the pair (a, b), and the forward check splits complex
    outputs the same way; on the real view both are ordinary real Jacobians, so the projection
    stages apply unchanged and memory stays O((n + m) k).
    """
    cin = tuple(j for j in diff if inputs[j].is_complex())

    def complex_args(args):
        new = list(args)
        for j in cin:
            new[j] = torch.view_as_complex(new[j])
        return new

    def real_outs(outs):
        return tuple(torch.view_as_real(o.resolve_conj()) if isinstance(o, torch.Tensor) and o.is_complex()
                     else o for o in as_tuple(outs))

    def on_real(*args):
        return real_outs(func(*complex_args(args)))

    if hasattr(func, "vmap_form"):
        on_real.vmap_form = lambda *args: real_outs(func.vmap_form(*complex_args(args)))  # type: ignore[attr-defined]
    real_inputs = tuple(torch.view_as_real(a.detach().resolve_conj()).clone().requires_grad_() if j in cin else a
                        for j, a in enumerate(inputs))
    cout = tuple(p for p, o in enumerate(func_out) if isinstance(o, torch.Tensor) and o.is_complex())
    return on_real, real_inputs, _RealViews(cin, cout)


class _Projected:
    """One projection check: the state its stages share."""

    def __init__(self, ctx, func, func_out, inputs, outputs, forward, complex_indices, test_imag, views=None,
                 full_decides=False):
        self.views = views
        self.full_decides = full_decides  # the caller runs the full check on a failure: no block recomputed
        self.ctx, self.ev, self.func, self.func_out, self.inputs = ctx, ctx.evaluator, func, func_out, inputs
        self.outputs, self.forward = outputs, forward
        self.complex_indices, self.test_imag = complex_indices, test_imag
        self.diff = diff_input_indices(inputs)
        # Positions in func_out of the outputs checked, in the full check's numbering.
        self.positions = [p for p, o in enumerate(func_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outputs:  # then every float output's finite differences must be zero
            self.positions = [p for p, o in enumerate(func_out) if is_float_or_complex(o)]
        g = torch.Generator().manual_seed(_SEED)
        self.U = [_rademacher((DIRECTIONS, *inputs[j].shape), inputs[j], g) for j in self.diff]
        self.V = [_rademacher((COTANGENTS, *o.shape), o, g) for o in outputs]

    # ------------------------------------------------------------------ driver
    def run(self) -> bool:
        stats = self.ev.stats
        numerical = [self._numerical(jj) for jj in range(len(self.diff))]  # [input][output] (k, m)
        if not self.outputs:
            return self._no_differentiable_outputs(numerical)
        if self.forward:
            stats.auto_paths.append(f"projected (J·U from forward AD{self._path_note})")
            analytical = [self._jvp(jj, strict=True) for jj in range(len(self.diff))]
            failure = self._compare_jvp(analytical, numerical, "forward AD")
            if failure:
                self._fail_jvp_stage(*failure)
            return True
        sources = (("forward AD", self._jvp_all), ("the VJP of the VJP", self._double_backward),
                   ("VJP rows", self._rows))
        for name, make in sources:
            try:
                analytical = make()
            except _Unavailable as e:
                stats.fallbacks.append(f"auto J·U from {name}: {e}")
                continue
            failure = self._compare_jvp(analytical, numerical, name)
            if failure is None:
                break
            if name == "VJP rows":  # built from backward itself: the backward is wrong
                stats.auto_paths.append(f"projected (J·U from {name}{self._path_note})")
                self._fail_jvp_stage(*failure)
            stats.fallbacks.append(f"auto J·U from {name}: disagrees with finite differences")
        stats.auto_paths.append(f"projected (J·U from {name}{self._path_note})")
        self._vjp_stage(analytical, name)
        return True

    @property
    def _path_note(self) -> str:
        return "; complex as view_as_real" if self.views else ""

    # ------------------------------------------------------------- numerical J·U
    def _numerical(self, jj):
        """Per checked output, (k, m) central differences along each direction of input diff[jj]."""
        j = self.diff[jj]
        if self.ev.batch_forward:
            try:
                return self._numerical_batched(j, self.U[jj])
            except Exception as e:  # the loop decides what the user sees
                self.ev._give_up("forward", e)
        return self._numerical_loop(j, self.U[jj])

    def _numerical_loop(self, j, U):
        eps, entry = self.ctx.eps, self.inputs[j].data
        nbhd = _nbhd_check(eps)
        orig = entry.clone()
        rows = []
        try:
            for u in U:
                entry.copy_(orig - eps * u)
                a = self.ev._call_cloned(self.func, self.inputs)
                entry.copy_(orig + eps * u)
                b = self.ev._call_cloned(self.func, self.inputs)
                entry.copy_(orig)
                per = []
                for p in self.positions:
                    nbhd(a[p], b[p])
                    per.append(((b[p] - a[p]) / (2 * eps)).detach().reshape(-1))
                rows.append(per)
        finally:
            entry.copy_(orig)
        return [torch.stack(col) for col in zip(*rows)] if rows else []

    def _numerical_batched(self, j, U):
        eps, k = self.ctx.eps, U.shape[0]
        base = [a.detach() if isinstance(a, torch.Tensor) else a for a in self.inputs]
        fn = getattr(self.func, "vmap_form", self.func)

        def single(xj):
            args = list(base)
            args[j] = xj
            return tuple(as_tuple(fn(*args))[p] for p in self.positions)

        points = torch.cat([base[j] - eps * U, base[j] + eps * U])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = self.ev._vmap(single, points)
        self.ev.stats.batched_calls += 1
        refs = [self.func_out[p] for p in self.positions]
        for o, r in zip(outs, refs):
            if o.shape[1:] != r.shape or o.dtype != r.dtype:
                raise _Disagreement("output shape or dtype changed under perturbation")
        entry = self.inputs[j].data
        orig = entry.clone()
        try:  # probe: one plain call at x + eps u_0 must match the batched row
            entry.copy_(orig + eps * U[0])
            plain = self.ev._call_cloned(self.func, self.inputs)
        finally:
            entry.copy_(orig)
        for o, p in zip(outs, self.positions):
            if not _close(o[k], plain[p]):
                raise _Disagreement("vmapped evaluation differs from the plain call")
        return [torch.sub(o[k:], o[:k]).div_(2 * eps).reshape(k, -1) for o in outs]

    # ------------------------------------------------------ analytical J·U: JVP
    def _jvp_all(self):
        return [self._jvp(jj, strict=False) for jj in range(len(self.diff))]

    def _jvp(self, jj, *, strict):
        """Per checked output, (k, m) forward-mode J·U for input diff[jj].

        strict: forward AD is what is checked, so the loop's exceptions reach the user; otherwise
        any failure makes this source unavailable.
        """
        j, U = self.diff[jj], self.U[jj]
        if self.ev.batch_jvp_func:
            try:
                return self._jvp_batched(j, U)
            except Exception as e:
                self.ev._give_up("jvp_func", e)
        if strict:
            return self._jvp_loop(j, U)
        try:
            return self._jvp_loop(j, U)
        except Exception as e:
            raise _Unavailable(exception_line(e)) from e

    def _jvp_loop(self, j, U):
        rows = []
        with fwAD.dual_level():
            duals, tangents = make_duals(self.inputs)
            t = tangents[j]
            for u in U:
                t.copy_(u)
                self.ev.stats.jvp_calls += 1
                outs = as_tuple(self.func(*duals))
                per = []
                for p in self.positions:
                    primal, tangent = fwAD.unpack_dual(outs[p])
                    if (self.ctx.check_grad_dtypes and tangent is not None
                            and primal.is_complex() != tangent.is_complex()):
                        self.ctx.fail("Forward AD gradient has dtype mismatch.", check="forward AD dtype",
                                      path=self.ctx.forward_path)
                    per.append(torch.zeros(primal.numel(), dtype=primal.dtype, device=primal.device)
                               if tangent is None else tangent.detach().reshape(-1).clone())
                rows.append(per)
                t.zero_()
        return [torch.stack(col) for col in zip(*rows)]

    def _jvp_batched(self, j, U):
        base = [a.detach() if isinstance(a, torch.Tensor) else a for a in self.inputs]
        fn = getattr(self.func, "vmap_form", self.func)

        def of_x(xj):
            args = list(base)
            args[j] = xj
            return tuple(as_tuple(fn(*args))[p] for p in self.positions)

        def column(u):
            return torch.func.jvp(of_x, (base[j],), (u,))[1]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = self.ev._vmap(column, U)
        self.ev.stats.batched_jvp_calls += 1
        res = [r.reshape(U.shape[0], -1) for r in as_tuple(res)]
        plain = self._jvp_loop(j, U[:1])  # probe
        for r, p in zip(res, plain):
            if not _close(r[:1], p):
                raise _Disagreement("batched JVP differs from the plain JVP")
        return res

    # -------------------------------------------- analytical J·U: VJP of the VJP
    def _double_backward(self):
        diff_inputs = [self.inputs[j] for j in self.diff]
        vs = [v[0].clone().requires_grad_() for v in self.V]  # any value: g(v) = Jᵀv is linear in v
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                grads = torch.autograd.grad(self.outputs, diff_inputs, vs, create_graph=True, allow_unused=True)
        except Exception as e:
            raise _Unavailable(f"{type(e).__name__}: {e}") from e
        self.ev.stats.vjp_calls += 1
        result = []
        for jj, g in enumerate(grads):
            k = self.U[jj].shape[0]
            if g is None:
                result.append([o.new_zeros((k, o.numel())) for o in self.outputs])
                continue
            if not g.requires_grad:
                raise _Unavailable("backward is not differentiable (its result does not require grad)")
            try:
                ju = _vjp_batch(self.ev, [g], vs, [self.U[jj]])
            except Exception as e:
                raise _Unavailable(exception_line(e)) from e
            result.append([(t.reshape(k, -1) if t is not None else o.new_zeros((k, o.numel())))
                           for t, o in zip(ju, self.outputs)])
        return result

    # ----------------------------------------------- analytical J·U: VJP rows
    def _rows(self):
        """(J U)[r] = (eᵣᵀ J) U, a chunk of rows at a time: never more than a chunk of J."""
        diff_inputs = [self.inputs[j] for j in self.diff]
        n_total = sum(t.numel() for t in diff_inputs)
        result = [[None] * len(self.outputs) for _ in self.diff]
        for i, o in enumerate(self.outputs):
            m = o.numel()
            chunk = self.ev._chunk(m, m + n_total, o.element_size())
            acc = [o.new_zeros((u.shape[0], m)) for u in self.U]
            for start in range(0, m, chunk):
                b = min(chunk, m - start)
                e = _one_hot_rows(b, m, start, o).view(b, *o.shape)
                grads = _vjp_batch(self.ev, [o], diff_inputs, [e], probe=start == 0)
                for jj, g in enumerate(grads):
                    if g is not None:
                        acc[jj][:, start:start + b] = (g.reshape(b, -1) @ self.U[jj].reshape(
                            self.U[jj].shape[0], -1).t().to(g.dtype)).t()
            for jj in range(len(self.diff)):
                result[jj][i] = acc[jj]
        return result

    # -------------------------------------------------------------- JVP stage
    def _compare_jvp(self, analytical, numerical, source):
        """The first block whose J·U differs entrywise from finite differences, or None."""
        atol, rtol = self.ctx.atol, self.ctx.rtol
        for i in range(len(self.outputs)):
            for jj in range(len(self.diff)):
                a, n = analytical[jj][i], numerical[jj][i].to(analytical[jj][i].device)
                if a.shape != n.shape:
                    raise AssertionError(f"J·U from {source} has shape {tuple(a.shape)}, expected {tuple(n.shape)}")
                if not allclose_promoted(a, n, rtol, atol):
                    return (i, jj, a, n, source)
        return None

    def _fail_jvp_stage(self, i, jj, a, n, source):
        ctx = self.ctx
        allowed = ctx.atol + ctx.rtol * n.abs()
        err = (a - n).abs()
        bad = ~(err <= allowed)
        excess = torch.where(bad, torch.nan_to_num(err - allowed, nan=math.inf), torch.full_like(err, -math.inf))
        worst = []
        shape = tuple(self.outputs[i].shape)
        for flat in torch.argsort(excess.reshape(-1), descending=True)[:min(WORST, int(bad.sum()))].tolist():
            l, col = divmod(flat, a.shape[1])
            worst.append(ProjectionEntry(unravel(col, shape), None, l, a[l, col].item(), n[l, col].item(),
                                         err[l, col].item(), allowed[l, col].item()))
        bad_out = bad.any(dim=0).nonzero().reshape(-1).tolist()
        hints = [f"{len(bad_out)} output element(s) have a wrong J·U; the first: "
                 + ", ".join(str(list(unravel(c, shape))) for c in bad_out[:8])]
        if int(bad.all(dim=0).sum()) == len(bad_out):
            hints.append("each of them is wrong in every direction: the error sits in those output rows of J")
        self._fail(i, jj, JVP_STAGE, source, a, n, bad, worst, hints)

    # -------------------------------------------------------------- VJP stage
    def _vjp_stage(self, analytical, source):
        ctx = self.ctx
        diff_inputs = [self.inputs[j] for j in self.diff]
        for i, (o, V) in enumerate(zip(self.outputs, self.V)):
            first = _vjp_batch(self.ev, [o], diff_inputs, [V])
            # A second pass on the same path: batched and looped VJPs may differ in the last bit.
            second = _vjp_batch(self.ev, [o], diff_inputs, [V], batched=self.ev.batch_vjp)
            self._check_vjp_values(first, second, diff_inputs)
            kv = V.shape[0]
            v = V.reshape(kv, -1)
            for jj, g in enumerate(first):
                x, U = diff_inputs[jj], self.U[jj].reshape(self.U[jj].shape[0], -1)
                ju = analytical[jj][i]
                g = x.new_zeros((kv, x.numel())) if g is None else g.reshape(kv, -1)
                lhs, rhs, err, allowed, bad = vjp_jvp_pairs(v, ju, g, U, ctx.nondet_tol)
                if bad.any():
                    worst = []
                    excess = torch.where(bad, torch.nan_to_num(err - allowed, nan=math.inf),
                                         torch.full_like(err, -math.inf))
                    for flat in torch.argsort(excess.reshape(-1), descending=True)[:min(WORST, int(bad.sum()))].tolist():
                        c, l = divmod(flat, lhs.shape[1])
                        worst.append(ProjectionEntry(None, c, l, rhs[c, l].item(), lhs[c, l].item(),
                                                     err[c, l].item(), allowed[c, l].item()))
                    hints = [f"J·U from {source} matches finite differences entrywise, and backward's JᵀV "
                             "disagrees with it beyond rounding: backward is wrong somewhere in this block "
                             "(or the JVP is, by less than atol + rtol * |numerical|)"]
                    self._fail(i, jj, VJP_STAGE, source, rhs, lhs, bad, worst, hints)

    def _check_vjp_values(self, first, second, diff_inputs):
        ctx = self.ctx
        for g, x in zip(first, diff_inputs):
            if g is not None and g.dtype != x.dtype:
                ctx.fail("Gradient has dtype mismatch: backward returned a gradient whose dtype differs from "
                         "its input's", check="gradient dtype", path=ctx.backward_path)
        for a, b in zip(first, second):
            if a is not None and b is not None and a.numel() and not torch.equal(a, b) \
                    and (a - b).abs().max() > ctx.nondet_tol:
                ctx.fail(
                    "Backward is not reentrant, i.e., running backward with same input and grad_output "
                    "multiple times gives different values, although analytical gradient matches numerical "
                    f"gradient.The tolerance for nondeterminism was {ctx.nondet_tol}.\n"
                    f"check: reentrancy ({ctx.backward_path}); two identical backward passes differ by up to "
                    f"{float((a - b).abs().max()):.4g}.\n{FAILED_NONDET_NOTE}",
                    check="reentrancy", path=ctx.backward_path)

    # ------------------------------------------------------------- reporting
    def _fail(self, i, jj, comparison, source, a, n, bad, worst, hints):
        """Raise: the block in full when it fits the budget, else the projection entries."""
        ctx = self.ctx
        j = self.diff[jj]
        first = _first_line(i, jj, self.complex_indices, self.test_imag, self.forward)
        check = "forward AD" if self.forward else "backward"
        path = ctx.forward_path if self.forward else ctx.backward_path
        head = f"auto: {comparison} (J·U from {source}) found a mismatch"
        x, o = self.inputs[j], self.outputs[i]
        n_float_out = sum(t.numel() for t in self.func_out if is_float_or_complex(t))
        if not self.full_decides and x.numel() * max(n_float_out, o.numel()) <= ctx.jacobian_budget:
            block = self._full_block(i, jj)
            if block is not None:
                fa, fn_ = block
                mismatch = _report(ctx, fa, fn_, output_idx=i, input_idx=jj, inputs=self.inputs,
                                   outputs=self.func_out if self.forward else self.outputs,
                                   complex_indices=self.complex_indices, test_imag=self.test_imag,
                                   is_forward_ad=self.forward)
                extra = ""
                if allclose_promoted(fa, fn_.to(fa.device), ctx.rtol, ctx.atol):
                    extra = ("\n" + FAST_FAIL_SLOW_OK_NOTE.replace("Fast gradcheck", "auto gradcheck")
                             + (" The VJP disagrees with the JVP beyond rounding: one of them is slightly off."
                                if comparison == VJP_STAGE else ""))
                views = "".join(f"\nhint: {h}" for h in self.views.hints(j, self.positions[i])) if self.views else ""
                ctx.fail(f"{first}\n{head}; the block fits the budget, recomputed in full:\n"
                         f"{mismatch.describe()}{views}{extra}", check=check, path=path, mismatch=mismatch)
        if self.views:
            hints = [*hints, *self.views.hints(j, self.positions[i])]
        part = None
        if self.complex_indices and i in self.complex_indices:
            part = "imaginary" if self.test_imag else "real"
        mismatch = ProjectionMismatch(
            check=check, path=path, comparison=comparison, source=source, output_idx=i, input_idx=jj,
            output_name=ctx.output_name(i), input_name=ctx.input_name(jj), part=part,
            input_shape=tuple(x.shape), output_shape=tuple(o.shape), atol=ctx.atol, rtol=ctx.rtol,
            mismatched=int(bad.sum()), total=bad.numel(), worst=tuple(worst), hints=tuple(hints),
            analytical=a, numerical=n)
        ctx.fail(f"{first}\n{mismatch.describe()}", check=check, path=path, mismatch=mismatch)

    def _full_block(self, i, jj):
        """(analytical, numerical) of one block, by the full check's code; None if that fails."""
        j = self.diff[jj]
        only = tuple(a if k == j else (a.detach() if isinstance(a, torch.Tensor) else a)
                     for k, a in enumerate(self.inputs))
        float_pos = [p for p, t in enumerate(self.func_out) if is_float_or_complex(t)]
        fi = float_pos.index(self.positions[i])
        try:
            numerical = numerical_jacobian(self.ctx, self.func, only, self.func_out,
                                           is_forward_ad=self.forward)[0][fi]
            if self.forward:
                analytical = analytical_jvp_jacobian(self.ctx, self.func, only, self.func_out)[0][fi]
            else:
                analytical = analytical_vjp_jacobian(self.ctx, (self.inputs[j],), self.outputs[i],
                                                     nondet_tol=float("inf"))[0]
        except Exception:  # the projection report below still stands
            return None
        return analytical, numerical

    def _no_differentiable_outputs(self, numerical):
        for per_input in numerical:
            for t in per_input:
                if t.numel() and bool(torch.ne(t, 0).any()):
                    self.ctx.fail("Numerical gradient for function expected to be zero\ncheck: no differentiable "
                                  "outputs; the outputs do not require grad, yet they change along random "
                                  "input directions", check="no differentiable outputs",
                                  path=self.ctx.backward_path)
        return True


# ----------------------------------------------------------------------------------- helpers
def vjp_jvp_pairs(v: torch.Tensor, ju: torch.Tensor, g: torch.Tensor, u: torch.Tensor, nondet_tol: float):
    """The VJP stage's comparison of one block: (Jᵀv)·u against vᵀ(Ju) for every pair.

    v: (k', m) cotangents, ju: (k, m) J·U, g: (k', n) JᵀV, u: (k, n) directions. Returns
    (lhs = vᵀ(Ju), rhs = (Jᵀv)ᵀu, |lhs - rhs|, allowed, bad), each (k', k), at the rounding bound
    of the module doc.
    """
    lhs = v @ ju.t()
    rhs = g @ u.t()
    eps = torch.finfo(lhs.dtype).eps
    rho = 1024 * eps * math.sqrt(g.shape[1] + v.shape[1])
    allowed = rho * (v.abs() @ ju.abs().t() + g.abs() @ u.abs().t()) + nondet_tol * g.shape[1] + 1e-300
    err = (lhs - rhs).abs()
    return lhs, rhs, err, allowed, ~(err <= allowed)


def _rademacher(shape, like: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    signs = torch.randint(0, 2, shape, generator=g, device="cpu").mul_(2).sub_(1)
    return signs.to(dtype=like.dtype, device=like.device)


def _vjp_batch(ev, outputs, wrt, cotangents, *, probe=True, batched=None):
    """Per tensor in wrt, the (b, *shape) VJPs for b stacked cotangents (None where unused).

    Batched through is_grads_batched when the evaluator allows (probed against a plain VJP), else
    one VJP per cotangent. `batched` forces the path.
    """
    b = cotangents[0].shape[0]

    def plain(r):
        ev.stats.vjp_calls += 1
        return torch.autograd.grad(outputs, wrt, [c[r] for c in cotangents], retain_graph=True, allow_unused=True)

    use_batch = ev.batch_vjp if batched is None else batched
    if use_batch and b >= 2:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                grads = torch.autograd.grad(outputs, wrt, cotangents, retain_graph=True, allow_unused=True,
                                            is_grads_batched=True)
            ev.stats.batched_vjp_calls += 1
            for gr, w in zip(grads, wrt):
                if gr is not None and tuple(gr.shape[1:]) != tuple(w.shape):
                    raise _Disagreement("batched gradient has an unexpected shape")
            if probe:
                for gr, r in zip(grads, plain(0)):
                    if (gr is None) != (r is None) or (r is not None and (gr.dtype != r.dtype or not _close(gr[0], r))):
                        raise _Disagreement("batched VJP differs from the plain VJP")
            return list(grads)
        except Exception as e:
            if batched:
                raise
            ev._give_up("vjp", e)
    rows = [plain(r) for r in range(b)]
    result = []
    for k in range(len(wrt)):
        col = [row[k] for row in rows]
        if all(c is None for c in col):
            result.append(None)
            continue
        for c in col:
            if c is not None and c.shape != wrt[k].shape:
                raise AssertionError(
                    f"Expected out_jacobian column to have {wrt[k].numel()} elements, but got {c.numel()} "
                    f"(backward returned a gradient of shape {tuple(c.shape)} for an input of shape "
                    f"{tuple(wrt[k].shape)})")
        result.append(torch.stack([c if c is not None else torch.zeros_like(wrt[k]) for c in col]))
    return result
