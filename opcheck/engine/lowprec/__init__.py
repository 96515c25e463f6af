"""The low-precision check: an op at float32/float16/bfloat16/complex64 against a float64 reference.

For kernels that run only in low precision, this is the check that decides. The op runs at the low
dtype; the reference (by default the op itself) runs on the float64/complex128 copies of the very
same inputs (every low-precision value is exact in double). Compared, each as its own part:

- every floating output;
- the VJP: the gradient of every input that requires grad, for one random cotangent;
- the JVP (with ``check_forward_ad``): the tangent of every output, for one random tangent.

The calibrated criterion ("baseline", the default) judges each entry of a part by what the same
math achieves at that dtype. With R the float64 result, L the op's, u the dtype's unit roundoff:

    |L - R| <= factor * B + ulp(R) + floor * u * max|R|,   B = max(B_emulated, B_cond, B_round, B_plain)

- B_emulated: the error of the reference run with every step rounded (RoundedTo): once to the
  dtype (plain PyTorch at the dtype, autograd's saved tensors included, each kernel rounding
  exactly once) and once to float32 (what a kernel that computes in float32 achieves);
- B_cond: how far the entry moves when every input (and the cotangent, the tangent) is perturbed by
  a relative u, the most over ``perturbations`` draws: the error a backward-stable computation at
  the dtype may make, which covers accumulation and conditioning;
- B_round: |R rounded to the dtype - R|, what no kernel can beat;
- B_plain (float32 and complex64 only, with a reference other than the op): the reference itself
  run at the dtype, FlashAttention's rule, for where kernels have no wider type to compute in;
- ulp(R): one unit in the last place of R at the dtype (a kernel may round the other way);
- floor * u * max|R|: ``floor`` roundings of the part's largest entry (LOWPREC_FLOORS: 0.5 for
  float16 and bfloat16, whose kernels compute in float32 and round once; 256 for float32 and
  complex64, where a correct kernel's cancellation, p - 1 as p -> 1, x - mean at a large mean,
  costs up to 151 in tests/lowprec).

What it guarantees: an entry fails when its error is more than twice the largest of these
baselines and beyond the floor; the baselines are entrywise, so a relative loss on an entry far
smaller than its tensor's largest shows (at float16 and bfloat16 down to half a rounding of the
largest entry), unlike a tolerance scaled by the tensor's largest entry. What it can miss: an error
below the floor (at float32, 256 roundings of the largest entry); an error the one cotangent or
tangent drawn does not excite; a loss that plain PyTorch at the dtype shares, by the reference's
own steps (a reference written as the naive composite rounds where the naive kernel does); an
accumulation no worse than input rounding (a float32 sum in any order).

The "table" criterion is the former fixed per-dtype tolerance: |L - R| <= atol * max(1, max|R|) +
rtol * |R|.

Kernels may write into their inputs through raw pointers, past autograd's version counter: after
the first call of the op (and of the reference) and after the VJP, every input is compared by
value with its copy from before; a change fails the check with the input named. With
``clone_inputs=True`` every call gets fresh copies instead.

Every backward and forward-AD call (the op's, the reference's, each baseline's) gets its own copy
of the cotangent and the tangent, so a kernel that writes into the gradient autograd hands it (a
rope backward rotating its grad_output in place) is judged on its values. The op's copies are
compared with the originals after its calls: a change fails the check, naming what was written
into ("the grad_output of output 0", "the tangent of input 1"), since autograd may hand that
tensor to other consumers; with ``writes_grad_outputs=True`` it is a finding of a passing check.

The reference's own precision is measured (opcheck.engine.lowprec.reference): a reference that
computes in float32 inside fails the check at float32 and complex64, where it would lower the bar
to nothing, and is a finding at float16 and bfloat16.
"""

from __future__ import annotations

from opcheck.engine.lowprec.check import judge, lowprec_check, lowprec_report
from opcheck.engine.lowprec.criterion import (
    BASELINE,
    CRITERIA,
    DEFAULT_FACTOR,
    DEFAULT_PERTURBATIONS,
    JVP,
    LOWPREC_FLOORS,
    OUTPUT,
    PARTS,
    TABLE,
    TABLE_TOLERANCES,
    VJP,
    Criterion,
    LowPrecisionError,
    LowPrecisionReport,
    PartResult,
    WorstEntry,
)
from opcheck.engine.lowprec.numbers import HIGH, NARROWER, RoundedTo, narrower_dtype_hint, upcast

__all__ = [
    "BASELINE",
    "CRITERIA",
    "DEFAULT_FACTOR",
    "DEFAULT_PERTURBATIONS",
    "HIGH",
    "JVP",
    "LOWPREC_FLOORS",
    "NARROWER",
    "OUTPUT",
    "PARTS",
    "TABLE",
    "TABLE_TOLERANCES",
    "VJP",
    "Criterion",
    "LowPrecisionError",
    "LowPrecisionReport",
    "PartResult",
    "RoundedTo",
    "WorstEntry",
    "judge",
    "lowprec_check",
    "lowprec_report",
    "narrower_dtype_hint",
    "upcast",
]
