"""Gradient-checking engine: a drop-in for torch.autograd.gradcheck / gradgradcheck.

Only torch is imported here: no YAML, no pytest, no spec. The low-precision check's names, and the
classes of a failure's report, are imported on first use, so that a process's first gradcheck does
not pay for them.
"""

from opcheck._lazy import lazy_names
from opcheck.engine.api import (
    GradcheckReport,
    gradcheck,
    gradcheck_report,
    gradgradcheck,
    gradgradcheck_report,
)
from opcheck.engine.batching import EvalStats, vmap_batching
from opcheck.engine.errors import GradcheckError
from opcheck.engine.flags import DEFAULT_JACOBIAN_BUDGET

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

_LOWPREC_NAMES = ("lowprec_check", "lowprec_report", "LowPrecisionReport", "LowPrecisionError")
_REPORT_NAMES = {
    "JacobianMismatch": "opcheck.engine.reporting.diagnostics",
    "EntryError": "opcheck.engine.reporting.diagnostics",
    "ProjectionMismatch": "opcheck.engine.auto.projections",
}
__getattr__, __dir__ = lazy_names(
    __name__, {**dict.fromkeys(_LOWPREC_NAMES, "opcheck.engine.lowprec"), **_REPORT_NAMES}
)
