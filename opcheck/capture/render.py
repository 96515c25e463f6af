"""A captured candidate as spec text: its sample's YAML, with comments saying where it came from,
why it was kept and what the run's values looked like; and its reduced twin.

Values become YAML through yaml.safe_dump only (flow style, one argument a line), so a string from
the user's run is always a quoted YAML scalar; comments are single lines with line breaks removed.
The spec loader validates the result like a hand-written spec before anything is written.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from opcheck.capture.select import Candidate, tensors

MAX_NAME = 60
REDUCE_ABOVE = 256
"""A reduced twin shrinks each dim above this to REDUCE_TO + (its remainder mod REDUCE_TO)."""
REDUCE_TO = 128
LOWPREC = ("float32", "float16", "bfloat16", "complex64")
_INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


@dataclass(frozen=True)
class Rendered:
    """One sample: its name, its YAML item (a mapping, key order kept) and its comment lines."""

    name: str
    item: dict[str, Any]
    comments: tuple[str, ...]
    values_keys: tuple[str, ...] = ()  # the entries of the sample's values file its arguments read


def grad_wanted(candidates: list[Candidate]) -> bool:
    """Whether the calls asked for gradients of some floating-point argument (else every one is
    checked: a call without gradients says nothing about which inputs need them)."""
    return any(d["requires_grad"] for c in candidates for d in tensors(c.args, c.kwargs))


def sample_name(c: Candidate, taken: set[str]) -> str:
    """`2x13x80_80`: the tensors' shapes, made unique among `taken` with `_2`, `_3`, ..."""
    shapes = ["x".join(map(str, d["shape"])) if d["shape"] else "scalar" for d in tensors(c.args, c.kwargs)]
    base = "_".join(shapes) or "call"
    base = re.sub(r"[^A-Za-z0-9_.]", "_", base)[:MAX_NAME]
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def render_sample(
    c: Candidate,
    name: str,
    why: list[str],
    *,
    grad: bool,
    values_file: str | None,
    structured_only: bool,
    cost: str | None = None,
) -> Rendered:
    """The sample for candidate `c`. values_file: the sample's file (spec-relative) when values were
    kept; with structured_only, only arguments whose values uniform draws cannot reproduce read it."""
    notes: list[str] = []
    keys: list[str] = []

    def arg(d: dict[str, Any], key: str, label: str) -> Any:
        if d["kind"] == "tensor":
            strided = d.get("layout", "strided") == "strided"  # a values file holds a strided tensor
            if values_file is not None and strided and (not structured_only or _structured(d)):
                keys.append(key)
                return _tensor(d, label, grad, notes, (values_file, key))
            return _tensor(d, label, grad, notes, None)
        if d["kind"] == "list":  # a list of tensors, or of literals
            return [arg(i, f"{key}.{n}", f"{label}[{n}]") for n, i in enumerate(d["items"])]
        if d["kind"] == "tuple":
            return {"tuple": [arg(i, f"{key}.{n}", f"{label}[{n}]") for n, i in enumerate(d["items"])]}
        if d["kind"] == "dtype":
            return {"dtype": d["name"]}
        return d["value"]

    item: dict[str, Any] = {"name": name}
    if c.args:
        item["args"] = [arg(d, f"args.{i}", f"args[{i}]") for i, d in enumerate(c.args)]
    if c.kwargs:
        item["kwargs"] = {k: arg(d, f"kwargs.{k}", k) for k, d in c.kwargs.items()}
    calls = f"{c.count} call" + ("s" if c.count != 1 else "")
    where = f", first at {c.sites[0]}" if c.sites else ""
    devices = sorted({d["device"] for d in tensors(c.args, c.kwargs)})
    dtypes = sorted({d["dtype"] for d in tensors(c.args, c.kwargs)})
    cast = f" (computed in {', '.join(c.autocast)} under autocast)" if c.autocast else ""
    comments = [f"{calls}{where}; {', '.join(dtypes)} on {', '.join(devices)} in the run{cast}"]
    comments.append("kept: " + "; ".join(why))
    comments += notes
    if cost:
        comments.append(cost)
    return Rendered(name, item, tuple(_one_line(x) for x in comments), tuple(keys))


def _structured(d: dict[str, Any]) -> bool:
    """Whether a tensor's values have structure that uniform draws in its range do not reproduce."""
    s = d.get("stats", {})
    return bool(s.get("dominant") or s.get("rows_off") or s.get("nonfinite") or s.get("binary") or s.get("mask"))


