import sys
from pathlib import Path

import pytest

# runtime_ops.py (ops with known bugs that specs in these tests point at) sits beside the tests;
# make it importable whatever pytest's import mode is, without turning tests/ into a package.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch):
    """The runtime reads these from the environment; a developer's shell must not change verdicts."""
    monkeypatch.delenv("OPCHECK_JACOBIAN_BUDGET", raising=False)
    monkeypatch.delenv("OPCHECK_UNAVAILABLE_DEVICES", raising=False)
