"""`--opcheck-isolation process|off`: a serial run of generated tests runs its session in a
supervised child and goes on in a new one when a test crashes it; pytest-xdist's workers are watched
the same way (opcheck.isolation). Under pytest-xdist on several GPUs, each worker takes one."""

from __future__ import annotations

import pytest

from opcheck.plugins.items import case_fields, is_generated_item, rerun_for
from opcheck.plugins.settings import TIME_BUDGET_KEY, isolation_mode

SUPERVISES_KEY = pytest.StashKey[bool]()


def supervises(config: pytest.Config) -> bool:
    """Whether this process runs its session in supervised children (opcheck.isolation) rather than
    itself: decided once, from the command line, where first asked. The Triton setup asks before
    conftest files are loaded, and a supervisor leaves it to its children, so that the process that
    only supervises imports neither torch nor triton."""
    decided = config.stash.get(SUPERVISES_KEY, None)
    if decided is None:
        from opcheck import isolation

        decided = isolation.wanted(config) and isolation_mode(config) != "off"
        config.stash[SUPERVISES_KEY] = decided
    return decided


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """A serial run of generated tests runs its session in a supervised child (opcheck.isolation)."""
    if not supervises(config):
        return None
    from opcheck import isolation

    return isolation.supervise(config)


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_gpu_worker(config: pytest.Config) -> None:
    """Under pytest-xdist on several GPUs, this worker takes its own before any test runs
    (opcheck.runtime.gpu_workers; OPCHECK_PIN_GPUS=0 opts out)."""
    from opcheck.runtime.gpu_workers import pin_xdist_worker

    pin_xdist_worker()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """After the results recorder and the margins list are registered."""
    _configure_isolation(config)


def _configure_isolation(config: pytest.Config) -> None:
    from opcheck import isolation

    def budget_of(item: pytest.Item) -> float | None:
        budget = config.stash.get(TIME_BUDGET_KEY, None)
        return budget.seconds if budget is not None and is_generated_item(item) else None

    isolation.configure(config, isolation.Hooks(budget_of=budget_of, case_of=case_fields, rerun_of=rerun_for))
