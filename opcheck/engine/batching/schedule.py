"""How a batched kind's columns are cut into calls: chunk sizes, a growing schedule, one-hot rows."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from opcheck.engine.batching.settings import PILOT_COLUMNS


def chunk_columns(n: int, per_column_elems: int, itemsize: int, memory_budget: int) -> int:
    """How many of n columns fit one call when each takes per_column_elems elements of itemsize bytes."""
    per_column = max(1, per_column_elems) * max(1, itemsize)
    return int(max(1, min(n, memory_budget // per_column)))


class Schedule:
    """The batches of a batched kind: (start, stop, timed) for each.

    Beyond 8 * PILOT_COLUMNS columns the first is a pilot of PILOT_COLUMNS; after each timed batch
    the next grows by the factor its columns undercut the loop's (at most 8-fold), until `chunk`.
    A batching rule whose cost per column grows with the batch (linearly: diagonal_scatter's VJP
    costs 0.3 ms a row at 8 rows, 2.7 ms at 64, 42 ms at 1000) then never runs a batch whose
    columns cost more than the loop's, and one that does not reaches `chunk` in a few steps.
    """

    def __init__(self, total: int, chunk: int, pilot: bool = True):
        self.total, self.chunk, self.start = total, chunk, 0
        self.size = min(chunk, PILOT_COLUMNS) if pilot and total > 8 * PILOT_COLUMNS else chunk
        self.per_column: float | None = None  # the latest batch's, for measured_alone

    def __iter__(self) -> Iterator[tuple[int, int, bool]]:
        while self.start < self.total:
            stop = min(self.total, self.start + self.size)
            yield self.start, stop, self.start == 0 or self.size < self.chunk
            self.start = stop

    def measured(self, batched_per_column: float, plain_per_column: float) -> None:
        factor = 8.0 if batched_per_column <= 0 else min(8.0, plain_per_column / batched_per_column)
        self.size = min(self.chunk, max(self.size, int(self.size * factor * (1 + 1e-9))))

    def measured_alone(self, batched_per_column: float) -> None:
        """After a timed batch, where no plain call was timed to compare with (a fused pass probes
        with the call it already has): the next batch grows eightfold while a column costs no more
        than in the batch before (within a quarter), and stays as it is once it does."""
        before, self.per_column = self.per_column, batched_per_column
        if before is None or batched_per_column <= 1.25 * before:
            self.size = min(self.chunk, self.size * 8)


class OneHotRows:
    """Chunks of rows of the n×n identity from one buffer, for a loop over the rows of a wide output.

    A fresh `torch.zeros(b, n)` per chunk costs more than the batched backward it feeds once n is
    large (allocating, zeroing and freeing b·n entries each time: 40 of 97 s for a 73,568-element
    output in 56-row chunks); here only the ones move. A chunk's rows are valid until the next
    `take`, so the caller consumes (copies or reduces) what it computed from them first.
    """

    def __init__(self, n: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        self.n, self.like, self.dtype = n, like, dtype or like.dtype
        self._buffer: torch.Tensor | None = None
        self._ones: tuple[torch.Tensor, torch.Tensor] | None = None

    def take(self, b: int, start: int) -> torch.Tensor:
        """Rows e_start ... e_(start+b-1) (rows past n stay zero), as a (b, n) view of the buffer."""
        device = self.like.device
        if self._buffer is None or self._buffer.shape[0] < b:
            self._buffer, self._ones = torch.zeros(b, self.n, dtype=self.dtype, device=device), None
        buffer = self._buffer
        if self._ones is not None:
            buffer[self._ones] = 0.0
        k = min(b, self.n - start)
        self._ones = (torch.arange(k, device=device), torch.arange(start, start + k, device=device))
        buffer[self._ones] = 1.0
        return buffer[:b]


def one_hot_rows(b: int, n: int, start: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rows e_start ... e_(start+b-1) of the n×n identity (rows past n stay zero)."""
    rows = torch.zeros(b, n, dtype=dtype or like.dtype, device=like.device)
    k = min(b, n - start)
    rows[torch.arange(k, device=like.device), torch.arange(start, start + k, device=like.device)] = 1.0
    return rows
