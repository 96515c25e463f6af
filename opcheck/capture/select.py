"""Deduplicate and bound what a capture recorded: one candidate per distinct signature, at most
`cap` per op, chosen to keep what differs.

Calls whose arguments differ only in their values are one candidate (the recorder already merged
them). Past that, each candidate is described by features, the properties of a call where kernel
bugs live:

- each tensor's rank and dtype, and whether it is non-contiguous or expanded (a stride of 0);
- each dim's size class: empty, 1, up to 64, or more than 64 (a kernel's second tile), and its
  alignment: the largest power of two up to 128 that divides it (80 is 16-aligned: a 64-wide tile
  leaves a remainder of 16; 13 is 1-aligned);
- broadcasting: a size-1 dim where another tensor argument of the same rank is wider;
- each non-tensor argument's value (`dim=-1` and `dim=0` are different calls).

The first candidate kept is the most frequent call (what the model runs most); each next one is
the candidate with the most features not yet kept (ties: the more frequent, then the smaller).
Candidates that add no feature are dropped whatever the cap, and each drop names the kept sample
that covers it; candidates past the cap are dropped with the features they would have added.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from opcheck.capture.records import merge_stats, signature

DEFAULT_CAP = 8
BIG_DIM = 64  # a dim past one 64-wide tile
MAX_ALIGN = 128


@dataclass
class Candidate:
    """One distinct call signature of an op, over every process of the run."""

    args: list[dict[str, Any]]
    kwargs: dict[str, dict[str, Any]]
    count: int
    sites: list[str]
    values: str | None  # the saved values of its first call (a file in the run's values folder)
    features: dict[str, str] = field(default_factory=dict)  # feature -> what it says, in words
    autocast: list[str] = field(default_factory=list)  # the dtypes autocast computed its calls in

    @property
    def numel(self) -> int:
        return sum(math.prod(d["shape"]) for d in tensors(self.args, self.kwargs))


@dataclass
class Choice:
    """An op's candidates: those kept (with why), and those dropped (with why)."""

    kept: list[tuple[Candidate, list[str]]]
    dropped: list[tuple[Candidate, str]]


