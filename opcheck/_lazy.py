"""A package's public names, imported from their modules on first use (PEP 562 module __getattr__).

opcheck's packages keep their imports light this way: `opcheck` (the engine's names) starts the
command line without torch, and `opcheck.spec` / `opcheck.runtime` let the pytest plugin import
the modules it needs (the case ids, the settings) without the suite's YAML, Jinja and JSON Schema
packages, which an engine-only install (`pip install opcheck`) does not have.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`, whose attribute NAME lives in module names[NAME]."""

    def __getattr__(name: str) -> Any:
        # Looked up in the module each time, never cached on the package: the package outlives a
        # module that is imported again (pytest's pytester drops the modules an inner run imported),
        # and a cached name would then be the old module's (its exception classes no longer the ones
        # `except` clauses name).
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(names[name]), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__
