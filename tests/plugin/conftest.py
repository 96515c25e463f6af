import sys
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401

# pytester's in-process runs drop the modules an inner run imported once it ends. torch modules
# that register C++ operator libraries at import (torch._dynamo pulls in torch._inductor's
# test_operators) then fail when imported again later in this process: import them up front.

# plugin_helpers.py sits beside the tests; make it importable without turning tests/ into a package.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    # `pytest_plugins` is only allowed in the top-level conftest; this one sits in tests/plugin.
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")


@pytest.fixture(autouse=True)
def _clean_env(request, monkeypatch):
    """The plugin reads these from the environment; a developer's shell must not change outcomes."""
    monkeypatch.delenv("OPCHECK_JACOBIAN_BUDGET", raising=False)
    monkeypatch.delenv("OPCHECK_UNAVAILABLE_DEVICES", raising=False)
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it starts
    # Inner runs need none of these; hypothesis' plugin alone costs ~0.7 s per in-process run.
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest -p no:benchmark -p no:randomly")
