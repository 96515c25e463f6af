"""Catalog ops with deliberate gradient bugs, each next to its correct twin.

Written the ways PyTorch users write custom gradients: `torch.autograd.Function` with
forward / setup_context / backward (and jvp), some in the old style `forward(ctx, ...)`, built
from the parts in tests/broken_ops.py. The specs in tests/mutation/specs point at
`mutants:<Name>.apply`; test_mutation.py proves that the generated tests fail on every mutant,
with a message that points at the bug, and pass every twin.

A mutant's bug is marked `# BUG:`; its twin is the same op without it.
"""

from __future__ import annotations

import torch

from tests.broken_ops import (
    COS,
    EXP,
    SIN,
    TANH,
    Elementwise,
    assumes_defined,
    broadcast_mul,
    conj_missing,
    detached,
    handles_undefined,
    ignores_grad_output,
    in_dtype,
    plus_noise,
    scaled,
    sin_cos,
    sin_via,
    sparse_mm,
    summed_over_dim0_transposed,
    tail,
    without_grad,
    written_into_zeros,
)

# ------------------------------------------------------------------------ sin: missing factor
# sin(x): backward g·cos(x), jvp t·cos(x).
Sin = SIN.function("Sin", jvp=True)
# BUG: a stray factor (d/dx sin(x/2) mixed up with sin)
SinHalfGrad = SIN.function("SinHalfGrad", bug=scaled(0.5))

# ------------------------------------------------------------------------ cos: sign flip
Cos = COS.function("Cos", old_style=True)
CosSignFlip = COS.function("CosSignFlip", old_style=True, bug=scaled(-1))  # BUG: d/dx cos = -sin

# ------------------------------------------------------------------------ tanh: one wrong entry
# tanh(x) with backward g·(1 - y²); vmappable, so the full Jacobian is computed in batches.
Tanh = TANH.function("Tanh", vmap=True)
# BUG: a leftover "special case" for element [0, 3] (a tiling edge in the original kernel).
TanhOneWrongEntry = TANH.function("TanhOneWrongEntry", vmap=True, bug=scaled(2, at=(0, 3)))

# ------------------------------------------------------------------------ complex exp: missing conj
# exp(z) for complex z: PyTorch's convention is grad_z = grad · conj(dexp/dz).
COMPLEX_EXP = Elementwise(torch.exp, lambda y: y.conj(), of="output")
ComplexExp = COMPLEX_EXP.function("ComplexExp", old_style=True)
ComplexExpNoConj = COMPLEX_EXP.function("ComplexExpNoConj", old_style=True, bug=conj_missing())  # BUG: grad * y

# ------------------------------------------------------------------------ exp: wrong jvp only
# exp(x), with backward g·y and jvp t·y, both from the saved output.
Exp = EXP.function("Exp", jvp=True)
ExpWrongJvp = EXP.function("ExpWrongJvp", jvp=True, jvp_of="input")  # BUG: the saved input where the output belongs

# ------------------------------------------------------------------------ sin: detached double backward
# BUG: "backward needs no graph": the second derivative is lost
SinNoGradBackward = SIN.function("SinNoGradBackward", old_style=True, bug=without_grad)
# BUG: d/dx of the VJP is zero, should be -g·sin(x)
SinDetachedBackward = SIN.function("SinDetachedBackward", old_style=True, bug=detached)

# ------------------------------------------------------------------------ mul: broadcast reduced on the wrong dim
# a * b with a broadcast against b (e.g. (4, 1) * (4, 4)).
BroadcastMul = broadcast_mul("BroadcastMul")
# BUG: a is (4, 1), broadcast along dim 1; summing over dim 0 and transposing "fits" the shape.
BroadcastMulWrongDim = broadcast_mul("BroadcastMulWrongDim", summed_over_dim0_transposed)

# ------------------------------------------------------------------------ sin: wrong only in float32
# BUG: a float32 fast path with a mistuned constant
SinWrongInFloat32 = SIN.function("SinWrongInFloat32", old_style=True, bug=scaled(1.01, when=in_dtype(torch.float32)))
# Sin in the old style (forward(ctx, x)): the twin of SinWrongInFloat32.
SinOldStyle = SIN.function("SinOldStyle", old_style=True)

