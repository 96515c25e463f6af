"""The checks beside the Jacobian comparison: batched gradients, zero and undefined grad_outputs.

They follow torch.autograd.gradcheck 2.13 step by step (including its use of the legacy vmap, whose
coverage differs from torch.func.vmap's), except that their random probes come from a private
generator, which leaves the user's RNG state alone (gradgradcheck's random grad_outputs, in api.py,
come from the global one as torch's do: they choose the function that is checked).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch
import torch.autograd.forward_ad as fwAD

from opcheck._records import record
from opcheck.engine._util import (
    SPARSE_LAYOUTS,
    Func,
    Inputs,
    as_tuple,
    autograd_grad,
    detached,
    differentiable_outputs,
    exception_line,
    is_float_or_complex,
    legacy_vmap,
    legacy_vmap_warning,
    make_dual,
    make_duals,
    requires_grad,
    unpack_dual,
    zeros_like_shape,
)
from opcheck.engine.context import CheckContext
from opcheck.engine.errors import GradcheckError, failed_batched_fwd_grad_note, failed_batched_grad_note
from opcheck.engine.reporting import torch_words
from opcheck.failure_facts import FailureFacts

SEED = 20240527
"""Seeds the random tangents and grad_outputs of the batched checks (output i's: SEED + i)."""

ExpectedJvps = Callable[[int, list[torch.Tensor]], list[torch.Tensor]]
"""expected(input_idx, tangents): per output, the (len(tangents), *shape) one-at-a-time JVPs."""
ZeroTangentJvps = Callable[[int, list[Any]], list[Any]]
"""jvps(k, all_u): per float output, its flat tangent for the directions all_u with the k-th
differentiable input's zeroed."""


def randn_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Standard normal values of t's shape, dtype and device, drawn on the CPU from g."""
    return torch.randn(t.shape, generator=g, dtype=t.dtype, device="cpu").to(t.device)


_FIRST_COTANGENTS: dict[tuple[Any, ...], torch.Tensor] = {}
_FIRST_COTANGENT_CACHE = 256
"""How many first cotangents first_cotangent keeps (of at most _FIRST_COTANGENT_ELEMENTS each)."""
_FIRST_COTANGENT_ELEMENTS = 4096


def first_cotangent(output: torch.Tensor, i: int) -> torch.Tensor:
    """The batched-gradient check's first random grad_output for output i (randn_like from a
    generator seeded SEED + i), the same tensor for every call on outputs of one shape, dtype and
    device: a new generator and a draw cost a small check as much as a kernel call. Callers read it
    and never write into it (backward gets a copy)."""
    key = (tuple(output.shape), output.dtype, output.device, i)
    found = _FIRST_COTANGENTS.get(key)
    if found is None:
        found = randn_like(output, torch.Generator().manual_seed(SEED + i))
        if output.numel() <= _FIRST_COTANGENT_ELEMENTS:
            if len(_FIRST_COTANGENTS) >= _FIRST_COTANGENT_CACHE:
                _FIRST_COTANGENTS.clear()
            _FIRST_COTANGENTS[key] = found
    return found


@record
class _BatchedCheck:
    """One of the two batched-gradient checks, as its failures name it."""

    check: str  # "batched forward AD" or "batched backward"
    path: str
    forward: bool

    @property
    def note(self) -> str:
        return failed_batched_fwd_grad_note() if self.forward else failed_batched_grad_note()

    def fail_to_batch(self, ex: RuntimeError) -> NoReturn:
        raise GradcheckError(
            f"{torch_words.batched_failure(ex, self.forward)}\n\ncheck: {self.check} ({self.path})\n{self.note}",
            check=self.check,
            path=self.path,
        ) from ex

    def mismatch(
        self,
        ctx: CheckContext,
        output_idx: int,
        input_idx: int,
        res: torch.Tensor,
        exp: torch.Tensor,
        torch_output_idx: int | None = None,
    ) -> NoReturn:
        """torch's first line ("For output i and input j:"), then where the vmapped result differs.

        torch's forward-mode check names the output for both (`torch_output_idx`); the next line says which."""
        diff = (res - exp).abs()
        where = torch.nonzero(~torch.isclose(res, exp)).tolist()[:5]
        named = output_idx if torch_output_idx is None else torch_output_idx
        first = torch_words.batched_mismatch(
            named, input_idx if torch_output_idx is None else named, is_forward_ad=self.forward
        )
        ctx.fail(
            f"{first}\n"
            f"check: {self.check} ({self.path}); for output {output_idx} and input {input_idx} the vmapped "
            f"result differs from the one-at-a-time result (max abs difference "
            f"{float(diff.max()) if diff.numel() else 0.0:.4g}; first differing [batch, *index] positions: "
            f"{where})\n{self.note}",
            check=self.check,
            path=self.path,
            facts=FailureFacts(inputs=(input_idx,)),
        )


def _jvp_of_input(func: Func, inputs: Inputs, input_idx: int) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The tangents of func's outputs for a tangent of input input_idx alone (torch's batched forward-AD check)."""
    current = inputs[input_idx]

    def jvp(tangent: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with fwAD.dual_level():
            dual = make_dual(current.detach(), tangent)
            args = tuple(dual if i == input_idx else a for i, a in enumerate(detached(inputs)))
            ret = []
            for out in as_tuple(func(*args)):
                if out is None:
                    continue
                primal, tangent_out = unpack_dual(out)
                ret.append(tangent_out if tangent_out is not None else zeros_like_shape(primal))
            return tuple(ret)

    return jvp


def check_batched_grad_forward_ad(
    ctx: CheckContext, func: Func, inputs: Inputs, expected_jvps: ExpectedJvps | None = None
) -> bool:
    """vmap (legacy) over forward AD against one JVP at a time, input by input.

    `expected_jvps(input_idx, tangents)`, when given, supplies the one-at-a-time JVPs (per output, a
    (len(tangents), *shape) tensor) instead of computing them with one call per tangent.
    """
    g = torch.Generator().manual_seed(SEED)
    batched = _BatchedCheck("batched forward AD", f"batched {ctx.forward_path}", forward=True)
    vmap = legacy_vmap if legacy_vmap is not None else torch.func.vmap
    for input_idx, current in enumerate(inputs):
        if not requires_grad(current) or not is_float_or_complex(current):
            continue
        jvp = _jvp_of_input(func, inputs, input_idx)
        tangents = [randn_like(current, g) for _ in range(2)]
        # As in check_batched_grad: torch reuses these tangents after the JVPs (a forward-AD rule
        # that writes into its tangent fails its check); "auto" gives each JVP its own copy.
        given = [t.clone() for t in tangents] if ctx.flags.auto else tangents
        if expected_jvps is not None:
            expected = expected_jvps(input_idx, given)
        else:
            expected = [torch.stack(shards) for shards in zip(*[jvp(t) for t in given])]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = vmap(jvp)(torch.stack(tangents))
        except RuntimeError as ex:
            batched.fail_to_batch(ex)
        for out_idx, (res, exp) in enumerate(zip(result, expected)):
            if not torch.allclose(res, exp):
                batched.mismatch(ctx, out_idx, input_idx, res, exp, torch_output_idx=out_idx)
    return True


def check_batched_grad(ctx: CheckContext, inputs: Inputs, output: torch.Tensor, output_idx: int) -> bool:
    """vmap (legacy) over backward against one VJP at a time, for two random grad_outputs."""
    g = torch.Generator().manual_seed(SEED + output_idx)
    diff_inputs = [a for a in inputs if requires_grad(a)]
    batched = _BatchedCheck("batched backward", f"batched {ctx.backward_path}", forward=False)

    def vjp(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        grads = autograd_grad((output,), diff_inputs, (v,), retain_graph=True)
        return tuple(gr if gr is not None else zeros_like_shape(inp) for gr, inp in zip(grads, diff_inputs))

    grad_outputs = [randn_like(output, g) for _ in range(2)]
    # torch hands these very tensors to backward and stacks them after, so a backward that writes
    # into its grad_output fails torch's check; fast_mode=True/False keep that verdict, while
    # "auto" (opcheck's own) gives each backward its own copy.
    given = [go.clone() for go in grad_outputs] if ctx.flags.auto else grad_outputs
    expected = [torch.stack(shards) for shards in zip(*[vjp(go) for go in given])]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        warnings.filterwarnings("ignore", message="Please use `torch.vmap`")
        try:
            result = legacy_vmap_warning(vjp)(torch.stack(grad_outputs))
        except RuntimeError as ex:
            batched.fail_to_batch(ex)
    for input_idx, (res, exp) in enumerate(zip(result, expected)):
        if not torch.allclose(res, exp):
            batched.mismatch(ctx, output_idx, input_idx, res, exp)
    return True


def check_backward_mul_by_grad_output(
    ctx: CheckContext, outputs: Sequence[torch.Tensor], inputs: Inputs, masked: bool | None
) -> bool:
    """With every grad_output zero, backward must return zeros of its inputs' layout, dtype, device and size."""
    diff_inputs = [a for a in inputs if requires_grad(a)]
    if not diff_inputs:
        ctx.fail(torch_words.no_tensors_requiring_grad(), check="zero grad_output")
    grads = autograd_grad(
        outputs, diff_inputs, [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format) for o in outputs]
    )
    for k, (given, inp) in enumerate(zip(grads, diff_inputs)):
        if given is None:
            continue
        fail = functools.partial(_fail_zero_grad_output, ctx, k, given, inp, masked)
        gi, di = given, inp
        if gi.layout != torch.strided:  # the layout first, as torch checks it, then the values densely
            if gi.layout != di.layout:
                fail(f"grad is incorrect layout ({gi.layout} is not {di.layout})")
            if gi.layout in SPARSE_LAYOUTS:
                kind = str(gi.layout).replace("torch.", "").replace("_coo", "")
                for what, got, want in (
                    ("sparse_dim", gi.sparse_dim(), di.sparse_dim()),
                    ("dense_dim", gi.dense_dim(), di.dense_dim()),
                ):
                    if got != want:
                        fail(f"grad is {kind} tensor, but has incorrect {what} {got}, expected {want}")
            gi, di = gi.to_dense(), di.to_dense()
        if not torch.allclose(gi, torch.zeros_like(gi)) if masked else not gi.eq(0).all():
            fail("backward not multiplied by grad_output", _nonzero(gi))
        if gi.dtype != di.dtype:
            fail("grad is incorrect type", f": {gi.dtype}, expected {di.dtype}")
        if gi.device != di.device:
            fail("grad is incorrect device", f": {gi.device}, expected {di.device}")
        if gi.size() != di.size():
            fail("grad is incorrect size", f": {tuple(gi.shape)}, expected {tuple(di.shape)}")
    return True


