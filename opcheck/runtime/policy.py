"""fast_mode: the full Jacobian while it is cheap, random projections beyond.

torch's fast mode compares one random projection vᵀJu per (input, output) pair: cheap, but a
single wrong entry of a large Jacobian moves vᵀJu by less than the tolerance and passes. The
full check sees every entry. With fast_mode "auto" a check computes the full Jacobian when its
size, the sum over (input, output) pairs of numel_in * numel_out, is within the budget
(context.DEFAULT_JACOBIAN_BUDGET = 2**20, measured there; `--opcheck-budget` or
OPCHECK_JACOBIAN_BUDGET change it), and projections beyond it. For second-order checks the
function checked maps (inputs, grad_outputs) to input gradients, so its size is
(Σ numel_in + Σ numel_out) * Σ numel_in.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcheck.runtime.context import Settings

_OVERRIDES = {"full": "false", "fast": "true", "auto": "auto"}
SECOND_ORDER = ("gradgradcheck", "fwgrad_bwgrad", "gradgrad_unsupported")


@dataclass(frozen=True)
class Policy:
    fast_mode: bool
    reason: str

    def describe(self) -> str:
        return f"{'fast mode (random projections)' if self.fast_mode else 'full Jacobian'}: {self.reason}"


def jacobian_entries(check: str, in_numels, out_numels) -> int:
    n_in, n_out = sum(in_numels), sum(out_numels)
    if check in SECOND_ORDER:
        return (n_in + n_out) * n_in
    return n_in * n_out


def choose_policy(spec_fast_mode: str, settings: Settings, entries) -> Policy:
    """entries: an int, or a callable computing it (only called for "auto")."""
    __tracebackhide__ = True
    mode = spec_fast_mode
    origin = "spec gradcheck.fast_mode"
    if settings.policy is not None:
        mode, origin = _OVERRIDES[settings.policy], f"--opcheck-policy={settings.policy}"
    if mode == "true":
        return Policy(True, f"fast_mode true ({origin})")
    if mode == "false":
        return Policy(False, f"fast_mode false ({origin})")
    n = entries() if callable(entries) else entries
    budget = settings.budget
    where = "" if settings.budget_source == "default" else f" from {settings.budget_source}"
    if n <= budget:
        return Policy(False, f"auto: {n} Jacobian entries <= budget {budget}{where}")
    return Policy(True, f"auto: {n} Jacobian entries > budget {budget}{where}")
