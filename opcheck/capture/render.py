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
from opcheck.capture.write import item_digest
from opcheck.spec.model import draw_shape

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
    """Whether a tensor's values have structure that uniform draws in its range do not reproduce
    (the makers reproduce its kind, not these very values)."""
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
    # A tensor the run did not differentiate keeps the run's structure exactly (a mask, a constant
    # scale, integer positions); one it did is drawn, so that finite differences never straddle a
    # step at an integer and a weight of ones does not hide a missing factor.
    differentiated = floating and (d["requires_grad"] or not grad)
    if values is not None and not sparse:
        out["values_file"], out["values_key"] = values
    elif s.get("mask") and not sparse:
        out.update(_mask(d, s))
        if "mask_values" in out:
            differentiated = False  # an additive mask's -inf takes no gradient
    elif s.get("dominant") and floating:
        out["maker"] = "dominant"
        out["low"], out["high"] = _range(s["min"], s["max"])
    elif "min" in s and s["min"] == s["max"] and not differentiated and not sparse:
        out["maker"], out["fill"] = "constant", _number(s["min"], floating)
    elif floating and "min" in s and s.get("integer") and not differentiated and not sparse:
        out["maker"], out["low"], out["high"] = "integer", int(s["min"]), int(s["max"]) + 1
    elif floating and "min" in s:
        low, high = _range(s["min"], s["max"])
        out["low"], out["high"] = low, high
    elif dtype in _INT_DTYPES and "min" in s:
        out["low"], out["high"] = int(s["min"]), int(s["max"]) + 1
    if floating and not differentiated:
        out["requires_grad"] = False
    if not sparse and d.get("contiguous") is False:
        strides = list(d["stride"])
        if differentiated and d.get("expanded"):
            strides = own_memory(d["shape"], strides)
            notes.append(
                f"{label}: strides {d['stride']} in the run, expanded along dim "
                f"{', '.join(map(str, d['expanded']))}; a gradient check perturbs each element in its own "
                f"memory, so the sample spreads it ({layout_words(d['shape'], strides) or 'contiguous'})"
            )
        else:
            notes.append(f"{label}: strides {strides} in the run ({layout_words(d['shape'], strides)})")
        if strides != contiguous_strides(d["shape"]):
            out["strides"] = strides
    notes += [f"{label}: {words}" for words in _structure_words(s, dtype, out)]
    return out


