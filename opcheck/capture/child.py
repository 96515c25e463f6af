"""`python -m opcheck.capture.child CONFIG.json`: run the user's command with the recorder on.

The parent (opcheck.capture.run) writes CONFIG: the selections, the command as
opcheck.capture.command parsed it, and where to write the records. This process installs the
recording (a TorchFunctionMode, a TorchDispatchMode for aten selections, and the patched
callables), runs the command as `python` would (sys.argv, sys.path[0] and `__main__` as for a
script, a `-m` module or `-c` code; pytest through pytest.main), and writes the records whatever
way the command ends (its exit status is this process's).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    from opcheck.capture import targets
    from opcheck.capture.recorder import Recorder

    selections = [targets.Selection(**s) for s in config["selections"]]
    values_dir = Path(config["values_dir"]) if config.get("values_dir") else None
    recorder = Recorder(config.get("values"), values_dir)
    records = Path(config["records"])
    status: int | None = None
    error: str | None = None
    sys.argv = list(config["argv"])
    if config["mode"] in ("module", "code", "pytest"):
        sys.path.insert(0, os.getcwd())
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(config["target"])))
    try:
        for module in config.get("imports", []):
            __import__(module)
        with _recording(recorder, selections):
            status = _run(config["mode"], config["target"])
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        status, error = 130, "interrupted"
    except targets.SelectionError as e:
        status, error = 2, str(e)
    except BaseException as e:  # the user's command raised: its traceback, as python prints it
        import traceback

        traceback.print_exc()
        status, error = 1, f"{type(e).__name__}: {e}"
    finally:
        _ignore_interrupts()  # a second Ctrl-C is the parent's: it ends this process, or this dump ends first
        recorder.dump(
            records, status, error, registering_modules(recorder.ops, _main_module(config)), _compiled_frames()
        )
    return status or 0


def _compiled_frames() -> int:
    """The frames torch.compile compiled in this process (0 where it never ran)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["ok"])
    except Exception:  # noqa: BLE001 - a torch whose counters differ: the summary's hint is only left out
        return 0


def _ignore_interrupts() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main_module(config: dict[str, Any]) -> str | None:
    """The name `__main__` is importable under: the `-m` module, or a script below the working
    directory as a dotted path (examples/transformer.py -> examples.transformer)."""
    if config["mode"] == "module":
        return str(config["target"])
    if config["mode"] != "script":
        return None
    relative = os.path.relpath(os.path.abspath(config["target"]), os.getcwd())
    parts = Path(relative).with_suffix("").parts
    if parts and all(p.isidentifier() for p in parts):
        return ".".join(parts)
    return None


def registering_modules(paths: Any, main: str | None) -> dict[str, str]:
    """For recorded torch.ops paths of operators `torch.library.custom_op` made: the module that
    made them, which a spec imports (`imports:`) to find the op (the command's own script under the
    name it is importable by, if any)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # pragma: no cover - a torch without it
        return {}
    out = {}
    for path in paths:
        parts = path.split(".")
        if len(parts) < 4 or parts[:2] != ["torch", "ops"] or parts[2] == "aten":
            continue
        opdef = OPDEFS.get(f"{parts[2]}::{parts[3]}")
        module = getattr(getattr(opdef, "_init_fn", None), "__module__", None)
        if module == "__main__":
            module = main
        if isinstance(module, str):
            out[path] = module
    return out


_REWRITE_WARNING = "Module already imported so cannot be rewritten; opcheck"


def _run(mode: str, target: str) -> int:
    if mode == "pytest":
        import pytest

        # This process imported opcheck (its plugin's package) before pytest could rewrite it: pytest's
        # warning about that is about capture, not the user's run.
        quiet = ["-W", f"ignore:{_REWRITE_WARNING}:pytest.PytestAssertRewriteWarning"]
        return int(pytest.main([*quiet, *sys.argv[1:]]))
    if mode == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "code":
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        runpy.run_path(target, run_name="__main__")
    return 0


class _recording:
    """The modes and patches on for the command, off after it."""

    def __init__(self, recorder: Any, selections: list[Any]):
        self.recorder, self.selections = recorder, selections
        self.modes: list[Any] = []
        self.patches: list[Any] = []

    def __enter__(self) -> None:
        from opcheck.capture import targets

        recorder = self.recorder
        if any(s.kind in ("function", "library") for s in self.selections):
            self.modes.append(_function_mode(recorder, targets.function_matcher(self.selections)))
        aten = [s for s in self.selections if s.kind == "aten"]
        if aten:
            self.modes.append(_dispatch_mode(recorder, targets.aten_match(aten)))

        def wrap(original: Any, path: str) -> Any:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                return recorder.call(path, original, args, kwargs)

            recorded.__wrapped__ = original  # type: ignore[attr-defined]
            recorded.__name__ = getattr(original, "__name__", "recorded")
            recorded.__doc__ = getattr(original, "__doc__", None)
            return recorded

        self.patches = targets.install_patches(self.selections, wrap)
        for mode in self.modes:
            mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        from opcheck.capture import targets

        for mode in reversed(self.modes):
            mode.__exit__(None, None, None)
        targets.restore(self.patches)


def _function_mode(recorder: Any, matcher: Any) -> Any:
    from torch.overrides import TorchFunctionMode

    class Recording(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            path = matcher.match(func)
            if path is None or recorder.busy():
                return func(*args, **kwargs)
            return recorder.call(path, func, tuple(args), kwargs)

    return Recording()


def _dispatch_mode(recorder: Any, match: Any) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            path = match(func)
            if path is None or recorder.busy():
                return func(*args, **kwargs)
            return recorder.call(path, func, tuple(args), kwargs)

    return Recording()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
