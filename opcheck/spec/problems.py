"""What a bad spec produces: located problems, collected and raised together as one SpecError."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opcheck.spec.model import Location

KeyPath = tuple[str | int, ...]
"""("samples", 2, "args", 0, "shape"): mapping keys and list indices, root first."""


@dataclass(frozen=True)
class KeyOf:
    """The last part of a path that names a mapping's key rather than its value.

    A schema problem with a key (unknown, missing, badly named) is flagged at
    `mapping_path + (KeyOf(key),)`: the mapping is incomplete or holds a value no schema judged
    (at `mapping_path + (key,)`), and a placeholder for that value, reported on its own, does not
    hide the problem with its key.
    """

    key: str


FlaggedPath = tuple[str | int | KeyOf, ...]
"""Where the schema found a problem: a KeyPath, or one that ends in KeyOf."""

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, where it was written, and what the key path to it is."""

    location: Location
    path: str  # "samples[2].args[0].shape"; "" for the document itself
    message: str

    def __str__(self) -> str:
        if self.path:
            return f"{self.location}: {self.path}: {self.message}"
        return f"{self.location}: {self.message}"

    def sort_key(self) -> tuple[str, int, int, str, str]:
        loc = self.location
        return (loc.file, loc.line, loc.col, self.path, self.message)


class SpecError(Exception):
    """Every problem found in the specs of one load, sorted by file, line and column."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: list[Problem] = sorted(set(problems), key=Problem.sort_key)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)

    # Pickles with its problems (Exception's default would pass the text).
    def __reduce__(self) -> tuple[type[SpecError], tuple[list[Problem]]]:
        return type(self), (self.problems,)


def format_path(path: KeyPath) -> str:
    """("samples", 2, "args", 0) -> "samples[2].args[0]"; keys that are not identifiers are quoted."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def show(value: object, limit: int = 60) -> str:
    """A given value as the message's "got ..." part, in YAML's words; control characters escaped."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "an empty list" if not value else "a list"
    text = repr(value)  # repr escapes control characters: a spec can't write to the terminal
    if len(text) <= limit:
        return text
    return text[: limit - 4] + ("...'" if isinstance(value, str) else "...")


def did_you_mean(word: object, choices: Sequence[str]) -> str:
    """ "; did you mean 'x'?" when a choice is close to the word, else ""."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
