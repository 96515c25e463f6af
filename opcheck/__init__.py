"""opcheck: declarative, fast, well-explained gradient checks for PyTorch operators.

The engine's names are imported on first use, so that `opcheck` on the command line and the
pytest plugin start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (a literal, parsed without importing)

_ENGINE_NAMES = (
    "GradcheckError",
    "GradcheckReport",
    "JacobianMismatch",
    "gradcheck",
    "gradcheck_report",
    "gradgradcheck",
    "gradgradcheck_report",
)
__all__ = list(_ENGINE_NAMES)


def __getattr__(name: str) -> Any:
    if name in _ENGINE_NAMES:
        value = getattr(importlib.import_module("opcheck.engine"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opcheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_ENGINE_NAMES))
