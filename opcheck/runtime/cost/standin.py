"""A stand-in for a probed function, for a dry run of the engine's own check.

The cost model (model.py) walks the engine's decisions a second time to plan a check. A dry run
instead runs the engine itself on a function that has what those decisions read from the probe,
and counts what it evaluates:

- the probed inputs' and outputs' shapes and dtypes, through a linear map with unit-scale random
  entries (so that a wrong stand-in's error stands well above any tolerance) of the inputs seen as
  real (a complex one as its real and imaginary parts) to the outputs that require grad (a complex
  one rebuilt from two real parts); the other outputs (indices, float outputs without a gradient)
  are the probed ones, as constants;
- vmap support only where the probe's vmapped forward worked (`generate_vmap_rule`), forward AD
  only where its JVP gave the tangent finite differences give, and a backward that raises on a
  batched grad_output (torch.func.vmap's or the legacy vmap's) where its batched backward raised,
  and on any grad_output where its plain backward raised;
- complex outputs that are conjugate views where the probed outputs batch and their parts do not
  (`.imag` of a conjugate view is a negative view, which has no batching rule);
- where the forward cannot be vmapped, a Jacobian whose columns fall in the probe's number of
  groups sharing no row (`Probe.column_groups`: blocks of that many columns, one block per row),
  which the grouped finite differences count;
- with `wrong`, a backward and a JVP off by that factor: the failing check's path.

`stand_in` returns None for sparse inputs, non-tensor outputs, a function without an output that
requires grad, and gradgradcheck's first derivative.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._functorch import is_batchedtensor, is_legacy_batchedtensor

from opcheck.engine import route
from opcheck.engine._util import unpack_dual
from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET
from opcheck.runtime.cost.probe import Probe

__all__ = ["DryRun", "dry_run", "stand_in"]


@dataclass(frozen=True)
class DryRun:
    """The engine's check of a stand-in: the stand-in's calls (forward side: every call of the
    function, plain, forward-mode or batched, once; backward side: its backward's), and the report."""

    forward_side: int
    backward_side: int
    report: Any  # opcheck.engine.GradcheckReport; None where the check raised (a backward that raises)
    crashed: bool = False


def dry_run(probe: Probe, kwargs: dict[str, Any], wrong: float = 1.0) -> DryRun | None:
    """The engine's first-order check (gradcheck_report with the test's keyword arguments) of the
    probed function's stand-in (None where it has none); with `wrong`, of a wrong gradient."""
    from opcheck.engine import gradcheck_report

    counts = Counter[str]()
    fn = stand_in(probe, wrong, counts, kwargs.get("jacobian_budget") or DEFAULT_JACOBIAN_BUDGET)
    if fn is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            report = gradcheck_report(fn, probe.inputs, **kwargs)
        except RuntimeError:  # the stand-in's backward raised through the check, as the probed one's
            return DryRun(counts["forward"], counts["backward"], None, crashed=True)
    return DryRun(counts["forward"], counts["backward"], report)


def stand_in(
    probe: Probe, wrong: float = 1.0, counts: Counter[str] | None = None, budget: int = DEFAULT_JACOBIAN_BUDGET
) -> Callable[..., Any] | None:
    """A function the engine checks as it checks the probed one (None where it has no stand-in);
    its backward and JVP are scaled by `wrong`; `counts` counts its calls ("forward", "backward");
    `budget` is the check's Jacobian budget (fast_mode="auto"'s jacobian_budget)."""
    calls: Counter[str] = Counter() if counts is None else counts
    outs = probe.func_out
    if probe.layouts or hasattr(probe.fn, "vmap_form") or not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    diff = probe.diff
    shapes = [_real(probe.inputs[j]).shape for j in diff]  # the Function's inputs: real views
    n = sum(s.numel() for s in shapes)
    mapped = [o for o in outs if o.requires_grad]  # the rest are constants, as the probed outputs
    if not mapped:
        return None
    vmaps, batched_backward = probe.vmap_whole is not None, probe.batched_backward is not None
    backward_raises = probe.backward_raises
    # complex outputs whose parts do not batch (a conjugate view's .imag is a negative view, which
    # has no batching rule) though the outputs do: the stand-in's are conjugate views too
    conjugate = vmaps and probe.vmap is None
    sizes = [_real(o).numel() for o in mapped]
    groups = 1
    sizes_of = route.Sizes(probe.n, probe.m_real, len(diff), budget, backward=True)
    if not vmaps and batched_backward and n and not probe.complex_inputs and sizes_of.full_first:
        groups = probe.column_groups  # (where the grouped finite differences can run: the full check first)
    # every column in some row: no more blocks than rows
    groups = max(1, min(n, max(groups, -(-n // max(1, sum(sizes))))))
    blocks = max(1, -(-n // groups))
    generator = torch.Generator().manual_seed(0)
    coefficients = [torch.randn(size, groups, generator=generator, dtype=torch.float64) for size in sizes]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    block_of = [(start + torch.arange(size)) % blocks for start, size in zip(starts, sizes)]

    def apply_maps(xs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        f = torch.cat([x.reshape(-1) for x in xs])
        grid = torch.nn.functional.pad(f, (0, blocks * groups - n)).reshape(blocks, groups)
        return tuple(
            (grid[rows] * c.to(f.dtype)).sum(-1).to(r.dtype).reshape(r.shape)
            for rows, c, r in zip(block_of, coefficients, map(_real, mapped))
        )

    def transposed(grads: Sequence[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor:
        """The inputs' flat gradient for the outputs' grads: the maps transposed."""
        grid = torch.zeros(blocks, groups, dtype=dtype)
        for g, rows, c in zip(grads, block_of, coefficients):
            if g is not None:
                grid = grid.index_add(0, rows, g.reshape(-1, 1).to(dtype) * c.to(dtype))
        return grid.reshape(-1)[:n]

    class StandIn(torch.autograd.Function):
        generate_vmap_rule = vmaps

        @staticmethod
        def forward(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return apply_maps(xs)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.dtypes = [x.dtype for x in inputs]

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            calls["backward"] += 1
            if backward_raises:
                raise RuntimeError("the stand-in's backward raises, as the probed one")
            if not batched_backward and any(_batched(g) for g in grads):
                raise RuntimeError("the stand-in's backward has no batching rule, as the probed one")
            dtype = next((g.dtype for g in grads if g is not None), torch.float64)
            parts = torch.split(wrong * transposed(grads, dtype), [s.numel() for s in shapes])
            return tuple(part.reshape(s).to(dtype) for part, s, dtype in zip(parts, shapes, ctx.dtypes))

    if probe.jvp is not None and probe.jvp_right:

        def jvp(ctx: Any, *tangents: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            zeros = [torch.zeros(s, dtype=torch.float64) if t is None else t for t, s in zip(tangents, shapes)]
            return tuple(wrong * t for t in apply_maps(zeros))

        StandIn.jvp = staticmethod(jvp)  # type: ignore[method-assign]

    def function(*xs: Any) -> Any:
        calls["forward"] += 1
        reals = iter(StandIn.apply(*(_real(xs[j]) for j in diff)))
        result = []
        for o in outs:
            if o.requires_grad:
                r = next(reals)
                if o.is_complex() and conjugate and unpack_dual(r)[1] is None:
                    r = torch.complex(r[..., 0], -r[..., 1]).conj()  # (forward AD's legacy batching takes none)
                elif o.is_complex():
                    r = torch.complex(r[..., 0], r[..., 1])
                result.append(r)
            else:
                result.append(o.detach().clone())
        return tuple(result) if len(result) > 1 else result[0]

    return function


def _real(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((x.real, x.imag), -1) if x.is_complex() else x


def _batched(g: torch.Tensor | None) -> bool:
    """Whether a grad_output is a batched one (torch.func.vmap's, or the legacy vmap's of
    torch.autograd.grad(is_grads_batched=True))."""
    return g is not None and (is_batchedtensor(g) or is_legacy_batchedtensor(g))
