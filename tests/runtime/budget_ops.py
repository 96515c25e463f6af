"""Ops that take their time, for the time-budget tests (`budget_ops:name`)."""

from __future__ import annotations

import signal
import time

import torch

SEEN: dict[str, object] = {}


def sleeps(x: torch.Tensor) -> torch.Tensor:
    time.sleep(30)
    return x * 2


def loops(x: torch.Tensor) -> torch.Tensor:
    end = time.monotonic() + 30
    n = 0
    while time.monotonic() < end:
        n += 1
    return x * 2


def swallows(x: torch.Tensor) -> torch.Tensor:
    """Catches every Exception while it sleeps: the budget's interrupt is not one."""
    for _ in range(300):
        try:
            time.sleep(0.1)
        except Exception:
            pass
    return x * 2


def slow_calls(x: torch.Tensor) -> torch.Tensor:
    """50 ms a call, and one call per perturbation: `.item()` cannot be vmapped, so the engine loops."""
    time.sleep(0.05)
    return x * 2 + 0 * x.sum().item()


def watches_alarm(x: torch.Tensor) -> torch.Tensor:
    """Records SIGALRM's handler and timer while a budgeted check runs (pytest-timeout's signal method)."""
    SEEN["handler"] = signal.getsignal(signal.SIGALRM)
    SEEN["timer"] = signal.getitimer(signal.ITIMER_REAL)
    return x * 2


def imports_slowly(x: torch.Tensor) -> torch.Tensor:
    """Imports SEEN["module"] (whose import takes a second), then loops."""
    import importlib

    importlib.import_module(str(SEEN["module"]))
    return loops(x)


class _SlowBackward(torch.autograd.Function):
    """A quick forward and a backward that takes SEEN["backward_seconds"] (60 ms unless set)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        time.sleep(float(SEEN.get("backward_seconds", 0.06)))  # type: ignore[arg-type]
        return g * 2


def slow_backward(x: torch.Tensor) -> torch.Tensor:
    """A kernel whose time is in its backward (no vmap rule: the engine loops over VJP rows)."""
    return _SlowBackward.apply(x) + 0 * x.sum().item()
