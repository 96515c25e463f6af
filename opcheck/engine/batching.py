"""Evaluate many perturbations, VJPs and JVPs at once, with the one-at-a-time loop as the fallback.

Every public method here has two implementations that must agree: a batched one (one vmapped call
per chunk of columns) and the loop torch.autograd.gradcheck uses. The batched one is tried first;
it is abandoned for the rest of the call the first time it raises or a probe (one plain call at a
point the batch also evaluated) disagrees with it, so the loop's result and its exceptions are what
the caller sees whenever batching is in doubt.
"""

from __future__ import annotations

import contextlib
import functools
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
PILOT_COLUMNS = 8
"""The first batch of a batched kind has at most this many columns: it is timed against a plain
call, and where batching costs more per column (an op whose batching rule loops inside, at tens
of milliseconds a row) the loop takes over after this little, not after a whole large batch."""

FUSE_MAX_COLUMNS = 128
"""Up to this many columns in all, every input's columns share one vmapped call: the call's
overhead is what counts. Beyond, each input gets its own call, with the other inputs left
unbatched: batching rules with several batched inputs (conv weights, matmul) cost more compute."""

Clock = Callable[[], float]
"""Seconds from an arbitrary origin, like time.perf_counter."""

_BATCHING = [True]
_CLOCKS: list[Clock] = [time.perf_counter]


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


def adaptive_clock() -> Clock:
    """The clock the adaptive rule of a check started now reads (see batching_clock)."""
    return _CLOCKS[-1]


@contextlib.contextmanager
def batching_clock(clock: Clock):
    """Time the adaptive rule with `clock` instead of time.perf_counter in the checks run inside.

    The rule reads the clock in pairs, around the two calls each of its decisions compares: first a
    batched call of b columns, then the plain call of one column that probes it (a batched call
    that raises is compared with nothing). So a clock that advances by the same step at every
    reading never finds batching slower, and one that makes the first of every two spans long
    finds it slower each time: either decision can be pinned, whatever the machine's load.
    Verdicts never depend on the clock; only the path taken to them and the counts in EvalStats do.
    """
    _CLOCKS.append(clock)
    try:
        yield
    finally:
        _CLOCKS.pop()


class _Disagreement(Exception):
    """The batched result differs from the loop's on the probe column."""


class _SlowerThanLoop(Exception):
    """The pilot batch cost more per column than the loop (already recorded): the loop takes over."""


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
    auto_paths: list[str] = field(default_factory=list)  # fast_mode="auto": "full" or "projected (...)" per comparison
    fused: bool = False  # fast_mode="auto": the fused pass (fused.py) passed every check of the call


