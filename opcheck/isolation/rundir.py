"""The folder a watched run keeps its files in, and what the processes before this one left there.

    run.1.log, run.2.log, ...     each test process's progress log (opcheck.isolation.progress)
    fault.1, fault.2, ...         where each one's faulthandler writes the stack of a fatal signal
    crash.1.json, ...             the supervisor's account of the test that process 1 died in

An xdist worker's files are named after the worker (`gw0.1.log`, `gw0.1.fault`): the controller
gives each worker it starts a name of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from opcheck.isolation.progress import Progress, read_progress


@dataclass(frozen=True)
class Crash:
    """The test a process died in, as the supervisor describes it to the next process."""

    nodeid: str
    message: str
    phase: str  # setup, call or teardown: the phase that was running
    duration: float
    reports: tuple[dict, ...] = ()  # the test's reports written before the process died
    process: int = 0  # the number of the process that died
    hints: tuple[str, ...] = ()  # the message's hints (opcheck.failure_facts)

    def to_json(self) -> dict:
        return {
            "nodeid": self.nodeid,
            "message": self.message,
            "phase": self.phase,
            "duration": self.duration,
            "reports": list(self.reports),
            "process": self.process,
            "hints": list(self.hints),
        }

    @classmethod
    def from_json(cls, data: dict) -> Crash:
        return cls(
            data["nodeid"],
            data["message"],
            data["phase"],
            data["duration"],
            tuple(data["reports"]),
            data["process"],
            tuple(data.get("hints", ())),
        )


@dataclass
class History:
    """What the earlier processes of a supervised run did: the tests they finished (with their
    reports and warnings), the tests they died in, and why the last one ended."""

    finished: dict[str, list[dict]] = field(default_factory=dict)
    warnings: dict[str, list[dict]] = field(default_factory=dict)
    crashes: dict[str, Crash] = field(default_factory=dict)
    restarts: list[dict] = field(default_factory=list)  # {"nodeid", "why", "index"}: processes that ended themselves
    processes: int = 0  # how many processes ran before

    def __bool__(self) -> bool:
        return bool(self.finished or self.crashes or self.restarts)


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def log(self, index: int | str) -> Path:
        return self.path / f"run.{index}.log"

    def fault(self, index: int | str) -> Path:
        return self.path / f"fault.{index}"

    def crash(self, index: int) -> Path:
        return self.path / f"crash.{index}.json"

    def write_crash(self, index: int, crash: Crash) -> None:
        self.crash(index).write_text(json.dumps(crash.to_json()), encoding="utf-8")

    def fault_text(self, index: int | str) -> str:
        try:
            return self.fault(index).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def progress(self, index: int) -> Progress:
        return read_progress(self.log(index))

    def history(self, before: int) -> History:
        """What processes 1 .. before-1 did."""
        history = History(processes=before - 1)
        for index in range(1, before):
            progress = self.progress(index)
            for nodeid in progress.finished:
                history.finished[nodeid] = progress.reports.get(nodeid, [])
                history.warnings[nodeid] = progress.warnings.get(nodeid, [])
            if progress.restart is not None:
                history.restarts.append(dict(progress.restart, index=index))
            path = self.crash(index)
            if path.is_file():
                crash = Crash.from_json(json.loads(path.read_text(encoding="utf-8")))
                history.crashes[crash.nodeid] = crash
        return history


def phase_after(reports: list[dict]) -> str:
    """The phase a test was in when its process died, from the reports it had written."""
    if not reports:
        return "setup"
    last = reports[-1]
    if last.get("when") == "setup" and last.get("outcome") == "passed":
        return "call"
    return "teardown"
