"""Clocks a test hands the engine (batching_clock) to pin a decision that it makes by timing."""

from __future__ import annotations


class Spans:
    """Readings that, taken in pairs, span `first` seconds, then `second`, then `first`, ...: the two
    timed calls a decision compares, in the order the engine makes them."""

    def __init__(self, first: float, second: float):
        self.spans, self.now, self.readings = (first, second), 0.0, 0

    def __call__(self) -> float:
        if self.readings % 2:
            self.now += self.spans[(self.readings // 2) % 2]
        self.readings += 1
        return self.now
