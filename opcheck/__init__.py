"""opcheck: declarative, fast, well-explained gradient checks for PyTorch operators."""

from opcheck.engine import GradcheckError, gradcheck, gradgradcheck

__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]
__version__ = "0.1.0"
