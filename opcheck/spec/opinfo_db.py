"""torch's OpInfo database (op_db): the one place that loads it and finds an entry by name.

Three readers name entries: `opinfo:` samples when the tests run (opcheck.runtime.opinfo), the
`op: opinfo:NAME[:variant]` op path (opcheck.spec.oppath), and `opcheck import-opinfo`
(opcheck.spec.opinfo_import). They share this lookup so that an entry means the same thing, and a
misspelt name gets the same suggestions, wherever it is written.

op_db lives in torch.testing._internal, which imports the expecttest package (and pytest): it is
imported on first use only, never by importing this module, so that specs and tests that name no
OpInfo never pay its import (several seconds) or need those packages.

An entry's skips and expected failures of torch's gradient tests are not all in op_db from torch
2.14 on: opcheck.spec.opinfo_skipops holds those the test files hold.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

EXPECTTEST_MISSING = "needs the expecttest package (pip install expecttest), which is not installed"
"""Why op_db cannot be read where expecttest is missing: torch.testing._internal imports it."""


class OpInfoUnavailable(ImportError):
    """op_db cannot be imported here; `needs_expecttest` says whether installing expecttest would help."""

    def __init__(self, message: str, *, needs_expecttest: bool = False) -> None:
        super().__init__(message)
        self.needs_expecttest = needs_expecttest


class UnknownOpInfo(LookupError):
    """No entry has the name; the message suggests the closest ones."""


def op_key(info: Any) -> str:
    """`name` or `name.variant`: how `opcheck import-opinfo` names an entry."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def opinfo_ref(info: Any) -> str:
    """`name` or `name:variant`: how a spec (`opinfo:` sample, `op: opinfo:...`) names an entry."""
    return f"{info.name}:{info.variant_test_name}" if info.variant_test_name else info.name


def load_op_db() -> tuple[Any, ...]:
    """Every entry of op_db, in its order; OpInfoUnavailable where torch.testing._internal does not import."""
    # Asked on every call, not only the first: whether expecttest is importable is the question,
    # and a process that already holds op_db answers it the same way as one that does not.
    try:
        import expecttest  # noqa: F401  (torch.testing._internal imports it)
    except ImportError:
        raise OpInfoUnavailable(f"torch's OpInfo database {EXPECTTEST_MISSING}", needs_expecttest=True) from None
    return _op_db()


# torch.testing._internal imports torch.utils.cpp_extension, which on a CUDA build without a GPU
# logs "No CUDA runtime is found, using CUDA_HOME=..." on stderr: about building C++ extensions,
# nothing a spec or its user does.
QUIET_LOGGERS = ("torch.utils.cpp_extension",)


@lru_cache(maxsize=1)
def _op_db() -> tuple[Any, ...]:
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as e:
        raise OpInfoUnavailable(f"cannot import torch's OpInfo database: {e}") from None
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    return tuple(op_db)


def find_entry(ref: str, db: Iterable[Any] | None = None, *, dotted: bool = False) -> Any:
    """The entry `ref` names: `name` or `name:variant`, and with `dotted` also `name.variant`.

    `db` defaults to op_db. A spec writes `name:variant` (names hold dots: `linalg.det`); the
    command line also takes `name.variant`, and with `dotted` the suggestions are written that way.
    UnknownOpInfo, with up to three close names, where no entry matches.
    """
    entries = load_op_db() if db is None else tuple(db)
    name, colon, variant = ref.partition(":")
    for info in entries:
        if info.name == name and (info.variant_test_name or "") == variant:
            return info
    if dotted and not colon:
        for info in entries:
            if op_key(info) == ref:
                return info
    known = sorted({(op_key if dotted else opinfo_ref)(info) for info in entries})
    close = difflib.get_close_matches(ref.replace(":", ".", 1) if dotted else ref, known, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownOpInfo(f"no OpInfo named {ref!r} in torch's op_db{hint}")
