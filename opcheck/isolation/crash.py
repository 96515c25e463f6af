"""What happened to a test process that died while a test ran, in the words a failure report shows.

The facts: the process's exit status (a signal on POSIX, an NTSTATUS code on Windows, or a plain
exit status), the Python stack faulthandler wrote when a fatal signal came (into a file of the
run, not the terminal), the watchdog's account of a test that ran out of its time budget, and
whether the watcher ended the process itself for that.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from opcheck.failure_facts import hint_lines
from opcheck.runtime.budget import HANG_WORDS, METER_FILE, format_seconds

STACK_FRAMES = 12
"""Innermost frames of the crashed thread a message shows."""

_WINDOWS_CODES = {
    0xC0000005: "access violation",
    0xC00000FD: "stack overflow",
    0xC0000409: "stack buffer overrun (abort)",
    0xC000001D: "illegal instruction",
    0xC0000094: "integer division by zero",
}
_FRAME = re.compile(r'\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)')
_HARNESS = ("_pytest", "pluggy")  # frames of pytest itself: the stack shown stops there


@dataclass(frozen=True)
class Death:
    """Why a test failed with its process: a first line, then what else is known."""

    headline: str
    details: str = ""
    hints: tuple[str, ...] = ()  # the hints `details` ends with

    @property
    def message(self) -> str:
        return self.headline + ("\n" + self.details if self.details else "")


@dataclass(frozen=True)
class BudgetKill:
    """The watcher ended the process: the test ran past its budget plus a grace period."""

    budget: float
    elapsed: float


def exit_reason(returncode: int | None) -> str:
    """`SIGSEGV (signal 11: segmentation fault)`, `exit status 1`, ...: how a process ended."""
    if returncode is None:
        return "an unknown cause (its exit status could not be read)"
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        text = signal.strsignal(number) if hasattr(signal, "strsignal") else None
        return f"{name} (signal {number}{': ' + text.lower() if text else ''})"
    if os.name == "nt" and returncode >= 0xC0000000:
        return f"exit code {returncode:#x} ({_WINDOWS_CODES.get(returncode, 'an unhandled exception')})"
    return f"exit status {returncode}"


def fault_stack(
    text: str, root: Path | None = None, limit: int = STACK_FRAMES, *, test_thread: bool = False
) -> list[str]:
    """The crashed thread's frames in a faulthandler dump, innermost first, up to pytest's own.

    With `test_thread` (the watcher ended a hung test with SIGABRT), the frames of the thread that
    runs the test, the one whose stack reaches pytest's frames. faulthandler shows as current the
    thread that took the signal, and the kernel may give a signal sent to a process to any of its
    threads free to take it: not to one with another signal pending, as the test's thread blocked in
    C can have the time budget's interrupt; the one that takes it may have no Python frames at all."""
    sections = _thread_sections(text.splitlines())
    if not sections:
        return []
    # the current thread first (without one, the first shown); with `test_thread`, the first thread
    # that reaches pytest's frames before it
    sections.sort(key=lambda section: (test_thread and not section[1], not section[0]))
    frames = sections[0][2]
    return [f"{_shown(path, root)}:{line} in {name}" for path, line, name in frames][:limit]


def _thread_sections(lines: list[str]) -> list[tuple[bool, bool, list[tuple[str, str, str]]]]:
    """Each thread a faulthandler dump shows, in its order: (whether it is the current thread,
    whether its stack reaches pytest's frames, its frames innermost first up to them)."""
    sections: list[tuple[bool, bool, list[tuple[str, str, str]]]] = []
    for i, line in enumerate(lines):
        current = line.startswith("Current thread")
        if not (current or line.startswith("Thread ")):
            continue
        frames: list[tuple[str, str, str]] = []
        harness = False
        for frame_line in lines[i + 1 :]:
            found = _FRAME.fullmatch(frame_line)
            if found is None:
                break
            path = found["file"]
            if any(f"{os.sep}{part}{os.sep}" in path for part in _HARNESS):
                harness = True
                break
            if path == METER_FILE:  # opcheck's wrapper around the op
                continue
            frames.append((path, found["line"], found["name"]))
        sections.append((current, harness, frames))
    return sections


