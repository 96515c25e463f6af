import os

import pytest
import torch

# pytester runs generated modules and the plugin in-process (tests/codegen, tests/plugin).
pytest_plugins = ["pytester"]

# The tests' tensors are small, where a second intra-op thread saves nothing and, on a machine
# whose other core is busy, makes torch several times slower (benchmarks/bench_threads.py): the
# same reason the plugin runs generated tests on one thread.
torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long: runs for ten seconds or more; scheduled first")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `long` (each runs for ten seconds or more, most of it in child processes)
    start first, shared out among the workers; otherwise the collection's order stands.

    pytest-xdist's load scheduling gives each worker a run of consecutive tests first (a quarter of
    its share) and the rest, a few at a time, to whichever worker is free. Long tests left at the
    end run alone while the other worker waits; long tests all at the start would all fall in the
    first worker's run. So worker k's first run starts with every k-th long test."""
    long = [item for item in items if item.get_closest_marker("long")]
    rest = [item for item in items if not item.get_closest_marker("long")]
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    first_run = max(2, len(items) // workers // 4)
    ordered: list[pytest.Item] = []
    for k in range(workers):
        lane = long[k::workers]
        take = max(0, first_run - len(lane)) if k < workers - 1 else 0
        ordered += lane + rest[:take]
        rest = rest[take:]
    items[:] = ordered + rest


@pytest.fixture(scope="session")
def _imported_before_pytester() -> None:
    import importlib

    for name in IMPORTED_BEFORE_PYTESTER:
        importlib.import_module(name)


IMPORTED_BEFORE_PYTESTER = (
    "torch._dynamo",
    "opcheck.spec.loader",
    "opcheck.codegen",
    "opcheck.runtime.checks",
    "opcheck.runtime.compiled",
    "opcheck.report.collect",
    "opcheck.isolation",
)
"""pytester's in-process runs take the modules imported inside them out of sys.modules again, so
that a module first imported there is imported afresh by the next test, beside the copies that
the modules kept still hold (a spec's YAML events of one copy, matched against the classes of the
other). torch's dynamo cannot be imported twice at all: it registers a torch library
(torch._inductor.test_operators) that a second import cannot register again. These are imported
once per process, before pytester takes its snapshot of sys.modules."""


@pytest.fixture
def pytester(_imported_before_pytester: None, pytester: pytest.Pytester) -> pytest.Pytester:
    return pytester
