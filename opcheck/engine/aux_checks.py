"""The checks beside the Jacobian comparison: batched gradients, zero and undefined grad_outputs.

They follow torch.autograd.gradcheck 2.13 step by step (including its use of the legacy vmap, whose
coverage differs from torch.func.vmap's), except that their random probes come from a private
generator, which leaves the user's RNG state alone (gradgradcheck's random grad_outputs, in api.py,
come from the global one as torch's do: they choose the function that is checked).
"""

from __future__ import annotations

import warnings

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine._util import (SPARSE_LAYOUTS, as_tuple, differentiable_outputs, exception_line, is_float_or_complex,
                                  make_duals, requires_grad)
from opcheck.engine.core import CheckContext, make_vectors
from opcheck.engine.errors import FAILED_BATCHED_FWD_GRAD_NOTE, FAILED_BATCHED_GRAD_NOTE

try:
    from torch._vmap_internals import _vmap as _legacy_vmap, vmap as _legacy_vmap_warn
except ImportError:  # pragma: no cover - depends on the torch release
    _legacy_vmap = _legacy_vmap_warn = torch.func.vmap

_SEED = 20240527


def _randn_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=g, dtype=t.dtype, device="cpu").to(t.device)


def _batched_mismatch(ctx, check, path, note, output_idx, input_idx, res, exp, *, torch_output_idx=None):
    """torch's first line ("For output i and input j:"), then where the vmapped result differs.

    torch's forward-mode check names the output for both (`torch_output_idx`); the next line says which."""
    diff = (res - exp).abs()
    where = torch.nonzero(~torch.isclose(res, exp)).tolist()[:5]
    named = output_idx if torch_output_idx is None else torch_output_idx
    ctx.fail(
        f"For output {named} and input {input_idx if torch_output_idx is None else named}:\n"
        f"check: {check} ({path}); for output {output_idx} and input {input_idx} the vmapped result differs "
        f"from the one-at-a-time result (max abs difference {float(diff.max()) if diff.numel() else 0.0:.4g}; "
        f"first differing [batch, *index] positions: {where})\n{note}",
        check=check, path=path,
    )


def test_batched_grad_forward_ad(ctx: CheckContext, func, inputs: tuple, expected_jvps=None) -> bool:
    """vmap (legacy) over forward AD against one JVP at a time, input by input.

    `expected_jvps(input_idx, tangents)`, when given, supplies the one-at-a-time JVPs (per output, a
    (len(tangents), *shape) tensor) instead of computing them with one call per tangent.
    """
    g = torch.Generator().manual_seed(_SEED)
    path = f"batched {ctx.forward_path}"
    for input_idx, current in enumerate(inputs):
        if not requires_grad(current):
            continue

        def jvp(tangent, input_idx=input_idx, current=current):
            with fwAD.dual_level():
                dual = fwAD.make_dual(current.detach(), tangent)
                args = tuple(dual if i == input_idx else (a.detach() if isinstance(a, torch.Tensor) else a)
                             for i, a in enumerate(inputs))
                ret = []
                for out in as_tuple(func(*args)):
                    if out is None:
                        continue
                    primal, tangent_out = fwAD.unpack_dual(out)
                    ret.append(tangent_out if tangent_out is not None else
                               torch.zeros([], dtype=primal.dtype, device=primal.device).expand(primal.shape))
                return tuple(ret)

        if not is_float_or_complex(current):
            continue
        tangents = [_randn_like(current, g) for _ in range(2)]
        if expected_jvps is not None:
            expected = expected_jvps(input_idx, tangents)
        else:
            expected = [torch.stack(shards) for shards in zip(*[jvp(t) for t in tangents])]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = _legacy_vmap(jvp)(torch.stack(tangents))
        except RuntimeError as ex:
            raise_batched_error(ctx, ex, "batched forward AD", path, FAILED_BATCHED_FWD_GRAD_NOTE)
        for out_idx, (res, exp) in enumerate(zip(result, expected)):
            if not torch.allclose(res, exp):
                _batched_mismatch(ctx, "batched forward AD", path, FAILED_BATCHED_FWD_GRAD_NOTE, out_idx,
                                  input_idx, res, exp, torch_output_idx=out_idx)
    return True


