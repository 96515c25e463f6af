"""Failure messages that say everything needed to understand and reproduce one failing case,
and the optional heatmap of a failing Jacobian block (`--opcheck-plot DIR`, needs matplotlib)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, replace

import torch

from opcheck.engine.reporting.diagnostics import WORST_ENTRIES
from opcheck.runtime.context import current_item
from opcheck.spec.case import CaseId
from opcheck.spec.model import OpSpec, Sample


@dataclass(frozen=True)
class Case:
    """One test: its identity, the spec and sample that identity names, and which draw of the sample.

    A case never changes: a re-draw and a note for the failure message are new cases (`redraw`,
    `with_note`).
    """

    id: CaseId
    spec: OpSpec
    sample: Sample
    attempt: int = 0  # 0: the first draw; n: the n-th re-draw after a draw next to a kink
    notes: tuple[str, ...] = ()  # re-draw history and the like

    @classmethod
    def of(cls, spec: OpSpec, check: str, device: str, dtype: str, sample: str | Sample) -> Case:
        """The case of `check` on (device, dtype, sample) of `spec`; `sample` by name or the spec's Sample."""
        sample = spec.sample(sample) if isinstance(sample, str) else sample
        return cls(CaseId(spec.name, check, device, dtype, sample.name), spec, sample)

    @property
    def check(self) -> str:
        return self.id.check

    @property
    def device(self) -> str:
        return self.id.device

    @property
    def dtype(self) -> str:
        return self.id.dtype

    @property
    def seed(self) -> int:
        """The seed of this draw of the sample."""
        return self.id.seed(self.attempt)

    def redraw(self, attempt: int) -> Case:
        return replace(self, attempt=attempt)

    def with_note(self, note: str) -> Case:
        return replace(self, notes=(*self.notes, note))

    @property
    def location(self) -> str:
        loc = self.sample.location
        return str(loc) if loc.file else self.spec.source

    def rerun_command(self) -> str:
        item = current_item.get()
        if item is not None:
            return item.rerun
        return f"pytest '{self.id.nodeid()}'"


def format_failure(
    case: Case,
    *,
    headline: str,
    body: str,
    call=None,
    path: str | None = None,
    tolerances: str | None = None,
    policy: str | None = None,
    plot: str | None = None,
    precision: str | None = None,
) -> str:
    """The whole message: a headline, one line per field, then the engine's own report."""
    seed_note = f" (sha256 of '{case.id.seed_key()}'" + (f", re-draw {case.attempt})" if case.attempt else ")")
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
    if precision:
        rows.append(("precision", precision))
    for note in case.notes:
        rows.append(("note", note))
    if plot:
        rows.append(("heatmap", plot))
    triton = sys.modules.get("opcheck.triton.launches")  # loaded only where opcheck.triton.setup() ran
    nodeid = getattr(current_item.get(), "nodeid", None)
    interpreted = triton.interpreter_note(nodeid) if triton is not None else None
    if interpreted:  # the test launched interpreted kernels: say so, and rerun it the same way
        rows.append(("triton", interpreted))
    rows.append(("rerun", (triton.rerun_prefix(nodeid) if triton is not None else "") + case.rerun_command()))
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
    base = item.nodeid if item is not None else case.id.nodeid()
    base = base.rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_") + ".png"


@dataclass(frozen=True)
class HeatmapLabels:
    x: str  # columns
    y: str  # rows
    colorbar: str
    comparison: str | None  # a title line naming what was compared, for a projection failure