def fatal_error(text: str) -> str | None:
    """faulthandler's first line, `Fatal Python error: Segmentation fault`, or None."""
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            return line
    return None


def _shown(path: str, root: Path | None) -> str:
    if root is None:
        return path
    try:
        relative = os.path.relpath(path, root)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def describe(
    returncode: int | None,
    fault_text: str = "",
    *,
    phase: str = "call",
    overdue: str | None = None,
    killed: BudgetKill | None = None,
    root: Path | None = None,
) -> Death:
    """Why the test running in `phase` failed with its process."""
    where = "" if phase == "call" else f" in its {phase}"
    if killed is not None:
        headline = (
            f"exceeded its time budget of {format_seconds(killed.budget)} and did not stop when interrupted{where}: "
            f"opcheck ended the test process after {format_seconds(killed.elapsed)}"
        )
    elif returncode is not None and returncode >= 0 and not (os.name == "nt" and returncode >= 0xC0000000):
        headline = f"ended the test process{where} with {exit_reason(returncode)}"
    else:
        headline = f"crashed the test process{where}: {exit_reason(returncode)}"
    details = []
    if overdue:
        details.append(f"where the time went: {overdue}")
    stack = fault_stack(fault_text, root, test_thread=killed is not None)
    if stack:
        details.append("the Python stack at the end (innermost first):")
        details += [f"  {frame}" for frame in stack]
    elif killed is None:
        details.append("no Python stack was recorded (the process was killed, or exited without a fatal error)")
    hung = overdue is not None and HANG_WORDS in overdue  # the account named a call that never returned
    hints = tuple(_hints(returncode, killed, hung))
    details += hint_lines(hints)
    return Death(headline, "\n".join(details), hints)


def _hints(returncode: int | None, killed: BudgetKill | None, hung: bool = False) -> list[str]:
    if killed is not None:
        never_returns = (
            "code that never returns to Python (a C++ or CUDA kernel that loops or deadlocks, a blocking call "
            "that retries) ignores the interrupt; the stack shows where it was"
        )
        if hung:  # one call of the op ran past half the budget: a cheaper check still makes that call
            return [
                never_returns,
                "if that one call is only this slow: a longer --opcheck-time-budget (time_budget in [tool.opcheck])",
            ]
        return [
            never_returns,
            "if the test is only slow: a smaller sample, `fast_mode: true` under `gradcheck:`, or a longer "
            "--opcheck-time-budget (time_budget in [tool.opcheck])",
        ]
    if returncode is not None and returncode >= 0:
        return [
            "something called os._exit() or exit(): a plugin that ends hung tests (pytest-timeout's "
            "thread method), or the op itself"
        ]
    return [
        "the op (or its backward) crashed the interpreter; the other tests ran in a new process. To debug it "
        "in one process, rerun this test alone with --opcheck-isolation off (under gdb: gdb --args python -m "
        "pytest ... --opcheck-isolation off)"
    ]


class CrashRepr:
    """A report's `longrepr` for a test that failed with its process: a message and a crash location,
    as pytest's terminal, JUnit XML and opcheck's results file read a longrepr."""

    def __init__(self, message: str, path: str, lineno: int | None) -> None:
        self.reprcrash = _CrashLocation(path, lineno or 0, message)

    def toterminal(self, tw) -> None:
        for line in self.reprcrash.message.splitlines():
            tw.line(line, red=line.startswith(("crashed", "ended", "exceeded")))

    def __str__(self) -> str:
        return self.reprcrash.message


@dataclass(frozen=True)
class _CrashLocation:
    path: str
    lineno: int
    message: str
