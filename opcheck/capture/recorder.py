"""The recording side of `opcheck capture`, in the process that runs the user's command.

Each recorded call is described as data (describe_value): a tensor by its shape, dtype, device,
layout, strides and requires_grad, and a few statistics of its values that are cheap to take and
change what a sample must look like (its range; whether it is non-negative, integer-valued, a 0/1
or additive (-inf/0) mask and the shares of its rows all off and all on, a row-wise dominant entry,
non-finite). Calls whose descriptions differ only in the statistics share a signature and collapse
into one record (opcheck.capture.records): a count, the first few call sites, the statistics
merged over the first STAT_CALLS calls, and (with values kept) the tensors of its first call.

Nothing here changes what the user's code computes: statistics are taken under no_grad on detached
tensors, and no random number is drawn.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from opcheck.capture.records import merge_described, signature

MAX_SIGNATURES = 512
"""Distinct signatures kept per op; more are counted, not kept."""
STAT_CALLS = 16
"""Calls of one signature whose values enter its statistics."""
MAX_SITES = 3
VALUES_MAX_BYTES = 64 * 2**20
"""The most one call's saved values may take (bytes, at their own dtype)."""
VALUES_TOTAL_BYTES = 2**30
"""The most a run's saved values may take together; later signatures get no values file."""
DOMINANT_GAP = 4.0
"""A row's largest entry exceeding its second by this much (e**4 ≈ 55x after a softmax)."""

_SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
_TORCH_FILES = os.path.dirname(torch.__file__)
_OWN_FILES = (_TORCH_FILES, os.path.dirname(os.path.dirname(__file__)))


# ------------------------------------------------------------------------------ descriptions
def describe_value(value: Any, stats: bool) -> dict[str, Any]:
    """A JSON-able description of one argument."""
    if isinstance(value, torch.Tensor):
        return _describe_tensor(value, stats)
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        if type(value) not in (list, tuple):  # torch.Size, a named tuple
            kind = "list" if isinstance(value, torch.Size) else "unsupported"
            if kind == "unsupported":
                return {"kind": kind, "type": type(value).__name__}
        return {"kind": kind, "items": [describe_value(v, stats) for v in value]}
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "name": str(value).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, str)):
        return {"kind": "value", "value": value}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"kind": "value", "value": value}
        return {"kind": "unsupported", "type": f"float {value!r}"}
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return {"kind": "unsupported", "type": f"{type(value).__name__} {value}"}
    return {"kind": "unsupported", "type": f"{type(value).__module__}.{type(value).__qualname__}"}


def _describe_tensor(t: torch.Tensor, stats: bool) -> dict[str, Any]:
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return {"kind": "unsupported", "type": f"tensor subclass {type(t).__qualname__}"}
    if t.layout not in _SPARSE and t.layout != torch.strided:
        return {"kind": "unsupported", "type": f"tensor of layout {t.layout}"}
    if t.device.type == "meta":
        return {"kind": "unsupported", "type": "meta tensor"}
    desc: dict[str, Any] = {
        "kind": "tensor",
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": t.device.type,
        "layout": str(t.layout).removeprefix("torch."),
        "requires_grad": bool(t.requires_grad),
    }
    if t.layout in _SPARSE:
        desc["nnz"] = int(t._nnz())
        desc["dense_dim"] = int(t.dense_dim())
        if t.layout in (torch.sparse_bsr, torch.sparse_bsc):
            desc["blocksize"] = list(t.values().shape[-2 - t.dense_dim() :][:2])
    elif t.layout == torch.strided:
        desc["stride"] = list(t.stride())
        desc["contiguous"] = bool(t.is_contiguous())
        desc["expanded"] = [d for d, (size, stride) in enumerate(zip(t.shape, t.stride())) if stride == 0 and size > 1]
    if stats:
        desc["stats"] = tensor_stats(t)
    return desc


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """The statistics of a tensor's values that shape a sample (a sparse one's specified values;
    empty for an empty tensor)."""
    if t.numel() == 0 or t.is_quantized:
        return {}
    if t.layout in _SPARSE:  # the specified values
        t = t._values() if t.layout == torch.sparse_coo else t.values()
        if t.numel() == 0:
            return {}
    with torch.no_grad():
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        if x.dtype == torch.bool:
            return _mask_stats(x)
        x = x.to(torch.float64) if x.is_floating_point() else x.to(torch.int64)
        finite = torch.isfinite(x) if x.is_floating_point() else torch.ones_like(x, dtype=torch.bool)
        values = x[finite]
        out: dict[str, Any] = {"nonfinite": bool(values.numel() != x.numel())}
        if values.numel() == 0:
            return out
        low, high = values.min().item(), values.max().item()
        integer = bool(torch.equal(values, values.round())) if values.is_floating_point() else True
        out.update(min=low, max=high, nonneg=low >= 0, integer=integer)
        out["binary"] = bool(low == 0 and high == 1 and integer)
        if out["binary"]:
            out.update(_mask_stats(x != 0))
        elif out["nonfinite"] and low == high:
            # an additive mask: one finite value where on, one non-finite one (-inf) where off
            off = x[~finite].unique()
            if off.numel() == 1 and not bool(off.isnan().item()):
                out.update(_mask_stats(finite), mask_values=[float(off.item()), low])
        if x.is_floating_point() and x.dim() >= 1 and x.shape[-1] >= 2 and not out["nonfinite"]:
            top = x.reshape(-1, x.shape[-1]).topk(2, dim=-1).values
            out["dominant"] = bool((top[:, 0] - top[:, 1] >= DOMINANT_GAP).all().item())
        return out


