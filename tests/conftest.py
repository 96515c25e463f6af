import pytest
import torch

# pytester runs generated modules and the plugin in-process (tests/codegen, tests/plugin).
pytest_plugins = ["pytester"]

# The tests' tensors are small, where a second intra-op thread saves nothing and, on a machine
# whose other core is busy, makes torch several times slower (benchmarks/bench_threads.py): the
# same reason the plugin runs generated tests on one thread.
torch.set_num_threads(1)


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
