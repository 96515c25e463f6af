"""fast_mode: which comparison the engine runs, and how a failure report names what it did.

torch's fast mode (`fast_mode: true`) compares one random projection vᵀJu per (input, output)
pair: cheap, but a single wrong entry of a large Jacobian moves vᵀJu by less than the tolerance
and passes. `false` computes the full Jacobian. `auto` (the default) calls the engine with
fast_mode="auto" and the run's budget (context.DEFAULT_JACOBIAN_BUDGET = 2**20, the engine's own
default; `--opcheck-budget` or OPCHECK_JACOBIAN_BUDGET change it): the full Jacobian up to
route.FULL_CHECK_ELEMENTS (128) input and output elements (a check of forward AD alone: up to
route.FORWARD_FULL_COLUMNS (32) input elements), entrywise projection checks beyond,
and within the budget a projection check that does not pass is decided by the full Jacobian
(opcheck.engine.auto.stepwise says what they guarantee).
The engine decides per comparison; a failure's `policy:` row reports what it did, from the
report's stats.auto_paths. Sizes count like the engine's: the sum over (input, output) pairs of
numel_in * numel_out; for second-order checks the function checked maps (inputs, grad_outputs) to
input gradients, so its size is (Σ numel_in + Σ numel_out) * Σ numel_in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opcheck.engine import GradcheckReport, ProjectionMismatch, route
from opcheck.runtime.context import Settings
from opcheck.spec.model import Check, FastMode

# --opcheck-policy → the fast_mode it puts in place of every spec's.
_OVERRIDES = {"full": FastMode.FALSE, "fast": FastMode.TRUE, "auto": FastMode.AUTO}
AUTO = "auto"  # the engine's fast_mode="auto"

Entries = int | Callable[[], int] | None


@dataclass(frozen=True)
class Policy:
    """The engine's fast_mode (True, False or "auto") and why; for "auto", the budget it gets.

    entries: the check's Jacobian size, or a callable computing it; only used to describe an auto
    check (so a passing check never pays for it).
    """

    fast_mode: bool | str
    reason: str
    budget: int | None = None
    budget_source: str = "default"
    entries: Entries = None

    def engine_kwargs(self) -> dict[str, object]:
        if self.fast_mode == AUTO:
            return {"fast_mode": AUTO, "jacobian_budget": self.budget}
        return {"fast_mode": self.fast_mode}

    def describe(self, report: GradcheckReport | None = None) -> str:
        """One line for the `policy:` row; for auto, what the engine did according to `report`."""
        if self.fast_mode != AUTO:
            return f"{paths_taken(self.fast_mode, report)[0]}: {self.reason}"
        where = "" if self.budget_source == "default" else f" from {self.budget_source}"
        n = self._count()
        size = f"{n} entries" if n is not None else "entries"
        budget = self.budget
        paths = _auto_paths(report) if report is not None else []
        if not paths:  # no comparison ran (the check raised first): the plan, not what happened
            return (
                f"{self.reason}: full Jacobian up to {route.FULL_CHECK_ELEMENTS} input and output elements, "
                f"entrywise projections beyond, decided by the full Jacobian within budget {self.budget}{where} "
                "entries" + (f"; this check has {n} entries" if n is not None else "")
            )
        # Within the budget the engine may still have passed the check on its projections (from
        # route.FULL_CHECK_ELEMENTS on); only the size says which side of the budget it is.
        within = n <= budget if n is not None and budget is not None else all(p.startswith("full") for p in paths)
        done = _words(paths)
        compare = f"{size} {'<=' if within else '>'} budget {self.budget}{where}"
        if done == ["full Jacobian"]:
            return f"auto: full Jacobian ({compare})"
        return f"auto: {'; '.join(done)}, {compare}"

    def _count(self) -> int | None:
        if not callable(self.entries):
            return self.entries
        try:
            return self.entries()
        except Exception:  # the op raised: the report says why; the size is only context
            return None


def paths_taken(fast_mode: bool | str, report: GradcheckReport | None) -> list[str]:
    """What the engine's check did, in the words of the `policy:` row: for fast_mode="auto", each
    comparison that decided (the full Jacobian, or projections and their source) once, the failing
    one last; otherwise the mode's one comparison."""
    if fast_mode != AUTO:
        return ["fast mode (random projections)" if fast_mode else "full Jacobian"]
    return _words(_auto_paths(report)) if report is not None else []


def _words(paths: Iterable[str]) -> list[str]:
    return list(
        dict.fromkeys(
            path.replace("full", "full Jacobian", 1)
            if path.startswith("full")
            else path.replace("projected", "projections", 1)
            for path in paths
        )
    )


def _auto_paths(report: GradcheckReport) -> list[str]:
    """The engine's auto_paths, with the comparison that failed (recorded only once it passes)."""
    paths = list(report.stats.auto_paths)
    mismatch = report.mismatch
    if isinstance(mismatch, ProjectionMismatch):
        paths.append(f"projected (J·U from {mismatch.source})")
    elif report.stats.failed_path is not None:  # a projection failure whose block was recomputed in full
        paths.append(report.stats.failed_path)
    return paths


def jacobian_entries(check: str, in_numels: Iterable[int], out_numels: Iterable[int]) -> int:
    n_in, n_out = sum(in_numels), sum(out_numels)
    if Check.parse(check).second_order:
        return (n_in + n_out) * n_in
    return n_in * n_out


def choose_policy(spec_fast_mode: str, settings: Settings, entries: Entries = None) -> Policy:
    """The policy for one check: the spec's fast_mode unless --opcheck-policy overrides it.

    entries: the check's Jacobian size (an int, or a callable computing it), kept to describe an
    auto check; the engine itself compares the size with the budget.
    """
    __tracebackhide__ = True
    mode = spec_fast_mode
    origin = "spec gradcheck.fast_mode"
    if settings.policy is not None:
        mode, origin = _OVERRIDES[settings.policy], f"--opcheck-policy={settings.policy}"
    if mode == FastMode.TRUE:
        return Policy(True, f"fast_mode true ({origin})")
    if mode == FastMode.FALSE:
        return Policy(False, f"fast_mode false ({origin})")
    return Policy(
        AUTO,
        f"fast_mode auto ({origin})",
        budget=settings.budget,
        budget_source=settings.budget_source,
        entries=entries,
    )
