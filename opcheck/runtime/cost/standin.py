"""A stand-in for a probed function, for a dry run of the engine's own check.

An estimate's plan of a check (estimate.plans_of) is a dry run: the engine itself run on a function
that has what its decisions read from the probe, counting what it evaluates:

- the probed inputs' and outputs' shapes and dtypes, through a linear map of O(n + m) entries with
  unit-scale random coefficients (so that a wrong stand-in's error stands well above any tolerance):
  each output element reads one block of input elements, the inputs seen as real (a complex one as
  its real and imaginary parts), to the outputs that require grad (a complex one rebuilt from two
  real parts); the other outputs (indices, float outputs without a gradient, values that are not
  tensors) are the probed ones, as constants, so that the check raises on them where it raises on
  the probed ones, and calls a function without an output that requires grad as often;
- vmap support only where the probe's vmapped forward worked (`generate_vmap_rule`), JVPs whose
  tangents alone are batched where the probe's batched, forward AD where the probe's ran (off by 2x
  where it disagreed with finite differences; raising on dual tensors under torch.func.vmap where
  the probe's did: `Probe.dual_jvp_raises`), and a backward that raises on a batched grad_output
  (torch.func.vmap's or the legacy vmap's) where its batched backward raised, and on any
  grad_output where its plain backward raised;
- a backward differentiable as the probe found the op's (`Probe.double_backward`: exactly, with a
  wrong derivative, without a graph, or raising), which the projections' VJP of the VJP reads;
- complex outputs that are conjugate views where the probed outputs batch and their parts do not
  (`.imag` of a conjugate view is a negative view, which has no batching rule);
- where the forward cannot be vmapped, blocks as wide as the probe's number of column groups (the
  columns of one block share rows, those of different blocks none), which the grouped finite
  differences count;
- for gradgradcheck (`second`, the first derivative's probe), a double backward that raises where
  that probe's backward raised and is wrong where the op's double backward was, and forward AD
  through backward where that probe's forward AD ran (off by 2x where it disagreed);
- with `wrong`, a derivative off by that factor: the failing check's path.

Each evaluation is recorded by kind and rows (`DryRun.evaluations`), priced at the probe's times
(`DryRun.plan`), and advances the virtual clock the engine's timed choices read in a dry run.
A sparse input goes into the stand-in as the engine gives it (the engine's own dense stand-ins
rebuild it), read by dense position where the numerical side moves its values: with masked=True
its specified positions alone, which alone a passing check's gradient has; its gradient is dense,
in a second-order check too (the first derivative's, differentiated in the sparse input), and a
complex one's is rebuilt from its real and imaginary parts. What it does not mirror: a batching
rule that works at some batch sizes only, a batched backward that raises only where its graph is
kept for a second derivative, and what a check's values decide (entries near the tolerance, batched
results that disagree with a plain call).

A dry run beyond the full check's first size runs on meta tensors (`on_meta`, `_PassingReads`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._functorch import (
    CVmapInterpreterPtr,
    TransformType,
    get_interpreter_stack,
    is_batchedtensor,
    is_legacy_batchedtensor,
)
from torch.utils._python_dispatch import TorchDispatchMode

from opcheck.engine import route
from opcheck.engine._util import unpack_dual
from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET
from opcheck.runtime.cost.plan import TIMED, Kind, Plan
from opcheck.runtime.cost.probe import Probe, unit_seconds

__all__ = ["DryRun", "dry_run", "on_meta", "stand_in"]


@dataclass(frozen=True)
class DryRun:
    """The engine's check of a stand-in: the stand-in's evaluations by kind and rows per call (a
    batched evaluation that raised as one row), and the engine's report."""

    evaluations: Counter[tuple[Kind, int]]
    report: Any  # opcheck.engine.GradcheckReport; None where the check raised (a backward that raises)
    crashed: bool = False
    fast_mode: bool | str = False  # the check's, as the engine was called
    clock_reads: int = 0  # the engine's timed choices: reads of the virtual clock

    @property
    def forward_side(self) -> int:
        """Every call of the function, plain, forward-mode or batched, once."""
        return sum(n for (kind, _), n in self.evaluations.items() if kind not in _BACKWARD_SIDE)

    @property
    def backward_side(self) -> int:
        return sum(n for (kind, _), n in self.evaluations.items() if kind in _BACKWARD_SIDE)

    def plan(self, probe: Probe) -> Plan:
        """The evaluations, each priced at the probe's times (probe.unit_seconds); the engine's path
        in the words of the test's `policy:` row (policy.paths_taken); and its stages, whose
        bookkeeping an estimate prices (estimate.PER_STEP): its comparisons, the fused pass where
        one decided, each kind of batching it gave up, and TIMED where it read its clock; and the
        engine's count of its backward passes."""
        from opcheck.runtime.policy import AUTO, paths_taken

        plan = Plan(crashed=self.crashed)
        for (kind, rows), count in self.evaluations.items():
            plan.add(kind, count, rows, unit_seconds(probe, kind, rows))
        if self.report is None:
            plan.note("crashes: a plain backward raises")
            return plan
        stats = self.report.stats
        for words in paths_taken(self.fast_mode, self.report):
            plan.note(f"auto: {words}" if self.fast_mode == AUTO else words)
        plan.steps["comparison"] = max(1, len(stats.auto_paths) + (stats.failed_path is not None))
        plan.steps["fused pass"] = int(stats.fused)
        plan.steps["failed batch"] = len(stats.fallbacks)
        plan.steps[TIMED] = int(self.clock_reads > 0)
        plan.engine_backward = stats.vjp_calls + stats.batched_vjp_calls
        return plan


