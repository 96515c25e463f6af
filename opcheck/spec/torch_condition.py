"""A rule's `where.torch`: a condition on the installed torch's version, such as "<2.14" or
">=2.12,<2.15" (a comma means "and").

Versions are MAJOR.MINOR or MAJOR.MINOR.PATCH and compare numerically, the shorter padded with
zeros (so "<2.14" excludes 2.14.1, and "==2.14" means 2.14.0). The installed version counts by its
release part alone: "2.14.1+cu130" is 2.14.1, and a pre-release "2.14.0a0" is 2.14.0.

This module does not import torch until `installed` is called.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable

_CLAUSE = r" *(<=|>=|==|!=|<|>) *([0-9]+\.[0-9]+(?:\.[0-9]+)?) *"
PATTERN = r"^ *(<=|>=|==|!=|<|>) *[0-9]+\.[0-9]+(\.[0-9]+)? *(, *(<=|>=|==|!=|<|>) *[0-9]+\.[0-9]+(\.[0-9]+)? *)*$"
"""What a condition looks like (the schema's `torchCondition` pattern is the same)."""

_OPERATORS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_RELEASE = re.compile(r"[0-9]+(?:\.[0-9]+)*")

Clause = tuple[str, tuple[int, ...]]


@functools.cache
def parse(condition: str) -> tuple[Clause, ...]:
    """The (operator, version) clauses of a condition; ValueError if it is not one."""
    clauses = [re.fullmatch(_CLAUSE, part) for part in condition.split(",")]
    if not all(clauses):
        raise ValueError(f"expected a version condition such as '<2.14' or '>=2.12,<2.15', got {condition!r}")
    return tuple((m.group(1), tuple(map(int, m.group(2).split(".")))) for m in clauses if m)


def release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version string: "2.14.1+cpu" -> (2, 14, 1)."""
    match = _RELEASE.match(version.strip().removeprefix("v"))
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(map(int, match.group().split(".")))


def satisfies(version: str, condition: str) -> bool:
    """Whether `version` (a torch.__version__) meets every clause of `condition`."""
    have = release(version)
    for op, want in parse(condition):
        width = max(len(have), len(want))
        if not _OPERATORS[op](_pad(have, width), _pad(want, width)):
            return False
    return True


def _pad(version: tuple[int, ...], width: int) -> tuple[int, ...]:
    return version + (0,) * (width - len(version))


@functools.cache
def installed() -> str:
    """The installed torch's `torch.__version__` (imports torch)."""
    import torch

    return str(torch.__version__)


def installed_satisfies(condition: str) -> bool:
    """Whether the installed torch meets `condition`."""
    return satisfies(installed(), condition)
