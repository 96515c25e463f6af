import pytest
import torch

# pytester runs generated modules and the plugin in-process (tests/codegen, tests/plugin).
pytest_plugins = ["pytester"]

# The tests' tensors are small, where a second intra-op thread saves nothing and, on a machine
# whose other core is busy, makes torch several times slower (benchmarks/bench_threads.py): the
# same reason the plugin runs generated tests on one thread.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def _dynamo_imported() -> None:
    import torch._dynamo  # noqa: F401


@pytest.fixture
def pytester(_dynamo_imported: None, pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester's in-process runs take the modules imported inside them out of sys.modules again.
    torch's dynamo, imported there, registers a torch library (torch._inductor.test_operators) that
    a second import cannot register again: it is imported once per process, before pytester takes
    its snapshot of sys.modules."""
    return pytester
