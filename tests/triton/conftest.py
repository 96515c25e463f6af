"""The Triton corpus's tests run where triton is installed (each module skips otherwise), under the
interpreter opcheck's plugin turned on before this file was loaded (opcheck.triton.pytest_hooks)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def interpreting():
    """opcheck.triton.setup()'s result in this process; the tests skip where kernels compile instead."""
    import opcheck.triton

    result = opcheck.triton.setup()
    if not result.interpreting:
        pytest.skip(f"the Triton interpreter is off here: {result.reason}")
    return result
