"""Run settings (policy, budget, plot folder, threads) and the pytest item a check runs under.

The plugin builds one `Settings` per pytest session from its options and, around each test call,
sets `current_item` so that a failure can quote the item's real node id and attach notes to its
report. Outside pytest (or with the plugin disabled) the settings come from the environment.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from dataclasses import dataclass, field

# DEFAULT_JACOBIAN_BUDGET: Jacobian entries (sum over input/output pairs of numel_in * numel_out)
# up to which fast_mode "auto" lets the full Jacobian decide a check that its entrywise projection
# checks (opcheck.engine.auto.stepwise; from 128 input and output elements on) do not pass, and beyond
# which the projections' verdict stands. The engine owns the value (2**20), so that a generated
# test and a direct opcheck.gradcheck(fast_mode="auto") call agree; the runtime re-exports it.
# Measured with the batched engine on 1 CPU thread (2-core x86, torch 2.13): 2**20 entries cost
# 38 ms (sin 32x32), 59 ms (softmax 32x32), 78 ms (cumsum 32x32) for gradcheck and 30-50 ms at
# 2**19-2**20.6 for gradgradcheck; the cost grows linearly (2**22: ~0.2-0.35 s, 2**24: ~1.4-1.8 s),
# while fast mode stays at 1-2 ms. 2**20 keeps every full check under ~0.1 s and covers a 32x32
# elementwise op, the size where torch's fast mode starts missing single-entry bugs.
from opcheck.engine import DEFAULT_JACOBIAN_BUDGET

BUDGET_ENV = "OPCHECK_JACOBIAN_BUDGET"
UNAVAILABLE_ENV = "OPCHECK_UNAVAILABLE_DEVICES"
POLICIES = ("auto", "full", "fast")


@dataclass(frozen=True)
class Settings:
    """What the command line (or the environment) says about every check of a run.

    policy: None keeps each spec's `gradcheck.fast_mode`; "auto"/"full"/"fast" override it.
    threads: torch's intra-op thread count while a generated test runs; None keeps torch's own.
    """

    policy: str | None = None
    budget: int = DEFAULT_JACOBIAN_BUDGET
    budget_source: str = "default"
    plot_dir: str | None = None
    threads: int | None = None

    @classmethod
    def from_env(cls) -> Settings:
        raw = os.environ.get(BUDGET_ENV)
        if raw:
            return cls(budget=parse_budget(raw, where=BUDGET_ENV), budget_source=BUDGET_ENV)
        return cls()


def parse_budget(raw: str, *, where: str) -> int:
    """A positive entry count: `1048576`, `2**20`, `1e6`, `4M`, `512k`."""
    text = str(raw).strip().lower().replace("_", "")
    scale = 1
    if text.endswith(("k", "m", "g")):
        scale = {"k": 2**10, "m": 2**20, "g": 2**30}[text[-1]]
        text = text[:-1]
    try:
        if "**" in text:
            base, exp = text.split("**", 1)
            value = int(base) ** int(exp)
        else:
            value = float(text)
            if value != int(value):
                raise ValueError
            value = int(value)
    except ValueError:
        raise ValueError(
            f"{where}: expected a positive number of Jacobian entries (e.g. 1048576, 2**20, 1M), got {raw!r}"
        ) from None
    value *= scale
    if value <= 0:
        raise ValueError(f"{where}: expected a positive number of Jacobian entries, got {raw!r}")
    return value


@dataclass
class ItemContext:
    """The pytest item a check runs under, as the plugin sees it."""

    nodeid: str
    rerun: str  # a shell command that reruns only this item
    settings: Settings
    user_properties: list = field(default_factory=list)
    add_report_section: Callable[[str, str, str], None] | None = None


current_item: contextvars.ContextVar[ItemContext | None] = contextvars.ContextVar("opcheck_item", default=None)


def current_settings() -> Settings:
    item = current_item.get()
    return item.settings if item is not None else Settings.from_env()
