"""Under pytest-xdist: the controller's side of watching workers.

xdist replaces a worker that dies and reports the test it was running as failed, with "worker
'gw0' crashed while running ..." and the phase `???` (which reads as an error in setup). Here
the controller gives each worker a progress log and a fault file (through `workerinput`; the
worker keeps them with opcheck.isolation.watched), watches the logs from a thread to end a worker
whose test runs past its time budget plus a grace period, and rewrites xdist's report of the test
a worker died in: what ended the process (the signal, the exit status, the budget), faulthandler's
stack, the phase it died in, and the command that reruns it. A worker that ended itself after a
CUDA error (its test already reported) is replaced without a second report for that test.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from opcheck.failure_facts import FailureFacts
from opcheck.isolation import crash as crashes
from opcheck.isolation.progress import read_progress
from opcheck.isolation.rundir import phase_after
from opcheck.isolation.watched import Hooks
from opcheck.isolation.watcher import Watcher

WORKER_KEY = "opcheck_watched"
"""The `workerinput` key under which the controller names a worker's files (without the suffix)."""

POLL = 0.5


def worker_files(base: str | Path) -> tuple[Path, Path]:
    """A worker's progress log and fault file, from the name the controller gave it."""
    return Path(f"{base}.log"), Path(f"{base}.fault")


class XdistWatch:
    """A pytest plugin for the xdist controller (see the module docstring)."""

    def __init__(self, config: pytest.Config, hooks: Hooks) -> None:
        self.config = config
        self.hooks = hooks
        self.folder = Path(tempfile.mkdtemp(prefix="opcheck-xdist-"))
        self._started = 0
        self._workers: dict[int, tuple[Path, Watcher]] = {}  # id(node) → its files and their watcher
        self._phases: dict[str, dict] = {}  # node id of a test in flight → its last report's when/outcome
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        self._started += 1
        base = self.folder / f"{node.gateway.id}.{self._started}"
        node.workerinput[WORKER_KEY] = str(base)
        with self._lock:
            self._workers[id(node)] = (base, Watcher(worker_files(base)[0]))
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="opcheck-xdist-watch", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(POLL):
            with self._lock:
                watchers = [watcher for _, watcher in self._workers.values()]
            for watcher in watchers:
                with contextlib.suppress(Exception):
                    watcher.poll()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self._phases.pop(report.nodeid, None)
        elif report.when in ("setup", "call"):
            self._phases[report.nodeid] = {"when": report.when, "outcome": report.outcome}

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        node = getattr(report, "node", None)
        with self._lock:
            base, watcher = self._workers.pop(id(node), (None, None))
        if base is None or watcher is None:
            return
        watcher.poll()
        progress = read_progress(watcher.log)
        if progress.restart is not None and progress.restart.get("nodeid") == crashitem:
            # The worker ended itself after this test, whose reports are in: nothing more to say for it.
            report.outcome, report.when, report.longrepr = "passed", "setup", None
            self._note(f"opcheck: {crashitem} {progress.restart.get('why')}; its worker was replaced")
            return
        last = self._phases.pop(crashitem, None)
        phase = phase_after([last] if last else [])
        fault = worker_files(base)[1]
        try:
            fault_text = fault.read_text(encoding="utf-8", errors="replace")
        except OSError:
            fault_text = ""
        returncode = _returncode(node)
        worker = getattr(getattr(node, "gateway", None), "id", "?")
        if progress.running != crashitem:  # it died between tests: this one, next in its queue, never started
            message = (
                f"not run: worker {worker} died before this test started, with {crashes.exit_reason(returncode)} "
                f"(replaced)\nrerun: {self.hooks.rerun_of(self.config, crashitem)}"
            )
            report.longrepr = cast(Any, crashes.CrashRepr(message, crashitem.split("::", 1)[0], None))
            report.when = "setup"
            return
        death = crashes.describe(
            returncode,
            fault_text,
            phase=phase,
            overdue=progress.overdue.get(crashitem),
            killed=watcher.killed,
            root=self.config.rootpath,
        )
        message = f"{death.headline} (worker {worker}, replaced)"
        if death.details:
            message += "\n" + death.details
        message += f"\nrerun: {self.hooks.rerun_of(self.config, crashitem)}"
        path = crashitem.split("::", 1)[0]
        report.longrepr = cast(Any, crashes.CrashRepr(message, path, None))
        facts = FailureFacts(hints=death.hints).to_property()
        report.user_properties = [*getattr(report, "user_properties", ()), facts]
        report.when = phase  # type: ignore[assignment]
        report.duration = watcher.elapsed()

    def _note(self, line: str) -> None:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(line, yellow=True, bold=True)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL)
        shutil.rmtree(self.folder, ignore_errors=True)


def _returncode(node: Any) -> int | None:
    """The exit status of a dead worker's process, where execnet lets it be read."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return None
    with contextlib.suppress(Exception):
        try:
            return popen.wait(timeout=2)
        except Exception:
            return popen.poll()
    return None