def _mask(d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """maker mask with the run's share on and its shares of rows all off and all on, as counts of
    the sample's rows (at least one where the run had any)."""
    out: dict[str, Any] = {"maker": "mask"}
    drawn = draw_shape(d["shape"], d.get("stride"))
    rows = math.prod(drawn[:-1]) if drawn else 1
    out["share_on"] = round(float(s.get("on", 0.5)), 2)
    off = _row_count(float(s.get("rows_off", 0.0)), rows)
    on = min(_row_count(float(s.get("rows_on", 0.0)), rows), rows - off)
    if off:
        out["rows_off"] = off
    if on:
        out["rows_on"] = on
    if "mask_values" in s:
        out["mask_values"] = list(s["mask_values"])
    return out


def _row_count(share: float, rows: int) -> int:
    return 0 if share <= 0 or rows == 0 else min(rows, max(1, round(share * rows)))


def _number(x: float, floating: bool) -> float | int:
    return float(x) if floating else int(x)


def contiguous_strides(shape: list[int]) -> list[int]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return out[::-1]


def own_memory(shape: list[int], strides: list[int]) -> list[int]:
    """The strides with each expanded dim (stride 0) given memory of its own, outside the others'
    span: the other dims keep their order and steps."""
    out = list(strides)
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    for d, (n, st) in enumerate(zip(shape, strides)):
        if st == 0 and n > 1:
            out[d] = span
            span *= n
    return out


def relayout(shape: list[int], strides: list[int], new_shape: list[int]) -> list[int]:
    """Strides for `new_shape` laid out as `strides` lay out `shape`: the same order of dims in
    memory, the same step in each (a slice step, a transpose, channels-last), stride 0 kept."""
    out = [0] * len(shape)
    span, new_span = 1, 1
    for st, d in sorted((st, d) for d, st in enumerate(strides) if st > 0):
        step = st // span if st % span == 0 and st >= span else 1
        out[d] = step * new_span
        span, new_span = st * max(shape[d], 1), out[d] * max(new_shape[d], 1)
    return out


def layout_words(shape: list[int], strides: list[int]) -> str:
    """What a layout is, in words: `dims 1 and 2 transposed`, `channels-last`, `dim 0 steps 16
    elements where 8 is dense`, `expanded along dim 0`."""
    words = []
    expanded = [d for d, (n, st) in enumerate(zip(shape, strides)) if st == 0 and n > 1]
    if expanded:
        words.append(f"expanded along dim {', '.join(map(str, expanded))}")
    real = [(st, d) for d, (n, st) in enumerate(zip(shape, strides)) if n > 1 and st > 0]
    order = [d for _, d in sorted(real, key=lambda x: (-x[0], x[1]))]
    natural = sorted(order)
    if order != natural:
        moved = sorted(d for d, e in zip(order, natural) if d != e)
        if len(shape) == 4 and order == [d for d in (0, 2, 3, 1) if d in order] and 1 in order:
            words.append("channels-last")
        elif len(moved) == 2:
            words.append(f"dims {moved[0]} and {moved[1]} transposed" if len(shape) > 2 else "transposed")
        else:
            words.append(f"dims in memory order {', '.join(map(str, order))}")
    span = 1
    for st, d in sorted(real):
        if st > span:
            words.append(f"dim {d} steps {st} elements where {span} is dense")
        span = st * shape[d]
    return ", ".join(words) if words else "contiguous"


def _structure_words(s: dict[str, Any], dtype: str, out: dict[str, Any]) -> list[str]:
    """What the run's values looked like, and where the sample does not reproduce it, why."""
    words = []
    maker = out.get("maker")
    if s.get("nonfinite"):
        if "mask_values" in out:
            words.append("an additive mask (-inf where off) in the run")
        else:
            words.append(
                "had non-finite entries in the run, which the sample does not (declare them with maker: mask "
                "and mask_values, or keep the run's values with --values)"
            )
    if s.get("mask"):
        rows = []
        if s.get("rows_off"):
            rows.append(f"{100 * s['rows_off']:.0f}% of rows all off")
        if s.get("rows_on"):
            rows.append(f"{100 * s['rows_on']:.0f}% all on")
        on = f"{100 * s.get('on', 0):.0f}% on"
        words.append(f"a 0/1 mask, {on}" + (f", {' and '.join(rows)}" if rows else ""))
    elif s.get("integer") and dtype not in (*_INT_DTYPES, "bool") and "min" in s and s["min"] != s["max"]:
        words.append(
            "integer-valued floats"
            + ("" if maker == "integer" else " (drawn as non-integers: the tensor is differentiated)")
        )
    if s.get("dominant"):
        words.append("one dominant entry per row (largest exceeds the second by 4 or more)")
    if "min" in s and s["min"] == s["max"] and not s.get("mask"):
        words.append(
            f"every entry {s['min']:g} in the run"
            + ("" if maker == "constant" else " (drawn around it: the tensor is differentiated)")
        )
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
            out = {**d, "shape": shape}
            if "stride" in d:  # the run's layout at the new sizes
                out["stride"] = relayout(d["shape"], d["stride"], shape)
                out["expanded"] = [i for i, (n, st) in enumerate(zip(shape, out["stride"])) if st == 0 and n > 1]
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
    lines = [f"{pad}- name: {dump(r.item['name'])}"]
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
    comments = [f"{pad}# {c}" for c in r.comments]
    comments.append(f"{pad}# captured as {item_digest(lines)} (a later capture replaces it until it is edited)")
    return "\n".join(comments + lines) + "\n"
