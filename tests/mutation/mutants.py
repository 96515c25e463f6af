"""Catalog ops with deliberate gradient bugs, each next to its correct twin.

Written the ways PyTorch users write custom gradients: `torch.autograd.Function` with
forward / setup_context / backward (and jvp), some in the old style `forward(ctx, ...)`. The specs
in tests/mutation/specs point at `mutants:<Name>.apply`; test_mutation.py proves that the
generated tests fail on every mutant, with a message that points at the bug, and pass every twin.

A mutant's bug is marked `# BUG:`; its twin carries the line that is right instead.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


# ------------------------------------------------------------------------ sin: missing factor
class Sin(torch.autograd.Function):
    """sin(x): backward g·cos(x), jvp t·cos(x)."""

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * torch.cos(x)


class SinHalfGrad(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x) * 0.5  # BUG: a stray factor (d/dx sin(x/2) mixed up with sin)


# ------------------------------------------------------------------------ cos: sign flip
class Cos(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.cos(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return -grad * torch.sin(x)


class CosSignFlip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.cos(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sin(x)  # BUG: d/dx cos = -sin


# ------------------------------------------------------------------------ tanh: one wrong entry
class Tanh(torch.autograd.Function):
    """tanh(x) with backward g·(1 - y²); vmappable, so the full Jacobian is computed in batches."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class TanhOneWrongEntry(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        grad_x = grad * (1 - y * y)
        # BUG: a leftover "special case" for element [0, 3] (a tiling edge in the original kernel).
        grad_x[0, 3] = grad_x[0, 3] * 2
        return grad_x


# ------------------------------------------------------------------------ complex exp: missing conj
class ComplexExp(torch.autograd.Function):
    """exp(z) for complex z: PyTorch's convention is grad_z = grad · conj(dexp/dz)."""

    @staticmethod
    def forward(ctx, z):
        y = torch.exp(z)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y.conj()


