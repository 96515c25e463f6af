"""What one gradcheck or gradgradcheck call checks, and how: its flags as one frozen value.

The public entry points build a CheckFlags once from their arguments; every later stage reads it.
The defaults are torch.autograd.gradcheck 2.13's, and are written only here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Literal

from opcheck._records import record
from opcheck.engine.reporting import torch_words

DEFAULT_EPS = 1e-6
"""The finite differences' step (torch's default)."""
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-3
"""A Jacobian entry passes when |analytical - numerical| <= atol + rtol * |numerical| (torch's defaults)."""

DEFAULT_JACOBIAN_BUDGET = 1 << 20
"""Jacobian entries (Σ numel_in * numel_out) up to which fast_mode="auto" lets the full check decide
a call that its projection checks do not pass."""

FastMode = bool | Literal["auto"]


@record
class CheckFlags:
    """The flags of one call, validated as torch validates them, in torch's order.

    gradgradcheck's are those of the gradcheck it runs on the first derivative: check_forward_ad is
    its check_fwd_over_rev, check_backward_ad its check_rev_over_rev.
    """

    eps: float = DEFAULT_EPS
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    nondet_tol: float = 0.0
    """How far two backward passes at the same point may differ (nondeterministic kernels)."""
    check_undefined_grad: bool = True
    """Backward must treat an undefined grad_output as zero (and forward AD an undefined tangent)."""
    check_grad_dtypes: bool = False
    """Forward AD's tangents must be real for real outputs, complex for complex ones."""
    check_batched_grad: bool = False
    """vmap over backward must agree with one backward at a time."""
    check_batched_forward_grad: bool = False
    """vmap over forward AD must agree with one JVP at a time."""
    check_forward_ad: bool = False
    """The JVP's Jacobian is checked against finite differences."""
    check_backward_ad: bool = True
    """The VJP's Jacobian is checked against finite differences."""
    fast_mode: FastMode = False
    """False: every Jacobian entry; True: torch's random projections; "auto": see opcheck.engine.auto.stepwise."""
    masked: bool | None = None
    """Sparse inputs: the gradient is checked at the specified elements only (else at every position)."""
    jacobian_budget: int = DEFAULT_JACOBIAN_BUDGET
    """fast_mode="auto": Jacobian entries up to which the full check decides what the projections do not pass."""

    def __post_init__(self) -> None:
        if not (self.check_forward_ad or self.check_backward_ad):
            raise AssertionError(torch_words.flag_error("gradcheck", "forward or backward"))
        if self.check_batched_grad and not self.check_backward_ad:
            raise AssertionError(torch_words.flag_error("gradcheck", "batched grad"))
        if self.check_batched_forward_grad and not self.check_forward_ad:
            raise AssertionError(torch_words.flag_error("gradcheck", "batched forward grad"))
        if isinstance(self.fast_mode, str) and self.fast_mode != "auto":
            raise ValueError(f"fast_mode must be True, False or 'auto', got {self.fast_mode!r}")
        budget = self.jacobian_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"jacobian_budget must be a non-negative int (Jacobian entries), got {budget!r}")

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> CheckFlags:
        """The flags of a public call from its arguments, by name: gradcheck's parameters are named
        as these fields are. The others (func, inputs, raise_exception) are not flags; a missing
        flag has its default, and jacobian_budget=None means the default budget."""
        names = {f.name for f in fields(cls)}
        given = {name: value for name, value in arguments.items() if name in names}
        if given.get("jacobian_budget") is None:
            given["jacobian_budget"] = DEFAULT_JACOBIAN_BUDGET
        return cls(**given)

    @property
    def auto(self) -> bool:
        """fast_mode="auto" (opcheck's own mode, see opcheck.engine.auto.stepwise)."""
        return isinstance(self.fast_mode, str)
