"""ResultsRecorder: setup/call/teardown reports → one verdict per generated test."""

import json

import pytest
from _pytest._code.code import ReprFileLocation

from opcheck.failure_facts import FailureFacts
from opcheck.report.collect import CASE_ATTR, ResultsRecorder, report_verdict
from opcheck.report.results import parse_json

NODE = "generated_tests/test_sin.py::test_gradcheck[cpu-float64-vec]"
CASE = dict(
    spec="sin",
    op="torch.sin",
    source="op_specs/sin.yaml",
    check="gradcheck",
    device="cpu",
    dtype="float64",
    sample="vec",
)


class _Crash:
    def __init__(self, message):
        self.reprcrash = ReprFileLocation("x.py", 1, message)

    def __str__(self):
        return "the whole traceback"


def report(when, outcome, longrepr=None, nodeid=NODE, case=CASE, **extra):
    rep = pytest.TestReport(
        nodeid=nodeid,
        location=("x.py", 1, "x"),
        keywords={},
        outcome=outcome,
        longrepr=longrepr,
        when=when,
        duration=0.5,
        **extra,
    )
    if case is not None:
        setattr(rep, CASE_ATTR, case)
    return rep


@pytest.mark.parametrize(
    "reports, verdict",
    [
        ([report("setup", "passed"), report("call", "passed"), report("teardown", "passed")], ("passed", "")),
        ([report("call", "passed", wasxfail="flaky on cpu")], ("xpassed", "flaky on cpu")),
        (
            [report("call", "skipped", ("x.py", 3, "Skipped: no cuda"), wasxfail="reason: known bug")],
            ("xfailed", "known bug"),
        ),
        ([report("setup", "skipped", ("x.py", 3, "Skipped: spec says so\nsecond line"))], ("skipped", "spec says so")),
        ([report("setup", "skipped", ("x.py", 3, "xfail run=False"), wasxfail="not run")], ("xfailed", "not run")),
        ([report("call", "failed", _Crash("AssertionError: boom\nmore"))], ("failed", "AssertionError: boom")),
        ([report("call", "failed", "[XPASS(strict)] known bug")], ("failed", "[XPASS(strict)] known bug")),
        (
            [report("setup", "failed", _Crash("RuntimeError: no device"))],
            ("error", "error in setup: RuntimeError: no device"),
        ),
        (
            [
                report("call", "failed", _Crash("AssertionError: first")),
                report("teardown", "failed", _Crash("OSError: then")),
            ],
            ("failed", "AssertionError: first"),
        ),
        (
            [report("call", "passed"), report("teardown", "failed", _Crash("OSError: then"))],
            ("error", "error in teardown: OSError: then"),
        ),
    ],
)
def test_reports_make_one_verdict(reports, verdict):
    recorder = ResultsRecorder("unused.json")
    for rep in reports:
        recorder.pytest_runtest_logreport(rep)
    (result,) = recorder.results()
    assert (result.outcome, result.reason) == verdict
    assert result.duration == 0.5 * len(reports)
    assert (result.spec, result.op, result.nodeid) == ("sin", "torch.sin", NODE)


def test_other_tests_are_ignored_and_a_crashed_workers_test_is_kept(tmp_path):
    recorder = ResultsRecorder(tmp_path / "deep" / "r.json")
    recorder.pytest_runtest_logreport(report("call", "passed", nodeid="tests/test_x.py::test_x", case={}))
    recorder.pytest_runtest_logreport(report("setup", "passed"))  # never got further: not a result
    # pytest-xdist's report for the test a dying worker was running carries no case
    crashed = "generated_tests/test_mm.py::test_lowprec[cpu-bfloat16-sq]"
    recorder.pytest_runtest_logreport(
        report("???", "failed", "worker 'gw0' crashed while running it", nodeid=crashed, case=None)
    )
    recorder.pytest_runtest_logreport(
        report("call", "passed", nodeid="tests/test_y.py::test_gradcheck[cpu-float64-s]", case={})
    )  # looks generated, but the plugin said it is not
    recorder.pytest_sessionfinish(session=None)
    (result,) = parse_json((tmp_path / "deep" / "r.json").read_text())
    assert (result.spec, result.check, result.device, result.dtype, result.sample) == (
        "mm",
        "lowprec",
        "cpu",
        "bfloat16",
        "sq",
    )
    assert (result.outcome, result.reason) == ("error", "error in setup: worker 'gw0' crashed while running it")
    assert json.loads((tmp_path / "deep" / "r.json").read_text())["format"] == "opcheck-results"


def test_verdict_of_a_passing_setup_is_none():
    assert report_verdict(report("setup", "passed")) is None
    assert report_verdict(report("teardown", "passed")) is None


FAILURE = """opcheck.runtime.checks.CheckFailed: opcheck gradcheck failed for torch.sin on cpu/float64, sample 'vec'
  rerun:       pytest 'generated_tests/test_sin.py::test_gradcheck[cpu-float64-vec]'

engine report:
check: backward (VJP); d output 0 / d input 0
worst entries:
  d out[1] / d in[1]: analytical 2, numerical 1, abs err 1, rel err 1
hint: analytical = 2 x numerical"""


WORST = "d output 0 / d input 0, d out[1] / d in[1]: analytical 2, numerical 1, abs err 1, rel err 1"


def test_a_failure_records_its_worst_entry_hints_and_message():
    recorder = ResultsRecorder("unused.json")
    facts = FailureFacts(worst=WORST, hints=("analytical = 2 x numerical", "h2"), inputs=(0,))
    recorder.pytest_runtest_logreport(report("call", "failed", _Crash(FAILURE), user_properties=[facts.to_property()]))
    recorder.pytest_runtest_logreport(report("teardown", "failed", _Crash("OSError: then\nmore")))
    (result,) = recorder.results()
    assert result.outcome == "failed" and result.reason == FAILURE.splitlines()[0]
    assert result.worst == WORST
    hint = "analytical = 2 x numerical\nh2"
    assert (result.hint, result.message) == (hint, FAILURE)  # the call's, not the teardown's


def test_the_worst_entry_and_hints_come_from_the_facts_not_from_the_message():
    recorder = ResultsRecorder("unused.json")
    recorder.pytest_runtest_logreport(report("call", "failed", _Crash(FAILURE)))  # marked lines, no facts
    (result,) = recorder.results()
    assert (result.worst, result.hint, result.message) == ("", "", FAILURE)


def test_an_error_after_a_pass_records_the_errors_message():
    recorder = ResultsRecorder("unused.json")
    recorder.pytest_runtest_logreport(report("call", "passed"))
    recorder.pytest_runtest_logreport(report("teardown", "failed", _Crash("OSError: then\nsecond line")))
    (result,) = recorder.results()
    assert (result.outcome, result.worst, result.hint) == ("error", "", "")
    assert result.message == "OSError: then\nsecond line"
