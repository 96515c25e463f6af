"""`pytest --opcheck-results` and `--junitxml` on the same generated-style modules, serial and with
`-n 2`: `opcheck report` makes the same matrix of each."""

import json

import pytest
from report_modules import module

from opcheck.cli import main
from opcheck.report import build_matrix, load_results

WRONG_OPS = """
import torch

class _SquareWrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * g * x

def square_wrong_if_2d(x):
    return _SquareWrong.apply(x) if x.dim() == 2 else x * x
"""

SQ = module(
    "OpSpec(name='sq', op='wrong_ops:square_wrong_if_2d', source='op_specs/sq.yaml', sha256='0', samples=("
    "Sample('a', args=(TensorArg(shape=(3,)),)), Sample('b', args=(TensorArg(shape=(2, 2)),))), "
    "gradcheck=GradcheckFlags(check_batched_grad=False))",
    {
        "gradcheck": [
            ("cpu", "float64", "a"),
            ("cpu", "float64", "b"),
            ("cuda", "float64", "a"),
            ("cuda", "float64", "b"),
            ("cpu", "complex128", "a", "pytest.mark.skip(reason='<script>alert(1)</script> (op_specs/sq.yaml:9:5)')"),
            ("cpu", "complex128", "b", "pytest.mark.xfail(reason='known bug (op_specs/sq.yaml:12:5)', strict=True)"),
        ],
        "lowprec": [("cpu", "float32", "a"), ("cuda", "float32", "a")],
    },
    extra="\n\ndef test_plain_helper_test_is_not_reported():\n    pass\n\n\n"
    "@pytest.mark.parametrize('device', ['cpu'])\ndef test_gradcheck_lookalike(device):\n    pass\n",
)

SIN = module(
    "OpSpec(name='sin', op='torch.sin', source='op_specs/sin.yaml', sha256='0', samples=("
    "Sample('vec', args=(TensorArg(shape=(4,)),)), Sample('teardown_boom', args=(TensorArg(shape=(2,)),))))",
    {"gradgradcheck": [("cpu", "float64", "vec"), ("cpu", "float64", "teardown_boom")]},
)

CONFTEST = """
import pytest

@pytest.fixture(autouse=True)
def _teardown_boom(request):
    yield
    if "teardown_boom" in request.node.name:
        raise OSError("teardown went wrong")
"""

EXPECTED = {  # nodeid: (outcome, reason)
    "test_sq.py::test_gradcheck[cpu-float64-a]": ("passed", ""),
    "test_sq.py::test_gradcheck[cpu-float64-b]": (
        "failed",
        "opcheck.runtime.checks.CheckFailed: opcheck gradcheck failed for wrong_ops:square_wrong_if_2d on "
        "cpu/float64, sample 'b'",
    ),
    "test_sq.py::test_gradcheck[cuda-float64-a]": (
        "skipped",
        "cuda is not available on this machine (OPCHECK_UNAVAILABLE_DEVICES lists it)",
    ),
    "test_sq.py::test_gradcheck[cuda-float64-b]": (
        "skipped",
        "cuda is not available on this machine (OPCHECK_UNAVAILABLE_DEVICES lists it)",
    ),
    "test_sq.py::test_gradcheck[cpu-complex128-a]": ("skipped", "<script>alert(1)</script> (op_specs/sq.yaml:9:5)"),
    "test_sq.py::test_gradcheck[cpu-complex128-b]": ("xfailed", "known bug (op_specs/sq.yaml:12:5)"),
    "test_sq.py::test_lowprec[cpu-float32-a]": ("passed", ""),
    "test_sq.py::test_lowprec[cuda-float32-a]": (
        "skipped",
        "cuda is not available on this machine (OPCHECK_UNAVAILABLE_DEVICES lists it)",
    ),
    "test_sin.py::test_gradgradcheck[cpu-float64-vec]": ("passed", ""),
    "test_sin.py::test_gradgradcheck[cpu-float64-teardown_boom]": (
        "error",
        "error in teardown: OSError: teardown went wrong",
    ),
}


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "cuda")  # the same skips on any machine
    pytester.syspathinsert()
    pytester.makepyfile(wrong_ops=WRONG_OPS, test_sq=SQ, test_sin=SIN)
    pytester.makeconftest(CONFTEST)
    return pytester


def shape(matrix):
    """What a matrix says about outcomes; JUnit knows no op paths and no whole failure messages
    (pytest shortens them there), so those and what the notes take from them are left out."""
    return (
        matrix.devices,
        [(r.spec, r.check, r.dtype, r.cells) for r in matrix.rows],
        matrix.totals,
        [(n.number, n.outcome, n.text, n.tests) for n in matrix.notes],
        [(r.nodeid, r.outcome, r.reason, n) for r, n in matrix.failures],
    )


def run(pytester, *args, subprocess=False):
    """Every device collected (unavailable ones skipped), so that JUnit sees every test too."""
    runner = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    result = runner("--opcheck-results", "out/r.json", "--junitxml", "j.xml", "--opcheck-device", "all", *args)
    result.assert_outcomes(passed=6, failed=1, skipped=4, xfailed=1, errors=1)
    return load_results(pytester.path / "out" / "r.json"), load_results(pytester.path / "j.xml"), result