def tensors(args: list[dict[str, Any]], kwargs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The tensor descriptions of a call, in argument order (args, then kwargs; lists flattened)."""
    out: list[dict[str, Any]] = []

    def visit(d: dict[str, Any]) -> None:
        if d["kind"] == "tensor":
            out.append(d)
        elif d["kind"] in ("list", "tuple"):
            for item in d["items"]:
                visit(item)

    for d in [*args, *kwargs.values()]:
        visit(d)
    return out


def merge_runs(runs: Iterable[dict[str, Any]]) -> dict[str, list[Candidate]]:
    """Per op path, the candidates of every process's records, merged by signature."""
    out: dict[str, dict[Any, Candidate]] = {}
    for run in runs:
        for path, calls in run.get("ops", {}).items():
            found = out.setdefault(path, {})
            for r in calls.get("records", []):
                key = (tuple(signature(d) for d in r["args"]), tuple((k, signature(d)) for k, d in r["kwargs"].items()))
                if key in found:
                    c = found[key]
                    c.count += r["count"]
                    c.sites += [s for s in r["sites"] if s not in c.sites][: max(0, 3 - len(c.sites))]
                    c.args = [_merge(a, b) for a, b in zip(c.args, r["args"])]
                    c.kwargs = {k: _merge(c.kwargs[k], r["kwargs"][k]) for k in c.kwargs}
                    c.values = c.values or r.get("values")
                    c.autocast += [d for d in r.get("autocast", []) if d not in c.autocast]
                else:
                    found[key] = Candidate(r["args"], r["kwargs"], r["count"], list(r["sites"]), r.get("values"))
                    found[key].autocast = list(r.get("autocast", []))
    return {path: list(found.values()) for path, found in out.items()}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if a["kind"] == "tensor":
        stats = merge_stats(a.get("stats", {}), b.get("stats", {}))
        return {**a, "stats": stats, "requires_grad": bool(a["requires_grad"] or b["requires_grad"])}
    if a["kind"] in ("list", "tuple"):
        return {**a, "items": [_merge(x, y) for x, y in zip(a["items"], b["items"])]}
    return a


def features(c: Candidate) -> dict[str, str]:
    """The candidate's features (see the module docstring), each with what it says in words."""
    out: dict[str, str] = {}
    named = _named_arguments(c)
    tensor_shapes = [d["shape"] for _, d in named if d["kind"] == "tensor"]
    for name, d in named:
        if d["kind"] != "tensor":
            if d["kind"] == "value":
                out[f"value:{name}:{d['value']!r}"] = f"{name} = {d['value']!r}"
            elif d["kind"] == "dtype":
                out[f"dtype-arg:{name}:{d['name']}"] = f"{name} = {d['name']}"
            continue
        shape = d["shape"]
        out[f"rank:{name}:{len(shape)}"] = f"{name} of rank {len(shape)}"
        out[f"dtype:{name}:{d['dtype']}"] = f"{name} in {d['dtype']}"
        if d.get("expanded"):
            out[f"expanded:{name}"] = f"{name} expanded (stride 0 in dim {', '.join(map(str, d['expanded']))})"
        elif d.get("contiguous") is False:
            out[f"noncontiguous:{name}"] = f"{name} non-contiguous (strides {d.get('stride')})"
        for i, size in enumerate(shape):
            size_class = "empty" if size == 0 else "one" if size == 1 else "tile" if size <= BIG_DIM else "tiles"
            words = {
                "empty": "empty",
                "one": "of size 1",
                "tile": f"at most {BIG_DIM}",
                "tiles": f"more than {BIG_DIM}",
            }[size_class]
            out[f"size:{name}:{i}:{size_class}"] = f"{name} dim {i} = {size} ({words})"
            if size > 1:
                align = _alignment(size)
                out[f"align:{name}:{i}:{align}"] = f"{name} dim {i} = {size} ({_align_words(size, align)})"
            if size == 1 and any(
                len(other) == len(shape) and other[i] > 1 for other in tensor_shapes if other is not shape
            ):
                out[f"broadcast:{name}:{i}"] = f"{name} broadcast along dim {i}"
    return out


def _merged_words(words: list[str]) -> list[str]:
    """`x dim 2 = 96 (more than 64)` and `x dim 2 = 96 (a multiple of 32, not 64)` as one phrase."""
    out: dict[str, list[str]] = {}
    for w in words:
        head, sep, tail = w.partition(" (")
        out.setdefault(head, [])
        if sep:
            out[head].append(tail.rstrip(")"))
    return [f"{head} ({'; '.join(tails)})" if tails else head for head, tails in out.items()]


def _alignment(size: int) -> int:
    align = 1
    while align < MAX_ALIGN and size % (align * 2) == 0:
        align *= 2
    return align


def _align_words(size: int, align: int) -> str:
    if align >= MAX_ALIGN:
        return f"a multiple of {MAX_ALIGN}"
    if align == 1:
        return "odd"
    return f"a multiple of {align}, not {align * 2}"


def _named_arguments(c: Candidate) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []

    def visit(d: dict[str, Any], name: str) -> None:
        if d["kind"] in ("list", "tuple"):
            if all(item["kind"] == "tensor" for item in d["items"]) and d["items"]:
                for i, item in enumerate(d["items"]):
                    visit(item, f"{name}[{i}]")
                return
            value = [item.get("value") for item in d["items"]]
            out.append((name, {"kind": "value", "value": value}))
            return
        out.append((name, d))

    for i, d in enumerate(c.args):
        visit(d, f"args[{i}]")
    for k, d in c.kwargs.items():
        visit(d, k)
    return out


def choose(candidates: list[Candidate], cap: int = DEFAULT_CAP) -> Choice:
    """The candidates kept (at most `cap`) and dropped, as the module docstring says."""
    for c in candidates:
        c.features = features(c)
    pool = sorted(candidates, key=lambda c: (-c.count, c.numel))
    kept: list[tuple[Candidate, list[str]]] = []
    dropped: list[tuple[Candidate, str]] = []
    covered: dict[str, Candidate] = {}
    while pool and len(kept) < cap:
        if not kept:
            best = pool[0]
            why = ["the most frequent call" if len(candidates) > 1 else "the only distinct call"]
        else:
            best = max(pool, key=lambda c: (len(set(c.features) - set(covered)), c.count, -c.numel))
            new = [c for c in best.features if c not in covered]
            if not new:
                break
            why = _merged_words([best.features[f] for f in new])
        pool.remove(best)
        kept.append((best, why))
        for f in best.features:
            covered.setdefault(f, best)
    for c in pool:
        new = [f for f in c.features if f not in covered]
        if new:
            words = "; ".join(_merged_words([c.features[f] for f in new]))
            dropped.append((c, f"past the cap of {cap} (--max-samples); it would add: {words}"))
        else:
            dropped.append((c, "adds nothing the kept samples do not have"))
    return Choice(kept, dropped)
