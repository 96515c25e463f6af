"""The pytest plugin of a test process that another process watches: a supervised child of a serial
run, or an xdist worker (opcheck.isolation.xdist).

It keeps the progress log (opcheck.isolation.progress) and points faulthandler at the run's fault
file, so that a crash leaves behind which test ran, in which phase, and the Python stack; it tells
the watcher what a test that ran out of its time budget spent (the budget's overdue listener).
After a test that failed with a CUDA error, which leaves the device unusable for every later test
of the process, it ends the process before the next test starts, and the watcher goes on in a new
one.

A supervised child that follows one that died replays the tests the earlier ones finished and the
test they died in: their logged reports go through pytest's report hooks again, in collection
order, so the terminal's counts and summary, the exit status, JUnit XML, the last-failed cache and
opcheck's results file cover the whole run, while the terminal, already showing them, stays quiet
until the first test that runs here.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from opcheck.failure_facts import FailureFacts
from opcheck.isolation.crash import CrashRepr
from opcheck.isolation.progress import ENDED, OVERDUE, REPORT, RESTART, WARNING, ProgressWriter
from opcheck.isolation.rundir import Crash, History
from opcheck.runtime import budget

CUDA_ERROR = re.compile(
    r"CUDA error|illegal memory access|device-side assert|CUBLAS_STATUS_EXECUTION_FAILED|unspecified launch failure"
)
"""Failures after which a CUDA context is unusable: every later CUDA call of the process fails too."""


@dataclass(frozen=True)
class Hooks:
    """What the watched process asks the opcheck plugin about a test."""

    budget_of: Callable[[pytest.Item], float | None]  # its time budget in seconds (None: none)
    case_of: Callable[[pytest.Item], dict]  # the case fields the results file records ({} for others)
    rerun_of: Callable[[pytest.Config, str], str]  # the command that reruns a node id


class WatchedProcess:
    """The pytest plugin of a watched test process (see the module docstring)."""

    def __init__(
        self,
        config: pytest.Config,
        log: Path,
        fault: Path,
        hooks: Hooks,
        *,
        reports: bool,
        history: History | None = None,
        stop: str | None = None,
    ) -> None:
        self.config = config
        self.hooks = hooks
        self.writer = ProgressWriter(log)
        self._fault = open(fault, "w", encoding="utf-8")  # noqa: SIM115 - open for the process's life
        self._reports = reports
        self.history = history or History()
        self._stop = stop  # why the tests not run yet are not run (too many crashes)
        self._current: str | None = None
        self._poison: tuple[str, str] | None = None  # (node id, why): end the process after this test
        self._has_next = False  # whether the test running is followed by another in this process
        self._replaying = False
        self._muted: tuple[Any, Any] | None = None
        budget.set_overdue_listener(self._overdue)

    # ------------------------------------------------------------------ session
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # After every pytest_configure, so after pytest's faulthandler plugin points it at stderr.
        faulthandler.enable(file=self._fault, all_threads=True)
        if self.history:
            self._mute()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        self._unmute()
        try:
            return (yield)
        finally:
            self.writer.write(ENDED, str(int(session.exitstatus)))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        budget.set_overdue_listener(None)
        self.writer.close()

    # ------------------------------------------------------------------ tests
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        nodeid = item.nodeid
        if nodeid in self.history.finished:
            self._replay(item, self.history.finished[nodeid], self.history.warnings.get(nodeid, []))
            return True
        if nodeid in self.history.crashes:
            crash = self.history.crashes[nodeid]
            latest = crash.process == self.history.processes  # the process just before this one died in it
            if latest:
                self._unmute()
            self._replay_crash(item, crash, note=latest)
            return True
        self._unmute()
        if self._stop is not None:
            item.session.shouldstop = self._stop
            return True
        self._current = nodeid
        self._has_next = nextitem is not None
        self.writer.started(nodeid, self.hooks.budget_of(item))
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self._replaying or report.nodeid != self._current:
            return
        if self._reports:
            self.writer.write_json(REPORT, {"nodeid": report.nodeid, "report": dump_report(self.config, report)})
        if self._poison is None and (report.failed or hasattr(report, "wasxfail")) and report.longrepr is not None:
            crash = getattr(report.longrepr, "reprcrash", None)
            found = _cuda_error(crash.message if crash is not None else str(report.longrepr))
            if found is not None:
                self._poison = (report.nodeid, found)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple) -> None:
        if not self._replaying and nodeid == self._current:
            self.writer.finished(nodeid)
            self._current = None
            if self._poison is not None and self._has_next:
                self._end()

    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage, when: str, nodeid: str) -> None:
        # pytest records a test's warnings once its protocol is over: after its F line.
        if self._reports and not self._replaying and when == "runtest" and nodeid not in self.history.finished:
            category = warning_message.category
            self.writer.write_json(
                WARNING,
                {
                    "nodeid": nodeid,
                    "category": f"{category.__module__}.{category.__qualname__}",
                    "message": str(warning_message.message),
                    "filename": warning_message.filename,
                    "lineno": warning_message.lineno,
                },
            )

    def _overdue(self, nodeid: str, account: str) -> None:  # from the budget's watchdog thread
        self.writer.write_json(OVERDUE, {"nodeid": nodeid, "account": account})

    def _end(self) -> None:
        """End the process after a test that left its device unusable; the watcher goes on in a new one
        (an xdist worker's tests not run yet go to the other workers)."""
        nodeid, why = self._poison or ("", "")
        self.writer.write_json(RESTART, {"nodeid": nodeid, "why": why})
        for stream in (sys.stdout, sys.stderr, self._fault):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

    # ------------------------------------------------------------------ replaying earlier processes
    def _replay(self, item: pytest.Item, reports: list[dict], warned: list[dict]) -> None:
        self._replaying = True
        try:
            ihook = item.ihook
            ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            for data in warned:
                self.config.hook.pytest_warning_recorded.call_historic(
                    kwargs=dict(warning_message=_warning(data), when="runtest", nodeid=item.nodeid, location=None)
                )
            for data in reports:
                ihook.pytest_runtest_logreport(report=load_report(self.config, item, data))
            ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        finally:
            self._replaying = False

    def _replay_crash(self, item: pytest.Item, crash: Crash, note: bool) -> None:
        if note:  # the dead process had started the test's line
            headline = crash.message.splitlines()[0]
            self._note(f"opcheck: {item.nodeid} {headline}; the tests after it run in a new process", open_line=True)
        self._replaying = True
        try:
            ihook = item.ihook
            ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            for data in crash.reports:
                ihook.pytest_runtest_logreport(report=load_report(self.config, item, data))
            message = f"{crash.message}\nrerun: {self.hooks.rerun_of(self.config, item.nodeid)}"
            path, lineno, _ = item.location
            extra: dict[str, Any] = {}
            case = self.hooks.case_of(item)
            if case:
                from opcheck.report.collect import CASE_ATTR

                extra[CASE_ATTR] = case
            failed = pytest.TestReport(
                nodeid=item.nodeid,
                location=item.location,
                keywords=dict.fromkeys(item.keywords, 1),
                outcome="failed",
                longrepr=cast(Any, CrashRepr(message, path, lineno)),
                when=crash.phase,  # type: ignore[arg-type]
                duration=crash.duration,
                user_properties=[FailureFacts(hints=crash.hints).to_property()],
                **extra,
            )
            ihook.pytest_runtest_logreport(report=failed)
            if crash.phase != "teardown":
                teardown = pytest.TestReport(
                    nodeid=item.nodeid,
                    location=item.location,
                    keywords=dict.fromkeys(item.keywords, 1),
                    outcome="passed",
                    longrepr=None,
                    when="teardown",
                    **extra,
                )
                ihook.pytest_runtest_logreport(report=teardown)
            ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        finally:
            self._replaying = False

    # ------------------------------------------------------------------ the terminal
    def _terminal(self):
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def _mute(self) -> None:
        """The terminal shows what the earlier processes printed: this one's writes go nowhere until unmuted."""
        writer = getattr(self._terminal(), "_tw", None)
        if writer is None or not hasattr(writer, "_file") or self._muted is not None:
            return
        self._muted = (writer, writer._file)
        writer._file = _Discard()

    def _unmute(self) -> None:
        if self._muted is None:
            return
        writer, file = self._muted
        writer._file = file
        self._muted = None
        for restart in self.history.restarts:
            if restart.get("index") == self.history.processes:  # the process just before this one
                self._note(f"opcheck: {restart['nodeid']} {restart['why']}; the tests after it run in a new process")

    def _note(self, line: str, open_line: bool = False) -> None:
        """A line of its own on the terminal; `open_line`: the terminal's line is open whatever the
        terminal reporter knows (a process died in the middle of it)."""
        terminal = self._terminal()
        if terminal is None:
            return
        if open_line or terminal.currentfspath:
            terminal._tw.line()
        terminal._tw.line(line, yellow=True, bold=True)
        terminal.currentfspath = None


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _cuda_error(text: str) -> str | None:
    """Why a failure leaves the CUDA device unusable (the line of the message that says so), or None."""
    for line in text.splitlines():
        if CUDA_ERROR.search(line):
            line = line.strip()
            return f"left the CUDA device unusable ({line[:200]})"
    return None


# ------------------------------------------------------------------ reports and warnings as JSON
_STRUCTURE = frozenset({"nodeid", "location", "keywords", "longrepr"})
"""What the replay takes from the item (and pytest's own `_` fields, which its constructor derives)."""
_LITE = "$opcheck_lite"


def dump_report(config: pytest.Config, report: pytest.TestReport) -> dict:
    """A report as JSON data: pytest's own serialization where there is a longrepr; else the
    report's fields without the node's own (location, keywords), which the replay takes from the item."""
    if report.longrepr is None:
        data = {key: value for key, value in vars(report).items() if key not in _STRUCTURE and key[:1] != "_"}
        data[_LITE] = True
        return data
    return config.hook.pytest_report_to_serializable(config=config, report=report)


def load_report(config: pytest.Config, item: pytest.Item, data: dict) -> pytest.TestReport:
    if data.get(_LITE):
        fields = {key: value for key, value in data.items() if key != _LITE}
        return pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords=dict.fromkeys(item.keywords, 1),
            longrepr=None,
            **fields,
        )
    return config.hook.pytest_report_from_serializable(config=config, data=data)


def _warning(data: dict) -> warnings.WarningMessage:
    category: type[Warning] = UserWarning
    module, _, name = data["category"].rpartition(".")
    with contextlib.suppress(Exception):
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, Warning):
            category = found
    return warnings.WarningMessage(data["message"], category, data["filename"], data["lineno"])
