"""`pytest --opcheck-results PATH`: one record per generated test, written at the end of the session.

The plugin attaches each generated test's case (spec, op, check, device, dtype, sample) to its
reports as `report.opcheck_case`; pytest-xdist ships report attributes from the workers to the
controller, so `ResultsRecorder` runs in the controller only (or in the one process without
xdist) and sees every report through `pytest_runtest_logreport`. Tests of device types this
machine lacks are not collected; the plugin hands them over (from a worker, through xdist's
`workeroutput`) and they are recorded as skipped, with torch's reason, so the coverage report
still shows those cells.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from opcheck.report.results import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    XFAILED,
    XPASSED,
    TestResult,
    error_reason,
    first_line,
    results_json,
    worse,
)
from opcheck.spec.case import CaseId

CASE_ATTR = "opcheck_case"
"""The report attribute holding a test's case: a dict for a generated test, {} for any other test."""


def report_verdict(report) -> tuple[str, str] | None:
    """(outcome, reason) that one setup/call/teardown report adds, or None (a setup or teardown that passed)."""
    wasxfail = getattr(report, "wasxfail", None)
    if report.when == "call":
        if report.passed:
            return (XPASSED, _xfail_reason(wasxfail)) if wasxfail is not None else (PASSED, "")
        if report.skipped:
            return (XFAILED, _xfail_reason(wasxfail)) if wasxfail is not None else (SKIPPED, _skip_reason(report))
        if report.failed:
            return FAILED, _crash_line(report)
        return None
    if report.failed:  # setup, teardown, or "???" for a test whose xdist worker crashed
        return ERROR, error_reason("teardown" if report.when == "teardown" else "setup", _crash_line(report))
    if report.skipped:  # skip marks and skips in fixtures; xfail(run=False)
        return (XFAILED, _xfail_reason(wasxfail)) if wasxfail is not None else (SKIPPED, _skip_reason(report))
    return None


def _xfail_reason(wasxfail: str) -> str:
    return first_line(wasxfail.removeprefix("reason: "))


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        return first_line(str(longrepr[2]).removeprefix("Skipped: "))
    return first_line(str(longrepr or ""))


def _crash_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    return first_line(crash.message if crash is not None else str(report.longrepr or ""))


class ResultsRecorder:
    """A pytest plugin object: collects the generated tests' verdicts and writes them as JSON."""

    def __init__(self, path: Path, unavailable: Callable[[], list[dict]] = list):
        self.path = Path(path)
        self._unavailable = unavailable  # the tests not collected for an unavailable device, at the end
        self._tests: dict[str, dict] = {}
        self.written = 0
        self.error: str | None = None

    def pytest_runtest_logreport(self, report) -> None:
        case = getattr(report, CASE_ATTR, None)
        if case is None:  # reports made outside the test protocol (a crashed xdist worker's test)
            parsed = CaseId.from_nodeid(report.nodeid)
            case = asdict(parsed) if parsed is not None else None
        if not case:
            return
        entry = self._tests.setdefault(report.nodeid, dict(case, nodeid=report.nodeid, duration=0.0, verdict=None))
        entry["duration"] += float(getattr(report, "duration", 0.0) or 0.0)
        entry["verdict"] = worse(entry["verdict"], report_verdict(report))

    def results(self, unavailable: Sequence[dict] = ()) -> list[TestResult]:
        """Every generated test that ran, then those not collected for an unavailable device (skipped)."""
        out = []
        for entry in self._tests.values():
            if entry["verdict"] is None:  # never ran (--setup-plan and the like)
                continue
            fields = {k: v for k, v in entry.items() if k != "verdict"}
            outcome, reason = entry["verdict"]
            out.append(TestResult(outcome=outcome, reason=reason, **fields))
        for case in unavailable:
            if case["nodeid"] not in self._tests:
                out.append(TestResult(outcome=SKIPPED, **case))
        return out

    def pytest_sessionfinish(self, session) -> None:
        results = self.results(self._unavailable())
        try:
            os.makedirs(self.path.parent, exist_ok=True)
            self.path.write_text(results_json(results), encoding="utf-8")
        except OSError as e:  # said in the summary; the tests' own verdicts stand
            self.error = f"opcheck: cannot write results to {self.path}: {e.strerror or e}"
            return
        self.written = len(results)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.error:
            terminalreporter.write_line(self.error, red=True, bold=True)
        else:
            terminalreporter.write_sep("-", f"opcheck results of {self.written} generated tests: {self.path}")