def _mask_stats(mask: torch.Tensor) -> dict[str, Any]:
    """A 0/1 tensor: the share on, and the shares of its rows (along the last dim) all off and all on."""
    out: dict[str, Any] = {"mask": True, "on": float(mask.float().mean().item())}
    if mask.dim() >= 1 and mask.shape[-1] >= 1:
        rows = mask.reshape(-1, mask.shape[-1])
        out["rows_off"] = float((~rows.any(dim=-1)).float().mean().item())
        out["rows_on"] = float(rows.all(dim=-1).float().mean().item())
    return out


def autocast_dtype(args: list[dict[str, Any]], kwargs: dict[str, dict[str, Any]]) -> str | None:
    """The dtype autocast computes in where this call's floating tensors are (their device's autocast
    is on), which their own float32 dtype does not show; None where it is off."""
    devices = {d["device"] for d in _flat([*args, *kwargs.values()]) if d["kind"] == "tensor"}
    for device in sorted(devices):
        try:
            if torch.is_autocast_enabled(device):
                return str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        except (TypeError, RuntimeError, AttributeError):  # a torch or device without per-device autocast
            continue
    return None


# ------------------------------------------------------------------------------ gradient checks
_CHECKS = (
    (os.path.join(_TORCH_FILES, "autograd", "gradcheck.py"), "torch.autograd.gradcheck"),
    (os.path.join(_TORCH_FILES, "testing", "_internal", "optests"), "torch.library.opcheck"),
    (os.path.join(os.path.dirname(os.path.dirname(__file__)), "engine"), "opcheck's checks"),
    (os.path.join(os.path.dirname(os.path.dirname(__file__)), "runtime"), "opcheck's checks"),
)
"""Files whose frames on the stack make a call one of a gradient check's: path prefix -> its name."""


