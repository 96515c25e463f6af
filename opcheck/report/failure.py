"""What a failure says in brief: the worst entry it names and its hints, read from the marked lines
of the message when the test fails, for the results file and the report's notes.

The marks are those the engine and the runtime write (opcheck.engine.reporting.diagnostics and .projections
for a Jacobian or projection block, opcheck.engine.lowprec.judge for a low-precision part,
opcheck.runtime.report.format_failure around either):

    check: backward (VJP); d output 0 / d input 0          <- the block (engine)
    VJP: gradient of input 0: 39 of 40 entries beyond ...  <- the part (low precision)
    worst entries:                                         <- or `worst entries (...):`
      d out[1] / d in[1]: analytical 4.557, numerical ...  <- the worst entry, indented
    hint: analytical ≈ 1.5 × numerical everywhere: ...     <- one hint per line, at the line's start

Any other failure (a crash, a plain assertion) has neither, and the report shows its first line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HINT_PREFIX = "hint: "
MESSAGE_LIMIT = 20_000
"""Characters of a failure's message the results file keeps (a message is a few thousand at most;
an exception that prints a whole tensor is cut)."""

_WORST_HEADER = re.compile(r"worst entries\b.*:")
_ENGINE_BLOCK = re.compile(r"check: .*; (?P<block>d .+)")
_LOWPREC_PART = re.compile(r"(?P<part>.+?): \d+ of \d+ entries beyond the bound\b.*")


@dataclass(frozen=True)
class FailureDetails:
    worst: str = ""  # "d output 0 / d input 0, d out[1] / d in[1]: analytical ..."; "" when none is named
    hint: str = ""  # the hints, one per line, without their "hint: " mark; "" when there are none


def failure_details(message: str) -> FailureDetails:
    """The first worst entry the message lists, after the block or part it belongs to, and every hint."""
    lines = message.splitlines()
    hints = [line.removeprefix(HINT_PREFIX).strip() for line in lines if line.startswith(HINT_PREFIX)]
    return FailureDetails(worst=_worst(lines), hint="\n".join(dict.fromkeys(h for h in hints if h)))


def _worst(lines: list[str]) -> str:
    context = ""
    for i, line in enumerate(lines):
        found = _ENGINE_BLOCK.fullmatch(line) or _LOWPREC_PART.fullmatch(line)
        if found is not None:
            context = found.group(1)
        elif _WORST_HEADER.fullmatch(line):
            entry = next((e for e in lines[i + 1 : i + 2] if e[:1].isspace() and e.strip()), "")
            if entry:
                return f"{context}, {entry.strip()}" if context else entry.strip()
    return ""


def kept_message(message: str) -> str:
    """The message as the results file keeps it: "" when its first line says it all, else at most
    MESSAGE_LIMIT characters of it."""
    text = message.strip("\n")
    if len([line for line in text.splitlines() if line.strip()]) <= 1:
        return ""
    if len(text) <= MESSAGE_LIMIT:
        return text
    return text[:MESSAGE_LIMIT] + f"\n... ({len(text) - MESSAGE_LIMIT:,} more characters)"
