import torch

# pytester runs generated modules and the plugin in-process (tests/codegen, tests/plugin).
pytest_plugins = ["pytester"]

# The tests' tensors are small, where a second intra-op thread saves nothing and, on a machine
# whose other core is busy, makes torch several times slower (benchmarks/bench_threads.py): the
# same reason the plugin runs generated tests on one thread.
torch.set_num_threads(1)
