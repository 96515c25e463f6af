"""The progress log a test process keeps for the process that watches it: one line per event,
written with one `os.write` each and never buffered, so it holds everything up to a crash.

    P 4711                                  the process started (its pid)
    S 600 1767.5 generated_tests/test_x.py::t[a]   a test started: its time budget in seconds (0: none),
                                            the time it started (time.time())
    R {...}                                 one of its reports (setup, call, teardown), serialized
    F generated_tests/test_x.py::t[a]       it finished
    W {...}                                 a warning it raised
    O {"nodeid": ..., "account": ...}       it ran out of its time budget: where the time went
    X {"nodeid": ..., "why": ...}           after it, the process ends itself (a CUDA error)
    E 1                                     the session ended, with this exit status

A test with an S line and no F line is the one that was running when the process died. Reports are
written only where a later process replays them (`reports=True`: the supervised run); an xdist
worker's go to the controller over xdist's own channel.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID, STARTED, REPORT, FINISHED, WARNING, OVERDUE, RESTART, ENDED = "PSRFWOXE"
_encode = json.JSONEncoder(separators=(",", ":"), default=repr).encode


class ProgressWriter:
    """Appends events to the log at `path` (created empty)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        self.write(PID, str(os.getpid()))

    def write(self, tag: str, payload: str) -> None:
        os.write(self._fd, f"{tag} {payload}\n".encode("utf-8", "backslashreplace"))

    def write_json(self, tag: str, data: Any) -> None:
        self.write(tag, _encode(data))

    def started(self, nodeid: str, budget: float | None) -> None:
        self.write(STARTED, f"{budget or 0:g} {time.time():.6f} {nodeid}")

    def finished(self, nodeid: str) -> None:
        self.write(FINISHED, nodeid)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


@dataclass
class Progress:
    """What a log says, read once (a finished process) or as it grows (`feed`)."""

    pid: int | None = None
    finished: list[str] = field(default_factory=list)
    reports: dict[str, list[dict]] = field(default_factory=dict)  # node id → its reports, in order
    warnings: dict[str, list[dict]] = field(default_factory=dict)
    running: str | None = None  # started and not finished
    running_budget: float = 0.0
    running_since: float = 0.0  # time.time() when it started
    overdue: dict[str, str] = field(default_factory=dict)  # node id → where the time went
    restart: dict | None = None  # {"nodeid", "why"}: the process ends itself after that test
    exitstatus: int | None = None  # the session ended
    with_reports: bool = True  # False: R and W lines are skipped (a watcher needs none)
    _partial: bytes = b""
    _offset: int = 0

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the log; a line is read once its newline is there."""
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            self._line(raw.decode("utf-8", "replace"))

    def update(self, path: Path) -> None:
        """Read what was appended to the log at `path` since the last call."""
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        self.feed(data)

    def _line(self, line: str) -> None:
        tag, _, payload = line.partition(" ")
        if tag == STARTED:
            budget, since, nodeid = payload.split(" ", 2)
            self.running, self.running_budget, self.running_since = nodeid, float(budget), float(since)
        elif tag == FINISHED:
            self.finished.append(payload)
            if self.running == payload:
                self.running = None
        elif tag in (REPORT, WARNING) and not self.with_reports:
            return
        elif tag == REPORT:
            data = json.loads(payload)
            self.reports.setdefault(data["nodeid"], []).append(data["report"])
        elif tag == WARNING:
            data = json.loads(payload)
            self.warnings.setdefault(data["nodeid"], []).append(data)
        elif tag == OVERDUE:
            data = json.loads(payload)
            self.overdue[data["nodeid"]] = data["account"]
        elif tag == RESTART:
            self.restart = json.loads(payload)
        elif tag == ENDED:
            self.exitstatus = int(payload)
        elif tag == PID:
            self.pid = int(payload)


def read_progress(path: Path) -> Progress:
    progress = Progress()
    progress.update(path)
    return progress
