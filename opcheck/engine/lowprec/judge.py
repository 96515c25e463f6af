"""Judging one compared tensor, entry by entry, by a Criterion; the text of a failing part."""

from __future__ import annotations

import math

import torch

from opcheck.engine.lowprec.criterion import TABLE, WORST, Criterion, PartResult, WorstEntry
from opcheck.engine.lowprec.numbers import (
    _dense,
    _is_float,
    _name,
    _num,
    _rounding,
    _scalar,
    _ulp,
    _unravel,
    narrower_dtype_hint,
)
from opcheck.failure_facts import hint_lines


def judge_part(
    criterion: Criterion,
    dtype: torch.dtype,
    path: str,
    what: str,
    low: torch.Tensor,
    ref: torch.Tensor,
    bases: list[torch.Tensor],
    conds: list[torch.Tensor],
) -> PartResult:
    if tuple(low.shape) != tuple(ref.shape):
        return PartResult(
            path,
            what,
            0,
            1,
            math.inf,
            text=f"{what}: shape {tuple(low.shape)} at low precision, {tuple(ref.shape)} in the reference",
        )
    lo, rf = _dense(low), _dense(ref)
    if not (_is_float(lo) and _is_float(rf)):
        wrong = int((lo != rf.to(lo.dtype)).sum())
        text = f"{what}: {wrong} of {lo.numel()} entries differ ({lo.dtype} output must match exactly)"
        return PartResult(path, what, lo.numel(), wrong, math.inf if wrong else 0.0, text=text if wrong else "")
    wide = torch.complex128 if rf.is_complex() or lo.is_complex() else torch.float64
    rf, lo_w = rf.to(wide), lo.to(wide)
    if lo.numel() == 0:
        return PartResult(path, what, 0, 0, 0.0)
    err = (lo_w - rf).abs()
    if criterion.kind == TABLE:
        atol, rtol = criterion.table_for(dtype)
        finite = rf[torch.isfinite(rf)].abs()
        scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
        allowed = atol * scale + rtol * rf.abs()
        term = allowed
        floor_needed = 0.0
    else:
        term = _rounding(rf, dtype)
        for base in bases:  # a baseline that overflowed or failed says nothing about the entry
            b_err = (_dense(base).to(wide) - rf).abs()
            term = torch.maximum(term, torch.where(torch.isfinite(b_err), b_err, torch.zeros_like(b_err)))
        if conds:
            moved = torch.stack([(_dense(c).to(wide) - rf).abs() for c in conds]).amax(0)
            term = torch.maximum(term, torch.where(torch.isfinite(moved), moved, torch.zeros_like(moved)))
        finite = rf[torch.isfinite(rf)].abs()
        scale = float(finite.max()) if finite.numel() else 0.0
        u = torch.finfo(dtype).eps / 2
        entrywise = criterion.factor * term + _ulp(rf, dtype)
        allowed = entrywise + criterion.floor_for(dtype) * u * scale
        over = torch.nan_to_num((err - entrywise) / (u * scale) if scale > 0 else err - entrywise, nan=math.inf)
        floor_needed = max(0.0, float(over.max()))
    same = (lo_w == rf) | (torch.isnan(lo_w) & torch.isnan(rf))
    bad = ~((err <= allowed) | same)
    ratio = torch.where(same, torch.zeros_like(err), err / allowed.clamp_min(1e-300))
    ratio = torch.nan_to_num(ratio, nan=math.inf)
    exceeding = int(bad.sum())
    max_ratio = float(ratio.max())
    order = torch.argsort(ratio.reshape(-1), descending=True)[: min(WORST, lo.numel())]
    worst = tuple(
        WorstEntry(
            _unravel(flat, lo.shape),
            _scalar(lo_w.reshape(-1)[flat]),
            _scalar(rf.reshape(-1)[flat]),
            float(err.reshape(-1)[flat]),
            float(term.reshape(-1)[flat]),
            float(allowed.reshape(-1)[flat]),
        )
        for flat in order.tolist()
        if bad.reshape(-1)[flat]
    )
    if not exceeding:
        return PartResult(path, what, lo.numel(), exceeding, max_ratio, worst, "", floor_needed)
    text, entries, hints = _part_text(criterion, dtype, what, lo, rf, bad, worst, max_ratio)
    return PartResult(path, what, lo.numel(), exceeding, max_ratio, worst, text, floor_needed, entries[0], hints)


def _part_text(criterion: Criterion, dtype: torch.dtype, what, lo, rf, bad, worst, max_ratio):  # type: ignore[no-untyped-def]
    """The part's report, the worst entries as it lists them, and its hints."""
    table = criterion.kind == TABLE
    lines = [
        f"{what}: {int(bad.sum())} of {bad.numel()} entries beyond the bound (shape {tuple(lo.shape)}, "
        f"{_name(lo.dtype)} against {_name(rf.dtype)})",
        f"criterion: {criterion.describe(dtype)}",
        "worst entries (op error / baseline error = how many times what the math loses at this dtype):"
        if not table
        else "worst entries:",
    ]
    entries = []
    for w in worst:
        idx = ", ".join(map(str, w.index))
        if table:
            entries.append(
                f"[{idx}]: {_name(lo.dtype)} {_num(w.low)}, {_name(rf.dtype)} {_num(w.ref)}, "
                f"abs err {w.error:.4g}, allowed {w.allowed:.4g}"
            )
        else:
            times = w.error / w.baseline if w.baseline > 0 else math.inf
            entries.append(
                f"[{idx}]: {_name(lo.dtype)} {_num(w.low)}, {_name(rf.dtype)} {_num(w.ref)}, op error "
                f"{w.error:.4g}, baseline error {w.baseline:.4g} ({times:.3g}x), allowed {w.allowed:.4g}"
            )
    lines += [f"  {entry}" for entry in entries]
    lines.append(f"max error / allowed: {max_ratio:.4g}")
    hint = narrower_dtype_hint(lo, lo.to(rf.dtype), rf, bad)
    hints = (hint,) if hint else ()
    lines += hint_lines(hints)
    return "\n".join(lines), entries or [""], hints