class ComplexExpNoConj(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        y = torch.exp(z)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y  # BUG: grad * conj(y)


# ------------------------------------------------------------------------ exp: wrong jvp only
class Exp(torch.autograd.Function):
    """exp(x), with backward g·y and jvp t·y, both from the saved output."""

    @staticmethod
    def forward(x):
        return torch.exp(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(inputs[0], output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y

    @staticmethod
    def jvp(ctx, tangent):
        x, y = ctx.saved_tensors
        return tangent * y


class ExpWrongJvp(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.exp(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(inputs[0], output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y

    @staticmethod
    def jvp(ctx, tangent):
        x, y = ctx.saved_tensors
        return tangent * x  # BUG: the saved input where the saved output belongs


# ------------------------------------------------------------------------ sin: detached double backward
class SinNoGradBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.no_grad():  # BUG: "backward needs no graph": the second derivative is lost
            return grad * torch.cos(x)


class SinDetachedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x.detach())  # BUG: d/dx of the VJP is zero, should be -g·sin(x)


# ------------------------------------------------------------------------ mul: broadcast reduced on the wrong dim
class BroadcastMul(torch.autograd.Function):
    """a * b with a broadcast against b (e.g. (4, 1) * (4, 4))."""

    @staticmethod
    def forward(a, b):
        return a * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return (grad * b).sum_to_size(a.shape), (grad * a).sum_to_size(b.shape)


class BroadcastMulWrongDim(torch.autograd.Function):
    @staticmethod
    def forward(a, b):
        return a * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        # BUG: a is (4, 1), broadcast along dim 1; summing over dim 0 and transposing "fits" the shape.
        grad_a = (grad * b).sum(dim=0, keepdim=True).t()
        return grad_a, grad * a


# ------------------------------------------------------------------------ sin: wrong only in float32
class SinWrongInFloat32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad_x = grad * torch.cos(x)
        if grad_x.dtype == torch.float32:
            grad_x = grad_x * 1.01  # BUG: a float32 fast path with a mistuned constant
        return grad_x


class SinOldStyle(torch.autograd.Function):
    """Sin in the old style (forward(ctx, x)): the twin of SinWrongInFloat32."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)


# ------------------------------------------------------------------------ sin: nondeterministic backward
class SinNondetBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        # BUG: as if accumulated with atomics in a different order on every call: far below the
        # gradient tolerances, but two runs with the same grad_output differ.
        return grad * torch.cos(x) + 1e-10 * torch.randn_like(x)


# ------------------------------------------------------------------------ exp: backward ignores grad_output
class ExpOldStyle(torch.autograd.Function):
    """exp(x) in the old style, with a differentiable backward (so it has a second derivative)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class ExpIgnoresGradOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y  # BUG: grad * y (right only when grad_output is all ones, as in y.sum().backward())


# ------------------------------------------------------------------------ tanh: forward AD declared unsupported
class TanhNoJvp(torch.autograd.Function):
    """tanh without a jvp: forward AD raises, as a spec with `supports_forward_ad: false` declares."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class TanhWithJvp(torch.autograd.Function):
    """tanh with a working jvp; the mutant is its spec, which declares `supports_forward_ad: false`."""

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)

    @staticmethod
    def jvp(ctx, tangent):
        (y,) = ctx.saved_tensors
        return tangent * (1 - y * y)


# ------------------------------------------------------------------------ exp: second derivative declared unsupported
# The mutant is a spec, not code: ExpOldStyle declared `supports_gradgrad: false` although its
# backward is differentiable. The twin really is once differentiable.
class ExpOnceDifferentiable(torch.autograd.Function):
    """exp whose backward is @once_differentiable: the second derivative raises, as declared."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


# ------------------------------------------------------------------------ sin: wrong jvp inside the backward
class _CosForBackward(torch.autograd.Function):
    """cos(x), used by SinViaCos's backward; its jvp matters only to forward-over-reverse."""

    @staticmethod
    def forward(x):
        return torch.cos(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return -grad * torch.sin(x)

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return -tangent * torch.sin(x)


class _CosForBackwardWrongJvp(_CosForBackward):
    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * torch.sin(x)  # BUG: d/dx cos = -sin, right in backward, wrong here


class SinViaCos(torch.autograd.Function):
    """sin whose backward calls a cos Function (as kernels reuse each other's autograd wrappers)."""

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * _CosForBackward.apply(x)

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * torch.cos(x)


class SinViaCosWrongJvp(SinViaCos):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * _CosForBackwardWrongJvp.apply(x)  # BUG: inherited from the helper's jvp


# ------------------------------------------------------------------------ sin: backward that vmap cannot batch
class SinVmappable(torch.autograd.Function):
    """sin with a backward built from out-of-place ops, which vmap can batch."""

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad_x = torch.zeros_like(x)
        return grad_x + grad * torch.cos(x)


class SinInplaceBackward(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad_x = torch.zeros_like(x)
        grad_x.copy_(grad * torch.cos(x))  # BUG: an in-place write of a batched grad into an unbatched buffer
        return grad_x


# ------------------------------------------------------------------------ sincos: undefined grad_output
class SinCos(torch.autograd.Function):
    """(sin x, cos x); with materialized grads off, backward must handle a None grad_output."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return torch.sin(x), torch.cos(x)

    @staticmethod
    def backward(ctx, grad_sin, grad_cos):
        (x,) = ctx.saved_tensors
        grad_x = torch.zeros_like(x)
        if grad_sin is not None:
            grad_x = grad_x + grad_sin * torch.cos(x)
        if grad_cos is not None:
            grad_x = grad_x - grad_cos * torch.sin(x)
        return grad_x


class SinCosAssumesGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return torch.sin(x), torch.cos(x)

    @staticmethod
    def backward(ctx, grad_sin, grad_cos):
        (x,) = ctx.saved_tensors
        return grad_sin * torch.cos(x) - grad_cos * torch.sin(x)  # BUG: either grad may be None


# ------------------------------------------------------------------------ sin: wrong tail, beyond the budget
class SinBatched(torch.autograd.Function):
    """sin(x) with a jvp and a vmap rule, so the auto check's projections run batched."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return tangent * torch.cos(x)


class SinWrongTail(SinBatched):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        # BUG: the remainder loop after the vectorized tiles (the last 7 elements) uses a mistuned
        # constant: their gradient is 10% too large. The jvp, a separate kernel, is right.
        scale = torch.ones(x.shape, dtype=x.dtype, device=x.device)
        scale.view(-1)[-7:] = 1.1
        return grad * torch.cos(x) * scale


# ------------------------------------------------------------------------ sparse @ dense: one specified value
class SparseMm(torch.autograd.Function):
    """sparse COO `a` @ dense `b`, with torch.sparse.mm's masked gradient: d a is specified where `a`
    is, one value per specified element (a row of grad times a row of b), and d b = aᵀ grad."""

    @staticmethod
    def forward(a, b):
        return torch.sparse.mm(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)  # an undefined grad_output stays None, as for torch's own op

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        a, b = ctx.saved_tensors
        return SparseMm.grad_a(a, b, grad), torch.sparse.mm(a.t(), grad)

    @staticmethod
    def grad_a(a, b, grad):
        rows, cols = a._indices()
        values = (grad[rows] * b[cols]).sum(-1)
        return torch.sparse_coo_tensor(a._indices(), values, a.shape, is_coalesced=True)


class SparseMmWrongValue(SparseMm):
    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        a, b = ctx.saved_tensors
        rows, cols = a._indices()
        values = (grad[rows] * b[cols]).sum(-1)
        # BUG: the kernel's loop over the specified elements stops one short (range(nnz - 1)):
        # the last specified value of `a` gets no gradient.
        values = torch.cat([values[:-1], torch.zeros_like(values[-1:])])
        return torch.sparse_coo_tensor(a._indices(), values, a.shape, is_coalesced=True), torch.sparse.mm(a.t(), grad)