class Evaluator:
    """Per-call batching policy and counters.

    `batch=False` forces the loop everywhere. Once a kind of batching (forward evaluation, VJP,
    JVP) fails, or costs more per column than the loop as timed by `clock`, it stays off for the
    rest of the call.
    """

    def __init__(self, batch: bool = True, memory_budget: int = DEFAULT_MEMORY_BUDGET, adaptive: bool = True,
                 clock: Clock = time.perf_counter):
        self.batch_forward = batch
        self.batch_vjp = batch
        self.batch_jvp_func = batch  # torch.func.jvp under torch.func.vmap (wider batching rules)
        self.batch_jvp = batch and _legacy_vmap is not None  # make_dual under the legacy vmap
        self.memory_budget = memory_budget
        self.adaptive = adaptive  # drop a kind of batching that turns out slower than the loop
        self.clock = clock
        self.randomness = "error"  # torch.func.vmap's randomness mode; see _vmap
        # The finite differences' probe: a perturbed row checked by a plain call (and timed for the
        # adaptive rule), or, when True, the unperturbed row checked against the outputs the caller
        # already has (no call; see fused.py).
        self.center_probe = False
        # JVP columns: the legacy vmap (torch's batched forward-AD check's own machinery) before
        # torch.func's, and which of them (or "loop") the latest jvp_columns call used.
        self.legacy_jvp_first = False
        self.jvp_kind_used: str | None = None
        self.numerical_batched = False  # whether the latest numerical_columns call was vmapped
        self.stats = EvalStats()
        # outputs whose batched VJP already matched the plain one, with the batches it used: the
        # reentrancy pass repeats them (kernels for other batch sizes may round otherwise)
        self._vjp_probed: list[tuple[torch.Tensor, list[tuple[int, int]]]] = []

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
            return False
        return True

    def _judge_batch(self, kind: str, schedule: "_Schedule", batched_per_column: float, plain_per_column: float,
                     more: bool) -> None:
        """After a timed batch: the loop takes over the rest of the columns when batching costs more,
        and otherwise the next batch grows by the factor this one undercut the loop."""
        if not self._keep_if_cheaper(kind, batched_per_column, plain_per_column) and more:
            raise _SlowerThanLoop(kind)
        schedule.measured(batched_per_column, plain_per_column)

    def _timed(self, f: Callable, *args, **kwargs):
        """f's result and the seconds it took by this evaluator's clock."""
        start = self.clock()
        try:
            result = f(*args, **kwargs)
        finally:  # read even when f raises: the clock sees its readings in pairs (see batching_clock)
            stop = self.clock()
        return result, stop - start

    def _vmap(self, f: Callable, *args):
        """torch.func.vmap(f)(*args); a random op inside is retried with one draw for the whole batch.

        That draw is what a plain call gets when the function seeds its generator (as OpInfo's
        dropout samples do); when it is not, the probe sees the plain call differ and the loop takes
        over.
        """
        try:
            return torch.func.vmap(f, randomness=self.randomness)(*args)
        except RuntimeError as e:
            if self.randomness != "error" or "random operation" not in str(e):
                raise
        self.randomness = "same"
        return torch.func.vmap(f, randomness="same")(*args)

    def _give_up(self, kind: str, why: BaseException | str) -> None:
        setattr(self, f"batch_{kind}", False)
        if isinstance(why, _SlowerThanLoop):
            return  # recorded by _keep_if_cheaper
        text = why if isinstance(why, str) else f"{type(why).__name__}: {str(why).splitlines()[0] if str(why) else ''}"
        self.stats.fallbacks.append(f"{kind}: {text}")

    # ------------------------------------------------------- numerical columns
    def numerical_columns(self, fn: Callable, inputs: tuple, segments: list[tuple[int, complex]], eps: float,
                          nbhd_check: Callable, ref_outputs: tuple,
                          positions: dict[int, list[int]] | None = None) -> list[list[torch.Tensor]]:
        """Central differences of every output of fn with respect to each element of some inputs.

        `segments` lists (input index, perturbation direction): 1 for real inputs and for the real
        part of complex ones, 1j for the imaginary part. Returns, per segment, a list over all
        outputs of (numel_in, numel_out) tensors. Up to FUSE_MAX_COLUMNS columns, all segments share
        one vmapped call per chunk. `positions`, per input index, limits the loop to those elements
        (flat); the others' columns are zero (a sparse input's unspecified positions, which nothing
        perturbs).
        """
        total = sum(inputs[idx].numel() for idx, _ in segments)
        self.numerical_batched = False
        # Without a plain probe call (center_probe) one vmapped call beats the loop from about 5 columns.
        if self.batch_forward and total >= (5 if self.center_probe else MIN_BATCH_COLUMNS):
            try:
                if total <= FUSE_MAX_COLUMNS:
                    result = self._numerical_batched(fn, inputs, segments, eps, ref_outputs)
                else:
                    result = []
                    for idx in dict.fromkeys(i for i, _ in segments):
                        result += self._numerical_batched(fn, inputs, [sg for sg in segments if sg[0] == idx],
                                                          eps, ref_outputs)
                self.numerical_batched = True
                return result
            except Exception as e:  # anything: the loop decides what the user sees
                self._give_up("forward", e)
        return [self._numerical_loop(fn, inputs, idx, eps, nbhd_check, p, (positions or {}).get(idx))
                for idx, p in segments]

    def plain_column(self, fn, inputs, idx: int, k: int, eps: float, nbhd_check, p: complex = 1) -> list[torch.Tensor]:
        """The central difference of every output along element k of input idx, by plain calls (torch's way)."""
        data = inputs[idx].data
        entry = data.view(-1)[k] if data.is_contiguous() else data[unravel(k, data.shape)]
        return self._one_column(fn, inputs, entry, eps * p if p != 1 else eps, eps, nbhd_check, k, data.shape)

    def _numerical_loop(self, fn, inputs, idx, eps, nbhd_check, p, positions=None):
        x = inputs[idx]
        data = x.data
        flat = data.view(-1) if data.is_contiguous() else None
        ks = range(x.numel()) if positions is None else (list(positions) or [0])
        columns: list[list[torch.Tensor]] = []
        for k in ks:
            entry = flat[k] if flat is not None else data[unravel(k, data.shape)]
            columns.append(self._one_column(fn, inputs, entry, eps * p if p != 1 else eps, eps, nbhd_check, k,
                                            data.shape))
        stacked = _stack_columns(columns)
        if positions is None:
            return stacked
        rows = torch.tensor(list(ks), dtype=torch.long)
        full = []
        for col in stacked:
            out = col.new_zeros((x.numel(), *col.shape[1:]))
            if positions:
                out[rows.to(col.device)] = col
            full.append(out)
        return full

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

    def _numerical_batched(self, fn, inputs, segments, eps, ref_outputs):
        refs = list(as_tuple(ref_outputs))
        if not all(isinstance(o, torch.Tensor) for o in refs):
            raise _Disagreement("non-tensor output")
        base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
        flats = {idx: base[idx].reshape(-1) for idx in {i for i, _ in segments}}
        batched_fn = getattr(fn, "vmap_form", fn)
        vidx = sorted(flats)

        def single(*xs):
            args = list(base)
            for i, xv in zip(vidx, xs):
                args[i] = xv
            return tuple(as_tuple(batched_fn(*args)))

        # Columns of all segments, numbered globally; a chunk of b columns is one vmapped call on
        # 2b rows (x - delta e_k, then x + delta e_k) plus, in the first chunk, a probe row.
        offsets, total = [], 0
        for idx, _ in segments:
            offsets.append(total)
            total += flats[idx].numel()
        in_elems = sum(f.numel() for f in flats.values())
        out_elems = sum(o.numel() for o in refs)
        itemsize = max(f.element_size() for f in flats.values())
        chunk = self._chunk(total, 2 * (in_elems + out_elems), itemsize)
        results = [o.new_empty((total, o.numel()), dtype=torch.promote_types(o.dtype, torch.get_default_dtype())
                               if not (o.is_floating_point() or o.is_complex()) else o.dtype) for o in refs]
        plain_per_column = None
        schedule = _Schedule(total, chunk)
        for start, stop, growing in schedule:
            b = stop - start
            probe = start == 0
            rows = 2 * b + (1 if probe else 0)
            stacked = {}
            for s, (idx, p) in enumerate(segments):
                lo, hi = max(start, offsets[s]), min(stop, offsets[s] + flats[idx].numel())
                if lo >= hi:
                    continue
                if idx not in stacked:
                    stacked[idx] = flats[idx].expand(rows, -1).clone()
                delta = eps * p if p != 1 else eps
                t = stacked[idx]
                r, c, n = lo - start, lo - offsets[s], hi - lo  # rows r.., columns c..: a diagonal each
                t[r:r + n, c:c + n].diagonal().sub_(delta)
                t[b + r:b + r + n, c:c + n].diagonal().add_(delta)
            if probe and not self.center_probe:  # one extra row: the first element of every input moved at once
                for idx, p in _first_directions(segments):
                    if idx not in stacked:
                        stacked[idx] = flats[idx].expand(rows, -1).clone()
                    stacked[idx][2 * b, 0] = flats[idx][0] + (eps * p if p != 1 else eps)
            for idx in vidx:  # inputs with no column in this chunk: the same point on every row
                if idx not in stacked:
                    stacked[idx] = flats[idx].expand(rows, -1)
            args = [stacked[i].view(rows, *base[i].shape) for i in vidx]
            # The clock is read only for what is compared.
            timed = self._timed if (probe and not self.center_probe) or (
                growing and plain_per_column is not None) else _untimed
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs, t_batched = timed(self._vmap, single, *args)
            self.stats.batched_calls += 1
            if len(outs) != len(refs):
                raise _Disagreement("number of outputs changed under vmap")
            for o, ref, res in zip(outs, refs, results):
                if o.shape[1:] != ref.shape or o.dtype != ref.dtype:
                    raise _Disagreement("output shape or dtype changed under perturbation")
                diff = torch.sub(o[b:2 * b], o[:b]).div_(2 * eps) if o.is_floating_point() or o.is_complex() \
                    else (o[b:2 * b] - o[:b]) / (2 * eps)
                res[start:stop].copy_(diff.reshape(b, -1))
            if probe and self.center_probe:
                if not all(_close(o[2 * b], ref.detach()) for o, ref in zip(outs, refs)):
                    raise _Disagreement("vmapped evaluation at the unperturbed point differs from the plain call")
            elif probe:
                _, t_plain = self._timed(self._probe_forward, fn, inputs, segments, eps, [o[2 * b] for o in outs])
                # A column is two rows (x - delta e_k and x + delta e_k); the probe evaluated one.
                plain_per_column = 2 * t_plain
                self._judge_batch("forward", schedule, t_batched / b, plain_per_column, stop < total)
            elif growing and plain_per_column is not None:
                self._judge_batch("forward", schedule, t_batched / b, plain_per_column, stop < total)
        return [[res[offsets[s]:offsets[s] + flats[idx].numel()] for res in results]
                for s, (idx, _) in enumerate(segments)]

    def _probe_forward(self, fn, inputs, segments, eps, batched_row):
        """One plain call at the probe row's point; the batched row must match it."""
        entries = []
        for idx, p in _first_directions(segments):
            data = inputs[idx].data
            entry = data.view(-1)[0] if data.is_contiguous() else data[(0,) * data.dim()]
            entries.append((entry, entry.clone()))
            entry.copy_(entries[-1][1] + (eps * p if p != 1 else eps))
        try:
            ref = self._call_cloned(fn, inputs)
        finally:
            for entry, orig in entries:
                entry.copy_(orig)
        for o, r in zip(batched_row, ref):
            if not _close(o, r):
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
        out: list[torch.Tensor | None] = [None] * len(diff_inputs)
        plain_per_column = None
        earlier = [bounds for o, bounds in self._vjp_probed if o is output]  # the reentrancy pass
        probed = bool(earlier)
        schedule = _Schedule(m, chunk)
        used: list[tuple[int, int]] = []
        for start, stop, growing in ([(a, z, False) for a, z in earlier[0]] if probed else schedule):
            used.append((start, stop))
            b = stop - start
            g = _one_hot_rows(b, m, start, output)
            probe = start == 0 and not probed
            timed = self._timed if probe or (growing and plain_per_column is not None) else _untimed
            grads, t_batched = timed(self._vjp, output, diff_inputs, g.view(b, *output.shape), batched=True)
            for i, gr in enumerate(grads):
                if gr is not None and tuple(gr.shape[1:]) != tuple(diff_inputs[i].shape):
                    raise _Disagreement("batched gradient has an unexpected shape")
                if start == 0:
                    out[i] = gr if gr is None or b == m else gr.new_empty((m, *gr.shape[1:]))
                elif (gr is None) != (out[i] is None):
                    raise _Disagreement("gradient defined for some rows only")
                if gr is not None and b != m:
                    out[i][start:stop].copy_(gr)
            if probe:
                # A dense random combination of the chunk's rows: a plain backward that differs from
                # the batched one in any row shows (a one-hot probe sees one row only).
                w = torch.rand(b, generator=torch.Generator().manual_seed(b), dtype=torch.float64).to(g.dtype)
                ref, t_plain = self._timed(self._vjp, output, diff_inputs, (w @ g).view(output.shape))
                for gr, r in zip(grads, ref):
                    if (gr is None) != (r is None) or (r is not None and (
                            gr.dtype != r.dtype or not combination_close(w, gr, r, extra_atol=nondet_tol * b))):
                        raise _Disagreement("batched VJP differs from the plain VJP")
                self._vjp_probed.append((output, used))
                plain_per_column = t_plain
                self._judge_batch("vjp", schedule, t_batched / b, t_plain, stop < m)
            elif growing and plain_per_column is not None:
                self._judge_batch("vjp", schedule, t_batched / b, plain_per_column, stop < m)
        return out

    # ---------------------------------------------------------- JVP columns
    def jvp_columns(self, fn: Callable, inputs: tuple, idxs: list[int], check_dtype: Callable,
                    ref_outputs: tuple) -> list[list[torch.Tensor]]:
        """Columns J e_k of every float/complex output for each element k of the inputs in idxs.

        Returns, per input in idxs, a list over float/complex outputs of (numel_in, numel_out)
        tensors (zeros where an output has no tangent). `check_dtype(primal, tangent)` raises on a
        dtype mismatch. Up to FUSE_MAX_COLUMNS columns, all inputs share one vmapped call per chunk.
        """
        total = sum(inputs[i].numel() for i in idxs)
        kinds = (("jvp_func", True), ("jvp", False))
        if total >= (2 if self.legacy_jvp_first else MIN_BATCH_COLUMNS):
            for kind, functorch in reversed(kinds) if self.legacy_jvp_first else kinds:
                if getattr(self, f"batch_{kind}"):
                    try:
                        if total <= FUSE_MAX_COLUMNS:
                            result = self._jvp_batched(fn, inputs, idxs, check_dtype, ref_outputs, functorch)
                        else:
                            result = [self._jvp_batched(fn, inputs, [i], check_dtype, ref_outputs, functorch)[0]
                                      for i in idxs]
                        self.jvp_kind_used = kind
                        return result
                    except Exception as e:
                        self._give_up(kind, e)
        self.jvp_kind_used = "loop"
        return [self._jvp_loop(fn, inputs, idx, check_dtype) for idx in idxs]

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
        return [torch.stack(c) for c in zip(*cols)] if cols else []

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

    def _jvp_batched(self, fn, inputs, idxs, check_dtype, ref_outputs, functorch):
        refs = [o for o in as_tuple(ref_outputs) if is_float_or_complex(o)]
        base = [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
        diff = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad]
        sizes = [inputs[i].numel() for i in idxs]
        offsets = [sum(sizes[:k]) for k in range(len(idxs))]
        total = sum(sizes)
        dtype = functools.reduce(torch.promote_types, [inputs[i].dtype for i in idxs])
        x0 = inputs[idxs[0]]
        out_elems = sum(o.numel() for o in refs)
        chunk = self._chunk(total, total + out_elems, x0.element_size())
        results = [o.new_empty((total, o.numel())) for o in refs]

        def split(t):
            """Per input in idxs, its (batch, *shape) tangent: a view of the rows' columns."""
            return [t[:, off:off + n].view(t.shape[0], *inputs[i].shape) if n else
                    t.new_zeros((t.shape[0], *inputs[i].shape))
                    for i, off, n in zip(idxs, offsets, sizes)]

        def columns(*ts):  # make_dual under the legacy vmap, as torch's own forward-AD batching does
            by_idx = dict(zip(idxs, ts))
            with fwAD.dual_level():
                args = []
                for j, a in enumerate(inputs):
                    if j in diff:
                        a = fwAD.make_dual(a.detach(), by_idx[j].to(a.dtype) if j in by_idx else torch.zeros_like(a))
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

        def of_x(*xs):
            args = list(base)
            for i, xv in zip(idxs, xs):
                args[i] = xv
            return tuple(o for o in as_tuple(fn(*args)) if is_float_or_complex(o))

        def columns_func(*ts):
            primals, tangents = torch.func.jvp(of_x, tuple(base[i] for i in idxs),
                                               tuple(t.to(base[i].dtype) for i, t in zip(idxs, ts)))
            for p, tg in zip(primals, tangents):
                if p.is_complex() != tg.is_complex():
                    check_dtype(p, tg)
            return tuple(tg.reshape(-1) for tg in tangents)

        t_batched = 0.0
        probe_direction = torch.rand(total, generator=torch.Generator().manual_seed(total),
                                     dtype=torch.float64).to(dtype=dtype, device=x0.device)
        plain_per_column = None
        kind = "jvp_func" if functorch else "jvp"
        schedule = _Schedule(total, chunk)
        for start, stop, growing in schedule:
            b = stop - start
            probe = start == 0
            t = _one_hot_rows(b + probe, total, start, x0, dtype=dtype)
            if probe:  # one extra row: a dense random direction over every input (see _probe_jvp)
                t[b] = probe_direction
            timed = self._timed if probe or (growing and plain_per_column is not None) else _untimed
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if functorch:
                    res, seconds = timed(self._vmap, columns_func, *split(t))
                else:
                    res, seconds = timed(_legacy_vmap(columns), *split(t))
            self.stats.batched_jvp_calls += 1
            res = as_tuple(res)
            if len(res) != len(refs):
                raise _Disagreement("number of outputs changed under vmap")
            for r, out in zip(res, results):
                out[start:stop].copy_(r[:b].reshape(b, -1))
            if probe:
                ref, t_plain = self._timed(self._probe_jvp, fn, inputs, idxs, check_dtype, probe_direction, offsets)
                for got, want in zip([r[b] for r in res], ref):
                    if not _close(got, want):
                        raise _Disagreement("batched JVP differs from the plain JVP")
                plain_per_column = t_plain
                self._judge_batch(kind, schedule, seconds / (b + 1), t_plain, stop < total)
            elif growing and plain_per_column is not None:
                self._judge_batch(kind, schedule, seconds / b, plain_per_column, stop < total)
        return [[out[off:off + n] for out in results] for off, n in zip(offsets, sizes)]

    def _probe_jvp(self, fn, inputs, idxs, check_dtype, direction, offsets):
        """One plain JVP along the probe row's direction, dense over every input in idxs: a plain JVP
        that differs from the batched one in any column shows (a one-hot probe sees one column)."""
        with fwAD.dual_level():
            duals, tangents = make_duals(inputs)
            for i, off in zip(idxs, offsets):
                n = inputs[i].numel()
                if n:
                    tangents[i].copy_(direction[off:off + n].view(inputs[i].shape))
            return self._jvp_outputs(fn, duals, check_dtype)


