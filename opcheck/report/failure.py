"""What the results file keeps of a failure's message.

The worst entry and the hints are not read from the message: the engine and the runtime hand them
over as values (opcheck.failure_facts), on the test's report.
"""

from __future__ import annotations

MESSAGE_LIMIT = 20_000
"""Characters of a failure's message the results file keeps (a message is a few thousand at most;
an exception that prints a whole tensor is cut)."""


def kept_message(message: str) -> str:
    """The message as the results file keeps it: "" when its first line says it all, else at most
    MESSAGE_LIMIT characters of it."""
    text = message.strip("\n")
    if len([line for line in text.splitlines() if line.strip()]) <= 1:
        return ""
    if len(text) <= MESSAGE_LIMIT:
        return text
    return text[:MESSAGE_LIMIT] + f"\n... ({len(text) - MESSAGE_LIMIT:,} more characters)"
