"""A stand-in for a probed function, for a dry run of the engine's own check.

The cost model (model.py) walks the engine's decisions a second time to plan a check. A dry run
instead runs the engine itself on a function that has what those decisions read from the probe,
and counts what it evaluates:

- the probed inputs' and outputs' shapes and dtypes, through a linear map with unit-scale random
  entries (so that a wrong stand-in's error stands well above any tolerance);
- vmap support only where the probe's vmapped forward worked (`generate_vmap_rule`), forward AD
  only where its JVP gave the tangent finite differences give, and a backward that raises on a
  batched grad_output where its batched backward raised;
- where the forward cannot be vmapped, a Jacobian whose columns fall in the probe's number of
  groups sharing no row (`Probe.column_groups`: blocks of that many columns, one block per row),
  which the grouped finite differences count;
- with `wrong`, a backward off by that factor: the failing check's path.

Real floating inputs and tensor outputs only: `stand_in` returns None for complex or sparse inputs,
complex or non-tensor outputs, and gradgradcheck's first derivative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C._functorch import is_batchedtensor

from opcheck.runtime.cost.probe import Probe

__all__ = ["stand_in"]


def stand_in(probe: Probe, wrong: float = 1.0) -> Callable[..., Any] | None:
    """A function the engine checks as it checks the probed one (None where it has no stand-in);
    its backward is scaled by `wrong`."""
    outs = probe.func_out
    if (
        probe.layouts
        or probe.complex_inputs
        or hasattr(probe.fn, "vmap_form")
        or not outs
        or not all(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs)
    ):
        return None
    diff, n = probe.diff, probe.n
    generator = torch.Generator().manual_seed(0)
    maps = [torch.randn(o.numel(), n, generator=generator, dtype=torch.float64) for o in outs]
    vmaps, batched_backward = probe.vmap is not None, probe.batched_backward is not None
    if not vmaps and batched_backward and n:
        groups = max(1, min(n, probe.column_groups))
        blocks = -(-n // groups)
        for w in maps:
            rows = torch.arange(w.shape[0]) % blocks
            columns = torch.arange(n) // groups
            w.mul_(rows[:, None] == columns[None, :])

    def flat(xs: tuple[Any, ...]) -> torch.Tensor:
        return torch.cat([xs[j].reshape(-1) for j in diff])

    def mapped(f: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple((w.to(o.dtype) @ f.to(o.dtype)).reshape(o.shape) for w, o in zip(maps, outs))

    class StandIn(torch.autograd.Function):
        generate_vmap_rule = vmaps

        @staticmethod
        def forward(*xs: Any) -> tuple[torch.Tensor, ...]:
            return mapped(flat(xs))

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.shapes = [inputs[j].shape for j in diff]
            ctx.dtypes = [inputs[j].dtype for j in diff]

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
            if not batched_backward and any(g is not None and is_batchedtensor(g) for g in grads):
                raise RuntimeError("the stand-in's backward has no batching rule, as the probed one")
            total = sum(g.reshape(-1) @ w.to(g.dtype) for g, w in zip(grads, maps) if g is not None)
            result: list[torch.Tensor | None] = [None] * len(probe.inputs)
            start = 0
            for j, shape, dtype in zip(diff, ctx.shapes, ctx.dtypes):
                size = shape.numel()
                part = total[start : start + size] if isinstance(total, torch.Tensor) else torch.zeros(size)
                result[j] = (wrong * part).reshape(shape).to(dtype)
                start += size
            return tuple(result)

    if probe.jvp is not None and probe.jvp_right:

        def jvp(ctx: Any, *tangents: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            parts = []
            for j in diff:
                t = tangents[j]
                parts.append((torch.zeros_like(probe.inputs[j]) if t is None else t).reshape(-1))
            return mapped(torch.cat(parts))

        StandIn.jvp = staticmethod(jvp)  # type: ignore[method-assign]

    def function(*xs: Any) -> Any:
        out = StandIn.apply(*xs)
        return out if len(out) > 1 else out[0]

    return function