def _untimed(f: Callable, *args, **kwargs):
    """f's result and no time: Evaluator._timed's stand-in where nothing is compared."""
    return f(*args, **kwargs), 0.0


def _one_hot_rows(b: int, n: int, start: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rows e_start ... e_(start+b-1) of the n×n identity (rows past n stay zero)."""
    rows = torch.zeros(b, n, dtype=dtype or like.dtype, device=like.device)
    k = min(b, n - start)
    rows[torch.arange(k, device=like.device), torch.arange(start, start + k, device=like.device)] = 1.0
    return rows


def _first_directions(segments):
    """(input index, direction) of the first segment of each input: the probe row moves these."""
    seen: dict[int, complex] = {}
    for idx, p in segments:
        seen.setdefault(idx, p)
    return list(seen.items())


def _stack_columns(columns: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    if not columns:
        return []
    return [torch.stack(per_output) for per_output in zip(*columns)]


class _Schedule:
    """The batches of a batched kind: (start, stop, timed) for each.

    Beyond 8 * PILOT_COLUMNS columns the first is a pilot of PILOT_COLUMNS; after each timed batch
    the next grows by the factor its columns undercut the loop's (at most 8-fold), until `chunk`.
    A batching rule whose cost per column grows with the batch (linearly: diagonal_scatter's VJP
    costs 0.3 ms a row at 8 rows, 2.7 ms at 64, 42 ms at 1000) then never runs a batch whose
    columns cost more than the loop's, and one that does not reaches `chunk` in a few steps.
    """

    def __init__(self, total: int, chunk: int, pilot: bool = True):
        self.total, self.chunk, self.start = total, chunk, 0
        self.size = min(chunk, PILOT_COLUMNS) if pilot and total > 8 * PILOT_COLUMNS else chunk

    def __iter__(self):
        while self.start < self.total:
            stop = min(self.total, self.start + self.size)
            yield self.start, stop, self.start == 0 or self.size < self.chunk
            self.start = stop

    def measured(self, batched_per_column: float, plain_per_column: float) -> None:
        factor = 8.0 if batched_per_column <= 0 else min(8.0, plain_per_column / batched_per_column)
        self.size = min(self.chunk, max(self.size, int(self.size * factor * (1 + 1e-9))))


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
    if got.is_floating_point() and float(torch.sub(got, want).abs_().max()) <= 1e3 * eps * float(
            want.abs().max()) + extra_atol:  # within the allowance below; NaN and inf never pass here
        return True
    scale = float(want.abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=1e3 * eps, atol=1e3 * eps * scale + extra_atol + 1e-300,
                               equal_nan=True))


def combination_close(weights: torch.Tensor, rows: torch.Tensor, want: torch.Tensor, extra_atol: float = 0.0) -> bool:
    """A plain call along Σ_r w_r (direction r) against Σ_r w_r rows[r] of a batched one.

    The sum is computed here, so beyond _close's allowance it may be off by the rounding of a
    length-b dot product, at most b * eps * Σ_r |w_r| |rows[r]| per entry (taken 4 times).
    """
    w = weights.to(rows.dtype)
    eps = torch.finfo(rows.dtype).eps
    rounding = 4 * len(w) * eps * float(torch.tensordot(w.abs(), rows.detach().abs(), 1).max()) if len(w) else 0.0
    return _close(torch.tensordot(w, rows, 1), want, extra_atol=extra_atol + rounding)
