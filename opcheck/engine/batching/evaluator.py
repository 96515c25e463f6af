"""The per-call evaluator: which kinds of batching are still on, the adaptive rule, and the counters.

Every strategy (finite_differences, fd_columns, vjp_rows, jvp_columns) evaluates through one
Evaluator: plain calls are counted and cloned here, vmapped ones go through its `vmap`, and a kind
of batching that raises, disagrees with its probe or costs more than the loop is turned off here
for the rest of the call.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from typing import Any, Literal, TypeVar

import torch

from opcheck._records import record
from opcheck.engine._util import Func, as_tuple, autograd_grad, batched_grad, legacy_vmap, vmap_rows
from opcheck.engine.batching.agreement import Disagreement
from opcheck.engine.batching.schedule import Schedule, chunk_columns
from opcheck.engine.batching.settings import DEFAULT_MEMORY_BUDGET, Clock, cost_seconds, cpu_clock

BatchingKind = Literal["forward", "vjp", "jvp_func", "jvp"]
"""A kind of batching: forward evaluation (finite differences), VJP rows (is_grads_batched), JVP
columns through torch.func.jvp under torch.func.vmap ("jvp_func") or make_dual under the legacy
vmap ("jvp")."""

T = TypeVar("T")


_WARM: set[str] = set()


def warm_functorch(transform: Literal["vjp", "jvp"]) -> None:
    """Call torch.func's vjp or jvp once in this process, before anything is timed.

    Their first call imports much of torch._functorch and sympy (1.5 s for vjp, 0.13 s for jvp in
    torch 2.13). Charged to a pilot batch, that made batching look a hundred times slower than the
    loop, and the first check of a process ran its loop for the rest of the call.
    """
    if transform in _WARM:
        return
    _WARM.add(transform)
    z = torch.zeros(2, 1, dtype=torch.float64)  # under vmap, as the batches call them
    try:
        with warnings.catch_warnings():  # what torch's modules warn of as they import, as in a batch
            warnings.simplefilter("ignore")
            if transform == "vjp":
                torch.func.vmap(lambda a: torch.func.vjp(torch.sin, a)[1](a)[0])(z)
            else:
                torch.func.vmap(lambda a: torch.func.jvp(torch.sin, (a,), (a,))[1])(z)
    except Exception:  # noqa: BLE001 - a torch.func that cannot run here fails in the batch, which falls back
        pass


class SlowerThanLoop(Exception):
    """The pilot batch cost more per column than the loop (already recorded): the loop takes over."""


@record(frozen=False)
class EvalStats:
    """What one check call evaluated, for benchmarks and tests."""

    calls: int = 0  # function evaluations, a batched call counting once
    batched_calls: int = 0
    vjp_calls: int = 0
    batched_vjp_calls: int = 0
    jvp_calls: int = 0
    batched_jvp_calls: int = 0
    fallbacks: list[str] = field(default_factory=list)
    auto_paths: list[str] = field(default_factory=list)  # fast_mode="auto": "full" or "projected (...)" per comparison
    # fast_mode="auto": the comparison that found a mismatch whose block was then recomputed in full
    # (the report's mismatch is that block, so only this says which comparison it was)
    failed_path: str | None = None
    fused: bool = False  # fast_mode="auto" or False: a fused pass (auto/fused.py) passed every check of the call
    # numerical rows near the tolerance, recomputed by plain calls (evaluation/numerical.py): what
    # the values decide, not the sizes
    settled_rows: int = 0
    # batched results that disagreed with a plain call, each handing its work to plain calls: what
    # the values decide too
    disagreements: int = 0


class Evaluator:
    """Per-call batching policy and counters.

    `batch=False` forces the loop everywhere. Once a kind of batching (forward evaluation, VJP,
    JVP) fails, or costs more per column than the loop as timed by `clock` (None: cost_seconds), it
    stays off for the rest of the call.
    """

    def __init__(
        self,
        batch: bool = True,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        adaptive: bool = True,
        clock: Clock | None = None,
    ):
        self.batch_forward = batch
        self.batch_vjp = batch
        self.batch_jvp_func = batch  # torch.func.jvp under torch.func.vmap (wider batching rules)
        self.batch_jvp = batch and legacy_vmap is not None  # make_dual under the legacy vmap
        self.memory_budget = memory_budget
        self.adaptive = adaptive  # drop a kind of batching that turns out slower than the loop
        self.clock = clock
        self.randomness = "error"  # torch.func.vmap's randomness mode; see vmap
        # The finite differences' probe: a perturbed row checked by a plain call (and timed for the
        # adaptive rule), or, when True, the unperturbed row checked against the outputs the caller
        # already has (no call; see auto/fused.py).
        self.center_probe = False
        # JVP columns: the legacy vmap (torch's batched forward-AD check's own machinery) before
        # torch.func's, and which of them (or "loop") the latest jvp_columns call used.
        self.legacy_jvp_first = False
        self.jvp_kind_used: BatchingKind | Literal["loop"] | None = None
        self.numerical_batched = False  # whether the latest numerical_columns call was vmapped
        # The most columns numerical_columns may compute one plain call pair at a time when they
        # cannot be batched (None: any); beyond, it raises LoopOverBudget (a fused pass sets it: a
        # cheaper check than the loop exists there).
        self.loop_columns: int | None = None
        # Seconds per row of the latest timed legacy batched backward (auto/fused_projected.py
        # weighs backward's rows against the finite differences of every column with it).
        self.backward_row_seconds: float | None = None
        # How far its vmapped rows were from the plain calls that probed them, in ulps of the
        # outputs' scale (agreement.ulps_apart): what settle_rows expects the other rows to be off by.
        self.numerical_ulps = 0.0
        self.stats = EvalStats()
        # Outputs whose batched VJP already matched the plain one, with the batches it used: the
        # reentrancy pass repeats them (kernels for other batch sizes may round otherwise).
        self.vjp_batches: list[tuple[torch.Tensor, list[tuple[int, int]]]] = []

    # ------------------------------------------------------------------ policy
    def batches(self, kind: BatchingKind) -> bool:
        """Whether this kind of batching is still on."""
        return {
            "forward": self.batch_forward,
            "vjp": self.batch_vjp,
            "jvp_func": self.batch_jvp_func,
            "jvp": self.batch_jvp,
        }[kind]

    def stop(self, *kinds: BatchingKind) -> None:
        """Turn these kinds of batching off for the rest of the call."""
        for kind in kinds:
            if kind == "forward":
                self.batch_forward = False
            elif kind == "vjp":
                self.batch_vjp = False
            elif kind == "jvp_func":
                self.batch_jvp_func = False
            else:
                self.batch_jvp = False

    def give_up(self, kind: BatchingKind, why: BaseException | str) -> None:
        """Turn a kind of batching off, recording why (the loop decides from now on)."""
        self.stop(kind)
        if isinstance(why, SlowerThanLoop):
            return  # recorded by keep_if_cheaper
        self.stats.disagreements += isinstance(why, Disagreement)
        text = why if isinstance(why, str) else f"{type(why).__name__}: {str(why).splitlines()[0] if str(why) else ''}"
        self.stats.fallbacks.append(f"{kind}: {text}")

    @contextlib.contextmanager
    def fused_pass(self, legacy_jvp_first: bool = False) -> Iterator[None]:
        """Inside a fused pass (auto/fused.py): the finite differences' probe is the unperturbed row, and
        JVP columns may come from the legacy vmap first."""
        self.center_probe, self.legacy_jvp_first = True, legacy_jvp_first
        try:
            yield
        finally:
            self.center_probe = self.legacy_jvp_first = False

    def chunk(self, n: int, per_column_elems: int, itemsize: int) -> int:
        """How many of n columns one call may take within the memory budget."""
        return chunk_columns(n, per_column_elems, itemsize, self.memory_budget)

    # ---------------------------------------------------------- adaptive rule
    def keep_if_cheaper(self, kind: BatchingKind, batched_per_column: float, plain_per_column: float) -> bool:
        """Stop batching this kind for the rest of the call when it costs more than the loop.

        Some ops have no batching rule and run under vmap's slow per-example fallback; the probe
        just timed one plain column, so the comparison is free.
        """
        if self.adaptive and batched_per_column > plain_per_column:
            self.give_up(
                kind,
                f"slower than the loop ({batched_per_column * 1e6:.0f} us vs "
                f"{plain_per_column * 1e6:.0f} us per column)",
            )
            return False
        return True

    def judge_batch(
        self, kind: BatchingKind, schedule: Schedule, batched_per_column: float, plain_per_column: float, more: bool
    ) -> None:
        """After a timed batch: the loop takes over the rest of the columns when batching costs more,
        and otherwise the next batch grows by the factor this one undercut the loop."""
        if not self.keep_if_cheaper(kind, batched_per_column, plain_per_column) and more:
            raise SlowerThanLoop(kind)
        schedule.measured(batched_per_column, plain_per_column)

    def timed(self, f: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
        """f's result and the seconds it took by this evaluator's clock (or cost_seconds)."""
        if self.clock is not None:
            start = self.clock()
            try:
                result = f(*args, **kwargs)
            finally:  # read even when f raises: the clock sees its readings in pairs (see batching_clock)
                stop = self.clock()
            return result, stop - start
        clock = cpu_clock()
        wall, cpu = time.perf_counter(), clock() if clock else 0.0
        result = f(*args, **kwargs)
        return result, cost_seconds(time.perf_counter() - wall, clock() - cpu if clock else None)

    # ------------------------------------------------------------ evaluations
    def vmap(self, f: Func, *args: Any) -> Any:
        """torch.func.vmap(f)(*args) (_util.vmap_rows); a random op inside is retried with one draw for the whole batch.

        That draw is what a plain call gets when the function seeds its generator (as OpInfo's
        dropout samples do); when it is not, the probe sees the plain call differ and the loop takes
        over.
        """
        try:
            return vmap_rows(f, args, self.randomness)
        except RuntimeError as e:
            if self.randomness != "error" or "random operation" not in str(e):
                raise
        self.randomness = "same"
        return vmap_rows(f, args, "same")

    def call_cloned(self, fn: Func, inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        """One plain call of fn, counted, its outputs cloned (the inputs are perturbed in place next)."""
        self.stats.calls += 1
        return tuple(a.clone() for a in as_tuple(fn(*inputs)))

    def vjp(
        self,
        output: torch.Tensor,
        diff_inputs: Sequence[torch.Tensor],
        grad_output: torch.Tensor,
        batched: bool = False,
    ) -> tuple[torch.Tensor | None, ...]:
        """One backward pass, counted: grad_output's leading dimension is the batch when `batched`.

        Backward gets its own copy of grad_output: a kernel may write into the gradient it is
        handed (a rope backward rotating it in place), and the caller reuses grad_output."""
        if batched:
            self.stats.batched_vjp_calls += 1
        else:
            self.stats.vjp_calls += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if batched:
                return batched_grad((output,), diff_inputs, (grad_output.clone(),))
            grads = autograd_grad((output,), diff_inputs, (grad_output.clone(),), retain_graph=True)
        return tuple(grads)


def untimed(f: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """f's result and no time: Evaluator.timed's stand-in where nothing is compared."""
    return f(*args, **kwargs), 0.0
