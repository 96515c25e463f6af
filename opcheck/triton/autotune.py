"""`@triton.autotune` without a GPU: no benchmarking, one documented config.

Triton's Autotuner times every config that survives pruning through the GPU driver's benchmarker,
which does not exist under the interpreter ("0 active drivers"), so no autotuned kernel runs at
all. Timing interpreted kernels would mean nothing anyway. Instead the kernel runs with the first
config that survives pruning (`prune_configs_by`: `early_config_prune`, then `perf_model`/`top_k`),
in the order the decorator lists them; CONFIG_ENV (or setup(autotune_config=N)) names another by
its index among the survivors (0 the first, -1 the last; an index past the end takes the last).
The launch itself is the Autotuner's own: the chosen config's `pre_hook` runs before each launch,
and since no benchmark ran, `reset_to_zero` and `restore_value` have no benchmark writes to undo
(the kernel sees its tensors as the caller passed them).
"""

from __future__ import annotations

import os

from opcheck.triton._patch import NotApplicable, Patch, is_patched, mark, parameters, require

CONFIG_ENV = "OPCHECK_TRITON_AUTOTUNE_CONFIG"
"""The index of the config autotuned kernels run with, among those that survive pruning."""

_choice: list[int] = [0]


def choose(index: int | None) -> int:
    """The config index in effect: `index`, else CONFIG_ENV, else 0."""
    if index is None:
        raw = os.environ.get(CONFIG_ENV, "").strip()
        try:
            index = int(raw) if raw else 0
        except ValueError:
            raise ValueError(f"{CONFIG_ENV}={raw!r}: expected a config index (0 the first, -1 the last)") from None
    _choice[0] = index
    return index


def chosen(configs: list) -> list:
    """The one config of `configs` (the survivors of pruning) that the kernel runs with."""
    if not configs:
        return configs
    index = _choice[0]
    index = max(-len(configs), min(index, len(configs) - 1))
    return [configs[index]]


def _prune(original):
    def prune_configs(self, *args, **kwargs):
        return chosen(list(original(self, *args, **kwargs)))

    return mark(prune_configs, wraps=original)


def _no_bench(original):
    def _bench(self, *args, config, **meta):
        # One config survives (prune_configs above); where a triton release still times a single
        # config, the timing must not reach the GPU driver.
        return [0.0, 0.0, 0.0]

    return mark(_bench, wraps=original)


def _no_benchmarker(kernel_call, quantiles):
    """A benchmark function that times nothing: what an autotuner made here gets instead of the
    GPU driver's (triton 3.2 asks the driver for it when the kernel is decorated)."""
    return [0.0 for _ in quantiles]


def _init(original):
    import inspect

    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        if bound.arguments.get("do_bench") is None:
            bound.arguments["do_bench"] = _no_benchmarker
        original(*bound.args, **bound.kwargs)

    return mark(__init__, wraps=original)


def _reserve_config_keywords() -> None:
    """triton 3.2's interpreter drops the launch options it knows (RESERVED_KWS) before calling the
    kernel, but a Config passes more (num_buffers_warp_spec, ...): the kernel got them as arguments.
    Later releases drop whatever the kernel does not take, and have no such list."""
    from triton.runtime import interpreter
    from triton.runtime.autotuner import Config

    reserved = getattr(interpreter, "RESERVED_KWS", None)
    if isinstance(reserved, list):
        reserved.extend(k for k in Config({}).all_kwargs() if k not in reserved)


def _apply() -> None:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError as e:
        raise NotApplicable(f"triton.runtime.autotuner.Autotuner cannot be imported ({e})") from None
    prune, bench = getattr(Autotuner, "prune_configs", None), getattr(Autotuner, "_bench", None)
    require(
        prune is not None and parameters(prune)[:2] == ["self", "kwargs"],
        "Autotuner.prune_configs(self, kwargs) is missing",
    )
    require(
        bench is not None and "config" in parameters(bench), "Autotuner._bench(self, *args, config, ...) is missing"
    )
    init = Autotuner.__init__
    # triton 3.2 asks the driver for a benchmark function when a kernel is decorated, unless one is
    # given; triton 3.1's Autotuner takes none and benchmarks only in _bench.
    if "do_bench" in parameters(init) and not is_patched(init):
        Autotuner.__init__ = _init(init)
    _reserve_config_keywords()
    if not is_patched(prune):
        Autotuner.prune_configs = _prune(prune)
    if not is_patched(bench):
        Autotuner._bench = _no_bench(bench)


PATCHES = (
    Patch(
        "autotune",
        f"@triton.autotune runs the first config that survives pruning, unbenchmarked ({CONFIG_ENV}=N picks "
        "the N-th); the benchmark needed a GPU driver",
        _apply,
    ),
)
