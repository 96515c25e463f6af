"""`requires:` the modules a spec's op needs that may not be installed (triton, which installs on
Linux x86_64 only), as pytest.importorskip would name them.

The one test of "installed" is importlib.util.find_spec, shared by the three places that act on it:
validation (opcheck.spec.build: an op whose required module is missing is not imported, nor its
samples checked against its signature), the CLI (one note per such spec, on stderr), and the
runtime (run_check skips every test of the spec). The generated modules do not depend on it.

Standard library only: the runtime imports it in an install without the suite's YAML packages.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable

from opcheck.spec.model import OpSpec

MODULE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
"""A dotted module name, as `import` takes it (`triton`, `triton.language`); the schema's
`moduleName` pattern."""


def missing_modules(names: Iterable[str]) -> tuple[str, ...]:
    """The names, in order, that importlib cannot find in this Python."""
    return tuple(name for name in names if not _installed(name))


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a missing parent package of a dotted name, or a finder that refuses the name
        return False
    except Exception:  # in sys.modules without a __spec__ (ValueError), or a parent that fails to
        return True  # import: it is there, and importing the op reports what is wrong with it


def not_installed_reason(spec: OpSpec) -> str | None:
    """Why the spec's tests cannot run here (a required module is missing), None when they can."""
    missing = missing_modules(spec.requires)
    if not missing:
        return None
    return f"requires {_names(missing)}, which {_is(missing)} not installed ({spec.source}: requires: {_listed(spec)})"


def validation_notes(specs: Iterable[OpSpec]) -> list[str]:
    """One line per spec whose required modules are not all installed: its op was not imported
    while validating it, and its tests skip. A family file's line names the spec."""
    specs = list(specs)
    per_file: dict[str, int] = {}
    for spec in specs:
        per_file[spec.source] = per_file.get(spec.source, 0) + 1
    notes = []
    for spec in specs:
        missing = missing_modules(spec.requires)
        if missing:
            which = f"spec {spec.name!r} " if per_file[spec.source] > 1 else ""
            notes.append(
                f"{spec.source}: {which}requires {_names(missing)}, which {_is(missing)} not installed: "
                "its op is not imported, and its tests skip"
            )
    return notes


def _names(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _is(names: tuple[str, ...]) -> str:
    return "is" if len(names) == 1 else "are"


def _listed(spec: OpSpec) -> str:
    return f"[{', '.join(spec.requires)}]"