def raise_batched_error(ctx, ex, check, path, note):
    from opcheck.engine.errors import GradcheckError

    raise GradcheckError(f"While computing batched gradients, got: {ex}\n\ncheck: {check} ({path})\n{note}",
                         check=check, path=path) from ex


def test_batched_grad(ctx: CheckContext, inputs: tuple, output: torch.Tensor, output_idx: int) -> bool:
    g = torch.Generator().manual_seed(_SEED + output_idx)
    diff_inputs = [a for a in inputs if requires_grad(a)]
    path = f"batched {ctx.backward_path}"

    def vjp(v):
        grads = torch.autograd.grad(output, diff_inputs, v, retain_graph=True, allow_unused=True)
        return tuple(gr if gr is not None else torch.zeros([], dtype=inp.dtype, device=inp.device).expand(inp.shape)
                     for gr, inp in zip(grads, diff_inputs))

    grad_outputs = [_randn_like(output, g) for _ in range(2)]
    expected = [torch.stack(shards) for shards in zip(*[vjp(go) for go in grad_outputs])]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        warnings.filterwarnings("ignore", message="Please use `torch.vmap`")
        try:
            result = _legacy_vmap_warn(vjp)(torch.stack(grad_outputs))
        except RuntimeError as ex:
            raise_batched_error(ctx, ex, "batched backward", path, FAILED_BATCHED_GRAD_NOTE)
    for input_idx, (res, exp) in enumerate(zip(result, expected)):
        if not torch.allclose(res, exp):
            _batched_mismatch(ctx, "batched backward", path, FAILED_BATCHED_GRAD_NOTE, output_idx, input_idx,
                              res, exp)
    return True


def test_backward_mul_by_grad_output(ctx: CheckContext, outputs: tuple, inputs: tuple, masked) -> bool:
    diff_inputs = [a for a in inputs if requires_grad(a)]
    if not diff_inputs:
        ctx.fail("no Tensors requiring grad found in input", check="zero grad_output")
    grads = torch.autograd.grad(
        outputs, diff_inputs,
        [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format) for o in outputs],
        allow_unused=True,
    )
    for k, (gi, di) in enumerate(zip(grads, diff_inputs)):
        if gi is None:
            continue
        where = f"\ncheck: zero grad_output ({ctx.backward_path}); gradient of {ctx.input_name(k)}"
        if gi.layout != torch.strided:  # the layout first, as torch checks it, then the values densely
            if gi.layout != di.layout:
                ctx.fail(f"grad is incorrect layout ({gi.layout} is not {di.layout}){where}", check="zero grad_output")
            if gi.layout in SPARSE_LAYOUTS:
                kind = str(gi.layout).replace("torch.", "").replace("_coo", "")
                for what, got, want in (("sparse_dim", gi.sparse_dim(), di.sparse_dim()),
                                        ("dense_dim", gi.dense_dim(), di.dense_dim())):
                    if got != want:
                        ctx.fail(f"grad is {kind} tensor, but has incorrect {what} {got}, expected {want}{where}",
                                 check="zero grad_output")
            gi, di = gi.to_dense(), di.to_dense()
        if masked:
            if not torch.allclose(gi, torch.zeros_like(gi)):
                ctx.fail("backward not multiplied by grad_output" + where + _nonzero(gi), check="zero grad_output")
        elif not gi.eq(0).all():
            ctx.fail("backward not multiplied by grad_output" + where + _nonzero(gi), check="zero grad_output")
        if gi.dtype != di.dtype:
            ctx.fail(f"grad is incorrect type{where}: {gi.dtype}, expected {di.dtype}", check="zero grad_output")
        if gi.device != di.device:
            ctx.fail(f"grad is incorrect device{where}: {gi.device}, expected {di.device}", check="zero grad_output")
        if gi.size() != di.size():
            ctx.fail(f"grad is incorrect size{where}: {tuple(gi.shape)}, expected {tuple(di.shape)}",
                     check="zero grad_output")
    return True


def _nonzero(gi: torch.Tensor) -> str:
    nz = int((gi != 0).sum())
    return (f": with every grad_output zero, backward returned {nz} nonzero entries (max |.| "
            f"{float(gi.abs().max()):.4g}); the gradient must be linear in grad_output")