# ------------------------------------------------------------------------ sin: nondeterministic backward
# BUG: as if accumulated with atomics in a different order on every call: far below the gradient
# tolerances, but two runs with the same grad_output differ.
SinNondetBackward = SIN.function(
    "SinNondetBackward", old_style=True, bug=plus_noise(lambda d: 1e-10 * torch.randn_like(d))
)

# ------------------------------------------------------------------------ exp: backward ignores grad_output
# exp(x) in the old style, with a differentiable backward (so it has a second derivative).
ExpOldStyle = EXP.function("ExpOldStyle", old_style=True)
# BUG: y instead of grad * y (right only when grad_output is all ones, as in y.sum().backward())
ExpIgnoresGradOutput = EXP.function("ExpIgnoresGradOutput", old_style=True, bug=ignores_grad_output)

# ------------------------------------------------------------------------ tanh: forward AD declared unsupported
# tanh without a jvp: forward AD raises, as a spec with `supports_forward_ad: false` declares.
TanhNoJvp = TANH.function("TanhNoJvp", old_style=True)
# tanh with a working jvp; the mutant is its spec, which declares `supports_forward_ad: false`.
TanhWithJvp = TANH.function("TanhWithJvp", jvp=True)

# ------------------------------------------------------------------------ exp: second derivative declared unsupported
# The mutant is a spec, not code: ExpOldStyle declared `supports_gradgrad: false` although its
# backward is differentiable. The twin really is once differentiable: its backward is
# @once_differentiable, so the second derivative raises, as declared.
ExpOnceDifferentiable = EXP.function("ExpOnceDifferentiable", old_style=True, once_differentiable=True)

# ------------------------------------------------------------------------ sin: wrong jvp inside the backward
# cos(x), used by SinViaCos's backward; its jvp matters only to forward-over-reverse.
_CosForBackward = COS.function("_CosForBackward", jvp=True)
# BUG: d/dx cos = -sin, right in backward, wrong here
_CosForBackwardWrongJvp = COS.function("_CosForBackwardWrongJvp", jvp=True, jvp_bug=scaled(-1))
# sin whose backward calls a cos Function (as kernels reuse each other's autograd wrappers).
SinViaCos = sin_via("SinViaCos", _CosForBackward)
SinViaCosWrongJvp = sin_via("SinViaCosWrongJvp", _CosForBackwardWrongJvp)  # BUG: inherited from the helper's jvp

# ------------------------------------------------------------------------ sin: backward that vmap cannot batch
# sin with a backward built from out-of-place ops, which vmap can batch.
SinVmappable = SIN.function("SinVmappable", bug=written_into_zeros("add"))
# BUG: an in-place write of a batched grad into an unbatched buffer
SinInplaceBackward = SIN.function("SinInplaceBackward", bug=written_into_zeros("copy_"))

# ------------------------------------------------------------------------ sincos: undefined grad_output
# (sin x, cos x); with materialized grads off, backward must handle a None grad_output.
SinCos = sin_cos("SinCos", handles_undefined, old_style=True)
SinCosAssumesGrads = sin_cos("SinCosAssumesGrads", assumes_defined, old_style=True)  # BUG: either grad may be None

# ------------------------------------------------------------------------ sin: wrong tail, beyond the budget
# sin(x) with a jvp and a vmap rule, so the auto check's projections run batched.
SinBatched = SIN.function("SinBatched", jvp=True, vmap=True)
# BUG: the remainder loop after the vectorized tiles (the last 7 elements) uses a mistuned
# constant: their gradient is 10% too large. The jvp, a separate kernel, is right.
SinWrongTail = SIN.function("SinWrongTail", jvp=True, vmap=True, bug=scaled(1.1, at=tail(7)))


# ------------------------------------------------------------------------ sparse @ dense: one specified value
def _last_value_dropped(values):
    # BUG: the kernel's loop over the specified elements stops one short (range(nnz - 1)):
    # the last specified value of `a` gets no gradient.
    return torch.cat([values[:-1], torch.zeros_like(values[-1:])])


SparseMm = sparse_mm("SparseMm")
SparseMmWrongValue = sparse_mm("SparseMmWrongValue", _last_value_dropped)
