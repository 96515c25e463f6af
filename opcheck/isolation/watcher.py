"""Watching a test process from outside: which test it runs, since when, and ending it when that test
runs past its time budget by more than a grace period (code that never returns to Python ignores
the budget's own interrupt). Used by the supervisor of a serial run and by the xdist controller.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opcheck.isolation.crash import BudgetKill
from opcheck.isolation.progress import Progress

ABORT_WAIT = 5.0
"""Seconds between SIGABRT (faulthandler writes the stack, then the process dies) and SIGKILL."""


def grace(budget: float) -> float:
    """Seconds a test may run past its budget before its process is ended: the interrupt normally
    ends it within milliseconds, and one call of the op that is already running must be able to finish."""
    return 5.0 + 0.1 * budget


@dataclass
class Watcher:
    """The progress of one test process, read from its log as it grows."""

    log: Path
    pid: int | None = None
    progress: Progress = field(default_factory=lambda: Progress(with_reports=False))
    running: str | None = None
    running_since: float = 0.0  # time.monotonic() when this watcher first saw the test start
    budget: float = 0.0
    killed: BudgetKill | None = None
    _abort_sent: float | None = None

    def poll(self, now: float | None = None, kill: Callable[[int, int], None] = os.kill) -> None:
        """Read the log's new lines; end the process when its test is past budget + grace."""
        now = time.monotonic() if now is None else now
        self.progress.update(self.log)
        if self.pid is None:
            self.pid = self.progress.pid
        if self.progress.running != self.running:
            self.running, self.running_since, self.budget = self.progress.running, now, self.progress.running_budget
            return
        if self.running is None or self.budget <= 0 or self.pid is None:
            return
        elapsed = now - self.running_since
        if self.killed is None and elapsed > self.budget + grace(self.budget):
            self.killed = BudgetKill(self.budget, elapsed)
            self._abort_sent = now
            _signal(kill, self.pid, getattr(signal, "SIGABRT", signal.SIGTERM))
        elif self._abort_sent is not None and now - self._abort_sent > ABORT_WAIT:
            self._abort_sent = None
            _signal(kill, self.pid, getattr(signal, "SIGKILL", signal.SIGTERM))

    def elapsed(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return now - self.running_since if self.running is not None else 0.0


def _signal(kill: Callable[[int, int], None], pid: int, signum: int) -> None:
    try:
        kill(pid, signum)
    except (ProcessLookupError, PermissionError, OSError):
        pass
