"""How a check ends when it neither passes nor fails: the runtime's own outcomes, free of pytest.

The runtime raises `CheckSkipped(reason)` where a case cannot run here (its device is missing, a
check does not apply to the op, `opinfo:` needs a package that is not installed). The plugin turns
it into pytest's skip with the same reason and the same location (the generated test's line), so a
run reads as if pytest.skip had been called there. It is also a `unittest.SkipTest`, the standard
library's skip signal, so that a runner without opcheck's plugin (`pytest -p no:opcheck`, unittest)
still reports a skip.

A failure is an exception of its own kind (opcheck.runtime.checks: CheckFailed, CheckCrashed, ...)
that reaches the runner unchanged: its qualified name and message are what a report shows, and its
`facts` (opcheck.failure_facts) what the results file records of it.
"""

from __future__ import annotations

import unittest

from opcheck.failure_facts import FailureFacts


class CheckSkipped(unittest.SkipTest):
    """This case cannot run here; `reason` says why, in the words a skip report shows."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CheckFailure(AssertionError):
    """A test's failure as the runtime raises it: the whole message, and `facts`, what it names as
    values (the engine's worst entry, hints and inputs, and the runtime's own hints)."""

    def __init__(self, message: str, facts: FailureFacts | None = None) -> None:
        super().__init__(message)
        self.facts = facts if facts is not None else FailureFacts()
