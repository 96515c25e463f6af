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
from opcheck.engine.auto.projections import ProjectionMismatch
from opcheck.engine.batching import EvalStats, vmap_batching
from opcheck.engine.errors import GradcheckError
from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET
from opcheck.engine.lowprec import LowPrecisionError, LowPrecisionReport, lowprec_check, lowprec_report
from opcheck.engine.reporting.diagnostics import EntryError, JacobianMismatch

__all__ = [
    # the checks (api)
    "gradcheck",
    "gradgradcheck",
    "gradcheck_report",
    "gradgradcheck_report",
    "GradcheckReport",
    # the low-precision check (lowprec)
    "lowprec_check",
    "lowprec_report",
    "LowPrecisionReport",
    "LowPrecisionError",
    # what a failure carries (errors, diagnostics, projections)
    "GradcheckError",
    "JacobianMismatch",
    "EntryError",
    "ProjectionMismatch",
    # how the checks run (batching, flags)
    "EvalStats",
    "vmap_batching",
    "DEFAULT_JACOBIAN_BUDGET",
]
