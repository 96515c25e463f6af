"""Resolve an op path from a spec to the callable it names."""

from __future__ import annotations

import importlib
import re
from typing import Callable

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
OP_PATH_RE = re.compile(rf"^{_DOTTED}(:{_DOTTED})?$")
"""`a.b.c` (longest importable prefix is the module) or `pkg.mod:Attr.path`."""


class OpPathError(ValueError):
    """The path does not name a callable; the message says which part failed."""


def resolve_op(path: str) -> Callable:
    if not OP_PATH_RE.match(path):
        raise OpPathError(f"{path!r} is not a dotted path ('torch.sin') or 'package.module:attribute'")
    if ":" in path:
        module_name, attrs = path.split(":", 1)
        module = _import(module_name, path)
        obj = _getattrs(module, attrs.split("."), module_name, path)
    else:
        parts = path.split(".")
        module, used = None, 0
        for i in range(len(parts), 0, -1):
            try:
                module = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            except Exception as e:  # a module that fails while importing
                raise OpPathError(f"importing {'.'.join(parts[:i])!r} failed: {type(e).__name__}: {e}") from e
            used = i
            break
        if module is None:
            raise OpPathError(f"no module named {parts[0]!r} (while resolving {path!r})")
        obj = _getattrs(module, parts[used:], ".".join(parts[:used]), path)
    if not callable(obj):
        raise OpPathError(f"{path!r} is a {type(obj).__name__}, not a callable")
    return obj


def _import(name: str, path: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise OpPathError(f"cannot import module {name!r} (while resolving {path!r}): {e}") from e
    except Exception as e:
        raise OpPathError(f"importing {name!r} failed: {type(e).__name__}: {e}") from e


def _getattrs(obj, attrs, prefix: str, path: str):
    for attr in attrs:
        try:
            obj = getattr(obj, attr)
        except Exception:
            hint = _suggest(obj, attr)
            raise OpPathError(f"{prefix!r} has no attribute {attr!r}{hint} (while resolving {path!r})") from None
        prefix = f"{prefix}.{attr}" if prefix else attr
    return obj


def _suggest(obj, attr: str) -> str:
    import difflib

    try:
        names = [n for n in dir(obj) if not n.startswith("_")]
    except Exception:
        return ""
    close = difflib.get_close_matches(attr, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
