"""The supervisor of a serial run of generated tests: the pytest process the user started runs the
session in a child (the same command line, with OPCHECK_SUPERVISED set), and starts another child
when one dies in a test.

The supervisor itself imports nothing of torch and collects nothing: it decides from the command
line (`wanted`), starts the child, and waits, reading the child's progress log twice a second to
end a test that runs past its time budget. When a child dies in a test, it writes why
(`crash.N.json`: the signal or exit status, faulthandler's stack, the watchdog's account) and starts
the next child, which replays what the earlier ones did and runs the tests that are left. The exit
status is that of the child that ends the session.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from opcheck.isolation import crash as crashes
from opcheck.isolation.rundir import Crash, RunDir, phase_after
from opcheck.isolation.watcher import Watcher
from opcheck.module_header import starts_generated

SUPERVISED_ENV = "OPCHECK_SUPERVISED"
"""Set in a supervised child: JSON with the run's folder, the child's number and, when set, why
the tests not yet run are not run."""

MAX_CRASHES = 32
"""Tests that may crash the test process in one run; past that, the tests left are not run (a
broken installation or an op that crashes everywhere would otherwise take a new process per test)."""

POLL = 0.5
"""Seconds between reads of the child's progress log."""

SCAN_LIMIT = 20_000
"""Files looked at for a generated module before deciding that a run has none."""

_NOT_A_TEST_RUN = (
    "help",
    "version",
    "markers",
    "showfixtures",
    "show_fixtures_per_test",
    "cacheshow",
    "collectonly",
    "setupplan",
    "usepdb",
    "trace",
    "looponfail",
)
"""Options (dests) under which pytest runs no tests, or runs them for a person at a debugger."""


def wanted(config: pytest.Config) -> bool:
    """Whether this pytest process should supervise its session: a command-line run (not pytest.main
    from other code, not an xdist run, whose workers are replaced after a crash already, not under a
    debugger or coverage) whose paths hold generated modules.

    It reads the command line as pytest parsed it before loading conftest files
    (config.known_args_namespace), so that it answers the same before then, where the Triton setup
    asks (a supervisor leaves that to its children), and after: options that conftest files add
    play no part in it."""
    if os.environ.get(SUPERVISED_ENV) is not None or hasattr(config, "workerinput"):
        return False
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return False
    option = config.known_args_namespace
    if any(getattr(option, name, False) for name in _NOT_A_TEST_RUN):
        return False
    if getattr(option, "numprocesses", None) or getattr(option, "dist", "no") != "no" or getattr(option, "tx", None):
        return False
    params = config.invocation_params
    if params.plugins or list(params.args) != sys.argv[1:] or not _started_as_pytest() or _traced():
        return False
    return _names_generated_tests(config)


def _traced() -> bool:
    """Whether a debugger or coverage measurement watches this process: what it sees or records
    of a child would be lost, so the tests run here."""
    if sys.gettrace() is not None:
        return True
    coverage = sys.modules.get("coverage")
    current = getattr(getattr(coverage, "Coverage", None), "current", None)
    return callable(current) and current() is not None


def _started_as_pytest() -> bool:
    """Whether this process is `pytest ...` or `python -m pytest ...`, which a child can repeat."""
    if not getattr(sys, "orig_argv", None):
        return False
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in ("pytest", "pytest.__main__"):
        return True
    name = Path(sys.argv[0]).name.lower()
    return name in ("pytest", "py.test", "pytest.exe", "py.test.exe", "pytest-script.py")


def _names_generated_tests(config: pytest.Config) -> bool:
    """Whether the run's paths hold a generated module: a file named, or one in a folder named."""
    patterns = [str(p) for p in config.getini("python_files")]
    skip_dirs = [str(p) for p in config.getini("norecursedirs")]
    budget = SCAN_LIMIT
    for arg in _run_args(config):
        path = config.invocation_params.dir / arg.split("::", 1)[0]
        if path.is_file():
            if starts_generated(path):
                return True
            continue
        if not path.is_dir():
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(
                d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in skip_dirs) and not d.startswith(".")
            )
            for name in sorted(files):
                if not any(fnmatch.fnmatch(name, p) for p in patterns):
                    continue
                if starts_generated(Path(folder) / name):
                    return True
                budget -= 1
                if budget <= 0:
                    return False
    return False


def _run_args(config: pytest.Config) -> list[str]:
    """The run's paths: config.args once pytest has parsed the command line; before, what it will
    decide from the same inputs, as pytest's own pytest_load_initial_conftests decides them early."""
    if config.args:
        return list(config.args)
    known = config.known_args_namespace
    decide = getattr(config, "_decide_args", None)
    if decide is not None:
        with contextlib.suppress(TypeError):  # a pytest whose _decide_args takes other arguments
            args, _ = decide(
                args=known.file_or_dir,
                pyargs=known.pyargs,
                testpaths=config.getini("testpaths"),
                invocation_dir=config.invocation_params.dir,
                rootpath=config.rootpath,
                warn=False,
            )
            return list(args)
    return list(known.file_or_dir) or [str(config.invocation_params.dir)]  # pragma: no cover


