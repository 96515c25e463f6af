"""The time budget's and the isolation's settings, and the parts that word a dead process's failure."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest
from plugin_helpers import generated_module, param, spec_source

from opcheck import config as project_config
from opcheck.config import ConfigError
from opcheck.isolation import crash, supervisor
from opcheck.isolation.progress import ProgressWriter, read_progress
from opcheck.isolation.rundir import Crash, RunDir
from opcheck.isolation.watcher import Watcher, grace
from opcheck.module_header import MARKER as GENERATED_MARKER

SLOW_OPS = """
import time

def slow(x):
    time.sleep(30)
    return x * 2
"""
SLOW_MODULE = generated_module(
    spec_source("slow", "slow_ops:slow", gradgradcheck="GradgradcheckFlags(enabled=False)"),
    {"gradcheck": [param("cpu", "float64", "vec")]},
)
PLAIN_SLOW_TEST = "import time\n\ndef test_plain():\n    time.sleep(1)\n"


def header(pytester, *args) -> str:
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider", *args)
    lines = [line for line in result.outlines if line.startswith("opcheck: ") and ";" in line]
    assert len(lines) == 1, result.outlines
    return lines[0]


# ------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    "raw, seconds",
    [(600, 600.0), ("90", 90.0), ("90s", 90.0), ("2.5", 2.5), ("10m", 600.0), ("1h", 3600.0), ("off", None), (0, None)],
)
def test_time_budget_values(raw, seconds):
    assert project_config.check_time_budget(raw, "here") == seconds


@pytest.mark.parametrize("raw", ["-5", "soon", "10 years", True, "inf"])
def test_bad_time_budgets_say_what_is_expected(raw):
    with pytest.raises(ConfigError, match=r"^here: expected a number of seconds \(e\.g\. 600, 90s, 10m\) or 'off'"):
        project_config.check_time_budget(raw, "here")


def test_the_budget_in_the_header_and_where_it_was_set(pytester):
    pytester.makepyfile(test_slow=SLOW_MODULE)
    assert "; time budget" not in header(pytester)  # the default (600 s) goes unsaid
    assert header(pytester, "--opcheck-time-budget", "90s").endswith("; time budget 90 s (--opcheck-time-budget)")
    assert header(pytester, "--opcheck-time-budget", "off").endswith("; no time budget")
    pytester.makepyprojecttoml('[tool.opcheck]\ntime_budget = "10m"\nisolation = "off"\n')
    assert header(pytester).endswith("; time budget 600 s ([tool.opcheck] time_budget)")


def test_the_ini_sets_the_budget_too(pytester):
    pytester.makeini("[pytest]\nopcheck_time_budget = 2m\nopcheck_isolation = off\n")
    pytester.makepyfile(test_slow=SLOW_MODULE)
    ini = pytester.path / "tox.ini"
    assert header(pytester).endswith(f"; time budget 120 s (ini opcheck_time_budget ({ini}))")


@pytest.mark.parametrize(
    "args, toml, message",
    [
        (
            ["--opcheck-time-budget", "soon"],
            "",
            "ERROR: --opcheck-time-budget: expected a number of seconds (e.g. 600, 90s, 10m) or 'off', got 'soon'",
        ),
        (
            [],
            "[tool.opcheck]\nisolation = 'proc'\n",
            "ERROR: pyproject.toml:2: [tool.opcheck] isolation: unknown isolation 'proc' (did you mean 'process'?); "
            "expected one of process, off",
        ),
        (
            [],
            "[tool.opcheck]\ntime_budget = [1]\n",
            "ERROR: pyproject.toml:2: [tool.opcheck] time_budget: expected a number of seconds or 'off', got [1]",
        ),
    ],
)
def test_bad_settings_are_usage_errors(pytester, args, toml, message):
    if toml:
        pytester.makepyprojecttoml(toml)
    pytester.makepyfile(test_slow=SLOW_MODULE)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == message


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="the budget interrupts sleeps with a signal")
def test_generated_tests_have_the_budget_and_other_tests_do_not(pytester):
    pytester.syspathinsert()
    pytester.makepyfile(slow_ops=SLOW_OPS, test_slow=SLOW_MODULE, test_plain=PLAIN_SLOW_TEST)
    result = pytester.runpytest("--opcheck-time-budget", "0.5", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*TimeBudgetExceeded: opcheck gradcheck exceeded its time budget of 500 ms (--opcheck-time-budget)*"]
    )


# ------------------------------------------------------------------------------------ when to supervise
def test_an_in_process_run_is_not_supervised(pytester):
    """pytest.main from other code (pytester here) runs its session itself: a child could not repeat it."""
    pytester.makepyfile(test_slow=SLOW_MODULE)
    seen = []

    class Spy:
        @pytest.hookimpl(tryfirst=True)
        def pytest_cmdline_main(self, config):
            seen.append(supervisor.wanted(config))

    pytester.inline_run("--co", plugins=[Spy()])
    pytester.inline_run(plugins=[Spy()])
    assert seen == [False, False]


def test_a_generated_module_is_found_in_the_folders_given(tmp_path):
    (tmp_path / "gen" / "deep").mkdir(parents=True)
    (tmp_path / "gen" / "deep" / "test_x.py").write_text(GENERATED_MARKER + " from op_specs/x.yaml.\n")
    (tmp_path / "gen" / "test_plain.py").write_text("def test(): pass\n")
    assert supervisor.starts_generated(tmp_path / "gen" / "deep" / "test_x.py")
    assert not supervisor.starts_generated(tmp_path / "gen" / "test_plain.py")


# ------------------------------------------------------------------------------------ a dead process
def test_exit_reasons():
    assert crash.exit_reason(-signal.SIGSEGV) == "SIGSEGV (signal 11: segmentation fault)"
    assert crash.exit_reason(-signal.SIGABRT) == "SIGABRT (signal 6: aborted)"
    assert crash.exit_reason(1) == "exit status 1"
    assert crash.exit_reason(None).startswith("an unknown cause")


FAULT = textwrap.dedent(
    """\
    Fatal Python error: Segmentation fault

    Thread 0x00007f0000000001 (most recent call first):
      File "/usr/lib/python3/threading.py", line 320 in wait

    Current thread 0x00007f0000000002 (most recent call first):
      File "/usr/lib/python3/ctypes/__init__.py", line 519 in string_at
      File "/project/faulty_ops.py", line 9 in segfault
      File "{meter}", line 107 in metered
      File "/project/generated_tests/test_segv.py", line 28 in test_gradcheck
      File "/venv/lib/python3/site-packages/_pytest/python.py", line 166 in pytest_pyfunc_call
      File "/venv/lib/python3/site-packages/pluggy/_callers.py", line 103 in _multicall

    Extension modules: torch._C (total: 1)
    """
)


def test_the_crashed_thread_s_stack_up_to_pytest():
    text = FAULT.format(meter=crash.METER_FILE)
    assert crash.fault_stack(text, Path("/project")) == [
        "/usr/lib/python3/ctypes/__init__.py:519 in string_at",
        "faulty_ops.py:9 in segfault",
        "generated_tests/test_segv.py:28 in test_gradcheck",
    ]
    assert crash.fatal_error(text) == "Fatal Python error: Segmentation fault"
    assert crash.fault_stack("") == []


HUNG = textwrap.dedent(
    """\
    Fatal Python error: Aborted

    Thread 0x00007f0000000003 (most recent call first):
      <no Python frame>

    Current thread 0x00007f0000000002 (most recent call first):
      File "/usr/lib/python3/threading.py", line 331 in wait
      File "/usr/lib/python3/threading.py", line 1016 in _bootstrap

    Thread 0x00007f0000000001 (most recent call first):
      File "/project/faulty_ops.py", line 30 in deadlock
      File "{meter}", line 107 in metered
      File "/project/generated_tests/test_hang.py", line 28 in test_gradcheck
      File "/venv/lib/python3/site-packages/_pytest/python.py", line 166 in pytest_pyfunc_call
    """
)


@pytest.mark.parametrize("current", [True, False], ids=["another_thread_current", "no_current_thread"])
def test_a_hung_test_s_stack_is_its_own_thread_s_whichever_thread_took_the_signal(current):
    # The test's thread blocked in C (a deadlock) with the budget's interrupt pending: the watcher's
    # SIGABRT went to another thread, a Python one or one without a Python thread state.
    text = HUNG.format(meter=crash.METER_FILE)
    if not current:
        text = text.replace("Current thread", "Thread")
    stack = ["faulty_ops.py:30 in deadlock", "generated_tests/test_hang.py:28 in test_gradcheck"]
    assert crash.fault_stack(text, Path("/project"), test_thread=True) == stack
    killed = crash.describe(-signal.SIGABRT, text, killed=crash.BudgetKill(3.0, 8.5), root=Path("/project"))
    assert "  faulty_ops.py:30 in deadlock" in killed.details
    # a crash is the thread's that crashed: the current one (or, unlabelled, the first shown)
    assert crash.fault_stack(text, Path("/project")) == (
        ["/usr/lib/python3/threading.py:331 in wait", "/usr/lib/python3/threading.py:1016 in _bootstrap"]
        if current
        else []
    )


def test_what_a_failure_says_of_a_dead_process():
    segv = crash.describe(-signal.SIGSEGV, FAULT.format(meter=crash.METER_FILE), root=Path("/project"))
    assert segv.headline == "crashed the test process: SIGSEGV (signal 11: segmentation fault)"
    assert "  faulty_ops.py:9 in segfault" in segv.details and "--opcheck-isolation off" in segv.details
    setup = crash.describe(-signal.SIGABRT, phase="setup")
    assert setup.headline == "crashed the test process in its setup: SIGABRT (signal 6: aborted)"
    assert "no Python stack was recorded" in setup.details
    killed = crash.describe(-signal.SIGABRT, overdue="3 s in gradcheck (VJP)", killed=crash.BudgetKill(3, 8.4))
    assert killed.headline == (
        "exceeded its time budget of 3 s and did not stop when interrupted: opcheck ended the test process after 8.4 s"
    )
    assert killed.details.startswith("where the time went: 3 s in gradcheck (VJP)")
    assert "if the test is only slow: a smaller sample, `fast_mode: true`" in killed.details
    hung = crash.describe(
        -signal.SIGABRT,
        overdue="3 s in gradcheck (VJP): the op's first call had run 3 s and was still running (a hang: 100% of "
        "the budget in one call, not a cost)",
        killed=crash.BudgetKill(3, 8.4),
    )
    assert "smaller sample" not in hung.details and "fast_mode" not in hung.details
    assert "hint: if that one call is only this slow: a longer --opcheck-time-budget" in hung.details
    exited = crash.describe(1)
    assert exited.headline == "ended the test process with exit status 1" and "pytest-timeout" in exited.details


def test_a_crash_report_reads_as_a_failure_with_a_message():
    longrepr = crash.CrashRepr("crashed the test process: SIGSEGV\nmore", "generated_tests/test_x.py", 3)
    assert longrepr.reprcrash.message == str(longrepr) == "crashed the test process: SIGSEGV\nmore"


# ------------------------------------------------------------------------------------ the progress log
def test_the_progress_log_says_which_test_was_running(tmp_path):
    log = tmp_path / "run.1.log"
    writer = ProgressWriter(log)
    writer.started("t.py::a", 600)
    writer.write_json("R", {"nodeid": "t.py::a", "report": {"when": "setup", "outcome": "passed"}})
    writer.finished("t.py::a")
    writer.started("t.py::b", None)
    progress = read_progress(log)
    assert progress.finished == ["t.py::a"] and progress.running == "t.py::b" and progress.running_budget == 0
    assert progress.reports == {"t.py::a": [{"when": "setup", "outcome": "passed"}]}
    assert progress.pid is not None and progress.exitstatus is None
    with open(log, "ab") as f:  # a line cut short by the crash is not read
        f.write(b"F t.py::b")
    assert read_progress(log).running == "t.py::b"


def test_the_history_of_earlier_processes(tmp_path):
    run = RunDir(tmp_path)
    first = ProgressWriter(run.log(1))
    first.started("t.py::a", 0)
    first.finished("t.py::a")
    first.started("t.py::b", 0)
    run.write_crash(1, Crash("t.py::b", "crashed the test process: SIGSEGV", "call", 0.5, (), 1))
    second = ProgressWriter(run.log(2))
    second.started("t.py::c", 0)
    second.finished("t.py::c")
    second.write_json("X", {"nodeid": "t.py::c", "why": "left the CUDA device unusable"})
    history = run.history(3)
    assert set(history.finished) == {"t.py::a", "t.py::c"} and set(history.crashes) == {"t.py::b"}
    assert history.restarts == [{"nodeid": "t.py::c", "why": "left the CUDA device unusable", "index": 2}]
    assert history.processes == 2 and not run.history(1)


def test_the_watcher_ends_a_test_past_its_budget_and_grace(tmp_path):
    log = tmp_path / "run.1.log"
    writer = ProgressWriter(log)
    writer.started("t.py::a", 10)
    sent = []
    watcher = Watcher(log)
    watcher.poll(now=100.0, kill=lambda pid, sig: sent.append(sig))
    watcher.poll(now=100.0 + 10 + grace(10) - 0.1, kill=lambda pid, sig: sent.append(sig))
    assert sent == [] and watcher.running == "t.py::a"
    watcher.poll(now=100.0 + 10 + grace(10) + 0.1, kill=lambda pid, sig: sent.append(sig))
    assert sent == [signal.SIGABRT] and watcher.killed is not None and watcher.killed.budget == 10
    watcher.poll(now=200.0, kill=lambda pid, sig: sent.append(sig))
    assert sent == [signal.SIGABRT, getattr(signal, "SIGKILL", signal.SIGTERM)]


def test_a_test_without_a_budget_is_never_ended(tmp_path):
    log = tmp_path / "run.1.log"
    ProgressWriter(log).started("t.py::a", None)
    sent = []
    watcher = Watcher(log)
    watcher.poll(now=0.0, kill=lambda pid, sig: sent.append(sig))
    watcher.poll(now=1e6, kill=lambda pid, sig: sent.append(sig))
    assert sent == []


def test_grace_grows_with_the_budget():
    assert grace(0) == 5 and grace(600) == 65


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="POSIX signals")


def test_the_supervisor_imports_no_torch():
    """The process that only supervises the run starts in a fraction of a second: torch is not for it."""
    import subprocess

    code = (
        "import importlib, sys, opcheck.plugin, opcheck.isolation, opcheck.isolation.xdist, opcheck.runtime.budget; "
        "[importlib.import_module(name) for name in opcheck.plugin.pytest_plugins]; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
