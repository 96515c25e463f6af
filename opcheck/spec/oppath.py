"""Resolve an op path from a spec to the callable it names.

Resolving imports the module the path names, which runs its top-level code (a spec is code, like
a conftest.py). Whatever that code raises, exits included, comes back as an OpPathError so the
spec loader reports it where `op:` is written instead of the program stopping mid-validation.

`opinfo:NAME[:variant]` names the callable of an entry of torch's OpInfo database (its `op`), for
the entries whose op no importable path names: lambdas and wrappers written inside op_db. Only
that form imports torch.testing._internal (opcheck.spec.opinfo_db), and it takes precedence over
`module:attribute`: a top-level module named `opinfo` is written as a dotted path (`opinfo.f`).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType, ModuleType
from typing import Any

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
OPINFO_PREFIX = "opinfo:"
_OPINFO = rf"{OPINFO_PREFIX}{_DOTTED}(:[A-Za-z0-9_][A-Za-z0-9_-]*)?"  # variants hold dashes: `nearest-exact`
OP_PATH_RE = re.compile(rf"^({_DOTTED}(:{_DOTTED})?|{_OPINFO})$")
"""`a.b.c` (longest importable prefix is the module), `pkg.mod:Attr.path`, or `opinfo:NAME[:variant]`."""


class OpPathError(ValueError):
    """The path does not name a callable; the message says which part failed."""


def resolve_op(path: str, *, imports: Sequence[str] = ()) -> Callable[..., Any]:
    """The callable `path` names; OpPathError saying which part failed otherwise.

    `imports` (a spec's `imports:`) are imported first, in order: the modules whose code registers
    the op (torch.library, a C++ extension's TORCH_LIBRARY) where the path does not import them.
    """
    for name in imports:
        import_listed(name, path)
    if not OP_PATH_RE.match(path):
        raise OpPathError(
            f"{path!r} is not a dotted path ('torch.sin'), 'package.module:attribute' or 'opinfo:name[:variant]'"
        )
    if path.startswith(OPINFO_PREFIX):
        obj = _opinfo_op(path)
    elif ":" in path:
        module_name, attrs = path.split(":", 1)
        obj = _getattrs(_import(module_name, path), attrs.split("."), module_name, path)
    else:
        parts = path.split(".")
        module: ModuleType | None = None
        used = 0
        # Shortest prefix first: importing `a.b.c` imports `a` and `a.b` anyway, and going up from
        # the top names the very module whose code failed, not the longest name that was tried.
        for i in range(1, len(parts) + 1):
            try:
                found = _import_module(".".join(parts[:i]), path)
            except ImportError:
                break
            module, used = found, i
        if module is None:
            raise OpPathError(f"no module named {parts[0]!r} (while resolving {path!r})")
        obj = _evaluate(module, parts, used, path)
    if not callable(obj):
        raise OpPathError(f"{path!r} is a {type(obj).__name__}, not a callable")
    return obj


def _evaluate(module: ModuleType, parts: list[str], imported: int, path: str) -> object:
    """The object `parts` names, where its first `imported` parts are importable modules (imported
    already; `module` is the last of them): the attributes after it. A path that is a module whole, and that its
    package binds to something callable of the same name, is what Python evaluates it to: that
    callable (`from .roi_align import roi_align` in torchvision.ops)."""
    import sys

    if imported == len(parts) > 1:
        bound = getattr(sys.modules.get(".".join(parts[:-1])), parts[-1], None)
        if callable(bound) and not isinstance(bound, ModuleType):
            return bound
    return _getattrs(module, parts[imported:], ".".join(parts[:imported]), path)


def _opinfo_op(path: str) -> object:
    """The `op` of the OpInfo entry `opinfo:NAME[:variant]` names."""
    from opcheck.spec.opinfo_db import OpInfoUnavailable, UnknownOpInfo, find_entry

    with _reported_as_problem("importing torch's OpInfo database raised", "", path):
        try:
            info = find_entry(path.removeprefix(OPINFO_PREFIX))
        except UnknownOpInfo as e:
            raise OpPathError(f"{e} (while resolving {path!r})") from None
        except OpInfoUnavailable as e:  # kept as the cause: a runner may skip where expecttest is missing
            raise OpPathError(f"{e} (while resolving {path!r})") from e
        except Exception as e:  # torch.testing._internal failing while it imports
            raise OpPathError(
                f"importing torch's OpInfo database failed: {type(e).__name__}: {e} (while resolving {path!r})"
            ) from e
    return info.op


def import_listed(name: str, path: str) -> ModuleType:
    """Import a module a spec's `imports:` lists, before resolving `path`; OpPathError otherwise."""
    try:
        return _import_module(name, path)
    except ImportError as e:
        resolving = f" (while resolving {path!r})" if path else ""
        raise OpPathError(f"cannot import module {name!r}, listed in `imports:`{resolving}: {e}") from e


def _import(name: str, path: str) -> ModuleType:
    try:
        return _import_module(name, path)
    except ImportError as e:
        raise OpPathError(f"cannot import module {name!r} (while resolving {path!r}): {e}") from e


def _import_module(name: str, path: str) -> ModuleType:
    """importlib.import_module, with every failure but ImportError turned into an OpPathError."""
    with _reported_as_problem(f"importing {name!r} raised", "while running its top-level code", path):
        try:
            return importlib.import_module(name)
        except ImportError:
            raise
        except Exception as e:  # a module that fails while importing
            raise OpPathError(f"importing {name!r} failed: {type(e).__name__}: {e}") from e


def _getattrs(obj: object, attrs: Sequence[str], prefix: str, path: str) -> object:
    for attr in attrs:
        # A module's __getattr__ may import lazily, and so run code that exits too.
        with _reported_as_problem(f"looking up {attr!r} in {prefix!r} raised", "", path):
            try:
                obj = getattr(obj, attr)
            except Exception:
                hint = _suggest(obj, attr) or _registration_hint(prefix)
                raise OpPathError(f"{prefix!r} has no attribute {attr!r}{hint} (while resolving {path!r})") from None
        prefix = f"{prefix}.{attr}" if prefix else attr
    return obj


def _registration_hint(prefix: str) -> str:
    """For `torch.ops.NS`: operators appear there when the code that registers them has run."""
    if prefix.startswith("torch.ops.") and prefix.count(".") == 2:
        return (
            f"; an operator appears in {prefix} once the module that registers it (torch.library.custom_op, "
            "torch.library.Library, a C++ extension's TORCH_LIBRARY) has been imported: list that module in the "
            "spec's `imports:` (`imports: [mypkg.ops]`), or name the op by that module's function (`mypkg.ops:my_op`)"
        )
    return ""


@contextlib.contextmanager
def _reported_as_problem(doing: str, when: str, path: str) -> Iterator[None]:
    """SystemExit, KeyboardInterrupt, GeneratorExit... raised by the user's code → OpPathError.

    Left alone they would end validation silently, or with nothing but the module's own output
    (`unittest.__main__` prints its usage and exits 2). A Ctrl-C the user presses meanwhile is not
    the module's doing: that KeyboardInterrupt still stops the program.
    """
    with _sigint_watch() as pressed:
        try:
            yield
        except Exception:
            raise
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) and pressed():
                raise
            when = f" {when}" if when else ""
            raise OpPathError(
                f"{doing} {e!r}{when}; code a spec names must not exit or interrupt (while resolving {path!r})"
            ) from None


@contextlib.contextmanager
def _sigint_watch() -> Iterator[Callable[[], bool]]:
    """Whether a SIGINT (a real Ctrl-C) arrived during the block, as opposed to code raising KeyboardInterrupt.

    Only where Python's own handler is installed and on the main thread (the only one that may set
    handlers); elsewhere every KeyboardInterrupt counts as raised by code.
    """
    seen: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: False
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: bool(seen)
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:  # the module may have set its own: keep it
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _suggest(obj: object, attr: str) -> str:
    import difflib

    try:
        names = [n for n in dir(obj) if not n.startswith("_")]
    except Exception:
        return ""
    close = difflib.get_close_matches(attr, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