def _fail_zero_grad_output(
    ctx: CheckContext,
    k: int,
    given: torch.Tensor,
    inp: torch.Tensor,
    masked: bool | None,
    fallback: str,
    detail: str = "",
) -> NoReturn:
    """The zero grad_output check failed for input k: torch's own check, asked about the gradient
    backward returned (`given`), words the first line."""
    first = torch_words.zero_grad_output(given, inp, masked) or fallback
    where = f"check: zero grad_output ({ctx.backward_path}); gradient of {ctx.input_name(k)}"
    ctx.fail(
        f"{first}\n{where}{detail}", check="zero grad_output", facts=FailureFacts(inputs=ctx.named_inputs(None, k))
    )


def _nonzero(gi: torch.Tensor) -> str:
    nz = int((gi != 0).sum())
    return (
        f": with every grad_output zero, backward returned {nz} nonzero entries (max |.| "
        f"{float(gi.abs().max()):.4g}); the gradient must be linear in grad_output"
    )


def check_undefined_forward_mode(
    ctx: CheckContext,
    func: Func,
    outputs: Sequence[torch.Tensor],
    inputs: Inputs,
    zero_tangent_jvps: ZeroTangentJvps | None = None,
) -> bool:
    """A zero tangent and an undefined one must give the same output tangents, input by input.

    `zero_tangent_jvps(k, all_u)`, when given, supplies the tangents of the float outputs (flat)
    for the directions all_u with the k-th differentiable input's zeroed, instead of a call.
    """
    from opcheck.engine.modes.fast import make_vectors, real_direction  # forward AD's: on first use

    diff = [(i, a) for i, a in enumerate(inputs) if requires_grad(a)]
    _, all_u = make_vectors([a for _, a in diff], outputs, use_forward_ad=True)
    with fwAD.dual_level():
        dual_inputs, tangents = make_duals(inputs)
        for fw_grad, u in zip(tangents.values(), all_u):
            fw_grad.copy_(real_direction(u).view_as(fw_grad))
        for k, (idx, inp) in enumerate(diff):
            saved = dual_inputs[idx]
            if zero_tangent_jvps is None:
                dual_inputs[idx] = make_dual(inp.detach(), torch.zeros_like(inp))
                res1s = [unpack_dual(o)[1] for o in as_tuple(func(*dual_inputs)) if is_float_or_complex(o)]
            else:
                res1s = zero_tangent_jvps(k, all_u)
            dual_inputs[idx] = inp.detach()
            outs2 = [o for o in as_tuple(func(*dual_inputs)) if is_float_or_complex(o)]
            dual_inputs[idx] = saved
            for index_o, (res1, o2) in enumerate(zip(res1s, outs2)):
                res2 = unpack_dual(o2)[1]
                if res1 is not None and res2 is not None:
                    res1 = res1.reshape(res2.shape)
                if res1 is not None and res2 is not None and not torch.allclose(res1, res2):
                    ctx.fail(
                        f"{torch_words.undefined_tangent(index_o, inp, res1, res2)}\ncheck: undefined tangent "
                        f"({ctx.forward_path}); output {index_o}'s tangent when {ctx.input_name(k)} has an "
                        f"undefined tangent is max |tangent| {float((res1 - res2).abs().max()):.4g} away from "
                        "its tangent for a zero one",
                        check="undefined tangent",
                        path=ctx.forward_path,
                        facts=FailureFacts(inputs=ctx.named_inputs(None, k)),
                    )
    return True


