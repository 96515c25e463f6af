"""What generated test modules call: `run_check(SPEC, check, device, dtype, sample)`.

One call builds the sample on (device, dtype) from a seed hashed from the test id (the case's
identity, opcheck.spec.case.CaseId), resolves flags, tolerances (tolerances.py) and the fast/full
policy (policy.py), runs the check (checks.py, lowprec.py) and either returns, raises
CheckSkipped with a reason (outcomes.py; the plugin reports it as pytest's skip), or raises a
failure whose message names the op, the spec location, the check path, device, dtype, sample,
seed, the tolerances used, the engine's localized report and the command that reruns only this
case. Nothing here imports pytest.

Running in parallel and sharding
--------------------------------

Test ids (`test_<check>[<device>-<dtype>-<sample>]`) and sample values depend only on the spec
and the id, never on the process, so any split of a suite gives the same outcomes as a serial run.

On one machine, with pytest-xdist (`pip install 'opcheck[parallel]'`):

    pytest -n 2 generated_tests            # or -n auto: one worker per core
    pytest -n 4 --dist loadfile generated_tests   # keep each op's tests on one worker

Each worker runs torch with all its threads; with many workers on few cores, set
OMP_NUM_THREADS=1 (or `torch.set_num_threads(1)` in conftest.py) to avoid oversubscription.
All `--opcheck-*` options reach every worker.

Across CI jobs, with pytest-split (`pip install 'opcheck[parallel]'`): record durations once,
commit `.test_durations`, then give each of N jobs its group:

    pytest generated_tests --store-durations             # writes .test_durations
    pytest generated_tests --splits 4 --group 1          # job 1 of 4 (groups are 1-based)
    ...
    pytest generated_tests --splits 4 --group 4

The groups are disjoint and together cover the suite (tests without a recorded duration are
spread by the average). Deselection by `--opcheck-device`/`--opcheck-dtype`/`-m` happens before
the split, so pass the same options to every job. The two combine: `--splits 4 --group 2 -n 2`.
"""

from opcheck._lazy import lazy_names

_NAMES = {
    "MAX_REDRAWS": "opcheck.runtime.checks",
    "CheckCrashed": "opcheck.runtime.checks",
    "CheckFailed": "opcheck.runtime.checks",
    "LibraryOpcheckFailed": "opcheck.runtime.checks",
    "LowPrecisionMismatch": "opcheck.runtime.checks",
    "OpcheckRedrawWarning": "opcheck.runtime.checks",
    "UnsupportedButWorks": "opcheck.runtime.checks",
    "run_check": "opcheck.runtime.checks",
    "DEFAULT_JACOBIAN_BUDGET": "opcheck.runtime.context",
    "Settings": "opcheck.runtime.context",
    "SampleError": "opcheck.runtime.makers",
    "CheckSkipped": "opcheck.runtime.outcomes",
    "Policy": "opcheck.runtime.policy",
    "choose_policy": "opcheck.runtime.policy",
    "jacobian_entries": "opcheck.runtime.policy",
    "SampleCall": "opcheck.runtime.samples",
    "build_calls": "opcheck.runtime.samples",
    "GRADIENT_TOLERANCES": "opcheck.runtime.tolerances",
    "LOWPREC_TOLERANCES": "opcheck.runtime.tolerances",
    "Tolerances": "opcheck.runtime.tolerances",
    "resolve_tolerances": "opcheck.runtime.tolerances",
    "CaseId": "opcheck.spec.case",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