def test_undefined_forward_mode(ctx: CheckContext, func, outputs, inputs, zero_tangent_jvps=None) -> bool:
    """A zero tangent and an undefined one must give the same output tangents, input by input.

    `zero_tangent_jvps(k, all_u)`, when given, supplies the tangents of the float outputs (flat)
    for the directions all_u with the k-th differentiable input's zeroed, instead of a call.
    """
    diff = [(i, a) for i, a in enumerate(inputs) if requires_grad(a)]
    _, all_u = make_vectors([a for _, a in diff], outputs, use_forward_ad=True)
    with fwAD.dual_level():
        dual_inputs, tangents = make_duals(inputs)
        for fw_grad, u in zip(tangents.values(), all_u):
            fw_grad.copy_(u.view_as(fw_grad))
        for k, (idx, inp) in enumerate(diff):
            saved = dual_inputs[idx]
            if zero_tangent_jvps is None:
                dual_inputs[idx] = fwAD.make_dual(inp.detach(), torch.zeros_like(inp))
                res1s = [fwAD.unpack_dual(o)[1] for o in as_tuple(func(*dual_inputs)) if is_float_or_complex(o)]
            else:
                res1s = zero_tangent_jvps(k, all_u)
            dual_inputs[idx] = inp.detach()
            outs2 = [o for o in as_tuple(func(*dual_inputs)) if is_float_or_complex(o)]
            dual_inputs[idx] = saved
            for index_o, (res1, o2) in enumerate(zip(res1s, outs2)):
                res2 = fwAD.unpack_dual(o2)[1]
                if res1 is not None and res2 is not None:
                    res1 = res1.reshape(res2.shape)
                if res1 is not None and res2 is not None and not torch.allclose(res1, res2):
                    ctx.fail(
                        f"Mismatch in tangent values for output with index: {index_o} when input: "
                        f"{ctx.input_name(k)} has an undefined tangent value.\ncheck: undefined tangent "
                        f"({ctx.forward_path}); a zero tangent gives max |tangent| "
                        f"{float((res1 - res2).abs().max()):.4g} away from an undefined one",
                        check="undefined tangent", path=ctx.forward_path)
    return True


def test_undefined_backward_mode(ctx: CheckContext, func, outputs, inputs) -> bool:
    diff_inputs = [a for a in inputs if requires_grad(a)]
    if not diff_inputs:
        ctx.fail("no Tensors requiring grad found in input", check="undefined grad_output")
    note = ('Please look at "Notes about undefined output gradients" in "tools/autograd/derivatives.yaml"')

    def check(to_check, which):
        grads_output = [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format) for o in to_check]
        try:
            grads = torch.autograd.grad(to_check, diff_inputs, grads_output, allow_unused=True)
        except RuntimeError as e:
            _warn_bc()
            from opcheck.engine.errors import GradcheckError

            raise GradcheckError(
                "Expected backward function to handle undefined output grads. " + note +
                f"\ncheck: undefined grad_output ({ctx.backward_path}); with {which} undefined, backward "
                f"raised {exception_line(e)}\nA custom backward "
                "receives None for an undefined grad_output unless ctx.set_materialize_grads(True) (the "
                "default) applies: handle None, or keep materialization on.",
                check="undefined grad_output", path=ctx.backward_path) from e
        for gi in grads:
            if gi is not None and not gi.eq(0).all():
                _warn_bc()
                ctx.fail("Expected all input grads to be undefined or zero when all output grads are "
                         "undefined or zero. " + note + f"\ncheck: undefined grad_output "
                         f"({ctx.backward_path}); with {which} undefined, backward returned nonzero values",
                         check="undefined grad_output", path=ctx.backward_path)
        return True

    all_undef = [torch._C._functions.UndefinedGrad()(o) for o in differentiable_outputs(func(*inputs))
                 if isinstance(o, torch.Tensor)]
    to_check = [(all_undef, "every grad_output")]
    if len(all_undef) > 1:
        for k in range(len(outputs)):
            outs = differentiable_outputs(func(*inputs))
            to_check.append(([torch._C._functions.UndefinedGrad()(o) if i == k else o for i, o in enumerate(outs)],
                             f"grad_output {k}"))
    return all(check(outs, which) for outs, which in to_check)


def _warn_bc():
    warnings.warn(
        "Backwards compatibility: New undefined gradient support checking feature is enabled by default, "
        "but it may break existing callers of this function. If this is true for you, you can call this "
        'function with "check_undefined_grad=False" to disable the feature',
        stacklevel=3,
    )
