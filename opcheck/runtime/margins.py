"""A passing test's margin: the worst error / allowed of the comparisons it made, on its report.

The gradient checks' comparisons feed the engine's recorder (opcheck.engine.margins says which);
a low-precision test feeds it the worst of its compared parts (each part's max error / allowed,
opcheck.engine.lowprec). The runtime opens one recorder per draw of a sample, so a pass after a
re-draw reports the passing draw's calls alone, and a passing test puts its worst margin on its
report's user_properties under MARGIN_PROPERTY as `<ratio> <where>` (a string: pytest-xdist and
opcheck's process isolation carry it to the controller, and JUnit XML writes it as a property),
where `--opcheck-results` records it and `--opcheck-margin` lists the closest passes.

Importing this module imports no torch: the plugin and the results readers use margin_of.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opcheck.engine.lowprec import LowPrecisionReport
    from opcheck.engine.margins import Margin

__all__ = ["MARGIN_PROPERTY", "announce_margin", "margin_of", "note_lowprec_margin", "parse_margin"]

MARGIN_PROPERTY = "opcheck_margin"


def note_lowprec_margin(report: LowPrecisionReport) -> None:
    """A passing low-precision report's parts (each its max error / allowed), for the open recorder."""
    from opcheck.engine.margins import current_recorder

    recorder = current_recorder()
    if recorder is None:
        return
    for part in report.parts:
        recorder.note(part.max_ratio, functools.partial(str, part.what))


def announce_margin(margin: Margin | None) -> None:
    """Put a passing test's worst margin on its report (nothing outside pytest, or without comparisons)."""
    from opcheck.runtime.context import current_item

    item = current_item.get()
    if item is None or margin is None:
        return
    item.user_properties.append((MARGIN_PROPERTY, f"{margin.ratio:.4g} {margin.where}"))


def parse_margin(value: object) -> tuple[float, str] | None:
    """(ratio, where) from a MARGIN_PROPERTY value; None for anything else."""
    ratio, _, where = str(value).partition(" ")
    try:
        number = float(ratio)
    except ValueError:
        return None
    return (number, where) if number >= 0 else None


def margin_of(user_properties: Iterable[Any]) -> tuple[float, str] | None:
    """(ratio, where) of the margin a test's report carries, or None (a failure, a skip, a check
    without comparisons)."""
    for entry in user_properties or ():
        if isinstance(entry, (tuple, list)) and len(entry) == 2 and entry[0] == MARGIN_PROPERTY:
            return parse_margin(entry[1])
    return None
