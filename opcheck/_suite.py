"""The suite's packages: what `pip install 'opcheck[suite]'` adds to the engine alone.

`pip install opcheck` installs the engine (`opcheck.gradcheck`, `opcheck.gradgradcheck`: torch
only). Specs, the generator, the generated modules and `opcheck report` need the suite's
packages; the `opcheck` command and the generated modules check for them first and name the
install command, rather than failing on the first import deep inside.
"""

from __future__ import annotations

import importlib

INSTALL = "pip install 'opcheck[suite]'"
MODULES = {"yaml": "pyyaml", "jinja2": "jinja2", "jsonschema": "jsonschema"}
"""Import name → distribution, for the packages the suite imports as soon as it loads."""


def missing() -> list[str]:
    """The suite's distributions that this Python cannot import (each is imported: the suite imports
    them right after anyway, and an installed but broken package is as missing as an absent one)."""
    absent = []
    for module, dist in MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            absent.append(dist)
    return absent


def require(what: str) -> None:
    """Raise ModuleNotFoundError naming the install command when a suite package is missing."""
    absent = missing()
    if absent:
        raise ModuleNotFoundError(
            f"{what} needs opcheck's suite, and {not_installed(absent)} in this Python: {INSTALL}",
            name=next(module for module, dist in MODULES.items() if dist == absent[0]),
        )


def not_installed(absent: list[str]) -> str:
    """`pyyaml is not installed` / `pyyaml, jinja2 are not installed`."""
    return f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed"
