"""fast_mode="auto": the full check while the Jacobian is small, entrywise projections beyond.

What it does
------------
Let the Jacobian's size be the sum over (differentiable input j, float output i) of
numel_in_j * numel_out_i = n·m, n the differentiable input elements and m the float output
elements. While n + m <= route.FULL_CHECK_ELEMENTS (128, so n·m <= 4096), and for a call that
checks forward AD alone n <= route.FORWARD_FULL_COLUMNS (32) as well (route.Sizes.full_first),
`auto` runs the full check (modes.full.full_check, fused into few calls by fused.py), so its
verdicts there are the full mode's.
Beyond it runs the projection check below, which never holds an n×m block; its checks cost a
handful of calls whatever the size (fused_projected.py), where the full check's cost grows with
(n + m)²: a scalar loss of a 64×64 input costs it 8,193 evaluations. Up to `jacobian_budget`
entries (default 2**20) a call that the projections do not pass is decided by the full check:
there `auto` fails exactly where the full check fails, and passes where the full check passes or
the projections do. Where the failing block holds an entry that the full check fails too, found by
bisection (pinpoint.py: a few calls per halving of the input), `auto` fails with those entries
without running it, so a failure costs about what a pass does (at most twice its op calls on a
LayerNorm kernel whose gradient is wrong in one row block, where the full check took 26 times);
only an error that no single entry shows (spread thinly over many entries, each within tolerance)
is left to the full check, which then passes it. Beyond the budget the projection check's own
verdict stands (this module, step by step, says what is wrong). A function that cannot be vmapped runs this module's
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
imaginary parts (parts.py), and the forward check splits complex inputs likewise. Beyond the
budget the stages run on the function seen through torch.view_as_real: every complex
differentiable input becomes a real (..., 2) leaf (view_as_complex'd before the call, so the
user's function and its backward see the complex tensor) and every complex output a real
(..., 2) view. Its Jacobian holds the same entries as the full check's, split into real and
imaginary parts, so a backward that drops a .conj() shows as a wrong sign of the imaginary
column; directions are real Rademacher on the view, and memory stays O((n + m) k). The entries
are compared part by part, where the full check compares complex entries by modulus.
"""

from __future__ import annotations

from opcheck.engine._util import diff_input_indices, exception_line, jacobian_sides
from opcheck.engine.comparison.compare import BACKWARD, Part
from opcheck.engine.context import Call, CheckContext
from opcheck.engine.errors import GradcheckError
from opcheck.engine.modes.full import full_check
from opcheck.engine.route import stepwise_full_first

__all__ = ["auto_check"]


# ------------------------------------------------------------------------------- entry point
def auto_check(ctx: CheckContext, call: Call, part: Part = BACKWARD) -> bool:
    """Step by step, once the fused passes have not passed the call: the full check within
    the Jacobian budget (unless the projections found entries it fails), the projection check
    beyond (see the module doc)."""
    n, m = jacobian_sides(call.inputs, call.func_out)
    stats = ctx.evaluator.stats

    def full() -> bool:
        stats.auto_paths.append("full")
        return full_check(ctx, call, part)

    sizes = ctx.sizes(n, m, len(diff_input_indices(call.inputs)))
    if stepwise_full_first(sizes, ctx.stepwise):
        return full()
    if sizes.within_budget:  # projections first; the full check decides what they do not pass
        mark = len(stats.auto_paths)
        try:
            return _projected(ctx, call, part, full_decides=True)
        except GradcheckError as e:
            if _pinned(e):
                raise  # entries the full check compares are out of tolerance: it fails too
            del stats.auto_paths[mark:]
            stats.fallbacks.append(f"auto projections: {exception_line(e)}; the full check decides")
            return full()
        except Exception as e:  # what the full check will raise in its own words
            del stats.auto_paths[mark:]
            stats.fallbacks.append(f"auto projections: {exception_line(e)}; the full check decides")
            return full()
    return _projected(ctx, call, part)


def _projected(ctx: CheckContext, call: Call, part: Part, full_decides: bool = False) -> bool:
    """The step-by-step projection check (projection_check.py): its modules load with its first
    use, which a call the full check decides never makes."""
    from opcheck.engine.auto.projection_check import projection_check

    return projection_check(ctx, call, part, full_decides)


def _pinned(e: GradcheckError) -> bool:
    """Whether the projections' failure names entries out of tolerance (pinpoint.py), which the
    full check compares too: it fails as well."""
    from opcheck.engine.auto.projections import ProjectionMismatch  # loaded with the projections

    return isinstance(e.mismatch, ProjectionMismatch) and bool(e.mismatch.pinned)
