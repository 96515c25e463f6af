"""Evaluate many perturbations, VJPs and JVPs at once, with the one-at-a-time loop as the fallback.

Every strategy here has two implementations that must agree: a batched one (one vmapped call
per chunk of columns) and the loop torch.autograd.gradcheck uses. The batched one is tried first;
it is abandoned for the rest of the call the first time it raises or a probe (one plain call at a
point the batch also evaluated) disagrees with it, so the loop's result and its exceptions are what
the caller sees whenever batching is in doubt.

Its rooms, imported one way (each only from those above it):

- settings: the context's switches (vmap_batching, batching_clock) and sizes;
- schedule: chunk sizes and the growing schedule of batches;
- agreement: when a batched result may stand for the plain one;
- evaluator: the per-call policy (which kinds still batch, the adaptive rule) and counters;
- finite_differences: central differences by plain calls, the loop every check uses;
- fd_columns: the numerical Jacobian's columns, vmapped;
- vjp_rows: the analytical Jacobian's rows from backward, batched;
- jvp_columns: its columns from forward-mode AD, vmapped.

jvp_columns' names load on first use (a check of backward alone never needs them); its function
is imported from its module, whose name it shares.
"""

from typing import TYPE_CHECKING

from opcheck._lazy import lazy_names
from opcheck.engine.batching.agreement import Disagreement, close, combination_close
from opcheck.engine.batching.evaluator import BatchingKind, EvalStats, Evaluator, warm_functorch
from opcheck.engine.batching.fd_columns import LoopOverBudget, Segment, numerical_columns
from opcheck.engine.batching.finite_differences import (
    Differences,
    InputWritten,
    difference_quotient,
    neighbourhood_check,
)
from opcheck.engine.batching.schedule import OneHotRows, Schedule, one_hot_rows
from opcheck.engine.batching.settings import (
    DEFAULT_MEMORY_BUDGET,
    FUSE_MAX_COLUMNS,
    FUSED_MIN_COLUMNS,
    MIN_BATCH_COLUMNS,
    PILOT_COLUMNS,
    Clock,
    adaptive_clock,
    batching_clock,
    batching_enabled,
    vmap_batching,
)
from opcheck.engine.batching.vjp_rows import BatchedRows, LoopRows, vjp_batch, vjp_rows

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "FUSE_MAX_COLUMNS",
    "FUSED_MIN_COLUMNS",
    "MIN_BATCH_COLUMNS",
    "PILOT_COLUMNS",
    "BatchedRows",
    "Clock",
    "Differences",
    "InputWritten",
    "Disagreement",
    "DtypeCheck",
    "EvalStats",
    "Evaluator",
    "ForwardCalls",
    "BatchingKind",
    "LoopOverBudget",
    "LoopRows",
    "Schedule",
    "Segment",
    "adaptive_clock",
    "batching_clock",
    "batching_enabled",
    "close",
    "combination_close",
    "difference_quotient",
    "legacy_tangents",
    "neighbourhood_check",
    "numerical_columns",
    "OneHotRows",
    "one_hot_rows",
    "vjp_batch",
    "vjp_rows",
    "vmap_batching",
    "warm_functorch",
]

if TYPE_CHECKING:
    from opcheck.engine.batching.jvp_columns import DtypeCheck, ForwardCalls, legacy_tangents

_FORWARD_NAMES = ("DtypeCheck", "ForwardCalls", "legacy_tangents")
__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(_FORWARD_NAMES, "opcheck.engine.batching.jvp_columns"))
