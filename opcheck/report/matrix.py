"""The coverage matrix: one row per (op, check, dtype), one column per device, each cell counting
the outcomes of that row's samples on that device.

Every decision the renderers need (order, a cell's status and text, note numbers) is made here,
so that the Markdown and the HTML say the same thing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from opcheck.report.results import ERROR, FAILED, OUTCOMES, PASSED, PASSES, SKIPPED, XFAILED, XPASSED, TestResult
from opcheck.spec.model import CHECKS, KNOWN_DEVICES, TENSOR_DTYPES

SEVERITY = (FAILED, ERROR, XPASSED, PASSED, XFAILED, SKIPPED)
"""A cell's status is the first of these among its tests: one failure makes the cell a failure."""
CLOSEST_SHOWN = 10
"""How many of the closest passes the report lists."""


@dataclass(frozen=True)
class Note:
    """A reason shared by one or more tests, numbered in the order the matrix first shows it; for
    failures, with the worst entry and the hints their messages name (the same for each test)."""

    number: int
    outcome: str
    text: str
    tests: int
    worst: str = ""
    hint: str = ""  # one hint per line

    @property
    def hints(self) -> tuple[str, ...]:
        return tuple(self.hint.splitlines())


@dataclass(frozen=True)
class Cell:
    """The tests of one (op, check, dtype, device), one per sample."""

    counts: tuple[tuple[str, int], ...]  # (outcome, tests) in OUTCOMES order, nonzero only
    reasons: tuple[tuple[str, str, tuple[str, ...]], ...]  # (outcome, reason, samples), most severe first
    notes: tuple[int, ...]  # numbers of the notes its reasons are
    margin: float | None = None  # the largest error / allowed among its passing tests; None: none recorded

    @property
    def status(self) -> str:
        present = {outcome for outcome, _ in self.counts}
        return next(s for s in SEVERITY if s in present)

    @property
    def tests(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def text(self) -> str:
        """`2 passed`, `1 failed, 1 passed`: readable without colour."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.counts)

    @property
    def margin_text(self) -> str:
        """`0.42 of bound` for a passing cell with a recorded margin (its closest pass), else ""."""
        if self.margin is None or self.status != PASSED:
            return ""
        return f"{format_ratio(self.margin)} of bound"

    @property
    def title(self) -> str:
        """The counts, then every reason with the samples it is about, one per line: the HTML tooltip."""
        lines = [self.text + (f" ({self.margin_text}: the closest pass's error / allowed)" if self.margin_text else "")]
        for outcome, reason, samples in self.reasons:
            names = ", ".join(samples[:_TITLE_SAMPLES]) + (", ..." if len(samples) > _TITLE_SAMPLES else "")
            lines.append(f"{len(samples)} {outcome} ({names}): {reason}")
        return "\n".join(lines)


_TITLE_SAMPLES = 4


def format_ratio(ratio: float) -> str:
    """error / allowed as the report writes it: two significant digits (0.42, 3.1e-07)."""
    return f"{ratio:.2g}"


@dataclass(frozen=True)
class Row:
    spec: str
    op: str  # "" when the results do not say (JUnit XML)
    source: str
    check: str
    dtype: str
    cells: tuple[Cell | None, ...]  # one per Matrix.devices; None: no test of this row on that device


@dataclass(frozen=True)
class Matrix:
    devices: tuple[str, ...]
    rows: tuple[Row, ...]
    totals: tuple[tuple[str, int], ...]  # (outcome, tests) for every outcome, in OUTCOMES order
    device_totals: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # (device, totals) per device
    notes: tuple[Note, ...]
    failures: tuple[tuple[TestResult, int | None], ...]  # failed and errored tests, with their note number
    closest: tuple[TestResult, ...] = ()  # the passes closest to their bound, closest first (CLOSEST_SHOWN)
    margins: int = 0  # passing tests with a recorded margin

    @property
    def tests(self) -> int:
        return sum(n for _, n in self.totals)

    @property
    def specs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(row.spec for row in self.rows))

    def outcomes_present(self) -> tuple[str, ...]:
        """The outcomes worth a column: passed and failed always, the others when some test had them."""
        return tuple(o for o, n in self.totals if n or o in (PASSED, FAILED))


def _order(known: tuple[str, ...]):
    return lambda value: (known.index(value), "") if value in known else (len(known), value)


_device_order, _dtype_order, _check_order = _order(KNOWN_DEVICES), _order(TENSOR_DTYPES), _order(CHECKS)


def build_matrix(results: list[TestResult]) -> Matrix:
    devices = tuple(sorted({r.device for r in results}, key=_device_order))
    groups: dict[tuple[str, str, str], dict[str, list[TestResult]]] = {}
    ops: dict[str, tuple[str, str]] = {}
    for r in results:
        groups.setdefault((r.spec, r.check, r.dtype), {}).setdefault(r.device, []).append(r)
        if r.op or r.source:
            ops.setdefault(r.spec, (r.op, r.source))
    keys = sorted(groups, key=lambda k: (k[0], _check_order(k[1]), _dtype_order(k[2])))

    notes: dict[tuple[str, str, str, str], list] = {}  # _note_key -> [number, tests]
    rows = []
    for spec, check, dtype in keys:
        cells = []
        for device in devices:
            tests = groups[spec, check, dtype].get(device)
            cells.append(_cell(sorted(tests, key=lambda r: r.sample), notes) if tests else None)
        op, source = ops.get(spec, ("", ""))
        rows.append(Row(spec, op, source, check, dtype, tuple(cells)))

    row_index = {key: i for i, key in enumerate(keys)}
    closest = _closest(results)
    failures = sorted(
        (r for r in results if r.outcome in (FAILED, ERROR)),
        key=lambda r: (row_index[r.spec, r.check, r.dtype], _device_order(r.device), r.sample),
    )
    return Matrix(
        devices=devices,
        rows=tuple(rows),
        totals=_totals(results),
        device_totals=tuple((d, _totals([r for r in results if r.device == d])) for d in devices),
        notes=tuple(
            Note(number, outcome, text, n, worst, hint) for (outcome, text, worst, hint), (number, n) in notes.items()
        ),
        failures=tuple((r, notes[_note_key(r)][0] if r.reason else None) for r in failures),
        closest=tuple(closest[:CLOSEST_SHOWN]),
        margins=len(closest),
    )


def _closest(results: list[TestResult]) -> list[TestResult]:
    """The passes with a recorded margin, closest to their bound first (ties by node id)."""
    passes = [r for r in results if r.margin is not None and r.outcome in PASSES]
    return sorted(passes, key=lambda r: (-(r.margin or 0.0), r.nodeid))


def _note_key(r: TestResult) -> tuple[str, str, str, str]:
    """What makes two tests share a note: the same outcome, reason, worst entry and hints."""
    return r.outcome, r.reason, r.worst, r.hint


def _cell(tests: list[TestResult], notes: dict) -> Cell:
    counts = Counter(r.outcome for r in tests)
    reasons: dict[tuple[str, str, str, str], list[str]] = {}
    for r in tests:
        if r.reason:
            reasons.setdefault(_note_key(r), []).append(r.sample)
    ordered = sorted(reasons, key=lambda k: SEVERITY.index(k[0]))  # stable: first seen first within an outcome
    numbers = []
    for key in ordered:
        note = notes.setdefault(key, [len(notes) + 1, 0])
        note[1] += len(reasons[key])
        numbers.append(note[0])
    margins = [r.margin for r in tests if r.margin is not None and r.outcome in PASSES]
    return Cell(
        counts=tuple((o, counts[o]) for o in OUTCOMES if counts[o]),
        reasons=tuple((key[0], key[1], tuple(reasons[key])) for key in ordered),
        notes=tuple(numbers),
        margin=max(margins) if margins else None,
    )


def _totals(results: list[TestResult]) -> tuple[tuple[str, int], ...]:
    counts = Counter(r.outcome for r in results)
    return tuple((o, counts[o]) for o in OUTCOMES)