@pytest.mark.parametrize("xdist", [False, True])
def test_tests_not_collected_for_an_unavailable_device_are_recorded_as_skipped(suite, xdist):
    if xdist:
        pytest.importorskip("xdist")
    runner = suite.runpytest_subprocess if xdist else suite.runpytest
    result = runner("--opcheck-results", "out/r.json", "--junitxml", "j.xml", *(["-n", "2"] if xdist else []))
    result.assert_outcomes(passed=6, failed=1, skipped=1, xfailed=1, errors=1, **({} if xdist else {"deselected": 3}))
    result.stdout.fnmatch_lines(
        ["opcheck: cuda unavailable: 3 tests not collected (--opcheck-device all to list them as skipped)"]
    )
    from_json = load_results(suite.path / "out" / "r.json")
    assert {r.nodeid: (r.outcome, r.reason) for r in from_json} == EXPECTED
    cuda = [r for r in from_json if r.device == "cuda"]
    assert {(r.spec, r.op, r.source, r.check, r.dtype, r.sample, r.duration) for r in cuda} == {
        ("sq", "wrong_ops:square_wrong_if_2d", "op_specs/sq.yaml", "gradcheck", "float64", "a", 0.0),
        ("sq", "wrong_ops:square_wrong_if_2d", "op_specs/sq.yaml", "gradcheck", "float64", "b", 0.0),
        ("sq", "wrong_ops:square_wrong_if_2d", "op_specs/sq.yaml", "lowprec", "float32", "a", 0.0),
    }
    # JUnit lists what ran; the coverage report of the JSON still has the cuda cells, with the reason
    assert {r.nodeid for r in load_results(suite.path / "j.xml")} == {n for n in EXPECTED if "[cuda-" not in n}
    all_devices, _, _ = run(suite)
    assert shape(build_matrix(from_json)) == shape(build_matrix(all_devices))


def test_results_json_and_junit_give_the_same_matrix(suite):
    from_json, from_junit, result = run(suite)
    result.stdout.fnmatch_lines([f"*- opcheck results of 10 generated tests: {suite.path / 'out' / 'r.json'} -*"])
    assert {r.nodeid: (r.outcome, r.reason) for r in from_json} == EXPECTED
    assert {r.nodeid: (r.outcome, r.reason) for r in from_junit} == EXPECTED
    sq = next(r for r in from_json if r.spec == "sq")
    assert (sq.op, sq.source) == ("wrong_ops:square_wrong_if_2d", "op_specs/sq.yaml")
    assert all(r.duration > 0 for r in from_json if r.outcome == "passed")
    assert shape(build_matrix(from_json)) == shape(build_matrix(from_junit))


def test_opcheck_report_prints_the_same_matrix_for_both(suite, capsys):
    run(suite)
    capsys.readouterr()  # the inner run's own output
    outputs = []
    for name in ("out/r.json", "j.xml"):
        assert main(["report", str(suite.path / name)]) == 0
        outputs.append(capsys.readouterr().out)
    from_json, from_junit = outputs
    assert "| sq (`wrong_ops:square_wrong_if_2d`) | gradcheck | float64 | **1 failed**, 1 passed [2] |" in from_json
    details = ("   - worst entry: `d output 0 / d input 0, d out[1, 1] / d in[1, 1]: ", "   - hint: analytical ≈ 1.5 ")
    assert all(any(line.startswith(d) for line in from_json.splitlines()) for d in details)
    from_json = "".join(line for line in from_json.splitlines(True) if not line.startswith(details))
    assert from_junit == (  # JUnit has no whole failure messages: no worst entry, no hint
        from_json.replace("r.json:", "j.xml:")
        .replace(" (`wrong_ops:square_wrong_if_2d`)", "")
        .replace(" (`torch.sin`)", "")
    )
    assert "\\<script\\>alert(1)\\</script\\>" in from_json


@pytest.mark.long
def test_xdist_controller_writes_the_serial_results(suite):
    pytest.importorskip("xdist")
    serial, serial_junit, _ = run(suite)
    parallel, parallel_junit, result = run(suite, "-n", "2", subprocess=True)
    result.stdout.fnmatch_lines(["*2 workers [[]1[24] items[]]*"])

    def without_durations(results):
        return sorted(
            (r.nodeid, r.spec, r.op, r.source, r.check, r.device, r.dtype, r.sample, r.outcome, r.reason)
            + (r.worst, r.hint, r.message)
            for r in results
        )

    assert without_durations(parallel) == without_durations(serial)
    assert shape(build_matrix(parallel)) == shape(build_matrix(parallel_junit)) == shape(build_matrix(serial_junit))
    data = json.loads((suite.path / "out" / "r.json").read_text())
    assert len(data["tests"]) == 10  # written once, by the controller


def test_results_path_that_is_a_folder_is_a_usage_error(pytester):
    pytester.mkdir("results")
    result = pytester.runpytest("--opcheck-results", "results")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --opcheck-results: */results is a directory; expected a file path*"])


def test_without_the_option_nothing_is_recorded(suite):
    suite.makeconftest(
        CONFTEST
        + """
def pytest_runtest_logreport(report):
    assert not hasattr(report, "opcheck_case")
"""
    )
    result = suite.runpytest("--junitxml", "j.xml")
    result.assert_outcomes(passed=6, failed=1, skipped=1, deselected=3, xfailed=1, errors=1)
    assert not (suite.path / "out").exists()
    assert "opcheck results" not in result.stdout.str()


def test_an_unwritable_results_path_is_reported_not_a_crash(suite):
    suite.path.joinpath("out").write_text("a file where a folder should be")
    result = suite.runpytest("--opcheck-results", "out/r.json")
    result.assert_outcomes(passed=6, failed=1, skipped=1, deselected=3, xfailed=1, errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"opcheck: cannot write results to {suite.path / 'out' / 'r.json'}: *"])
    assert "INTERNALERROR" not in result.stdout.str()
