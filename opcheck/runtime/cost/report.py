"""`opcheck list --cost`: the estimates of every generated test (cost.py), as a report; and
`opcheck generate --cost`'s warning of the tests estimated past the time budget.

Per spec (costliest first): its tests estimated, their seconds and calls together, and its costliest
test; then the costliest tests of all, with the engine's path for each; then every test estimated
over the threshold with what would make it cheaper; then the total, and what was not estimated.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from opcheck.runtime.context import Settings
from opcheck.runtime.cost.estimate import THRESHOLD, Calls, Estimate, estimate_spec, format_seconds, machine_factor
from opcheck.spec.model import OpSpec


def estimate_specs(
    specs: Iterable[OpSpec], settings: Settings, devices: Sequence[str] | None, threshold: float = THRESHOLD
) -> list[Estimate]:
    """Every test of the specs on these device types (None: every type; an unavailable one's tests
    come back skipped, saying so), with advice for those over `threshold` seconds."""
    result: list[Estimate] = []
    for spec in specs:
        result += estimate_spec(spec, settings, devices, threshold)
    return result


def render(estimates: Sequence[Estimate], *, threshold: float = THRESHOLD, top: int = 10, settings: Settings) -> str:
    """The report, as `opcheck list --cost` prints it."""
    done = [e for e in estimates if e.skipped is None]
    lines = [_header(done, settings)]
    if done:
        lines += _per_spec(done)
        chosen = sorted(done, key=lambda e: -e.seconds)
        chosen = chosen[:top] if top > 0 else chosen
        lines.append("")
        lines.append(f"costliest tests ({len(chosen)} of {len(done)}):" if top > 0 else "every test:")
        lines += _tests(chosen, threshold)
        over = [e for e in done if e.over(threshold)]
        if over:
            lines.append("")
            lines.append(f"over {format_seconds(threshold)} (--threshold), and what would make each cheaper:")
            for e in sorted(over, key=lambda e: -e.seconds):
                lines.append(f"  ! {_name(e)}: {format_seconds(e.seconds)} ({_calls(e.calls)})")
                lines += [f"      - {a}" for a in e.advice] or ["      - nothing cheaper is known"]
    lines.append("")
    lines.append(_total(estimates, done, threshold))
    return "\n".join(lines) + "\n"


def render_over_budget(estimates: Sequence[Estimate], budget: float, where: str, out: str) -> str:
    """`opcheck generate --cost`'s warning: the tests estimated past the time budget of `budget`
    seconds (set in `where`), by their ids in the modules under `out`, each with what makes it
    cheaper; "" when none is."""
    over = sorted((e for e in estimates if e.over(budget)), key=lambda e: -e.seconds)
    if not over:
        return ""
    lines = [
        f"warning: {len(over)} generated test(s) estimated past the time budget of {format_seconds(budget)} "
        f"({where}); each stops there and fails:"
    ]
    for e in over:
        lines.append(f"  {out}/test_{e.case.spec}.py::{e.case.name}: ~{format_seconds(e.seconds)} ({_calls(e.calls)})")
        lines += [f"    - {a}" for a in e.advice] or ["    - nothing cheaper is known: a longer time_budget"]
    return "\n".join(lines) + "\n"


def _header(done: Sequence[Estimate], settings: Settings) -> str:
    devices = ", ".join(sorted({e.case.device for e in done})) or "no device"
    threads = (
        "torch's own thread setting"
        if settings.threads is None
        else f"{settings.threads} torch thread" + ("s" if settings.threads > 1 else "")
    )
    policy = f"--opcheck-policy {settings.policy}" if settings.policy else "each spec's fast_mode"
    return (
        f"estimated on {devices}, {threads}, {policy}, Jacobian budget {settings.budget} "
        f"(machine factor {machine_factor():.2f}; passing checks in a warm process)"
    )


def _name(e: Estimate) -> str:
    return f"{e.case.spec}::{e.case.name}"


def _calls(calls: Calls) -> str:
    return f"{calls.total:,} calls: {calls.describe()}"


def _per_spec(done: Sequence[Estimate]) -> list[str]:
    by_spec: dict[str, list[Estimate]] = defaultdict(list)
    for e in done:
        by_spec[e.case.spec].append(e)
    rows = [("spec", "tests", "seconds", "calls", "costliest test")]
    for name, found in sorted(by_spec.items(), key=lambda kv: (-sum(e.seconds for e in kv[1]), kv[0])):
        worst = max(found, key=lambda e: e.seconds)
        rows.append(
            (
                name,
                str(len(found)),
                format_seconds(sum(e.seconds for e in found)),
                f"{sum(e.calls.total for e in found):,}",
                f"{worst.case.name} ({format_seconds(worst.seconds)})",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {1, 2, 3}
    return [
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def _tests(chosen: Sequence[Estimate], threshold: float) -> list[str]:
    rows = [("", "seconds", "fwd/bwd/jvp/batched", "test", "what the engine does")]
    for e in chosen:
        c = e.calls
        rows.append(
            (
                "!" if e.over(threshold) else "",
                format_seconds(e.seconds),
                f"{c.forward}/{c.backward}/{c.jvp}/{c.batched}",
                _name(e),
                "; ".join(e.path),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.rjust(w) if i in (1, 2) else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]


def _total(estimates: Sequence[Estimate], done: Sequence[Estimate], threshold: float) -> str:
    specs = len({e.case.spec for e in estimates})
    devices = ", ".join(sorted({e.case.device for e in done})) or "no device"
    over = sum(1 for e in done if e.over(threshold))
    text = (
        f"{specs} spec(s), {len(done):,} tests estimated on {devices}: {format_seconds(sum(e.seconds for e in done))}, "
        f"{over} over {format_seconds(threshold)}"
    )
    missing = [e for e in estimates if e.skipped is not None]
    unavailable = Counter(e.case.device for e in missing if e.not_estimated == "unavailable")
    reasons = Counter(_why(e) for e in missing if e.not_estimated != "unavailable")
    parts = []
    if unavailable:
        per_device = ", ".join(f"{d} {n:,}" for d, n in sorted(unavailable.items()))
        parts.append(f"{sum(unavailable.values()):,} on device types unavailable here ({per_device})")
    parts += [f"{n:,} {why}" for why, n in sorted(reasons.items())]
    return text + ("; not estimated: " + ", ".join(parts) if parts else "")


def _why(e: Estimate) -> str:
    return {
        "spec": "skipped by their spec",
        "probe": "whose probe raised (the test will say why)",
        "requires": "that require a module not installed",
    }.get(e.not_estimated or "", f"on {e.case.device}: {e.skipped}")
