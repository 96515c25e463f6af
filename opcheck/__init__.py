"""opcheck: declarative, fast, well-explained gradient checks for PyTorch operators."""

from opcheck.engine import (
    GradcheckError,
    GradcheckReport,
    JacobianMismatch,
    gradcheck,
    gradcheck_report,
    gradgradcheck,
    gradgradcheck_report,
)

__all__ = [
    "GradcheckError",
    "GradcheckReport",
    "JacobianMismatch",
    "gradcheck",
    "gradcheck_report",
    "gradgradcheck",
    "gradgradcheck_report",
]
__version__ = "0.1.0"
