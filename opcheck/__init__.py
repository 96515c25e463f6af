"""opcheck: declarative, fast, well-explained gradient checks for PyTorch operators.

The engine's names are imported on first use, so that `opcheck` on the command line and the
pytest plugin start without importing torch.
"""

from __future__ import annotations

from opcheck._lazy import lazy_names

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (a literal, parsed without importing)

_ENGINE_NAMES = (
    "GradcheckError",
    "GradcheckReport",
    "JacobianMismatch",
    "gradcheck",
    "gradcheck_report",
    "gradgradcheck",
    "gradgradcheck_report",
    "LowPrecisionError",
    "LowPrecisionReport",
    "lowprec_check",
    "lowprec_report",
)
__all__ = list(_ENGINE_NAMES)
__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(_ENGINE_NAMES, "opcheck.engine"))