def heatmap_labels(mismatch) -> HeatmapLabels:
    """What the rows and columns of a failing block are: Jacobian entries, or projection entries.

    A JacobianMismatch block is (input element, output element); a ProjectionMismatch is
    (direction u_l, output element) in the JVP stage and (cotangent v_i, direction u_l) in the
    VJP stage (opcheck.engine.auto.projections).
    """
    from opcheck.engine.auto.projections import JVP_STAGE, VJP_STAGE, ProjectionMismatch

    out = f"{mismatch.output_name} element (shape {tuple(mismatch.output_shape)})"
    if not isinstance(mismatch, ProjectionMismatch):
        return HeatmapLabels(
            x=out,
            y=f"{mismatch.input_name} element (shape {tuple(mismatch.input_shape)})",
            colorbar="|analytical - numerical|",
            comparison=None,
        )
    direction = f"direction u_l along {mismatch.input_name} (shape {tuple(mismatch.input_shape)})"
    comparison = f"auto: {mismatch.comparison} (J·U from {mismatch.source})"
    if mismatch.comparison == JVP_STAGE:
        return HeatmapLabels(
            x=out, y=direction, colorbar="|(J u_l)[out]: analytical - finite differences|", comparison=comparison
        )
    if mismatch.comparison == VJP_STAGE:
        return HeatmapLabels(
            x=direction,
            y=f"cotangent v_i of {mismatch.output_name} (shape {tuple(mismatch.output_shape)})",
            colorbar="|(Jᵀv_i)ᵀu_l - v_iᵀ(J u_l)|",
            comparison=comparison,
        )
    raise ValueError(f"unknown projection comparison {mismatch.comparison!r}")


def write_heatmap(mismatch, case: Case, plot_dir: str) -> str:
    """Write |analytical - numerical| of the failing block (Jacobian or projection entries); returns
    the path or why not."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
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
    rows, cols = diff.shape
    image = ax.imshow(
        torch.clamp(shown, max=vmax).numpy(),
        aspect="auto",
        interpolation="nearest",
        cmap="magma",
        vmin=0.0,
        vmax=vmax if vmax > 0 else 1.0,
        extent=(-0.5, cols - 0.5, rows - 0.5, -0.5),  # the block's own indices, pooled or not
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    worst_rows, worst_cols = worst_cells(diff, n.abs().to(torch.float64), mismatch)
    ax.scatter(worst_cols, worst_rows, marker="s", s=60, facecolors="none", edgecolors="cyan", linewidths=1.2,
               label=f"worst {len(worst_rows)}")  # fmt: skip
    ax.legend(loc="upper right", fontsize=7, framealpha=0.6)
    labels = heatmap_labels(mismatch)
    fig.colorbar(image, ax=ax, label=labels.colorbar)
    ax.set_xlabel(labels.x)
    ax.set_ylabel(labels.y)
    title = f"{case.spec.op}: {mismatch.check} ({mismatch.path}), {case.device} {case.dtype}"
    if labels.comparison:
        title += f"\n{labels.comparison}"
    if pooled:
        title += f"\nmax-pooled to {shown.shape[0]}x{shown.shape[1]} from {diff.shape[0]}x{diff.shape[1]}"
    ax.set_title(title, fontsize=9)
    os.makedirs(plot_dir, exist_ok=True)
    path = os.path.join(plot_dir, plot_file_name(case))
    fig.savefig(path, dpi=100)
    return path


def worst_cells(diff: torch.Tensor, scale: torch.Tensor, mismatch) -> tuple[list[int], list[int]]:
    """(rows, columns) of the block's worst entries, the report's ranking: |a - n| beyond atol + rtol·|n|."""
    excess = diff - (mismatch.atol + mismatch.rtol * scale)
    excess = torch.nan_to_num(excess, nan=float("inf"))
    k = min(WORST_ENTRIES, int((excess > 0).sum()), excess.numel())
    flat = torch.topk(excess.reshape(-1), k).indices.tolist() if k else []
    cols = diff.shape[1]
    return [i // cols for i in flat], [i % cols for i in flat]


def _downsample(diff: torch.Tensor):
    rows, cols = diff.shape
    if rows <= MAX_PIXELS and cols <= MAX_PIXELS:
        return diff, False
    out = torch.nn.functional.adaptive_max_pool2d(diff[None, None], (min(rows, MAX_PIXELS), min(cols, MAX_PIXELS)))
    return out[0, 0], True
