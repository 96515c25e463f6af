"""A case's identity (opcheck.spec.case.CaseId): its names, parsing and seeds, pinned.

The numbers below are the seeds that generated tests have always drawn their samples from; a
change to any of them changes every sample of a catalog run and breaks reproduction from old ids.
"""

import hashlib
import subprocess
import sys
from dataclasses import FrozenInstanceError

import pytest

from opcheck.runtime.context import current_item
from opcheck.runtime.report import Case, plot_file_name
from opcheck.spec.case import CaseId, spec_of_module
from opcheck.spec.model import OpSpec, Sample, TensorArg

SIN = CaseId("sin", "gradcheck", "cpu", "float64", "vector")
SOFTMAX = CaseId("softmax", "gradgradcheck", "cuda", "complex128", "noncontig_cols.2-x")
HUBER = CaseId("huber_loss", "lowprec", "mps", "bfloat16", "delta_1")

# (case, attempt) -> (seed of the sample, seed of the low-precision check's cotangents)
PINNED = {
    (SIN, 0): (1372547151466262413, 5045289290750989574),
    (SIN, 2): (1179408424123305921, 7292404270919792509),
    (SOFTMAX, 0): (5565033161488425603, 3522153849978061065),
    (HUBER, 0): (4689885886674990254, 211494794011664948),
}


@pytest.mark.parametrize(("case", "attempt"), list(PINNED))
def test_seeds_are_pinned(case, attempt):
    assert (case.seed(attempt), case.seed(attempt, stream="cotangent")) == PINNED[(case, attempt)]


def test_seed_is_the_sha256_of_the_spec_and_name():
    digest = hashlib.sha256(b"sin::test_gradcheck[cpu-float64-vector]::redraw2").digest()
    assert SIN.seed_key(2) == "sin::test_gradcheck[cpu-float64-vector]::redraw2"
    assert SIN.seed(2) == int.from_bytes(digest[:8], "little") & (2**63 - 1)
    assert SIN.seed_key(1, stream="cotangent") == "sin::test_gradcheck[cpu-float64-vector]::cotangent::redraw1"


def test_names_ids_and_node_ids():
    assert SIN.param_id == "cpu-float64-vector"
    assert SIN.name == "test_gradcheck[cpu-float64-vector]"
    assert SOFTMAX.name == "test_gradgradcheck[cuda-complex128-noncontig_cols.2-x]"
    assert SIN.module == "test_sin.py"
    assert SIN.nodeid() == "generated_tests/test_sin.py::test_gradcheck[cpu-float64-vector]"
    assert SIN.nodeid("out") == "out/test_sin.py::test_gradcheck[cpu-float64-vector]"
    with pytest.raises(FrozenInstanceError):
        SIN.sample = "other"


def test_parse_and_from_nodeid_invert_name_and_nodeid():
    for case in (SIN, SOFTMAX, HUBER):
        assert CaseId.parse(case.spec, case.name) == case
        assert CaseId.from_nodeid(case.nodeid()) == case
        assert CaseId.from_nodeid(case.nodeid("a/b").replace("/", "\\")) == case
    for name in (
        "test_gradcheck",
        "test_foo[cpu-float64-s]",
        "test_gradcheck[cpu-float64]",
        "test_gradcheck[cpu-half-s]",
        "test_gradcheck[cpu-float64-s] ",
        "test_gradcheck[cpu-float64-s]\n",
    ):
        assert CaseId.parse("x", name) is None, name
    assert CaseId.from_nodeid("a/test_mm.py::TestX::test_lowprec[cpu-bfloat16-sq]") is None
    assert CaseId.from_nodeid("a/test_mm.py") is None
    assert spec_of_module("generated_tests.test_sin") == spec_of_module("generated_tests/test_sin.py") == "sin"


def test_a_runtime_case_is_frozen_and_redraws_are_new_values():
    spec = OpSpec(
        name="sin",
        op="torch.sin",
        source="op_specs/sin.yaml",
        sha256="0",
        samples=(Sample("vector", args=(TensorArg(shape=(7,)),)),),
    )
    case = Case.of(spec, "gradcheck", "cpu", "float64", "vector")
    assert case.id == SIN and case.sample is spec.samples[0] and case.seed == PINNED[(SIN, 0)][0]
    redrawn = case.redraw(2).with_note("kink")
    assert (redrawn.attempt, redrawn.seed, redrawn.notes) == (2, PINNED[(SIN, 2)][0], ("kink",))
    assert (case.attempt, case.notes) == (0, ())
    with pytest.raises(FrozenInstanceError):
        case.attempt = 1
    # outside pytest, the rerun command and the heatmap's file are named from the id
    token = current_item.set(None)
    try:
        assert case.rerun_command() == "pytest 'generated_tests/test_sin.py::test_gradcheck[cpu-float64-vector]'"
        assert plot_file_name(case) == "test_sin.py_test_gradcheck_cpu-float64-vector.png"
    finally:
        current_item.reset(token)


def test_importing_the_runtime_does_not_import_pytest():
    code = (
        "import sys, opcheck.runtime, opcheck.runtime.opinfo\n"
        "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules, "
        "sorted(m for m in sys.modules if 'pytest' in m)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
