"""The calibrated low-precision criterion at its defaults: every mutant of the corpus is caught at
the dtypes where it is a bug, and every correct twin passes at float32, float16 and bfloat16."""

import pytest
import torch

from opcheck import lowprec_report
from tests.lowprec.corpus import LOW_DTYPES, MUTANTS

SEEDS = (0, 1, 2)


def _report(kernel, mutant, dtype, seed):
    inputs = mutant.inputs(dtype, torch.Generator().manual_seed(seed))
    return lowprec_report(kernel, inputs, reference=mutant.reference, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_twin_passes(mutant, dtype, seed):
    report = _report(mutant.twin, mutant, dtype, seed)
    assert report.passed, report.message


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "mutant, dtype",
    [pytest.param(m, d, id=f"{m.name}-{str(d)[6:]}") for m in MUTANTS for d in m.dtypes],
)
def test_mutant_is_caught(mutant, dtype, seed):
    report = _report(mutant.mutant, mutant, dtype, seed)
    assert not report.passed, f"{mutant.name} ({mutant.bug}) passed at {dtype}"
    failing = report.first_failure
    assert failing is not None and failing.exceeding > 0 and failing.worst
    assert report.message.startswith(failing.what)


def test_the_table_misses_what_the_baseline_catches():
    # The fixed per-dtype table passes the float16 cross-entropy whose backward rounds p before
    # subtracting 1; the calibrated criterion fails it on the true-class entries.
    (mutant,) = [m for m in MUTANTS if m.name == "ce_rounded_probability"]
    inputs = mutant.inputs(torch.float16, torch.Generator().manual_seed(0))
    assert lowprec_report(mutant.mutant, inputs, reference=mutant.reference, criterion="table").passed
    report = lowprec_report(mutant.mutant, inputs, reference=mutant.reference)
    assert report.first_failure.what == "VJP: gradient of input 0"
    rows = {w.index[0] for w in report.first_failure.worst}
    targets = inputs[1]
    assert all(w.index[1] == int(targets[w.index[0]]) for w in report.first_failure.worst), rows


def _triton_cases():
    try:
        from tests.lowprec.triton_corpus import TRITON_DTYPES, TRITON_MUTANTS
    except ImportError:  # no triton on this platform
        return [], []
    twins = [pytest.param(m, d, id=f"{m.name}-{str(d)[6:]}") for m in TRITON_MUTANTS for d in TRITON_DTYPES]
    mutants = [pytest.param(m, d, id=f"{m.name}-{str(d)[6:]}") for m in TRITON_MUTANTS for d in m.dtypes]
    return twins, mutants


TRITON_TWINS, TRITON_BUGS = _triton_cases()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mutant, dtype", TRITON_TWINS)
def test_triton_twin_passes(mutant, dtype, seed):
    report = _report(mutant.twin, mutant, dtype, seed)
    assert report.passed, report.message


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mutant, dtype", TRITON_BUGS)
def test_triton_mutant_is_caught(mutant, dtype, seed):
    report = _report(mutant.mutant, mutant, dtype, seed)
    assert not report.passed, f"{mutant.name} ({mutant.bug}) passed at {dtype}"
