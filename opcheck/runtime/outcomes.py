"""How a check ends when it neither passes nor fails: the runtime's own outcomes, free of pytest.

The runtime raises `CheckSkipped(reason)` where a case cannot run here (its device is missing, a
check does not apply to the op, `opinfo:` needs a package that is not installed). The plugin turns
it into pytest's skip with the same reason and the same location (the generated test's line), so a
run reads as if pytest.skip had been called there. It is also a `unittest.SkipTest`, the standard
library's skip signal, so that a runner without opcheck's plugin (`pytest -p no:opcheck`, unittest)
still reports a skip.

A failure is an exception of its own kind (opcheck.runtime.checks: CheckFailed, CheckCrashed, ...)
that reaches the runner unchanged: its qualified name and message are what a report shows.
"""

from __future__ import annotations

import unittest


class CheckSkipped(unittest.SkipTest):
    """This case cannot run here; `reason` says why, in the words a skip report shows."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