_BACKWARD_SIDE = (Kind.BACKWARD, Kind.BATCHED_BACKWARD, Kind.DOUBLE_BACKWARD)


def dry_run(
    probe: Probe, kwargs: dict[str, Any], wrong: float = 1.0, second: Probe | None = None, meta: bool | None = None
) -> DryRun:
    """The engine's first-order check (gradcheck_report with the test's keyword arguments) of the
    probed function's stand-in; with `wrong`, of a wrong gradient. With
    `second`, the probe of its first derivative, the second-order check (gradgradcheck_report), of
    a wrong second derivative with `wrong`; its evaluations are of the function, its backward and
    double backward (each of the first derivative's calls is a call and a backward).

    The engine's timed choices (a batch schedule's growth, a batched kind that costs more per column
    than the loop) read a virtual clock that each of the stand-in's evaluations advances by what
    that evaluation of the probed function costs (probe.unit_seconds): they are the choices the
    engine would make on the function, at the probe's times. No price is measured inside the check
    (a batch of the probe's timed inside the check's vmap is a batch of batches, and inside its
    backward or forward-AD level runs otherwise than alone): the clock prices each evaluation from
    the batch sizes timed so far; a run that read its clock runs again once the sizes it made are
    timed (_RUNS).

    `meta` runs the check on meta tensors (on_meta says where, by default; never with sparse
    inputs, which the engine's dense stand-ins rebuild on their own device): no evaluation or
    comparison computes anything, and every read of a value answers as a passing check's
    (_PassingReads), so that a dry run of a large check costs what its number of evaluations costs,
    not what its sizes do."""
    meta = on_meta(probe, wrong, second) if meta is None else meta and not probe.layouts
    # what the prices read, probed before the check: the probe's batched calls, tried alone
    _ = probe.jvp, probe.vmap, probe.vmap_jvp, probe.vmap_tangents, probe.batched_backward
    run = _dry_run(probe, kwargs, wrong, second, meta)
    for _ in range(_RUNS):
        if not run.clock_reads:
            return run
        # the sizes it made, timed: where one's price moves, the clock read another
        moved = [unit_seconds(probe, k, r, measure=False) != unit_seconds(probe, k, r) for k, r in run.evaluations]
        if not any(moved):
            return run
        run = _dry_run(probe, kwargs, wrong, second, meta)
    return run


_RUNS = 3
"""A dry run that reads its clock runs again, up to this many times more, until every size it made
was timed before it ran."""


