"""How the checks started in the current context batch: on or off, the adaptive rule's clock, sizes.

The switches are context variables, so a check sees those of the code that started it, and
concurrent checks (threads, tasks) never see each other's.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

DEFAULT_MEMORY_BUDGET = 64 * 2**20
"""Bytes the batched tensors of one chunk may take (perturbed inputs and outputs, or cotangents and
gradients). Larger chunks mean fewer calls; beyond a few MiB, allocation costs more than calls save."""

MIN_BATCH_COLUMNS = 8
"""Below this many columns the plain loop is cheaper than a vmapped call plus its probe."""
FUSED_MIN_COLUMNS = 3
"""A fused pass's finite differences (no plain probe call: the unperturbed row is checked against
the outputs already computed) take one vmapped call from this many columns on, and loop below:
on torch.sin (torch 2.13, CPU) the loop's two plain calls per column cost less than a vmapped
call at 2 columns, about the same at 3, more from 4 on; an op of many kernels costs the loop more."""
PILOT_COLUMNS = 8
"""The first batch of a batched kind has at most this many columns: it is timed against a plain
call, and where batching costs more per column (an op whose batching rule loops inside, at tens
of milliseconds a row) the loop takes over after this little, not after a whole large batch."""

FUSE_MAX_COLUMNS = 128
"""Up to this many columns in all, every input's columns share one vmapped call: the call's
overhead is what counts. Beyond, each input gets its own call, with the other inputs left
unbatched: batching rules with several batched inputs (conv weights, matmul) cost more compute."""

Clock = Callable[[], float]
"""Seconds from an arbitrary origin, like time.perf_counter."""

_BATCHING: ContextVar[bool] = ContextVar("opcheck_vmap_batching", default=True)
_CLOCK: ContextVar[Clock | None] = ContextVar("opcheck_batching_clock", default=None)


def cost_seconds(wall: float, cpu: float | None) -> float:
    """What a timed call cost the adaptive rule: its wall seconds, or its CPU seconds by
    cpu_clock where fewer (None: that clock is not to be trusted now, wall seconds alone).

    On a loaded machine a call loses the CPU to other processes midway (a time slice is a few
    milliseconds, about what a batched call takes), and of the two calls a decision compares, the
    longer, batched one is the likelier to: timed by the wall clock, three processes on two cores
    made conv2d's batched VJP look 2-4x dearer per column than the loop, cheaper by CPU time. CPU
    time leaves out time off the CPU; it adds up every thread of a parallel kernel, where the wall
    clock is the smaller.
    """
    return wall if cpu is None else min(wall, cpu)


def cpu_clock() -> Clock | None:
    """The CPU clock a call timed now is read by (the process's or the calling thread's), or None
    for wall seconds alone.

    None while an accelerator is in use (the host's CPU time does not see a device's work) and on
    Windows, which counts CPU time in 15.6 ms scheduler ticks. While a CPU timer of the process is
    armed (``setitimer(ITIMER_PROF)`` or ``ITIMER_VIRTUAL``: a profiler's, or a harness's time
    limit), Linux too reads the process's CPU clock in 4 ms ticks, and a plain call of 1 ms read
    0 s, so that the loop took over from a batch 13x cheaper: the calling thread's CPU clock, which
    stays exact, stands in where torch runs on one thread; with more, wall seconds (the thread's
    clock would leave out the other threads' share of a parallel kernel).
    """
    if accelerator_in_use() or sys.platform == "win32":
        return None
    if not _process_cpu_timer_armed():
        return time.process_time
    return time.thread_time if torch.get_num_threads() == 1 else None


def _process_cpu_timer_armed() -> bool:
    return any(any(signal.getitimer(which)) for which in (signal.ITIMER_PROF, signal.ITIMER_VIRTUAL))


def accelerator_in_use() -> bool:
    """Whether this process has started a CUDA (or ROCm) or XPU context, or runs where MPS is."""
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return True
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_initialized():
        return True
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def batching_enabled() -> bool:
    """Whether the checks started now may batch (see vmap_batching)."""
    return _BATCHING.get()


@contextlib.contextmanager
def vmap_batching(enabled: bool) -> Iterator[None]:
    """Turn vmapped evaluation on or off for the checks run inside (the loop is torch's algorithm)."""
    token = _BATCHING.set(enabled)
    try:
        yield
    finally:
        _BATCHING.reset(token)


def adaptive_clock() -> Clock | None:
    """The clock the adaptive rule of a check started now reads (see batching_clock); None: the
    wall and CPU clocks, as cost_seconds combines them."""
    return _CLOCK.get()


@contextlib.contextmanager
def batching_clock(clock: Clock | None) -> Iterator[None]:
    """Time the adaptive rule with `clock` instead of cost_seconds's clocks in the checks run inside.

    The rule reads the clock in pairs, around the two calls each of its decisions compares: first a
    batched call of b columns, then the plain call of one column that probes it (a batched call
    that raises is compared with nothing). So a clock that advances by the same step at every
    reading never finds batching slower, and one that makes the first of every two spans long
    finds it slower each time: either decision can be pinned, whatever the machine's load.
    Verdicts never depend on the clock; only the path taken to them and the counts in EvalStats do.
    """
    token = _CLOCK.set(clock)
    try:
        yield
    finally:
        _CLOCK.reset(token)
