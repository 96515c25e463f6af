"""Gradient-checking engine: a drop-in for torch.autograd.gradcheck / gradgradcheck.

Only torch is imported here: no YAML, no pytest, no spec.
"""

from opcheck.engine.api import (
    GradcheckReport,
    gradcheck,
    gradcheck_report,
    gradgradcheck,
    gradgradcheck_report,
)
from opcheck.engine.auto import DEFAULT_JACOBIAN_BUDGET, ProjectionMismatch
from opcheck.engine.batching import EvalStats, vmap_batching
from opcheck.engine.diagnostics import EntryError, JacobianMismatch
from opcheck.engine.errors import GradcheckError

__all__ = [
    "DEFAULT_JACOBIAN_BUDGET",
    "ProjectionMismatch",
    "EntryError",
    "EvalStats",
    "vmap_batching",
    "GradcheckError",
    "GradcheckReport",
    "JacobianMismatch",
    "gradcheck",
    "gradcheck_report",
    "gradgradcheck",
    "gradgradcheck_report",
]
