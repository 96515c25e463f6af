"""Triton kernels on a machine without a GPU, with nothing to set.

Where torch sees no GPU and triton is installed, `setup()` turns on Triton's interpreter
(TRITON_INTERPRET=1), so that `@triton.jit` kernels run on CPU tensors, and patches what the
interpreter lacks for kernels written for a GPU (autotuning, bfloat16 arithmetic, loop indices,
device queries), each patch guarded by a check of the shape of what it patches and described in
one line. The pytest plugin calls it before conftest files are loaded (opcheck.triton.pytest_hooks;
`[tool.opcheck] triton_interpret = false` opts out); a script calls it before defining its kernels:

    import opcheck.triton
    opcheck.triton.setup()

Nothing here is imported by `import opcheck`, and nothing imports triton or torch until setup()
runs. The patches live in this process only: no file of triton's or torch's is changed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from opcheck.triton._patch import Patch, PatchResult, run_patch

INTERPRET_ENV = "TRITON_INTERPRET"
SET_BY_OPCHECK_ENV = "OPCHECK_SET_TRITON_INTERPRET"
"""Set with TRITON_INTERPRET=1 by setup(), so that the processes a run starts (isolation, xdist
workers) know who set it."""
_TRUE = ("1", "true", "yes", "on", "y")  # how triton reads a boolean setting


@dataclass(frozen=True)
class TritonSetup:
    """What setup() decided and did."""

    interpreting: bool
    reason: str  # why the interpreter is on or off
    set_by_opcheck: bool = False  # opcheck set TRITON_INTERPRET=1 (rather than the environment)
    triton_version: str | None = None
    patches: tuple[PatchResult, ...] = field(default_factory=tuple)
    autotune_config: int = 0

    @property
    def applied(self) -> tuple[PatchResult, ...]:
        return tuple(p for p in self.patches if p.applied)

    @property
    def not_applied(self) -> tuple[PatchResult, ...]:
        return tuple(p for p in self.patches if not p.applied)

    def describe(self) -> str:
        """A few lines: interpreting or not and why, then each patch, applied or not and why."""
        head = "Triton interpreter on" if self.interpreting else "Triton interpreter off"
        lines = [f"{head}: {self.reason}"]
        lines += [f"  {p.describe()}" for p in self.patches]
        return "\n".join(lines)


_done: list[TritonSetup] = []


def status() -> TritonSetup:
    """What setup() did in this process; where it has not run, what it would find without running it."""
    if _done:
        return _done[0]
    return TritonSetup(interpreting=_env_says_interpret() is True, reason="opcheck.triton.setup() has not run")


def setup(*, interpret: bool | None = None, autotune_config: int | None = None) -> TritonSetup:
    """Run Triton kernels through the interpreter where there is no GPU, with the interpreter's gaps patched.

    interpret: None decides (triton installed, torch sees no GPU, TRITON_INTERPRET not set to 0);
        False leaves Triton alone; True turns the interpreter on even with a GPU.
    autotune_config: the index of the config autotuned kernels run with, among those that survive
        pruning (default: OPCHECK_TRITON_AUTOTUNE_CONFIG, else 0, the first).

    Idempotent: a second call returns the first call's result (a new autotune_config applies).
    Call it before the kernels are defined: a kernel defined while the interpreter was off stays
    compiled for a GPU.
    """
    from opcheck.triton import autotune

    if _done:
        if autotune_config is not None:
            autotune.choose(autotune_config)
        return _done[0]
    result = _decide(interpret)
    if result.interpreting:
        choice = autotune.choose(autotune_config)
        try:
            _reload_triton_language()
            import triton
            import triton.runtime.interpreter  # noqa: F401  (needs numpy, which the engine alone does not)
        except ImportError as e:
            result = _not_importable(result, e)
            _done.append(result)
            return result
        patches = tuple(run_patch(p) for p in all_patches())
        result = TritonSetup(
            True, result.reason, result.set_by_opcheck, triton.__version__, patches, autotune_config=choice
        )
    _done.append(result)
    return result


def setup_for_project(start: Path) -> TritonSetup | None:
    """setup() as the project at or above `start` configures it (`[tool.opcheck] triton_interpret`);
    None where triton is not installed (nothing is imported then). Raises opcheck.config.ConfigError
    for a bad table."""
    if not triton_installed():
        return None
    from opcheck import config as project_config

    setting = project_config.load(start).get("triton_interpret")
    return setup(interpret=False if setting is not None and setting.value is False else None)


def all_patches() -> tuple[Patch, ...]:
    """Every patch, in the order setup() applies them (and the README lists them)."""
    from opcheck.triton import autotune, bfloat16, constexprs, devices, launches, loops

    return (
        *autotune.PATCHES,
        *bfloat16.PATCHES,
        *constexprs.PATCHES,
        *loops.PATCHES,
        *devices.PATCHES,
        *launches.PATCHES,
    )


def triton_installed() -> bool:
    """Whether `import triton` would find it (without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken installation
        return False


def _env_says_interpret() -> bool | None:
    raw = os.environ.get(INTERPRET_ENV)
    if raw is None or not raw.strip():
        return None
    return raw.strip().lower() in _TRUE


def _decide(interpret: bool | None) -> TritonSetup:
    if not triton_installed():
        return TritonSetup(False, "triton is not installed")
    env = _env_says_interpret()
    raw = os.environ.get(INTERPRET_ENV)
    if env is False:
        return TritonSetup(False, f"{INTERPRET_ENV}={raw} in the environment: kernels compile, nothing is patched")
    if env is True and os.environ.get(SET_BY_OPCHECK_ENV) == "1":
        return TritonSetup(True, f"{INTERPRET_ENV}=1 set by opcheck (torch sees no GPU)", set_by_opcheck=True)
    if env is True:
        return TritonSetup(True, f"{INTERPRET_ENV}={raw} in the environment")
    if interpret is False:
        return TritonSetup(False, "turned off (triton_interpret = false): kernels compile, nothing is patched")
    if interpret is None:
        import torch

        if torch.cuda.is_available():
            return TritonSetup(False, "torch sees a GPU: kernels compile for it, nothing is patched")
    os.environ[INTERPRET_ENV] = "1"
    os.environ[SET_BY_OPCHECK_ENV] = "1"
    why = "asked for" if interpret else "torch sees no GPU"
    return TritonSetup(True, f"{INTERPRET_ENV}=1 set by opcheck ({why})", set_by_opcheck=True)


def _not_importable(decided: TritonSetup, error: ImportError) -> TritonSetup:
    """Triton's interpreter does not import (numpy missing, as in an install of the engine alone
    beside a torch that brings triton): Triton is left as it was, and a pytest run goes on."""
    if decided.set_by_opcheck:
        os.environ.pop(INTERPRET_ENV, None)
        os.environ.pop(SET_BY_OPCHECK_ENV, None)
    why = f"{type(error).__name__}: {error}"
    return TritonSetup(False, f"Triton's interpreter does not import ({why}): nothing is patched")


def _reload_triton_language() -> None:
    """Where triton was imported before the interpreter was on (torch._dynamo and
    torch.testing._internal import it), its own @triton.jit functions (tl.sum, tl.max, tl.sigmoid,
    ...) were made compiled, and an interpreted kernel cannot call them ("Cannot call @triton.jit'd
    outside of the scope of a kernel"). Define them again, as importing triton now would."""
    if "triton.language" not in sys.modules:
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.sum, InterpretedFunction):
        return
    for name in ("triton.language.standard", "triton.language.random", "triton.language"):
        if name in sys.modules:
            importlib.reload(sys.modules[name])


__all__ = ["TritonSetup", "all_patches", "setup", "setup_for_project", "status", "triton_installed"]