def gradient_check_running() -> str | None:
    """The gradient check (torch's gradcheck, torch.library.opcheck, opcheck's engine) that this call
    is made inside, found on the stack; None for a call of the run itself."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        for prefix, check in _CHECKS:
            if name.startswith(prefix):
                return check
        frame = frame.f_back
    return None


# ------------------------------------------------------------------------------ records
@dataclass
class Record:
    """The calls of one op that share a signature."""

    args: list[dict[str, Any]]
    kwargs: dict[str, dict[str, Any]]
    count: int = 0
    sites: list[str] = field(default_factory=list)
    values: str | None = None  # the first call's tensors, saved (a file name in the values folder)
    autocast: list[str] = field(default_factory=list)  # the dtypes autocast computed its calls in

    def as_json(self) -> dict[str, Any]:
        return {
            "args": self.args,
            "kwargs": self.kwargs,
            "count": self.count,
            "sites": self.sites,
            "values": self.values,
            "autocast": self.autocast,
        }


@dataclass
class OpCalls:
    records: dict[Any, Record] = field(default_factory=dict)
    calls: int = 0
    dropped: int = 0  # calls of signatures past MAX_SIGNATURES
    backward: int = 0  # calls made by autograd's backward pass (an aten op in a derivative), not recorded
    in_checks: dict[str, int] = field(default_factory=dict)  # calls a gradient check made -> count, by check
    unsupported: dict[str, int] = field(default_factory=dict)  # why a call could not be a sample -> count


class Recorder:
    """Every recorded call of the selected ops in this process."""

    def __init__(self, values: str | None, values_dir: Path | None):
        self.values, self.values_dir = values, values_dir  # values: None, "structured" or "all"
        self.ops: dict[str, OpCalls] = {}
        self.values_bytes = 0
        self._local = threading.local()

    # The depth guard: only the outermost recorded call counts.
    def busy(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def call(self, path: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record one call of `path`, then make it."""
        if self.busy():
            return fn(*args, **kwargs)
        if torch._C._current_graph_task_id() != -1:  # autograd's backward pass: a derivative, not a call
            calls = self.ops.setdefault(path, OpCalls())
            calls.backward += 1
            return fn(*args, **kwargs)
        check = gradient_check_running()
        if check is not None:  # the perturbed float64 calls of a test's own gradcheck: not the run's
            calls = self.ops.setdefault(path, OpCalls())
            calls.in_checks[check] = calls.in_checks.get(check, 0) + 1
            return fn(*args, **kwargs)
        self._local.depth = 1
        try:
            try:
                self.record(path, args, kwargs)
            except Exception as e:  # never let the recording break the user's run
                calls = self.ops.setdefault(path, OpCalls())
                reason = f"recording failed: {type(e).__name__}: {e}"
                calls.unsupported[reason] = calls.unsupported.get(reason, 0) + 1
            return fn(*args, **kwargs)
        finally:
            self._local.depth = 0

    def record(self, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls = self.ops.setdefault(path, OpCalls())
        calls.calls += 1
        described_args = [describe_value(a, stats=False) for a in args]
        described_kwargs = {k: describe_value(v, stats=False) for k, v in kwargs.items()}
        bad = [d["type"] for d in _flat([*described_args, *described_kwargs.values()]) if d["kind"] == "unsupported"]
        if bad:
            reason = f"an argument a spec cannot write: {bad[0]}"
            calls.unsupported[reason] = calls.unsupported.get(reason, 0) + 1
            return
        key = (
            tuple(signature(d) for d in described_args),
            tuple((k, signature(d)) for k, d in described_kwargs.items()),
        )
        record = calls.records.get(key)
        if record is None and len(calls.records) >= MAX_SIGNATURES:
            calls.dropped += 1
            return
        site = call_site()
        if record is None or record.count < STAT_CALLS:
            with_stats_args = [describe_value(a, stats=True) for a in args]
            with_stats_kwargs = {k: describe_value(v, stats=True) for k, v in kwargs.items()}
            if record is None:
                record = Record(with_stats_args, with_stats_kwargs)
                calls.records[key] = record
                if self.values is not None:
                    record.values = self._save_values(path, len(calls.records), args, kwargs)
            else:
                record.args = [merge_described(a, b) for a, b in zip(record.args, with_stats_args)]
                record.kwargs = {k: merge_described(record.kwargs[k], with_stats_kwargs[k]) for k in record.kwargs}
        record.count += 1
        cast = autocast_dtype(described_args, described_kwargs)
        if cast is not None and cast not in record.autocast:
            record.autocast.append(cast)
        if site and site not in record.sites and len(record.sites) < MAX_SITES:
            record.sites.append(site)

    def _save_values(self, path: str, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        tensors = dict(_tensors(args, kwargs))
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if not tensors or size > VALUES_MAX_BYTES or self.values_dir is None:
            return None
        if self.values_bytes + size > VALUES_TOTAL_BYTES:
            return None
        self.values_bytes += size
        name = f"{abs(hash(path)) % 10**8:08d}-{index}-{os.getpid()}.pt"
        with torch.no_grad():
            torch.save(
                {k: t.detach().to("cpu").contiguous().clone() for k, t in tensors.items()}, self.values_dir / name
            )
        return name

    def dump(
        self, file: Path, exit_status: int | None, error: str | None, imports: dict[str, str], compiled: int = 0
    ) -> None:
        data = {
            "pid": os.getpid(),
            "exit": exit_status,
            "error": error,
            "imports": imports,
            "compiled": compiled,  # frames torch.compile compiled in the run
            "ops": {
                path: {
                    "calls": c.calls,
                    "dropped": c.dropped,
                    "backward": c.backward,
                    "unsupported": c.unsupported,
                    "in_checks": c.in_checks,
                    "records": [r.as_json() for r in c.records.values()],
                }
                for path, c in self.ops.items()
            },
        }
        part = file.with_name(f".{file.name}.part")  # whole or absent: the parent reads it after the command
        part.write_text(json.dumps(data, allow_nan=False), encoding="utf-8")
        os.replace(part, file)


def _flat(descs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in descs:
        out.append(d)
        if d["kind"] in ("list", "tuple"):
            out += _flat(d["items"])
    return out


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a call under its key: `args.0`, `args.1.2` (in a list), `kwargs.weight`."""
    out: list[tuple[str, torch.Tensor]] = []

    def visit(value: Any, key: str) -> None:
        if isinstance(value, torch.Tensor):
            out.append((key, value))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, f"{key}.{i}")

    for i, a in enumerate(args):
        visit(a, f"args.{i}")
    for k, v in kwargs.items():
        visit(v, f"kwargs.{k}")
    return out


def call_site() -> str | None:
    """`file:line (function)` of the innermost frame in the user's code: outside torch and opcheck."""
    for frame, line in traceback.walk_stack(sys._getframe(2)):
        filename = frame.f_code.co_filename
        if filename.startswith("<") or any(filename.startswith(own) for own in _OWN_FILES):
            continue
        # Whole path parts: a user's folder named test_pytest_x or my_pluggy_app is the user's.
        if {"site-packages", "dist-packages", "_pytest", "pluggy"} & set(Path(filename).parts):
            continue
        try:
            shown = os.path.relpath(filename)
        except ValueError:
            shown = filename
        if shown.startswith(".."):
            shown = filename
        return f"{Path(shown).as_posix()}:{line} ({frame.f_code.co_name})"
    return None
