"""Failure messages that say everything needed to understand and reproduce one failing case,
and the optional heatmap of a failing Jacobian block (`--opcheck-plot DIR`, needs matplotlib)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch

from opcheck.runtime.context import current_item
from opcheck.runtime.samples import case_id
from opcheck.spec.model import OpSpec, Sample


@dataclass
class Case:
    """One test: a spec, a check kind, a device, a dtype and a sample, with its current draw."""

    spec: OpSpec
    check: str
    device: str
    dtype: str
    sample: Sample
    seed: int = 0
    attempt: int = 0
    notes: list = field(default_factory=list)  # re-draw history and the like

    @property
    def test_id(self) -> str:
        return case_id(self.check, self.device, self.dtype, self.sample.name)

    @property
    def location(self) -> str:
        loc = self.sample.location
        return str(loc) if loc.file else self.spec.source

    def rerun_command(self) -> str:
        item = current_item.get()
        if item is not None:
            return item.rerun
        module = f"generated_tests/test_{self.spec.name}.py"
        return f"pytest '{module}::{self.test_id}'"


def format_failure(case: Case, *, headline: str, body: str, call=None, path: str | None = None,
                   tolerances: str | None = None, policy: str | None = None, plot: str | None = None) -> str:
    """The whole message: a headline, one line per field, then the engine's own report."""
    seed_note = f" (sha256 of '{case.spec.name}::{case.test_id}'" + (
        f", re-draw {case.attempt})" if case.attempt else ")")
    rows = [
        ("op", f"{case.spec.op} (spec {case.spec.name!r}, {case.spec.source})"),
        ("sample", f"{case.sample.name!r} at {case.location}"),
    ]
    if call is not None:
        if call.label:
            rows.append(("", call.label))
        name = case.spec.op.replace(":", ".").rsplit(".", 1)[-1]
        rows.append(("", f"call: {name}{call.description}"))
    if path:
        rows.append(("check path", path))
    rows += [("device", case.device), ("dtype", case.dtype), ("seed", f"{case.seed}{seed_note}")]
    if tolerances:
        rows.append(("tolerances", tolerances))
    if policy:
        rows.append(("policy", policy))
    for note in case.notes:
        rows.append(("note", note))
    if plot:
        rows.append(("heatmap", plot))
    rows.append(("rerun", case.rerun_command()))
    width = max(len(k) for k, _ in rows) + 3
    lines = [headline]
    for key, value in rows:
        label = f"{key}:" if key else ""
        for i, part in enumerate(str(value).splitlines() or [""]):
            lines.append(f"  {(label if i == 0 else ''):<{width}}{part}")
    return "\n".join(lines) + "\n\n" + body.rstrip()


# ------------------------------------------------------------------------------------ heatmaps
MAX_PIXELS = 256


def plot_file_name(case: Case) -> str:
    item = current_item.get()
    base = item.nodeid if item is not None else f"test_{case.spec.name}.py::{case.test_id}"
    base = base.rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_") + ".png"


def write_heatmap(mismatch, case: Case, plot_dir: str) -> str:
    """Write |analytical - numerical| of the failing block; returns the path or why not."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "not written: matplotlib is not installed (pip install 'opcheck[plot]')"
    a = mismatch.analytical.detach().to("cpu")
    n = mismatch.numerical.detach().to("cpu")
    dtype = torch.promote_types(a.dtype, n.dtype)
    diff = (a.to(dtype) - n.to(dtype)).abs().to(torch.float64)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    shown, pooled = _downsample(diff)
    fig = Figure(figsize=(7, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    finite = shown[torch.isfinite(shown)]
    vmax = float(finite.max()) if finite.numel() else 1.0
    image = ax.imshow(torch.clamp(shown, max=vmax).numpy(), aspect="auto", interpolation="nearest",
                      cmap="magma", vmin=0.0, vmax=vmax if vmax > 0 else 1.0)
    fig.colorbar(image, ax=ax, label="|analytical - numerical|")
    ax.set_xlabel(f"{mismatch.output_name} element (shape {tuple(mismatch.output_shape)})")
    ax.set_ylabel(f"{mismatch.input_name} element (shape {tuple(mismatch.input_shape)})")
    title = f"{case.spec.op}: {mismatch.check} ({mismatch.path}), {case.device} {case.dtype}"
    if pooled:
        title += f"\nmax-pooled to {shown.shape[0]}x{shown.shape[1]} from {diff.shape[0]}x{diff.shape[1]}"
    ax.set_title(title, fontsize=9)
    os.makedirs(plot_dir, exist_ok=True)
    path = os.path.join(plot_dir, plot_file_name(case))
    fig.savefig(path, dpi=100)
    return path


def _downsample(diff: torch.Tensor):
    rows, cols = diff.shape
    if rows <= MAX_PIXELS and cols <= MAX_PIXELS:
        return diff, False
    out = torch.nn.functional.adaptive_max_pool2d(diff[None, None], (min(rows, MAX_PIXELS),
                                                                      min(cols, MAX_PIXELS)))
    return out[0, 0], True
