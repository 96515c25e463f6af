"""How the checks started in the current context batch: on or off, the adaptive rule's clock, sizes.

The switches are context variables, so a check sees those of the code that started it, and
concurrent checks (threads, tasks) never see each other's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

DEFAULT_MEMORY_BUDGET = 64 * 2**20
"""Bytes the batched tensors of one chunk may take (perturbed inputs and outputs, or cotangents and
gradients). Larger chunks mean fewer calls; beyond a few MiB, allocation costs more than calls save."""

MIN_BATCH_COLUMNS = 8
"""Below this many columns the plain loop is cheaper than a vmapped call plus its probe."""
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
_CLOCK: ContextVar[Clock] = ContextVar("opcheck_batching_clock", default=time.perf_counter)


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


def adaptive_clock() -> Clock:
    """The clock the adaptive rule of a check started now reads (see batching_clock)."""
    return _CLOCK.get()


@contextlib.contextmanager
def batching_clock(clock: Clock) -> Iterator[None]:
    """Time the adaptive rule with `clock` instead of time.perf_counter in the checks run inside.

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
