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

from opcheck.runtime.checks import (
    MAX_REDRAWS,
    CheckCrashed,
    CheckFailed,
    LibraryOpcheckFailed,
    LowPrecisionMismatch,
    OpcheckRedrawWarning,
    UnsupportedButWorks,
    run_check,
)
from opcheck.runtime.context import DEFAULT_JACOBIAN_BUDGET, Settings
from opcheck.runtime.makers import SampleError
from opcheck.runtime.outcomes import CheckSkipped
from opcheck.runtime.policy import Policy, choose_policy, jacobian_entries
from opcheck.runtime.samples import Call, build_calls
from opcheck.runtime.tolerances import (
    GRADIENT_TOLERANCES,
    LOWPREC_TOLERANCES,
    Tolerances,
    resolve_tolerances,
)
from opcheck.spec.case import CaseId

__all__ = [
    "Call",
    "CaseId",
    "CheckCrashed",
    "CheckFailed",
    "CheckSkipped",
    "DEFAULT_JACOBIAN_BUDGET",
    "GRADIENT_TOLERANCES",
    "LOWPREC_TOLERANCES",
    "LibraryOpcheckFailed",
    "LowPrecisionMismatch",
    "MAX_REDRAWS",
    "OpcheckRedrawWarning",
    "Policy",
    "SampleError",
    "Settings",
    "Tolerances",
    "UnsupportedButWorks",
    "build_calls",
    "choose_policy",
    "jacobian_entries",
    "resolve_tolerances",
    "run_check",
]