# ------------------------------------------------------------------------------------ the run
def supervise(config: pytest.Config) -> int:
    """Run the session in children until one ends it; its exit status."""
    folder = Path(tempfile.mkdtemp(prefix="opcheck-run-"))
    try:
        return _Supervisor(config, RunDir(folder)).run()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Supervisor:
    def __init__(self, config: pytest.Config, run: RunDir) -> None:
        self.config = config
        self.run_dir = run
        self.crashes = 0
        self._child: subprocess.Popen | None = None
        self._terminated: int | None = None  # the signal that asked the run to end

    def run(self) -> int:
        try:
            with self._forwarding_signals():
                return self._loop()
        except KeyboardInterrupt:
            return int(pytest.ExitCode.INTERRUPTED)
        finally:
            child = self._child
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()

    def _loop(self) -> int:
        index = 0
        while True:
            index += 1
            stop = None
            if self.crashes >= MAX_CRASHES:
                stop = f"opcheck: {self.crashes} tests crashed the test process; the tests not run yet were not run"
            returncode, watcher = self._run_child(index, stop)
            progress = self.run_dir.progress(index)
            if progress.exitstatus is not None:
                return progress.exitstatus
            if self._terminated is not None:
                return 128 + self._terminated
            if progress.restart is not None:  # it ended itself after a test that broke its device
                continue
            if progress.running is not None:
                self.crashes += 1
                self._record_crash(index, progress.running, returncode, watcher)
                continue
            if returncode is not None and returncode >= 0 and not progress.finished:
                return returncode  # it ended by itself before any test (a plugin's own command, a usage error)
            if progress.finished:  # it died between tests: the next child replays them and ends the session
                continue
            return self._give_up(index, returncode)

    def _run_child(self, index: int, stop: str | None) -> tuple[int | None, Watcher]:
        setting = {"dir": str(self.run_dir.path), "index": index}
        if stop:
            setting["stop"] = stop
        env = dict(os.environ, **{SUPERVISED_ENV: json.dumps(setting)})
        argv = [sys.executable, *sys.orig_argv[1:]]
        child = subprocess.Popen(argv, env=env, cwd=self.config.invocation_params.dir)
        self._child = child
        watcher = Watcher(self.run_dir.log(index), pid=child.pid)
        interrupts = 0
        while True:
            try:
                returncode = child.wait(POLL)
                break
            except subprocess.TimeoutExpired:
                watcher.poll()
            except KeyboardInterrupt:  # the child had the Ctrl-C too: it ends its session and reports
                interrupts += 1
                if interrupts >= 3:
                    child.kill()
        self._child = None
        watcher.poll()
        return returncode, watcher

    def _record_crash(self, index: int, nodeid: str, returncode: int | None, watcher: Watcher) -> None:
        progress = self.run_dir.progress(index)
        reports = progress.reports.get(nodeid, [])
        phase = phase_after(reports)
        death = crashes.describe(
            returncode,
            self.run_dir.fault_text(index),
            phase=phase,
            overdue=progress.overdue.get(nodeid),
            killed=watcher.killed if watcher.running == nodeid else None,
            root=self.config.rootpath,
        )
        duration = max(time.time() - progress.running_since, 0.0)
        crash = Crash(nodeid, death.message, phase, duration, tuple(reports), index, death.hints)
        self.run_dir.write_crash(index, crash)

    def _give_up(self, index: int, returncode: int | None) -> int:
        """The child died outside any test (collection, the end of the session) without moving on."""
        fault = self.run_dir.fault_text(index).strip()
        sys.stderr.write(
            f"opcheck: the test process died outside any test (during collection or at the end of the session) "
            f"with {crashes.exit_reason(returncode)}; --opcheck-isolation off runs the session in this process\n"
        )
        if fault:
            sys.stderr.write(fault + "\n")
        return int(pytest.ExitCode.INTERNAL_ERROR)

    @contextlib.contextmanager
    def _forwarding_signals(self):
        """SIGTERM and SIGHUP to the supervisor reach the child too (Ctrl-C reaches both already)."""
        names = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
        previous = {}

        def forward(signum, frame):
            self._terminated = signum
            child = self._child
            if child is not None and child.poll() is None:
                child.send_signal(signum)

        for name in names:
            number = getattr(signal, name)
            with contextlib.suppress(ValueError, OSError):
                previous[number] = signal.signal(number, forward)
        try:
            yield
        finally:
            for number, handler in previous.items():
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(number, handler)