def _dry_run(probe: Probe, kwargs: dict[str, Any], wrong: float, second: Probe | None, meta: bool) -> DryRun:
    from opcheck.engine import gradcheck_report, gradgradcheck_report
    from opcheck.engine.batching import batching_clock

    device = torch.device("meta") if meta else None
    evaluations = Counter[tuple[Kind, int]]()
    elapsed, reads = [0.0], [0]

    def clock() -> float:
        reads[0] += 1
        return elapsed[0]

    def record(kind: Kind, rows: int) -> None:
        evaluations[(kind, rows)] += 1
        elapsed[0] += unit_seconds(probe, kind, rows, measure=False)

    budget = kwargs.get("jacobian_budget") or DEFAULT_JACOBIAN_BUDGET
    fn = stand_in(probe, wrong, record, budget, second, device=device)
    check = gradcheck_report if second is None else gradgradcheck_report
    inputs = tuple(_on(x, device) for x in (probe.given_inputs if probe.layouts else probe.inputs))
    passing = _PassingReads() if meta else contextlib.nullcontext()
    with warnings.catch_warnings(), batching_clock(clock), torch.random.fork_rng(devices=[]), passing:
        warnings.simplefilter("ignore")
        torch.default_generator.manual_seed(0)  # gradgradcheck draws its grad_outputs from the global generator
        try:
            report = check(fn, inputs, **kwargs)
        except Exception as e:
            if not _raises_as_probed(e, probe, second, kwargs):
                raise
            return DryRun(evaluations, None, True, kwargs.get("fast_mode", False), reads[0])
    return DryRun(evaluations, report, False, kwargs.get("fast_mode", False), reads[0])


def _raises_as_probed(e: Exception, probe: Probe, second: Probe | None, kwargs: dict[str, Any]) -> bool:
    """Whether the check raised on the stand-in where it raises on the probed function: on the
    outputs, which are the probed ones' (one that is not a tensor, an integer output before a float
    one: torch's gradcheck raises there too, not with a RuntimeError), or through a backward that
    raises as the probed one's (its double backward, forward AD through it). Any other exception
    is the stand-in's own, and is raised."""
    if not isinstance(e, RuntimeError):
        return any(_has_constant_outputs(p) for p in (probe, second) if p is not None)
    return (
        probe.backward_raises
        or (second is not None and second.backward_raises)
        or (second is not None and second.jvp is None and bool(kwargs.get("check_fwd_over_rev")))
    )


def _has_constant_outputs(probe: Probe) -> bool:
    """Whether some output of the probed function is not a tensor that requires grad (the stand-in
    returns those as the probed values)."""
    return len(probe.outputs) < len(probe.func_out)


def on_meta(probe: Probe, wrong: float = 1.0, second: Probe | None = None) -> bool:
    """Whether a dry run runs on meta tensors: a passing first-order check beyond the size up to
    which fast_mode="auto" runs the full check first (route.FULL_CHECK_ELEMENTS). Below it the
    engine's choices read values (the grouped finite differences group backward's nonzero
    entries), and evaluations of that size cost little; a failing check reads its values to
    localize the failure; a second-order check's first derivative is the stand-in's backward; and
    where backward's own derivative is wrong (Probe.double_backward), or forward AD is (a JVP that
    disagrees with finite differences), a passing check finds that source of J·U disagreeing, which
    a meta tensor cannot show."""
    if wrong != 1.0 or second is not None or probe.double_backward == "wrong" or probe.layouts:
        return False
    if probe.jvp is not None and not probe.jvp_right:
        return False
    return probe.n + probe.m_real > route.FULL_CHECK_ELEMENTS


def _on(x: Any, device: torch.device | None) -> Any:
    """x on `device` (None: x itself), a tensor as a leaf that requires grad as x does."""
    if device is None or not isinstance(x, torch.Tensor):
        return x
    return x.detach().to(device).requires_grad_(x.requires_grad)


