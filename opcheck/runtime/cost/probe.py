"""What a probe learns about a function under check: its sizes, the seconds of its calls, and which
of the engine's batched evaluations work for it (standin.py builds a check's stand-in from these,
and `unit_seconds` prices each of its evaluations).

The probe calls the function the way a check will: a plain forward and a backward along a random
cotangent, each timed (the best of a few repeats); and, only when a plan asks, each batched
evaluation the engine may try (a vmapped forward, a vmapped forward-mode JVP, a batched backward),
first on a few rows, then at the batch size the plan needs (its time per row is not constant); a
JVP and a double backward, each compared with finite differences along one direction. An
evaluation that raises, or disagrees, is one the engine gives up on: the plan takes its loop.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine import route
from opcheck.engine._util import batched_grad, unpack_dual
from opcheck.engine.batching import warm_functorch
from opcheck.runtime.cost.plan import Kind

REPEATS = 3
"""Timed repeats of the forward and the backward (the best counts: the others caught a busy machine)."""
REPEAT_UNDER = 0.01
"""A call that took this many seconds or more is timed once: a busy machine moves a slow call's time by
a small share, and a repeat of it (a kernel in Triton's interpreter: seconds) is what makes estimating
slow."""
SMALL_BATCH = 3
"""Every batched evaluation is first tried on this many rows: whether it works, and its base cost (not
2: a batching rule that confuses the batch with a dimension of size 2 of a sample works there)."""
LARGEST_TIMED = 512
"""Batches up to this many rows are timed at the next power of two at or above their size (the cost
per row of a batching rule is not constant: a cache, a grouped convolution); beyond, extrapolated."""


class Batched:
    """One kind of batched evaluation of the probed function: its seconds by number of rows, timed
    on first use at SMALL_BATCH rows and at the power of two at or above the rows asked for."""

    def __init__(self, run: Callable[[int], Any], device: torch.device | None, small: float):
        self._run, self._device = run, device
        self._times: dict[int, float] = {SMALL_BATCH: small}

    @classmethod
    def probe(
        cls, run: Callable[[int], Any], device: torch.device | None, check: Callable[[Any], bool] | None = None
    ) -> Batched | None:
        """The evaluation when it works on SMALL_BATCH rows (and agrees with `check`), else None."""
        try:
            out, small = timed(lambda: _quiet(lambda: run(SMALL_BATCH)), 2, device)
        except Exception:
            return None
        if check is not None and not check(out):
            return None
        return cls(run, device, small)

    def _time(self, rows: int) -> float:
        if rows not in self._times:
            try:
                _, self._times[rows] = timed(lambda: _quiet(lambda: self._run(rows)), 2, self._device)
            except Exception:  # e.g. out of memory at this size: the smallest batch's rate
                self._times[rows] = self._times[SMALL_BATCH] * rows / SMALL_BATCH
        return self._times[rows]

    def at(self, rows: int, measure: bool = True) -> float:
        """Seconds of one evaluation of `rows` rows; without `measure`, from the sizes timed so far
        (the largest, else the small batch's rate), timing none."""
        small = self._times[SMALL_BATCH]
        if rows <= SMALL_BATCH:
            return small
        size = min(LARGEST_TIMED, 1 << (rows - 1).bit_length())
        if not measure and size not in self._times:
            size = max(self._times)
            if size == SMALL_BATCH:
                return small * rows / SMALL_BATCH
        large = self._time(size)
        per_row = max(0.0, (large - small) / (size - SMALL_BATCH))
        return small + per_row * (rows - SMALL_BATCH)


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(
    f: Callable[[], Any], repeats: int = 1, device: torch.device | None = None, at_least: int = 1
) -> tuple[Any, float]:
    """f's last result and its best seconds over up to `repeats` calls (no more once a call took
    REPEAT_UNDER seconds or more, after `at_least` calls: 2 where the first may pay a warm-up, a Triton
    kernel's first launch, a first rounding mode): the wall clock, or the calling thread's CPU clock
    where less (time the machine gave to other processes is not the call's)."""
    best = float("inf")
    result = None
    for done in range(1, max(1, repeats, at_least) + 1):
        _sync(device)
        wall, cpu = time.perf_counter(), time.thread_time()
        result = f()
        _sync(device)
        elapsed = time.perf_counter() - wall
        if device is None or device.type == "cpu":
            elapsed = min(elapsed, time.thread_time() - cpu)
        best = min(best, elapsed)
        if best >= REPEAT_UNDER and done >= at_least:
            break
    return result, best


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _randn_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    real = torch.randn(t.shape, generator=g, dtype=torch.float64)
    if t.is_complex():
        real = torch.complex(real, torch.randn(t.shape, generator=g, dtype=torch.float64))
    return real.to(dtype=t.dtype, device=t.device)


def _quiet(f: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f()


class Probe:
    """One function at one point, as the engine's check will call it.

    fn(*inputs) is the function (gradgradcheck's first derivative carries a `vmap_form`, the same
    function through torch.func, which the engine vmaps instead). Sizes count as the engine counts
    them: n the elements of the inputs that require grad, m those of the float and complex outputs.
    The batched evaluations are probed on first use (None: it raises, or disagrees with a plain call).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[Any],
        repeats: int = REPEATS,
        masked: bool = False,
        first: bool = False,
    ):
        """`first`: the first probe of its op in the process, whose first call may pay a warm-up
        (its forward and backward are then timed at least twice)."""
        warm()
        self.fn, self.inputs, self.repeats = fn, tuple(inputs), repeats
        self._at_least = 2 if first else 1
        self.diff = [i for i, x in enumerate(self.inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
        # Sparse inputs: the engine checks them through dense stand-ins (the function rebuilds the
        # layout), the numerical columns only at the positions its pattern perturbs, with loops.
        self.layouts = any(self.inputs[j].layout != torch.strided for j in self.diff)
        self.columns = [self.inputs[j].numel() * (2 if self.inputs[j].is_complex() else 1) for j in self.diff]
        self.given_inputs = self.inputs  # as the engine gets them (sparse ones too)
        self.perturbed: dict[int, list[int]] = {}  # a sparse input's dense positions the numerical side moves
        if self.layouts:
            from opcheck.engine.layouts import LayoutInputs

            stand_ins = LayoutInputs(self.inputs, masked)
            self.fn, self.inputs = stand_ins.wrap(fn), stand_ins.inputs
            for k, j in enumerate(self.diff):
                positions = stand_ins.numerical_positions(self.inputs[j])
                if positions is not None:
                    self.columns[k] = max(1, len(positions)) * (2 if self.inputs[j].is_complex() else 1)
                    self.perturbed[j] = positions
        fn = self.fn
        tensors = [x for x in self.inputs if isinstance(x, torch.Tensor)]
        self.device = tensors[0].device if tensors else None
        out, self.forward = timed(lambda: _quiet(lambda: fn(*self.inputs)), repeats, self.device, self._at_least)
        self.func_out = _as_tuple(out)
        self.float_outs = [o for o in self.func_out if _is_float(o)]
        self.outputs = [o for o in self.func_out if isinstance(o, torch.Tensor) and o.requires_grad]
        self.n = sum(self.inputs[j].numel() for j in self.diff)
        self.m = sum(o.numel() for o in self.float_outs)
        self.m_real = sum(o.numel() * (2 if o.is_complex() else 1) for o in self.float_outs)  # as view_as_real
        self.n_inputs, self.n_outputs = len(self.diff), len(self.outputs)
        self.output_sizes = [o.numel() for o in self.outputs]
        self.complex_inputs = any(self.inputs[j].is_complex() for j in self.diff)
        self.complex_outputs = any(o.is_complex() for o in self.float_outs)
        self.backward = self._time_backward()
        self.double_backward_seconds: float | None = None  # one backward through backward's graph, once probed
        self._alone: dict[int, bool] = {}  # vmaps_alone, by input

    @functools.cached_property
    def column_groups(self) -> int:
        """How many groups of columns sharing no row of backward's Jacobian (every input's columns
        side by side) the engine's grouped finite differences perturb (opcheck.engine.auto.grouped),
        as many as route.grouped_differences needs to tell: from backward's rows in one batched
        backward (the plan asks only where the engine's batched backward runs)."""
        from opcheck.engine.auto.grouped import column_groups

        most = route.loop_columns(self.n_inputs) // route.GROUP_WEIGHTINGS + 1
        total = sum(self.output_sizes)
        cotangents, offset = [], 0
        for o in self.outputs:
            v = torch.zeros((total, o.numel()), dtype=o.dtype, device=o.device)
            v[offset : offset + o.numel()].fill_diagonal_(1)
            cotangents.append(v.view(total, *o.shape))
            offset += o.numel()
        grads = self._grad(cotangents, batched=True)
        rows = [
            torch.zeros((total, self.inputs[j].numel())) if g is None else g.detach().reshape(total, -1).cpu()
            for j, g in zip(self.diff, grads)
        ]
        found = column_groups(torch.cat(rows, dim=1) != 0, most)
        return most if found is None else len(found)

    @property
    def backward_raises(self) -> bool:
        """Whether a plain backward of the function raises (an op whose backward, or gradgradcheck's
        double backward, is not implemented or returns a gradient of the wrong shape)."""
        return bool(self.outputs and self.diff) and self.backward is None

    # ------------------------------------------------------------------ always measured
    def cotangents(self, rows: int | None = None) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        if rows is None:
            return [_randn_like(o, g) for o in self.outputs]
        return [torch.stack([_randn_like(o, g) for _ in range(rows)]) for o in self.outputs]

    def _grad(self, cotangents: list[torch.Tensor], batched: bool = False, create_graph: bool = False) -> Any:
        wrt = [self.inputs[j] for j in self.diff]
        if batched and not create_graph:  # as the engine takes its batched backward passes
            return _quiet(lambda: batched_grad(self.outputs, wrt, cotangents))
        return _quiet(
            lambda: torch.autograd.grad(
                self.outputs,
                wrt,
                cotangents,
                retain_graph=True,
                allow_unused=True,
                is_grads_batched=batched,
                create_graph=create_graph,
            )
        )

    def _time_backward(self) -> float | None:
        if not self.outputs or not self.diff:
            return None
        v = self.cotangents()
        try:
            _, seconds = timed(lambda: self._grad(v), self.repeats, self.device, self._at_least)
        except Exception:  # the check will say why; its cost is the forward's
            return None
        return seconds

    # ------------------------------------------------------------- probed on first use
    def _batched_inputs(self, rows: int) -> list[torch.Tensor]:
        return [self.inputs[j].detach().unsqueeze(0).expand(rows, *self.inputs[j].shape).clone() for j in self.diff]

    def _of_diff(self) -> Callable[..., tuple[Any, ...]]:
        form = getattr(self.fn, "vmap_form", self.fn)
        if form is not self.fn:
            warm_functorch("vjp")  # as first_derivative does, where batching is on: before its batches are timed
        base = [x.detach() if isinstance(x, torch.Tensor) else x for x in self.inputs]

        def call(*xs: Any) -> tuple[Any, ...]:
            args = list(base)
            for j, x in zip(self.diff, xs):
                args[j] = x
            return tuple(o for o in _as_tuple(form(*args)) if _is_float(o))

        return call

    @functools.cached_property
    def vmap(self) -> Batched | None:
        """A vmapped forward (finite differences' batches), or None where the engine loops."""
        whole = self.vmap_whole
        if whole is not None and self.complex_outputs:
            # the step-by-step check vmaps their imaginary and real parts (parts.py)
            f = self._of_diff()
            imag = lambda *xs: tuple(o.imag if o.is_complex() else o for o in f(*xs))  # noqa: E731
            try:
                _quiet(lambda: _vmap(imag)(*self._batched_inputs(SMALL_BATCH)))
            except Exception:
                return None
        return whole

    @functools.cached_property
    def vmap_whole(self) -> Batched | None:
        """The vmapped forward with its complex outputs whole, as the fused passes see them (through
        torch.view_as_real), or None; `vmap` also asks that their parts batch."""
        if not self.diff or self.layouts:
            return None
        f = self._of_diff()
        plain = [o.detach() for o in self.float_outs]

        def agrees(outs: Any) -> bool:
            return len(outs) == len(plain) and all(
                o.shape[1:] == p.shape and torch.allclose(o[0], p, rtol=1e-6, atol=1e-9, equal_nan=True)
                for o, p in zip(outs, plain)
            )

        return Batched.probe(lambda rows: _vmap(f)(*self._batched_inputs(rows)), self.device, agrees)

    def vmaps_alone(self, k: int) -> bool:
        """Whether the vmap form batches along the k-th differentiable input alone, the others
        fixed (the step-by-step projections' differences, one input at a time: a first derivative
        whose backward has no batching rule batches along its inputs yet not its grad_outputs)."""
        if k not in self._alone:
            if self.vmap is not None:
                self._alone[k] = True
            else:
                f, j = self._of_diff(), self.diff[k]
                fixed = [self.inputs[i].detach() for i in self.diff]

                def along(x: torch.Tensor) -> tuple[Any, ...]:
                    return f(*(x if i == j else t for i, t in zip(self.diff, fixed)))

                rows = self._batched_inputs(SMALL_BATCH)[k]
                try:
                    _quiet(lambda: _vmap(along)(rows))
                    self._alone[k] = True
                except Exception:
                    self._alone[k] = False
        return self._alone[k]

    @functools.cached_property
    def vmap_jvp(self) -> Batched | None:
        """The fused passes' one call of points and tangents batched (perturbed points with zero
        tangents, and the point with the tangents), as passes.jvps_at_points makes it: dual tensors
        under torch.func.vmap, else torch.func.jvp under it; or None."""
        if not self.diff or self.layouts:
            return None
        f, k = self._of_diff(), len(self.diff)

        def duals(rows: int) -> Any:
            points = self._batched_inputs(rows)
            with fwAD.dual_level():
                outs = _vmap(f)(*(fwAD.make_dual(p, p) for p in points))
                return [_tangent_or_zeros(o) for o in outs]

        def jvps(rows: int) -> Any:
            points = self._batched_inputs(rows)
            return _vmap(lambda *dt: torch.func.jvp(f, dt[:k], dt[k:]))(*points, *points)

        dual = None if hasattr(self.fn, "vmap_form") else Batched.probe(duals, self.device)
        self._dual_jvp_raises = dual is None and not hasattr(self.fn, "vmap_form")
        return dual if dual is not None else Batched.probe(jvps, self.device)

    @property
    def dual_jvp_raises(self) -> bool:
        """Whether dual tensors under torch.func.vmap raise where the function has no vmap form of
        its own (the engine then tries torch.func.jvp under vmap)."""
        _ = self.vmap_jvp
        return self._dual_jvp_raises

    @functools.cached_property
    def vmap_tangents(self) -> Batched | None:
        """torch.func.jvp under torch.func.vmap, the tangents batched at a fixed point (the Jacobian's
        columns J e_k, and the step-by-step projections' J·U), or None."""
        if not self.diff or self.layouts:
            return None
        f = self._of_diff()
        base = tuple(self.inputs[j].detach() for j in self.diff)

        def run(rows: int) -> Any:
            return _vmap(lambda *t: torch.func.jvp(f, base, t))(*self._batched_inputs(rows))

        return Batched.probe(run, self.device)

    @functools.cached_property
    def batched_backward(self) -> Batched | None:
        """A batched backward (is_grads_batched: the VJP rows' batches), or None."""
        if not self.outputs or not self.diff or self.backward is None:
            return None
        return Batched.probe(lambda rows: self._grad(self.cotangents(rows), batched=True), self.device)

    @functools.cached_property
    def jvp(self) -> float | None:
        """Seconds of one forward-mode call (dual inputs), or None where it raises."""
        return self._jvp_probe[0]

    @functools.cached_property
    def jvp_right(self) -> bool:
        """Whether forward AD's J·u agrees with central differences along one random direction (a
        torch.library custom op without forward AD gives no tangent: the engine then turns to backward)."""
        return self._jvp_probe[1]

    @functools.cached_property
    def _jvp_probe(self) -> tuple[float | None, bool]:
        if not self.diff or self.layouts:
            return None, False
        g = torch.Generator().manual_seed(1)
        u = [_randn_like(self.inputs[j], g) for j in self.diff]

        def dual_call() -> list[torch.Tensor | None]:
            with fwAD.dual_level():
                args = list(self.inputs)
                for j, t in zip(self.diff, u):
                    args[j] = fwAD.make_dual(self.inputs[j].detach(), t)
                return [fwAD.unpack_dual(o).tangent for o in _as_tuple(self.fn(*args)) if _is_float(o)]

        try:
            tangents, seconds = timed(lambda: _quiet(dual_call), self.repeats, self.device)
        except Exception:
            return None, False
        if any(t is None for t in tangents):
            return seconds, False
        numerical = self._along(dict(zip(self.diff, u)))
        if numerical is None:
            return seconds, True
        differentiable = [t for t, o in zip(tangents, [o for o in self.func_out if _is_float(o)]) if o.requires_grad]
        return seconds, _agree([t for t in differentiable if t is not None], numerical)

    @functools.cached_property
    def double_backward(self) -> str:
        """How the VJP of the VJP (backward differentiated in its cotangent: J·u) goes: "ok";
        "wrong" (it runs, and disagrees with finite differences along u: a backward that is not
        differentiable yet keeps a graph, as @once_differentiable does); "detached" (backward's result
        does not require grad, which the engine sees at once); or "raises"."""
        if self.backward is None:
            return "raises"
        vs = [v.requires_grad_() for v in self.cotangents()]
        try:
            grads = self._grad(vs, create_graph=True)
        except Exception:
            return "raises"
        used = [(g, j) for g, j in zip(grads, self.diff) if g is not None]
        if not used or not all(g.requires_grad for g, _ in used):
            return "detached"
        gen = torch.Generator().manual_seed(2)
        u = {j: _randn_like(self.inputs[j], gen) for _, j in used}
        try:
            ju, self.double_backward_seconds = timed(
                lambda: _quiet(
                    lambda: torch.autograd.grad(
                        [g for g, _ in used], vs, [u[j] for _, j in used], allow_unused=True, retain_graph=True
                    )
                ),
                2,
                self.device,
            )
        except Exception:
            return "raises"
        if self.complex_inputs or self.complex_outputs:
            return "ok"  # J·u of a complex function is not a directional derivative: not compared
        numerical = self._along({j: u.get(j) for j in self.diff})
        if numerical is None:
            return "ok"
        analytical = [t if t is not None else torch.zeros_like(v) for t, v in zip(ju, vs)]
        return "ok" if _agree(analytical, numerical) else "wrong"

    def _along(self, u: dict[int, torch.Tensor | None], eps: float = 1e-6) -> list[torch.Tensor] | None:
        """Central differences of the differentiable outputs along u (None where they cannot be taken)."""
        with torch.no_grad():
            points = [list(self.inputs), list(self.inputs)]
            for j, d in u.items():
                if d is not None:
                    points[0][j] = self.inputs[j].detach() - eps * d
                    points[1][j] = self.inputs[j].detach() + eps * d
            try:
                lo, hi = (_as_tuple(_quiet(functools.partial(self.fn, *args))) for args in points)
            except Exception:
                return None
        pairs = [(a, b) for a, b, o in zip(lo, hi, self.func_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        return [(b.detach() - a.detach()) / (2 * eps) for a, b in pairs]


def _agree(analytical: Sequence[torch.Tensor], numerical: Sequence[torch.Tensor]) -> bool:
    """Whether a derivative along a direction agrees with its finite differences, as a whole (an
    entry next to a kink moves the norm by little; a missing derivative, all of it)."""
    for a, n in zip(analytical, numerical):
        if a.shape != n.shape:
            return False
        scale = float(n.abs().norm()) if n.numel() else 0.0
        if float((a.detach() - n).abs().norm()) > 1e-2 * scale + 1e-6:
            return False
    return True


@functools.cache
def warm() -> None:
    """A first backward, and torch.func's vmap and jvp, once, before anything is timed: their first
    calls import much of torch (a backward given its cotangents: sympy, 0.3 s; the transforms:
    torch._functorch, as the engine warms them before it times a batch). torch.func.vjp, whose first
    call imports torch._dynamo (over a second), is warmed only where a probe calls it (`_of_diff`:
    gradgradcheck's function in its vmap form): `opcheck capture`'s probe of a new spec's flags never
    does."""
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with contextlib.suppress(Exception), warnings.catch_warnings():  # one that cannot run fails where timed
        warnings.simplefilter("ignore")
        y = torch.sin(x)
        torch.autograd.grad(y, x, torch.ones_like(y))  # given cotangents, as the probes give them
    warm_functorch("jvp")


def _vmap(f: Callable[..., Any]) -> Callable[..., Any]:
    """torch.func.vmap as the engine calls it: a random op inside is retried with one draw per batch."""

    def run(*args: Any) -> Any:
        try:
            return torch.func.vmap(f, randomness="error")(*args)
        except RuntimeError as e:
            if "random operation" not in str(e):
                raise
        return torch.func.vmap(f, randomness="same")(*args)

    return run


def _tangent_or_zeros(o: torch.Tensor) -> torch.Tensor:
    _, tangent = unpack_dual(o)
    return tangent if tangent is not None else torch.zeros_like(o)


def unit_seconds(p: Probe, kind: Kind, rows: int = 1, measure: bool = True) -> float:
    """The seconds of one evaluation of this kind, from the probe's times; without `measure`, from
    the batch sizes timed so far (Batched.at)."""
    forward = p.forward
    backward = p.backward if p.backward is not None else forward
    if kind == Kind.FORWARD:
        return forward
    if kind == Kind.BACKWARD:
        return backward
    if kind == Kind.JVP:
        return p.jvp if p.jvp is not None else 2 * forward
    if kind == Kind.VMAP:
        return p.vmap.at(rows, measure) if p.vmap is not None else rows * forward
    if kind in (Kind.VMAP_JVP, Kind.VMAP_TANGENTS):
        batched = p.vmap_jvp if kind == Kind.VMAP_JVP else p.vmap_tangents
        if batched is not None:
            return batched.at(rows, measure)
        return p.vmap.at(rows, measure) * 2 if p.vmap is not None else rows * 2 * forward
    if kind == Kind.BATCHED_BACKWARD:
        return p.batched_backward.at(rows, measure) if p.batched_backward is not None else rows * backward
    # a backward through backward's graph, batched over `rows` cotangents (a batch costs less per row)
    once = p.double_backward_seconds if p.double_backward != "raises" else None
    return (once if once is not None else 2 * backward + forward) * (1 + (rows - 1) / 4)