def check_undefined_backward_mode(
    ctx: CheckContext, func: Func, outputs: Sequence[torch.Tensor], inputs: Inputs
) -> bool:
    """With every grad_output undefined (and each one alone), backward must return undefined or zero grads."""
    diff_inputs = [a for a in inputs if requires_grad(a)]
    if not diff_inputs:
        ctx.fail(torch_words.no_tensors_requiring_grad(), check="undefined grad_output")

    def check(to_check: list[torch.Tensor], which: str) -> bool:
        grads_output = [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format) for o in to_check]
        try:
            grads = autograd_grad(to_check, diff_inputs, grads_output)
        except RuntimeError as e:
            _warn_bc()
            raise GradcheckError(
                torch_words.undefined_grad_crash()
                + f"\ncheck: undefined grad_output ({ctx.backward_path}); with {which} undefined, backward "
                f"raised {exception_line(e)}\nA custom backward "
                "receives None for an undefined grad_output unless ctx.set_materialize_grads(True) (the "
                "default) applies: handle None, or keep materialization on.",
                check="undefined grad_output",
                path=ctx.backward_path,
            ) from e
        for gi in grads:
            if gi is not None and not gi.eq(0).all():
                _warn_bc()
                ctx.fail(
                    torch_words.undefined_grad_nonzero() + f"\ncheck: undefined grad_output "
                    f"({ctx.backward_path}); with {which} undefined, backward returned nonzero values",
                    check="undefined grad_output",
                    path=ctx.backward_path,
                )
        return True

    all_undef = [_undefined(o) for o in differentiable_outputs(func(*inputs)) if isinstance(o, torch.Tensor)]
    to_check: list[tuple[list[torch.Tensor], str]] = [(all_undef, "every grad_output")]
    if len(all_undef) > 1:
        for k in range(len(outputs)):
            outs = differentiable_outputs(func(*inputs))
            to_check.append(
                (
                    [_undefined(o) if i == k else o for i, o in enumerate(outs)],
                    f"grad_output {k}",
                )
            )
    return all(check(outs, which) for outs, which in to_check)


def _undefined(o: torch.Tensor) -> torch.Tensor:
    """o with an undefined gradient: backward receives None (or zeros, materialized) for it."""
    undefined: torch.Tensor = torch._C._functions.UndefinedGrad()(o)  # type: ignore[assignment]
    return undefined


def _warn_bc() -> None:
    warnings.warn(torch_words.undefined_grad_warning(), stacklevel=3)