class _PassingReads(TorchDispatchMode):
    """A passing check on meta tensors: factory calls without a device or on the CPU (the engine's
    random directions, drawn on the CPU from its own generators) make meta tensors, and each read
    of a meta tensor's values answers as it would in a check whose every comparison holds: equal,
    close, no entry beyond its tolerance (`any` false, `all` true), every scalar read (a worst
    excess, a count of entries beyond tolerance) zero."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not tensors and any(a.name == "device" for a in func._schema.arguments):
            device = kwargs.get("device")
            if device is None or torch.device(device).type == "cpu":
                kwargs["device"] = torch.device("meta")
                if "generator" in kwargs:
                    kwargs["generator"] = None  # a CPU generator draws for the CPU; nothing is drawn here
        elif any(t.is_meta for t in tensors):
            packet = func.overloadpacket
            if func is torch.ops.aten._local_scalar_dense.default:
                return False if tensors[0].dtype == torch.bool else 0
            if packet in (torch.ops.aten.equal, torch.ops.aten.allclose):
                return True
            if packet in (torch.ops.aten.all, torch.ops.aten.any):
                return torch.tensor(packet is torch.ops.aten.all)  # a CPU scalar, which bool() reads
        return func(*args, **kwargs)


def stand_in(
    probe: Probe,
    wrong: float = 1.0,
    record: Callable[[Kind, int], None] | None = None,
    budget: int = DEFAULT_JACOBIAN_BUDGET,
    second: Probe | None = None,
    device: torch.device | None = None,
) -> Callable[..., Any]:
    """A function the engine checks as it checks the probed one; its backward and JVP are scaled
    by `wrong`; `record(kind, rows)` is told of each of its calls; `budget` is the check's Jacobian
    budget (fast_mode="auto"'s jacobian_budget). With `second`, the probe of the function's first
    derivative (gradgradcheck's), the stand-in's backward has that probe's support, and `wrong`
    scales its double backward instead of its backward. Its maps and constant outputs are on
    `device` (None: the probe's); sparse inputs stay on their own.

    The probe is of a function as the user gives it: gradgradcheck's first derivative has no
    stand-in of its own (the op's, with `second`, is the second-order check's)."""
    called: Callable[[Kind, int], None] = record or (lambda kind, rows: None)
    outs = probe.func_out
    if hasattr(probe.fn, "vmap_form"):
        raise ValueError("a first derivative's stand-in is the op's, with second= its probe")
    if probe.layouts and device is not None:
        raise ValueError("a sparse input goes into the stand-in on its own device")
    constants = [_on(o.detach(), device) if isinstance(o, torch.Tensor) else o for o in outs]
    diff = probe.diff
    shapes = [_real(probe.inputs[j]).shape for j in diff]  # the Function's inputs: real views
    # a sparse input, as the engine gives it: its dense values, where the numerical side moves them
    # (masked=True: the specified positions alone, whose gradient alone a passing check has)
    masks: dict[int, torch.Tensor] = {}
    for k, j in enumerate(diff):
        if j in probe.perturbed:
            dense = probe.inputs[j]
            mask = torch.zeros(dense.numel(), dtype=torch.bool)
            mask[probe.perturbed[j]] = True
            masks[k] = mask.reshape(dense.shape)
    n = sum(s.numel() for s in shapes)
    # the rest are constants, as the probed outputs (those that are not tensors too)
    mapped = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if not mapped:  # nothing to differentiate: the engine calls it, and finds that

        def constant(*xs: Any) -> Any:
            called(*_forward_kind([xs[j] for j in diff]))
            return _outputs(None, outs, constants)

        return constant
    vmaps, batched_backward = probe.vmap_whole is not None, probe.batched_backward is not None
    backward_raises = probe.backward_raises
    # complex outputs whose parts do not batch (a conjugate view's .imag is a negative view, which
    # has no batching rule) though the outputs do: the stand-in's are conjugate views too
    # (not in a second-order check, whose first derivative takes no output's parts: its batching is
    # the first derivative's probe's, and a negative view of its grad_output has no batching rule)
    conjugate = vmaps and probe.vmap is None and second is None
    sizes = [_real(o).numel() for o in mapped]
    groups = 1
    sizes_of = route.Sizes(probe.n, probe.m_real, len(diff), budget, backward=True)
    if not vmaps and batched_backward and n and not probe.complex_inputs and sizes_of.full_first:
        groups = probe.column_groups  # (where the grouped finite differences can run: the full check first)
    # every column in some row: no more blocks than rows
    groups = max(1, min(n, max(groups, -(-n // max(1, sum(sizes))))))
    if second is not None and second.vmap_whole is None and second.batched_backward is not None and n:
        # the first derivative's columns cannot be batched: blocks whose first derivative falls in
        # as many column groups as the probed one's (where the grouped finite differences can run)
        first = route.Sizes(second.n, second.m_real, len(second.diff), budget, backward=True)
        if first.full_first:
            groups = _second_order_groups(second.column_groups, groups, n, sizes, len(second.diff))
    blocks = max(1, -(-n // groups))
    generator = torch.Generator().manual_seed(0)
    coefficients = [_coefficients(size, groups, generator, device) for size in sizes]
    block_of = [(start + torch.arange(size, device=device)) % blocks for start, size in zip(_starts(sizes), sizes)]

    real_outputs = [_real(_on(o, device)) for o in mapped]
    # probed here, as what follows: the check's transforms are no place to probe
    double_backward = probe.double_backward
    second_batched_backward = second is not None and second.batched_backward is not None
    # a first derivative whose JVPs batch their tangents where it does not batch (tangents_only below)
    second_tangents_only = second is not None and second.vmap_whole is None and second.vmap_tangents is not None
    # ... and which of its inputs (the op's, then the grad_outputs) it batches along alone, the others
    # fixed (a backward without a batching rule batches along the op's inputs, not its grad_outputs)
    second_vmaps = second is None or second.vmap_whole is not None
    second_alone: list[bool] | None = None
    if not second_vmaps and second is not None and len(second.diff) == len(diff) + len(mapped):
        second_alone = [second.vmaps_alone(k) for k in range(len(second.diff))]
    detached = second is not None and double_backward == "detached"
    second_wrong = 1.0
    if second is not None:  # a wrong second derivative; one the probe found wrong (@once_differentiable) too
        wrong, second_wrong = 1.0, wrong * (2.0 if double_backward == "wrong" else 1.0)

    def apply_maps(xs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return maps(torch.cat([_real(_dense(x, masks.get(k))).reshape(-1) for k, x in enumerate(xs)]))

    def maps(f: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The outputs' real parts for the inputs' flat real values."""
        grid = torch.nn.functional.pad(f, (0, blocks * groups - n)).reshape(blocks, groups)
        return tuple(
            (grid[rows] * c.to(f.dtype)).sum(-1).to(r.dtype).reshape(r.shape)
            for rows, c, r in zip(block_of, coefficients, real_outputs)
        )

    def transposed(grads: Sequence[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor:
        """The inputs' flat gradient for the outputs' grads: the maps transposed."""
        grid = torch.zeros(blocks, groups, dtype=dtype, device=device)
        for g, rows, c in zip(grads, block_of, coefficients):
            if g is not None:
                grid = grid.index_add(0, rows, g.reshape(-1, 1).to(dtype) * c.to(dtype))
        return grid.reshape(-1)[:n]

    # torch.func.jvp under torch.func.vmap with the point fixed and the tangents batched (the
    # columns J e_k, the projections' J·U) batches where the forward does not (a batching rule
    # that broadcasts its batch dimension against the sample's own)
    tangents_only = probe.vmap_tangents is not None and not probe.layouts

    class StandIn(torch.autograd.Function):
        generate_vmap_rule = vmaps or tangents_only

        @staticmethod
        def forward(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if second is None:
                return apply_maps(xs)
            return tuple(y + 0.5 * y * y for y in apply_maps(xs))

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.dtypes = [x.dtype for x in inputs]
            if second is not None:
                ctx.save_for_backward(*inputs)
                ctx.save_for_forward(*inputs)

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            rows = _batch_rows(grads)
            # (a second-order check's batched backward is its first derivative's batched call: Transposed's)
            if backward_raises or (rows and not batched_backward and second is None):
                called(Kind.BATCHED_BACKWARD if rows else Kind.BACKWARD, 1)
                if backward_raises:
                    raise RuntimeError("the stand-in's backward raises, as the probed one")
                raise RuntimeError("the stand-in's backward has no batching rule, as the probed one")
            called(*((Kind.BATCHED_BACKWARD, rows) if rows else (Kind.BACKWARD, 1)))
            dtype = next((g.dtype for g in grads if g is not None), torch.float64)
            if second is None:  # backward's own derivative (the VJP of the VJP) as the probe found it
                with torch.set_grad_enabled(torch.is_grad_enabled() and double_backward != "detached"):
                    flat = _as_differentiated(wrong * transposed(grads, dtype), double_backward)
            else:  # the maps' VJP at y = maps(x): (1 + y) * grad, transposed, differentiable in x and grad
                with torch.set_grad_enabled(torch.is_grad_enabled() and not detached):
                    given = [
                        (torch.zeros(r.shape, dtype=dtype) if g is None else g) * (1 + y)
                        for g, r, y in zip(grads, real_outputs, apply_maps(ctx.saved_tensors))
                    ]
                    along = [k for k, t in enumerate((*ctx.saved_tensors, *grads)) if _batched_primal(t)]
                    alone = second_alone is not None and len(along) == 1 and second_alone[along[0]]
                    if along and not second_vmaps and not alone:
                        raise RuntimeError("the stand-in's backward has no batching rule, as its first derivative")
                    flat = transposed(given, dtype) if detached else Transposed.apply(*given)
            parts = torch.split(flat, [s.numel() for s in shapes])
            # (copies, not views of one flat gradient: a second-order check's backward passes then are the op's)
            return tuple(
                _dense(_as_dtype(part.reshape(s), dtype), masks.get(k)).to(dtype, copy=True)
                for k, (part, s, dtype) in enumerate(zip(parts, shapes, ctx.dtypes))
            )

    class Transposed(torch.autograd.Function):
        """Backward's map, whose own backward (the double backward) has the first derivative's
        probed support: vmap, a backward that raises, a batched backward that raises; scaled by
        `wrong`."""

        generate_vmap_rule = second is not None and (
            second.vmap_whole is not None or second_tangents_only or any(second_alone or ())
        )

        @staticmethod
        def forward(*grads: torch.Tensor) -> torch.Tensor:
            return transposed(grads, grads[0].dtype).clone()  # not a view of the function's own tensor

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            pass

        @staticmethod
        def backward(ctx: Any, gg: torch.Tensor) -> tuple[torch.Tensor, ...]:
            assert second is not None
            rows = _batch_rows([gg])
            called(Kind.DOUBLE_BACKWARD, rows or 1)
            if second.backward_raises:
                raise RuntimeError("the stand-in's double backward raises, as the probed one")
            if rows and not second_batched_backward:
                raise RuntimeError("the stand-in's double backward has no batching rule, as the probed one")
            return tuple(second_wrong * t for t in maps(gg))

    if second is not None and second.jvp is not None:  # forward AD through backward, where the probe's ran
        second_jvp_wrong = second_wrong * (1.0 if second.jvp_right else 2.0)

        def transposed_jvp(ctx: Any, *tangents: torch.Tensor | None) -> torch.Tensor:
            dtype = next((t.dtype for t in tangents if t is not None), torch.float64)
            return second_jvp_wrong * transposed(tangents, dtype)

        Transposed.jvp = staticmethod(transposed_jvp)  # type: ignore[method-assign]

    if probe.jvp is not None:  # a JVP that disagrees with finite differences where the probe's did
        jvp_wrong = wrong * (1.0 if probe.jvp_right else 2.0)
        dual_jvp_raises = probe.dual_jvp_raises

        def jvp(ctx: Any, *tangents: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            if dual_jvp_raises and _vmap_rows() and not _in_jvp_transform():
                raise RuntimeError("the stand-in's JVP of dual tensors under vmap raises, as the probed one's")
            zeros = [
                torch.zeros(s, dtype=torch.float64, device=device) if t is None else t for t, s in zip(tangents, shapes)
            ]
            if second is None:
                return tuple(jvp_wrong * t for t in apply_maps(zeros))
            ys = apply_maps(ctx.saved_tensors)
            return tuple(jvp_wrong * t * (1 + y) for t, y in zip(apply_maps(zeros), ys))

        StandIn.jvp = staticmethod(jvp)  # type: ignore[method-assign]

    def function(*xs: Any) -> Any:
        kind, rows = _forward_kind([xs[j] for j in diff])
        try:
            if kind in (Kind.VMAP, Kind.VMAP_JVP) and not vmaps:
                if kind is Kind.VMAP or any(_batched_primal(xs[j]) for j in diff):
                    raise RuntimeError("the stand-in's forward has no batching rule, as the probed one")
            reals = iter(StandIn.apply(*(_real(xs[j]) for j in diff)))
        except Exception:  # a batched attempt that raises: one call of the op, priced as one row
            called(kind, 1)
            raise
        called(kind, rows)
        result = []
        for o in mapped:
            r = next(reals)
            if o.is_complex() and conjugate and kind in (Kind.FORWARD, Kind.VMAP):
                r = torch.complex(r[..., 0], -r[..., 1]).conj()  # (forward AD's batching takes none)
            elif o.is_complex():
                r = torch.view_as_complex(r)  # (its backward takes a conjugate grad_output under vmap)
            result.append(r)
        return _outputs(result, outs, constants)

    return function


def _outputs(mapped: list[torch.Tensor] | None, outs: Sequence[Any], constants: Sequence[Any]) -> Any:
    """The stand-in's outputs: the mapped ones in the places of the probed outputs that require
    grad, copies of the others (as the probed function returns new ones at each call)."""
    found = iter(mapped or ())
    result = []
    for o, c in zip(outs, constants):
        if isinstance(o, torch.Tensor) and o.requires_grad:
            result.append(next(found))
        else:
            result.append(c.clone() if isinstance(c, torch.Tensor) else c)
    return tuple(result) if len(result) > 1 else result[0]


def _second_order_groups(target: int, least: int, n: int, sizes: Sequence[int], inputs: int) -> int:
    """The block width from `least` up whose stand-in's first derivative has `target` column groups
    (opcheck.engine.auto.grouped.column_groups, bounded as the probe bounds them), else the nearest.

    With blocks of `g` input elements, each output element reading one block, and the stand-in's
    y + y²/2 of the maps y, the first derivative (x, v) -> Jᵀ((1 + y) v) has, in the rows of a
    block, the block's x columns and the v columns of the outputs that read it."""
    from opcheck.engine.auto.grouped import column_groups

    most = route.loop_columns(inputs) // route.GROUP_WEIGHTINGS + 1
    reads = torch.cat([start + torch.arange(size) for start, size in zip(_starts(sizes), sizes)])
    best, off = least, None
    for g in range(least, n + 1):
        blocks = -(-n // g)
        row_block = torch.arange(n) // g
        read_block = reads % blocks
        read = torch.zeros(blocks, dtype=torch.bool)
        read[read_block] = True
        x_columns = (row_block[:, None] == row_block[None, :]) & read[row_block][None, :]
        v_columns = row_block[:, None] == read_block[None, :]
        found = column_groups(torch.cat([x_columns, v_columns], dim=1), most)
        count = most if found is None else len(found)
        if off is None or abs(count - target) < off:
            best, off = g, abs(count - target)
        if count == target:
            break
    return best


def _starts(sizes: Sequence[int]) -> list[int]:
    return [sum(sizes[:k]) for k in range(len(sizes))]


class _WrongWhenDifferentiated(torch.autograd.Function):
    """The identity, whose backward doubles its gradient (`double`) or raises: a backward whose own
    derivative is wrong, or raises."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, double: bool) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.double = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if not ctx.double:
            raise RuntimeError("the stand-in's double backward raises, as the probed one")
        return 2 * grad, None


def _as_differentiated(flat: torch.Tensor, double_backward: str) -> torch.Tensor:
    """Backward's result, differentiable as the probe found the op's (Probe.double_backward): exactly
    ("ok"), with a derivative twice what it is ("wrong": a graph kept where backward is not
    differentiable), or by a backward that raises ("raises"); "detached" is computed without a
    graph by the caller."""
    if double_backward in ("wrong", "raises") and flat.requires_grad:
        return _WrongWhenDifferentiated.apply(flat, double_backward == "wrong")
    return flat


def _coefficients(size: int, groups: int, generator: torch.Generator, device: torch.device | None) -> torch.Tensor:
    """A map's (size, groups) unit-scale random coefficients; on meta tensors, none drawn."""
    if device is not None and device.type == "meta":
        return torch.empty(size, groups, dtype=torch.float64, device=device)
    return torch.randn(size, groups, generator=generator, dtype=torch.float64)


def _real(x: torch.Tensor) -> torch.Tensor:
    if x.layout != torch.strided:
        return x  # a sparse input (real) into the stand-in as given
    return torch.stack((x.real, x.imag), -1) if x.is_complex() else x


def _as_dtype(real: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A gradient of real parts as an input of `dtype` takes it: a complex (sparse) input, which
    goes into the stand-in as given, from its real and imaginary parts."""
    return torch.view_as_complex(real.contiguous()) if dtype.is_complex else real


def _dense(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A sparse input's values by dense position (those the numerical side moves, with `mask`),
    whose gradient is dense, as a dense input's."""
    if x.layout != torch.strided:
        x = _Densified.apply(x)
    return x if mask is None else x * mask.to(x.device)


class _Densified(torch.autograd.Function):
    """A sparse tensor's values by dense position, whose gradient is dense (to_dense's is sparse,
    which the engine's comparisons of a second-order check's gradients cannot read)."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.to_dense()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _batched_primal(x: Any) -> bool:
    """Whether a point the function is called at is batched by torch.func.vmap at some level below
    its other transforms' wrappers (a JVP's, whose tangents alone may be the batched ones)."""
    while isinstance(x, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(x):
        if is_batchedtensor(x):
            return True
        x = torch._C._functorch.get_unwrapped(x)
    return False


def _vmap_rows() -> int:
    """The rows of the torch.func.vmap calls around this one (0: none)."""
    stack = get_interpreter_stack() or []
    sizes = [CVmapInterpreterPtr(i).batchSize() for i in stack if i.key() == TransformType.Vmap]
    return math.prod(sizes) if sizes else 0


def _legacy_rows(t: torch.Tensor) -> int:
    """The rows of a tensor batched by the legacy vmap (torch.autograd.grad's is_grads_batched,
    make_dual's tangents under it): its level is the one below the next."""
    level = torch._C._vmapmode_increment_nesting()
    torch._C._vmapmode_decrement_nesting()
    return int(torch._remove_batch_dim(t, level - 1, 1, 0).shape[0])


def _batch_rows(grads: Sequence[torch.Tensor | None]) -> int:
    """The rows of a batched backward's grad_outputs (torch.func.vmap's or the legacy vmap's; 0: not batched)."""
    for g in grads:
        if g is not None and is_legacy_batchedtensor(g):
            return _legacy_rows(g)
    return _vmap_rows() if any(g is not None and is_batchedtensor(g) for g in grads) else 0


def _in_jvp_transform() -> bool:
    """Whether a torch.func.jvp is around this call (not torch's forward AD of dual tensors)."""
    return any(i.key() == TransformType.Jvp for i in get_interpreter_stack() or [])


def _forward_kind(xs: Sequence[torch.Tensor]) -> tuple[Kind, int]:
    """What kind of evaluation a call of the function is, and its rows."""
    rows = _vmap_rows()
    jvp = _in_jvp_transform()
    if rows:
        return (Kind.VMAP_JVP if jvp else Kind.VMAP), rows
    if jvp:
        return Kind.JVP, 1
    for x in xs:
        if is_legacy_batchedtensor(x):
            return Kind.VMAP, _legacy_rows(x)
        tangent = unpack_dual(x)[1]
        if tangent is not None:
            return (Kind.VMAP_TANGENTS, _legacy_rows(tangent)) if is_legacy_batchedtensor(tangent) else (Kind.JVP, 1)
    return Kind.FORWARD, 1
