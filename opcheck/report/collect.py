"""`pytest --opcheck-results PATH`: one record per generated test, written at the end of the session.

The plugin attaches each generated test's case (spec, op, check, device, dtype, sample) to its
reports as `report.opcheck_case`; pytest-xdist ships report attributes from the workers to the
controller, so `ResultsRecorder` runs in the controller only (or in the one process without
xdist) and sees every report through `pytest_runtest_logreport`. A failure's whole message comes
with its report (pytest's crash message, kept as opcheck.report.failure says), and its worst entry
and hints on its report's user_properties (opcheck.failure_facts), as a pass's margin does
(opcheck.runtime.margins). Tests of device types this machine lacks are not collected; the plugin
hands them over (from a worker, through xdist's `workeroutput`) and they are recorded as skipped,
with torch's reason, so the coverage report still shows those cells.

The file is updated, not replaced (opcheck.report.store): what this run ran replaces its records,
the rest are kept, and records of tests that no longer exist are dropped. Which tests exist is
known where the tests are collected: here without xdist, else in each worker (`KnownTests`),
which hands it over through `workeroutput` too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import pytest

from opcheck.failure_facts import FailureFacts
from opcheck.report.failure import kept_message
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
    worse,
)
from opcheck.report.store import Known, Merged, ResultsFileError, save, still_there
from opcheck.runtime.margins import margin_of
from opcheck.spec.case import CaseId

CASE_ATTR = "opcheck_case"
"""The report attribute holding a test's case: a dict for a generated test, {} for any other test."""
KNOWN_OUTPUT = "opcheck_known_tests"
"""The key under which an xdist worker hands the generated tests it collected to the controller."""


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
    return first_line(_crash_message(report))


def _crash_message(report) -> str:
    """The whole message of what failed (pytest's crash message: `Type: the exception's text`)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message if crash is not None else str(report.longrepr or "")


def failure_fields(report) -> dict[str, str]:
    """What a failed or errored report adds to its test's record: the worst entry, the hints, the message."""
    facts = FailureFacts.from_properties(getattr(report, "user_properties", ()))
    return {"worst": facts.worst, "hint": "\n".join(facts.hints), "message": kept_message(_crash_message(report))}


def margin_fields(report) -> dict:
    """What a passing report adds to its test's record: its margin, where the runtime put one on it."""
    margin = margin_of(getattr(report, "user_properties", ()))
    return {"margin": margin[0], "margin_where": margin[1]} if margin is not None else {}


def collected_tests(config, items, is_generated: Callable[[pytest.Item], bool]) -> Known | None:
    """The generated tests among `items`, by module, as pytest collected them before any
    deselection (-k, -m, --deselect, opcheck's devices); None when the run collected modules in
    part in a way that cannot be told apart (`--lf`, a node id that names no file)."""
    if config.getoption("lf", default=False):  # --lf collects only a module's last failures
        return None
    partial = set()
    for arg in config.args:
        if "::" not in arg:
            continue
        path = config.invocation_params.dir / arg.split("::", 1)[0]
        if not path.is_file():
            return None
        try:
            partial.add(Path(os.path.relpath(path, config.rootpath)).as_posix())
        except ValueError:  # another drive on Windows
            return None
    return Known.of((item.nodeid for item in items if is_generated(item)), partial=partial.__contains__)