def _tensor(
    d: dict[str, Any], label: str, grad: bool, notes: list[str], values: tuple[str, str] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"shape": list(d["shape"])}
    dtype, s = d["dtype"], d.get("stats", {})
    floating = dtype not in (*_INT_DTYPES, "bool")
    if not floating:
        out["dtype"] = dtype
    sparse = d.get("layout", "strided") != "strided"
    if sparse:  # the same sparsity: how many elements (blocks) are specified, and the block shape
        out["layout"] = d["layout"]
        out["nnz"] = d["nnz"]
        if d.get("blocksize"):
            out["blocksize"] = list(d["blocksize"])
        if d.get("dense_dim"):
            out["dense_dim"] = d["dense_dim"]
    if values is not None and not sparse:
        out["values_file"], out["values_key"] = values
    elif floating and "min" in s:
        low, high = _range(s["min"], s["max"])
        out["low"], out["high"] = low, high
    elif dtype in _INT_DTYPES and "min" in s:
        out["low"], out["high"] = int(s["min"]), int(s["max"]) + 1
    if floating and grad and not d["requires_grad"]:
        out["requires_grad"] = False
    if d.get("expanded") or d.get("contiguous") is False:
        out["noncontiguous"] = True
        how = (
            f"expanded (stride 0 in dim {', '.join(map(str, d['expanded']))})"
            if d.get("expanded")
            else f"strides {d.get('stride')}"
        )
        notes.append(f"{label}: {how} in the run; the sample is non-contiguous")
    notes += [f"{label}: {words}" for words in _structure_words(s, dtype)]
    return out


def _structure_words(s: dict[str, Any], dtype: str) -> list[str]:
    words = []
    if s.get("nonfinite"):
        words.append("had non-finite entries (an additive -inf mask?)")
    if s.get("mask"):
        rows = []
        if s.get("rows_off"):
            rows.append("some rows all off")
        if s.get("rows_on"):
            rows.append("some rows all on")
        on = f"{100 * s.get('on', 0):.0f}% on"
        words.append(f"a 0/1 mask, {on}" + (f", {' and '.join(rows)}" if rows else ""))
    elif s.get("integer") and dtype not in (*_INT_DTYPES, "bool") and "min" in s and s["min"] != s["max"]:
        words.append("integer-valued floats")
    if s.get("dominant"):
        words.append("one dominant entry per row (largest exceeds the second by 4 or more)")
    if "min" in s and s["min"] == s["max"]:
        words.append(f"every entry {s['min']:g} in the run")
    elif s.get("nonneg") and not s.get("mask") and dtype not in (*_INT_DTYPES, "bool"):
        words.append("non-negative")
    return words


def _range(low: float, high: float) -> tuple[float, float]:
    """A [low, high) that holds the run's values, rounded outwards to 2 significant digits."""
    if high - low < 1e-6 * max(1.0, abs(low), abs(high)):  # one value (a norm's weight of ones)
        half = max(0.5, abs(low) / 2)
        return _round(low - half, math.floor), _round(high + half, math.ceil)
    span = high - low
    return _round(low, math.floor, span), _round(high, math.ceil, span)


def _round(x: float, how: Any, span: float | None = None) -> float:
    scale = abs(span if span else x) or 1.0
    step = 10 ** (math.floor(math.log10(scale)) - 1)
    r = how(x / step) * step
    return float(f"{r:.6g}") if r != 0 else 0.0


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------ reduced twin
def reduced_size(size: int) -> int:
    """A smaller size with the same remainder modulo every power of two up to REDUCE_TO, and still
    more than one REDUCE_TO-wide tile."""
    return REDUCE_TO + size % REDUCE_TO if size > REDUCE_ABOVE else size


def twin(c: Candidate) -> Candidate | None:
    """The candidate at reduced sizes (every dim above REDUCE_ABOVE shrunk the same way, so dims
    that were equal stay equal, and integer ranges shrunk alike), without saved values; None when
    no dim shrinks."""
    changed = False

    def shrink(d: dict[str, Any]) -> dict[str, Any]:
        nonlocal changed
        if d["kind"] == "tensor":
            shape = [reduced_size(n) for n in d["shape"]]
            changed = changed or shape != d["shape"]
            out = {**d, "shape": shape, "expanded": [], "contiguous": d.get("contiguous", True)}
            s = dict(d.get("stats", {}))
            if d["dtype"] in _INT_DTYPES and "max" in s and s["max"] + 1 > REDUCE_ABOVE:
                s["max"] = reduced_size(int(s["max"]) + 1) - 1
                s["min"] = min(s["min"], s["max"])
            out["stats"] = s
            return out
        if d["kind"] in ("list", "tuple"):
            return {**d, "items": [shrink(i) for i in d["items"]]}
        return d

    args = [shrink(d) for d in c.args]
    kwargs = {k: shrink(d) for k, d in c.kwargs.items()}
    if not changed:
        return None
    return Candidate(args, kwargs, c.count, c.sites, None)


# ------------------------------------------------------------------------------ text
def dump(value: Any) -> str:
    """One YAML value on one line (flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**9, allow_unicode=True)
    lines = [line for line in text.splitlines() if line != "..."]
    return " ".join(lines).strip()


def sample_text(r: Rendered, indent: int) -> str:
    """The sample as a block-sequence item at `indent` columns, its comments above it."""
    pad = " " * indent
    lines = [f"{pad}# {c}" for c in r.comments]
    lines.append(f"{pad}- name: {dump(r.item['name'])}")
    for key in ("args", "kwargs"):
        if key not in r.item:
            continue
        value = r.item[key]
        if not value:
            lines.append(f"{pad}  {key}: {dump(value)}")
            continue
        lines.append(f"{pad}  {key}:")
        if key == "args":
            lines += [f"{pad}    - {dump(v)}" for v in value]
        else:
            lines += [f"{pad}    {dump(k)}: {dump(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"
