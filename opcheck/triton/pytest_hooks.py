"""The pytest side: setup() before any conftest file is loaded.

pytest loads entry-point plugins (opcheck's among them) before conftest files, and calls
pytest_load_initial_conftests before loading those: kernels defined in conftest files, in modules
they import, and in the ops that specs name are therefore defined after TRITON_INTERPRET=1 is set,
interpreted. A project opts out with `[tool.opcheck] triton_interpret = false`; the environment's
TRITON_INTERPRET, where set, decides instead. torch is imported here only where triton is installed,
and not in a process that only supervises the session's children (opcheck.isolation): each child
sets Triton up before its own conftest files load.
"""

from __future__ import annotations

import pytest

from opcheck.triton import setup_for_project


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    from opcheck.plugins.isolation import supervises

    try:
        if supervises(early_config):
            return  # this process only supervises: each child it starts sets Triton up for itself
        setup_for_project(early_config.rootpath)
    except ValueError as e:  # a bad [tool.opcheck] key (ConfigError) or OPCHECK_TRITON_AUTOTUNE_CONFIG
        raise pytest.UsageError(str(e)) from None