class KnownTests:
    """A pytest plugin object for an xdist worker: hands the tests it collected to the controller."""

    def __init__(self, is_generated: Callable[[pytest.Item], bool]):
        self._is_generated = is_generated
        self.known: Known | None = None

    @pytest.hookimpl(tryfirst=True)  # before -k, -m and opcheck's own deselection
    def pytest_collection_modifyitems(self, config, items) -> None:
        self.known = collected_tests(config, items, self._is_generated)

    def pytest_sessionfinish(self, session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None and self.known is not None:
            workeroutput[KNOWN_OUTPUT] = self.known.to_json()


class ResultsRecorder:
    """A pytest plugin object: collects the generated tests' verdicts and updates the results file.

    root: pytest's rootdir, which node ids are relative to (None: no record is dropped for a
    deleted module); is_generated: which collected items are generated tests (None: the run's
    collection is not looked at, and only deleted modules drop records).
    """

    def __init__(
        self,
        path: Path,
        unavailable: Callable[[], list[dict]] = list,
        root: Path | None = None,
        is_generated: Callable[[pytest.Item], bool] | None = None,
    ):
        self.path = Path(path)
        self._unavailable = unavailable  # the tests not collected for an unavailable device, at the end
        self._root = root
        self._is_generated = is_generated
        self._tests: dict[str, dict] = {}
        self.known: Known | None = None
        self.summary: str | None = None
        self.warning: str | None = None
        self.error: str | None = None

    def pytest_runtest_logreport(self, report) -> None:
        case = getattr(report, CASE_ATTR, None)
        if case is None:  # reports made outside the test protocol (a crashed xdist worker's test)
            parsed = CaseId.from_nodeid(report.nodeid)
            case = asdict(parsed) if parsed is not None else None
        if not case:
            return
        entry = self._tests.setdefault(
            report.nodeid, dict(case, nodeid=report.nodeid, duration=0.0, verdict=None, details={})
        )
        entry["duration"] += float(getattr(report, "duration", 0.0) or 0.0)
        verdict = report_verdict(report)
        if verdict is not None and worse(entry["verdict"], verdict) is verdict:
            entry["verdict"] = verdict
            entry["details"] = failure_fields(report) if verdict[0] in (FAILED, ERROR) else margin_fields(report)

    @pytest.hookimpl(tryfirst=True)  # before -k, -m and opcheck's own deselection
    def pytest_collection_modifyitems(self, config, items) -> None:
        if self._is_generated is not None:
            self.known = collected_tests(config, items, self._is_generated)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist, in the controller: the tests the first worker that says collected."""
        known = getattr(node, "workeroutput", {}).get(KNOWN_OUTPUT)
        if self.known is None and known is not None:
            self.known = Known.from_json(known)

    def results(self, unavailable: Sequence[dict] = ()) -> list[TestResult]:
        """Every generated test that ran, then those not collected for an unavailable device (skipped)."""
        out = self._ran()
        out += [r for r in self._skipped(unavailable) if r.nodeid not in self._tests]
        return out

    def _ran(self) -> list[TestResult]:
        out = []
        for entry in self._tests.values():
            if entry["verdict"] is None:  # never ran (--setup-plan and the like)
                continue
            fields = {k: v for k, v in entry.items() if k not in ("verdict", "details")}
            outcome, reason = entry["verdict"]
            out.append(TestResult(outcome=outcome, reason=reason, **fields, **entry["details"]))
        return out

    @staticmethod
    def _skipped(unavailable: Sequence[dict]) -> list[TestResult]:
        return [TestResult(outcome=SKIPPED, **case) for case in unavailable]

    def pytest_sessionfinish(self, session) -> None:
        try:
            earlier, merged = save(
                self.path,
                self._ran(),
                self._skipped(self._unavailable()),
                exists=still_there(self.known, self._root),
            )
        except ResultsFileError as e:
            self.error = f"opcheck: results not written: {e}"
            return
        except OSError as e:  # said in the summary; the tests' own verdicts stand
            self.error = f"opcheck: cannot write results to {self.path}: {e.strerror or e}"
            return
        if earlier.moved_to is not None:
            self.warning = (
                f"opcheck: {self.path} held no opcheck results ({earlier.problem}); "
                f"moved it to {earlier.moved_to} and wrote this run's results in its place"
            )
        self.summary = _summary(merged, had_earlier=bool(earlier.results))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.warning:
            terminalreporter.write_line(self.warning, yellow=True, bold=True)
        if self.error:
            terminalreporter.write_line(self.error, red=True, bold=True)
        elif self.summary:
            terminalreporter.write_sep("-", f"{self.summary}: {self.path}")


def _summary(merged: Merged, had_earlier: bool) -> str:
    """`opcheck results of 352 generated tests (12 from this run, 340 kept from earlier runs)`."""
    total = len(merged.results)
    line = f"opcheck results of {total} generated test{'s' if total != 1 else ''}"
    if not had_earlier:
        return line
    parts = [f"{merged.recorded} from this run", f"{merged.kept} kept from earlier runs"]
    if merged.dropped:
        parts.append(f"{merged.dropped} dropped (no longer exist)")
    return f"{line} ({', '.join(parts)})"
