"""opcheck's pytest plugin (entry point `pytest11: opcheck`): this module registers the plugins of
opcheck.plugins, one per module, and turns on Triton's interpreter before conftest files load.

- registers one marker per check kind (`pytest -m gradgradcheck`, `-m "not lowprec"`), described by
  the check kinds' own table (opcheck.spec.model.Check); pyproject's `markers` list repeats it for
  runs without the plugin, and a test keeps the two equal;
- generated tests for device types this machine does not have are deselected at collection, with
  one summary line; `--opcheck-device all` collects them and skips each with torch's reason, and
  `--opcheck-results` records them as skipped with that reason either way;
- `--opcheck-device cpu,cuda` / `--opcheck-dtype float64` deselect the other devices / dtypes
  of generated tests (reported as deselected); a device named there that is unavailable is skipped;
- `--opcheck-threads N` (ini `opcheck_threads`, default 1) sets torch's intra-op threads around
  each generated test and restores them after: the checks' tensors are small, where one thread
  is fastest and workers of pytest-xdist do not compete for cores;
- `--opcheck-policy auto|full|fast` overrides every spec's `gradcheck.fast_mode`, and
  `--opcheck-budget N` (or OPCHECK_JACOBIAN_BUDGET) sets the auto policy's Jacobian budget;
- `--opcheck-plot DIR` writes a heatmap of every failing Jacobian block (needs matplotlib);
- `--opcheck-time-budget SECONDS` (default 600, `off` for none) stops a generated test that runs
  longer, failing it with where the time went and what to change (opcheck.runtime.budget);
- `--opcheck-isolation process|off`: a serial run that collects generated tests runs its session in
  a child process and goes on in a new one when a test crashes it (a signal, an abort, a CUDA
  error, a hang past the budget), each such test failing with what happened; under pytest-xdist the
  workers are watched the same way (opcheck.isolation);
- under pytest-xdist on a machine with several GPUs, each worker takes one of them
  (opcheck.runtime.gpu_workers: `-n <number of GPUs>` runs one worker per GPU);
- `--opcheck-results PATH` keeps one JSON record per generated test (its spec, op, check, device,
  dtype, sample, outcome, reason and duration; for a failure also its worst entry, hints and whole
  message), for `opcheck report`: at the end of the session the tests that ran replace their
  records and the others are kept (opcheck.report.store); under pytest-xdist the workers attach
  each test's case to its reports, say which tests they collected, and the controller writes;
- `--opcheck-margin FRACTION` lists, at the end, the passing tests whose worst comparison came to
  FRACTION of its bound or closer (opcheck.plugin_margins);
- every option but `--opcheck-plot` and `--opcheck-margin` also has an ini setting
  (`opcheck_device`, `opcheck_dtype`, `opcheck_policy`, `opcheck_budget`, `opcheck_threads`,
  `opcheck_results`, `opcheck_time_budget`, `opcheck_isolation`) for pyproject.toml's
  `[tool.pytest.ini_options]` or pytest.ini, and a key of pyproject.toml's `[tool.opcheck]` table
  (`device`, ..., `results`; opcheck.config), which the `opcheck` command reads too; the command
  line overrides either, setting both is a usage error, and so is a bad value, naming where it
  was written;
- at collection, one warning (StaleModulesWarning) names every collected generated module whose
  spec file now hashes differently from its header's `# spec sha256:` (or is gone), with the
  command that regenerates them; each spec file is read once per session;
- around each test call, tells the runtime the item's node id, so that failures print the exact
  command that reruns them, and reports the runtime's own skip (opcheck.runtime.outcomes.CheckSkipped)
  as pytest's skip, with its reason and at the line that raised it.
"""

import pytest

# Triton's interpreter is turned on (where there is no GPU) before conftest files define kernels.
from opcheck.triton.pytest_hooks import pytest_load_initial_conftests  # noqa: F401

# Registered in this order; hooks of the same priority run the last registered first, so that
# pytest_configure stashes the settings, then registers the results recorder, the margins list and
# the isolation's plugin, in that order (each after what it reads).
pytest_plugins = [
    "opcheck.plugins.runtest",
    "opcheck.plugins.isolation",
    "opcheck.plugin_margins",
    "opcheck.plugins.results",
    "opcheck.plugins.selection",
    "opcheck.plugins.settings",
]
# Marked for pytest's assertion rewriting before any of them is imported: pytest marks each plugin
# just before importing it, and the first imports the later ones (runtest imports settings), which
# an installed package's marks cover but an editable install's do not (pytest would warn that each
# was already imported).
pytest.register_assert_rewrite(*pytest_plugins)
