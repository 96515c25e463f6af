"""`pytest --opcheck-margin FRACTION`: the passing tests that came within FRACTION of their bound.

A passing gradient check or low-precision test carries its margin on its report (the worst error /
allowed among its comparisons, and which comparison: opcheck.runtime.margins). With the option,
the end of the run lists every passing test whose margin is at least FRACTION, closest first: a
pass at 0.97 of its bound is one rounding change away from a failure. The reports are read where
pytest's terminal summary is written (the xdist controller, the supervised child that replays the
earlier ones), so the list covers the whole run. opcheck.plugins.settings adds the option; this
plugin's pytest_configure registers the list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from opcheck.runtime.margins import margin_of

MARGIN_PLUGIN = "opcheck-margins"
OPTION = "--opcheck-margin"


def add_option(group) -> None:
    """The option, in the plugin's option group."""
    group.addoption(
        OPTION,
        default=None,
        metavar="FRACTION",
        help="at the end of the run, list the passing gradient-check and low-precision tests whose worst "
        "comparison came within FRACTION of its bound (error / allowed >= FRACTION; a number in (0, 1], "
        "e.g. 0.5), closest first",
    )


def parse_fraction(raw: str) -> float:
    """A fraction of the bound in (0, 1]; anything else is a usage error that says what was given."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise pytest.UsageError(
            f"{OPTION}: expected a fraction of the bound greater than 0 and at most 1 (e.g. 0.5), got {raw!r}"
        )
    return value


def pytest_configure(config: pytest.Config) -> None:
    configure(config)


def configure(config: pytest.Config) -> None:
    """Register the list when the option is given (not in an xdist worker: its controller lists)."""
    raw = config.getoption("opcheck_margin", None)
    if raw is None:
        return
    fraction = parse_fraction(raw)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(CloseCalls(fraction), MARGIN_PLUGIN)


@dataclass(frozen=True)
class CloseCall:
    nodeid: str
    ratio: float
    where: str


class CloseCalls:
    """A pytest plugin object: collects the passing tests at or above the fraction, lists them at the end."""

    def __init__(self, fraction: float):
        self.fraction = fraction
        self.found: dict[str, CloseCall] = {}

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call" or not report.passed:
            return
        margin = margin_of(getattr(report, "user_properties", ()))
        if margin is not None and margin[0] >= self.fraction:
            self.found[report.nodeid] = CloseCall(report.nodeid, *margin)

    def lines(self) -> list[str]:
        """One line per close pass, closest first: `0.97  <node id>: <comparison>`."""
        ordered = sorted(self.found.values(), key=lambda c: (-c.ratio, c.nodeid))
        return [f"{c.ratio:.2g}  {c.nodeid}" + (f": {c.where}" if c.where else "") for c in ordered]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.lines()
        n = len(lines)
        title = (
            f"opcheck: {n} passing test{'s' if n != 1 else ''} at {self.fraction:g} of the bound or closer "
            "(error / allowed of the worst comparison)"
        )
        terminalreporter.write_sep("-", title)
        for line in lines:
            terminalreporter.write_line(line)
