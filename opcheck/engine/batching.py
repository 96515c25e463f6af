"""Evaluate many perturbations, VJPs and JVPs at once, with the one-at-a-time loop as the fallback.

Every public method here has two implementations that must agree: a batched one (one vmapped call
per chunk of columns) and the loop torch.autograd.gradcheck uses. The batched one is tried first;
it is abandoned for the rest of the call the first time it raises or its first column disagrees
with the loop's (a probe), so the loop's result and its exceptions are what the caller sees
whenever batching is in doubt.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.autograd.forward_ad as fwAD

from opcheck.engine._util import as_tuple, is_float_or_complex, make_duals, unravel

try:  # the legacy vmap is what torch's own gradcheck uses for forward-AD batching
    from torch._vmap_internals import _vmap as _legacy_vmap
except ImportError:  # pragma: no cover - depends on the torch release
    _legacy_vmap = None

DEFAULT_MEMORY_BUDGET = 64 * 2**20
"""Bytes the batched tensors of one chunk may take (perturbed inputs and outputs, or cotangents and
gradients). Larger chunks mean fewer calls; beyond a few MiB, allocation costs more than calls save."""


MIN_BATCH_COLUMNS = 8
"""Below this many columns the plain loop is cheaper than a vmapped call plus its probe."""

_BATCHING = [True]


def batching_enabled() -> bool:
    return _BATCHING[-1]


@contextlib.contextmanager
def vmap_batching(enabled: bool):
    """Turn vmapped evaluation on or off for the checks run inside (the loop is torch's algorithm)."""
    _BATCHING.append(enabled)
    try:
        yield
    finally:
        _BATCHING.pop()


class _Disagreement(Exception):
    """The batched result differs from the loop's on the probe column."""


@dataclass
class EvalStats:
    """What one check call evaluated, for benchmarks and tests."""

    calls: int = 0  # function evaluations, a batched call counting once
    batched_calls: int = 0
    vjp_calls: int = 0
    batched_vjp_calls: int = 0
    jvp_calls: int = 0
    batched_jvp_calls: int = 0
    fallbacks: list[str] = field(default_factory=list)


class Evaluator:
    """Per-call batching policy and counters.

    `batch=False` forces the loop everywhere. Once a kind of batching (forward evaluation, VJP,
    JVP) fails, it stays off for the rest of the call.
    """

    def __init__(self, batch: bool = True, memory_budget: int = DEFAULT_MEMORY_BUDGET, adaptive: bool = True):
        self.batch_forward = batch
        self.batch_vjp = batch
        self.batch_jvp_func = batch  # torch.func.jvp under torch.func.vmap (wider batching rules)
        self.batch_jvp = batch and _legacy_vmap is not None  # make_dual under the legacy vmap
        self.memory_budget = memory_budget
        self.adaptive = adaptive  # drop a kind of batching that turns out slower than the loop
        self.stats = EvalStats()
        self._vjp_probed: list[torch.Tensor] = []  # outputs whose batched VJP already matched the plain one

    # ----------------------------------------------------------------- chunking
    def _chunk(self, n: int, per_column_elems: int, itemsize: int) -> int:
        per_column = max(1, per_column_elems) * max(1, itemsize)
        return int(max(1, min(n, self.memory_budget // per_column)))

    def _keep_if_cheaper(self, kind: str, batched_per_column: float, plain_per_column: float) -> None:
        """Stop batching this kind for the rest of the call when it costs more than the loop.

        Some ops have no batching rule and run under vmap's slow per-example fallback; the probe
        just timed one plain column, so the comparison is free.
        """
        if self.adaptive and batched_per_column > plain_per_column:
            self._give_up(kind, f"slower than the loop ({batched_per_column * 1e6:.0f} us vs "
                                f"{plain_per_column * 1e6:.0f} us per column)")

    def _give_up(self, kind: str, why: BaseException | str) -> None:
        setattr(self, f"batch_{kind}", False)
        text = why if isinstance(why, str) else f"{type(why).__name__}: {str(why).splitlines()[0] if str(why) else ''}"
        self.stats.fallbacks.append(f"{kind}: {text}")

    # ------------------------------------------------------- numerical columns
    def numerical_columns(self, fn: Callable, inputs: tuple, idx: int, eps: float, nbhd_check: Callable,
                          perturbations: tuple, ref_outputs: tuple) -> list[list[torch.Tensor]]:
        """Central differences of every output of fn with respect to each element of inputs[idx].

        Returns, for each perturbation direction p in `perturbations` (1 for real inputs, 1j for the
        imaginary part of complex ones), a list over all outputs of (numel_in, numel_out) tensors.
        """
        x = inputs[idx]
        if self.batch_forward and x.numel() >= MIN_BATCH_COLUMNS:
            try:
                return self._numerical_batched(fn, inputs, idx, eps, perturbations, ref_outputs)
            except Exception as e:  # anything: the loop decides what the user sees
                self._give_up("forward", e)
        return self._numerical_loop(fn, inputs, idx, eps, nbhd_check, perturbations)

    def _numerical_loop(self, fn, inputs, idx, eps, nbhd_check, perturbations):
        x = inputs[idx]
        data = x.data
        flat = data.view(-1) if data.is_contiguous() else None
        results = []
        for p in perturbations:
            columns: list[list[torch.Tensor]] = []
            for k in range(x.numel()):
                entry = flat[k] if flat is not None else data[unravel(k, data.shape)]
                columns.append(self._one_column(fn, inputs, entry, eps * p if p != 1 else eps, eps, nbhd_check, k, data.shape))
            results.append(_stack_columns(columns))
        return results

    def _one_column(self, fn, inputs, entry, v, eps, nbhd_check, k, shape):
        orig = entry.clone()
        entry.copy_(orig - v)
        outa = self._call_cloned(fn, inputs)
        entry.copy_(orig + v)
        outb = self._call_cloned(fn, inputs)
        entry.copy_(orig)
        cols = []
        for a, b in zip(outa, outb):
            nbhd_check(a, b, idx=unravel(k, shape) if len(shape) else ())
            cols.append(((b - a) / (2 * eps)).detach().reshape(-1))
        return cols

    def _call_cloned(self, fn, inputs):
        self.stats.calls += 1
        return tuple(a.clone() for a in as_tuple(fn(*inputs)))

    def _numerical_batched(self, fn, inputs, idx, eps, perturbations, ref_outputs):
        x = inputs[idx].detach()
        n = x.numel()
        base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
        batched_fn = getattr(fn, "vmap_form", fn)

        def single(xp):
            args = list(base)
            args[idx] = xp
            return tuple(as_tuple(batched_fn(*args)))

        out_probe = [o for o in as_tuple(ref_outputs)]
        if not all(isinstance(o, torch.Tensor) for o in out_probe):
            raise _Disagreement("non-tensor output")
        out_elems = sum(o.numel() for o in out_probe)
        chunk = self._chunk(n, 2 * (n + out_elems), x.element_size())
        flat = x.reshape(-1)
        results = []
        for p in perturbations:
            delta = eps * p if p != 1 else eps
            per_output: list[list[torch.Tensor]] = [[] for _ in out_probe]
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                b = stop - start
                rows = torch.arange(b, device=x.device)
                cols = torch.arange(start, stop, device=x.device)
                # Rows [0, b) are x - delta e_k, rows [b, 2b) are x + delta e_k: one call for both sides.
                stacked = flat.expand(2 * b, n).clone()
                stacked[rows, cols] = flat[cols] - delta
                stacked[rows + b, cols] = flat[cols] + delta
                stacked = stacked.view(2 * b, *x.shape)
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    outs = torch.func.vmap(single, randomness="error")(stacked)
                t_batched = time.perf_counter() - t0
                self.stats.batched_calls += 1
                if len(outs) != len(out_probe):
                    raise _Disagreement("number of outputs changed under vmap")
                for o_idx, (o, ref) in enumerate(zip(outs, out_probe)):
                    if o.shape[1:] != ref.shape or o.dtype != ref.dtype:
                        raise _Disagreement("output shape or dtype changed under perturbation")
                    a, bb = o[:b], o[b:]
                    per_output[o_idx].append(((bb - a) / (2 * eps)).reshape(b, -1))
                if start == 0:
                    t0 = time.perf_counter()
                    self._probe_forward(fn, inputs, idx, delta, outs, b)
                    self._keep_if_cheaper("forward", t_batched / b, time.perf_counter() - t0)
            results.append([_cat(chunks) for chunks in per_output])
        return results

    def _probe_forward(self, fn, inputs, idx, delta, outs, b):
        entry = inputs[idx].data.view(-1)[0] if inputs[idx].is_contiguous() else inputs[idx].data[(0,) * inputs[idx].dim()]
        orig = entry.clone()
        entry.copy_(orig - delta)
        try:
            ref_minus = self._call_cloned(fn, inputs)
            entry.copy_(orig + delta)
            ref_plus = self._call_cloned(fn, inputs)
        finally:
            entry.copy_(orig)
        for o, rm, rp in zip(outs, ref_minus, ref_plus):
            if not (_close(o[0], rm) and _close(o[b], rp)):
                raise _Disagreement("vmapped evaluation differs from the plain call")

    # ----------------------------------------------------------- VJP rows
    def vjp_rows(self, output: torch.Tensor, diff_inputs: list[torch.Tensor], nondet_tol: float,
                 batched: bool | None = None) -> list[torch.Tensor | None] | list[list]:
        """Rows e_j^T J for every output element j: per input, a (numel_out, *input.shape) tensor or None.

        With the loop, the per-input entry is a list of row tensors (or None) as torch builds them, so
        the caller's size/dtype checks see exactly what backward returned. `batched` forces the path
        (the reentrancy check compares two passes, which must be computed the same way).
        """
        m = output.numel()
        if batched is False:
            return self._vjp_loop(output, diff_inputs)
        if (batched or self.batch_vjp) and m >= MIN_BATCH_COLUMNS:
            try:
                return self._vjp_batched(output, diff_inputs, nondet_tol)
            except Exception as e:
                self._give_up("vjp", e)
        return self._vjp_loop(output, diff_inputs)

    def _vjp(self, output, diff_inputs, grad_output, batched=False):
        if batched:
            self.stats.batched_vjp_calls += 1
        else:
            self.stats.vjp_calls += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.autograd.grad(output, diff_inputs, grad_output, retain_graph=True,
                                       allow_unused=True, is_grads_batched=batched)

    def _vjp_loop(self, output, diff_inputs):
        base = torch.zeros_like(output, memory_format=torch.legacy_contiguous_format)
        flat = base.view(-1)
        rows: list[list] = [[] for _ in diff_inputs]
        for j in range(flat.numel()):
            flat.zero_()
            flat[j] = 1.0
            grads = self._vjp(output, diff_inputs, base)
            for i, g in enumerate(grads):
                rows[i].append(g.clone() if isinstance(g, torch.Tensor) else None)
        return rows

    def _vjp_batched(self, output, diff_inputs, nondet_tol):
        m = output.numel()
        itemsize = output.element_size()
        chunk = self._chunk(m, m + sum(t.numel() for t in diff_inputs), itemsize)
        pieces: list[list[torch.Tensor | None]] = [[] for _ in diff_inputs]
        for start in range(0, m, chunk):
            stop = min(m, start + chunk)
            b = stop - start
            g = _one_hot_rows(b, m, start, output)
            t0 = time.perf_counter()
            grads = self._vjp(output, diff_inputs, g.view(b, *output.shape), batched=True)
            t_batched = time.perf_counter() - t0
            for i, gr in enumerate(grads):
                if gr is not None and tuple(gr.shape[1:]) != tuple(diff_inputs[i].shape):
                    raise _Disagreement("batched gradient has an unexpected shape")
                pieces[i].append(gr)
            if start == 0 and not any(output is o for o in self._vjp_probed):
                t0 = time.perf_counter()
                ref = self._vjp(output, diff_inputs, g[0].view(output.shape))
                self._keep_if_cheaper("vjp", t_batched / b, time.perf_counter() - t0)
                for gr, r in zip(grads, ref):
                    if (gr is None) != (r is None) or (r is not None and (
                            gr.dtype != r.dtype or not _close(gr[0], r, extra_atol=nondet_tol))):
                        raise _Disagreement("batched VJP differs from the plain VJP")
                self._vjp_probed.append(output)
        out: list = []
        for chunks in pieces:
            if all(c is None for c in chunks):
                out.append(None)
            elif any(c is None for c in chunks):
                raise _Disagreement("gradient defined for some rows only")
            else:
                out.append(_cat(chunks))
        return out

    # ---------------------------------------------------------- JVP columns
    def jvp_columns(self, fn: Callable, inputs: tuple, idx: int, check_dtype: Callable) -> list[torch.Tensor]:
        """Columns J e_k of every float/complex output for each element k of inputs[idx].

        Returns a list over float/complex outputs of (numel_in, numel_out) tensors (zeros where an
        output has no tangent). `check_dtype(primal, tangent)` raises on a dtype mismatch.
        """
        x = inputs[idx]
        if self.batch_jvp_func and x.numel() >= MIN_BATCH_COLUMNS:
            try:
                return self._jvp_batched(fn, inputs, idx, check_dtype, functorch=True)
            except Exception as e:
                self._give_up("jvp_func", e)
        if self.batch_jvp and x.numel() >= MIN_BATCH_COLUMNS:
            try:
                return self._jvp_batched(fn, inputs, idx, check_dtype, functorch=False)
            except Exception as e:
                self._give_up("jvp", e)
        return self._jvp_loop(fn, inputs, idx, check_dtype)

    def _jvp_loop(self, fn, inputs, idx, check_dtype):
        cols: list[list[torch.Tensor]] = []
        with fwAD.dual_level():
            duals, tangents = make_duals(inputs)
            tangent = tangents[idx]
            flat_pos = [unravel(k, tangent.shape) for k in range(tangent.numel())]
            for pos in flat_pos:
                tangent[pos] = 1.0
                cols.append(self._jvp_outputs(fn, duals, check_dtype))
                tangent[pos] = 0.0
        return [torch.stack(c) if c else None for c in zip(*cols)] if cols else []

    def _jvp_outputs(self, fn, duals, check_dtype, batched=False):
        if batched:
            self.stats.batched_jvp_calls += 1
        else:
            self.stats.jvp_calls += 1
        outs = []
        for o in as_tuple(fn(*duals)):
            if not is_float_or_complex(o):
                continue
            primal, tangent = fwAD.unpack_dual(o)
            if tangent is not None:
                check_dtype(primal, tangent)
            outs.append(tangent.reshape(-1).clone() if tangent is not None
                        else torch.zeros(primal.numel(), dtype=primal.dtype, device=primal.device))
        return outs

    def _jvp_batched(self, fn, inputs, idx, check_dtype, functorch):
        x = inputs[idx]
        n = x.numel()
        with fwAD.dual_level():
            duals, _ = make_duals(inputs)
            probe_outs = [o for o in as_tuple(fn(*duals)) if is_float_or_complex(o)]
        out_elems = sum(o.numel() for o in probe_outs)
        chunk = self._chunk(n, n + out_elems, x.element_size())
        per_output: list[list[torch.Tensor]] = [[] for _ in probe_outs]
        probe_col = None

        def columns(t):
            with fwAD.dual_level():
                args = []
                for j, a in enumerate(inputs):
                    if isinstance(a, torch.Tensor) and a.requires_grad:
                        a = fwAD.make_dual(a.detach(), t if j == idx else torch.zeros_like(a))
                    args.append(a)
                res = []
                for o in as_tuple(fn(*args)):
                    if not is_float_or_complex(o):
                        continue
                    primal, tangent = fwAD.unpack_dual(o)
                    if tangent is None:
                        tangent = torch.zeros([], dtype=primal.dtype, device=primal.device).expand(primal.shape)
                    elif primal.is_complex() != tangent.is_complex():
                        check_dtype(primal, tangent)
                    res.append(tangent.reshape(-1))
                return tuple(res)

        base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]

        def of_x(xv):
            args = list(base)
            args[idx] = xv
            return tuple(o for o in as_tuple(fn(*args)) if is_float_or_complex(o))

        def columns_func(t):
            primals, tangents = torch.func.jvp(of_x, (base[idx],), (t,))
            for p, tg in zip(primals, tangents):
                if p.is_complex() != tg.is_complex():
                    check_dtype(p, tg)
            return tuple(tg.reshape(-1) for tg in tangents)

        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            b = stop - start
            t = _one_hot_rows(b, n, start, x)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if functorch:
                    res = torch.func.vmap(columns_func, randomness="error")(t.view(b, *x.shape))
                else:
                    res = _legacy_vmap(columns)(t.view(b, *x.shape))
            self.stats.batched_jvp_calls += 1
            res = as_tuple(res)
            if len(res) != len(probe_outs):
                raise _Disagreement("number of outputs changed under vmap")
            for o_idx, r in enumerate(res):
                per_output[o_idx].append(r.reshape(b, -1))
            if start == 0:
                probe_col = [r[0] for r in res]
                t_batched = (time.perf_counter() - t0) / b
        t0 = time.perf_counter()
        with fwAD.dual_level():
            duals, tangents = make_duals(inputs)
            tangents[idx][unravel(0, x.shape)] = 1.0
            ref = self._jvp_outputs(fn, duals, check_dtype)
        for got, want in zip(probe_col, ref):
            if not _close(got, want):
                raise _Disagreement("batched JVP differs from the plain JVP")
        self._keep_if_cheaper("jvp_func" if functorch else "jvp", t_batched, time.perf_counter() - t0)
        return [_cat(chunks) for chunks in per_output]


def _cat(chunks: list[torch.Tensor]) -> torch.Tensor:
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def _one_hot_rows(b: int, n: int, start: int, like: torch.Tensor) -> torch.Tensor:
    """Rows e_start ... e_(start+b-1) of the n×n identity."""
    rows = torch.zeros(b, n, dtype=like.dtype, device=like.device)
    rows[torch.arange(b, device=like.device), torch.arange(start, start + b, device=like.device)] = 1.0
    return rows


def _stack_columns(columns: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    if not columns:
        return []
    return [torch.stack(per_output) for per_output in zip(*columns)]


def _close(got: torch.Tensor, want: torch.Tensor, extra_atol: float = 0.0) -> bool:
    """Agreement up to reassociation: what batched and plain kernels may differ by."""
    got, want = got.detach(), want.detach()
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.numel() == 0:
        return True
    if not (got.is_floating_point() or got.is_complex()):
        return bool(torch.equal(got, want))
    eps = torch.finfo(got.dtype).eps
    scale = float(want.abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=1e3 * eps, atol=1e3 * eps * scale + extra_atol + 1e-300,
                               equal_nan=True))
