"""What a failure names, as a value: its worst entry, its hints, and the inputs it speaks of.

The message says the same things in words; programs read these instead of parsing it. The engine
sets them on its errors (`GradcheckError.facts`, `LowPrecisionError.facts`), the runtime adds its
own hints and keeps them on the test's failure (`facts` on the exception), the runtest plugin puts
them on the test's report (user_properties under FAILURE_PROPERTY, a JSON string: pytest-xdist and
opcheck's process isolation carry it to the controller, JUnit XML writes it as a property), and the
results file reads them there (opcheck.report.collect). A test that died with its process gets its
facts from the supervisor that describes the death.

Importing this module imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from opcheck._records import record

FAILURE_PROPERTY = "opcheck_failure"
HINT_PREFIX = "hint: "


@record
class FailureFacts:
    # The block or part, then its first worst entry: "d output 0 / d input 0, d out[1] / d in[1]:
    # analytical 4.557, ..."; "" when the failure names no entry.
    worst: str = ""
    hints: tuple[str, ...] = ()  # what to try, each written in the message after HINT_PREFIX
    # The inputs the message names ("input 2"), by the numbers it writes: the position among the
    # tensors gradcheck was given that require grad (gradgradcheck: among its function's inputs).
    inputs: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.worst or self.hints or self.inputs)

    def adding(self, *, hints: Iterable[str] = (), inputs: Iterable[int] = ()) -> FailureFacts:
        """These facts with more hints and inputs (each kept once, in order)."""
        return replace(
            self,
            hints=tuple(dict.fromkeys((*self.hints, *hints))),
            inputs=tuple(dict.fromkeys((*self.inputs, *inputs))),
        )

    def to_property(self) -> tuple[str, str]:
        data = {"worst": self.worst, "hints": list(self.hints), "inputs": list(self.inputs)}
        return FAILURE_PROPERTY, json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_properties(cls, user_properties: Iterable[Any]) -> FailureFacts:
        """The facts a report carries (the last ones put there); empty facts when it carries none."""
        found = cls()
        for entry in user_properties or ():
            if isinstance(entry, (tuple, list)) and len(entry) == 2 and entry[0] == FAILURE_PROPERTY:
                try:
                    data = json.loads(entry[1])
                    found = cls(
                        worst=str(data.get("worst", "")),
                        hints=tuple(str(h) for h in data.get("hints", ())),
                        inputs=tuple(int(i) for i in data.get("inputs", ())),
                    )
                except (TypeError, ValueError, AttributeError):
                    continue
        return found


def facts_of(error: BaseException | None) -> FailureFacts:
    """The facts an exception carries; empty facts for one that carries none (a crash, a plain assertion)."""
    facts = getattr(error, "facts", None)
    return facts if isinstance(facts, FailureFacts) else FailureFacts()


def hint_lines(hints: Iterable[str]) -> list[str]:
    """The message's lines for `hints`."""
    return [f"{HINT_PREFIX}{hint}" for hint in hints]
