"""Recorded calls as data, without torch: what makes two calls one sample (signature), and the
statistics of two calls of one signature merged as if they were one call's (merge_stats). The
parent of `opcheck capture` merges the records of every process of a run with these before it
needs torch; the recorder (opcheck.capture.recorder) takes them in the command's process."""

from __future__ import annotations

from typing import Any


def merge_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The statistics of two calls' values of one argument, as if they were one call's."""
    if not a:
        return dict(b)
    if not b:
        return dict(a)
    out = dict(a)
    for key in ("min",):
        if key in a and key in b:
            out[key] = min(a[key], b[key])
    for key in ("max",):
        if key in a and key in b:
            out[key] = max(a[key], b[key])
    for key in ("nonneg", "integer", "binary", "mask", "dominant"):  # true of every call
        out[key] = bool(a.get(key)) and bool(b.get(key))
    out["nonfinite"] = bool(a.get("nonfinite")) or bool(b.get("nonfinite"))  # true of some call
    for key in ("rows_off", "rows_on"):  # the largest share of any call
        out[key] = max(float(a.get(key, 0.0)), float(b.get(key, 0.0)))
    if a.get("mask_values") != b.get("mask_values"):
        out.pop("mask_values", None)
    if "on" in a and "on" in b:
        out["on"] = (a["on"] + b["on"]) / 2
    return out


def signature(desc: dict[str, Any]) -> Any:
    """What makes two calls different samples: everything in a description but the statistics and
    requires_grad (merged: a tensor some call differentiates is differentiated in the sample)."""
    if desc["kind"] == "tensor":
        return tuple((k, _hashable(v)) for k, v in sorted(desc.items()) if k not in ("stats", "requires_grad"))
    if desc["kind"] in ("list", "tuple"):
        return (desc["kind"], tuple(signature(item) for item in desc["items"]))
    return tuple((k, _hashable(v)) for k, v in sorted(desc.items()))


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def merge_described(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two descriptions of one signature: the first, its statistics merged with the second's."""
    if a["kind"] == "tensor":
        out = dict(a)
        out["stats"] = merge_stats(a.get("stats", {}), b.get("stats", {}))
        out["requires_grad"] = bool(a["requires_grad"] or b["requires_grad"])
        return out
    if a["kind"] in ("list", "tuple"):
        return {**a, "items": [merge_described(x, y) for x, y in zip(a["items"], b["items"])]}
    return a
