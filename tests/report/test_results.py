"""Reading results: JUnit XML and `--opcheck-results` JSON give the same TestResults."""

import json

import pytest

from opcheck.report.results import ReportError, TestResult, load_results, parse_json, parse_junit, results_json

# The shapes pytest 8/9 write, by hand: a pass, a skip with its reason, an xfail, a failure, a setup
# error, a failure followed by a teardown error (two <testcase>s), and tests that are not opcheck's.
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="2" failures="2" skipped="2" tests="9" time="1.0">
<testcase classname="generated_tests.test_sin" name="test_gradcheck[cpu-float64-vec]" time="0.010" />
<testcase classname="generated_tests.test_sin" name="test_gradcheck[cuda-float64-vec]" time="0.000">
  <skipped type="pytest.skip" message="cuda is not available on this machine (torch.cuda.is_available() is False)">/x/generated_tests/test_sin.py:20: cuda is not available on this machine (torch.cuda.is_available() is False)</skipped>
</testcase>
<testcase classname="generated_tests.test_sin" name="test_gradgradcheck[cpu-float64-vec]" time="0.020">
  <skipped type="pytest.xfail" message="second derivative wrong (op_specs/sin.yaml:12:5)" />
</testcase>
<testcase classname="generated_tests.test_sin" name="test_lowprec[cpu-bfloat16-vec]" time="0.030">
  <failure message="opcheck.runtime.checks.CheckFailed: opcheck lowprec failed for torch.sin on cpu/bfloat16, sample 'vec'&#10;  spec: op_specs/sin.yaml">long traceback</failure>
</testcase>
<testcase classname="generated_tests.test_sin" name="test_forward_ad[cpu-float64-vec]" time="0.001">
  <error message="failed on setup with &quot;RuntimeError: no fixture&quot;">traceback</error>
</testcase>
<testcase classname="generated_tests.test_sin" name="test_forward_ad[cpu-complex128-vec]" time="0.002">
  <failure message="AssertionError: boom">traceback</failure>
</testcase>
<testcase classname="generated_tests.test_sin" name="test_forward_ad[cpu-complex128-vec]" time="0.003">
  <error message="failed on teardown with &quot;OSError: disk full&quot;">traceback</error>
</testcase>
<testcase classname="tests.test_other" name="test_unrelated" time="0.000" />
<testcase classname="tests.test_other" name="test_gradcheck[cpu-notadtype-vec]" time="0.000" />
</testsuite></testsuites>
"""  # noqa: E501  (pytest writes each element on one line)

SIN = dict(spec="sin", op="torch.sin", source="op_specs/sin.yaml")


def record(check, device, dtype, outcome, reason="", sample="vec", duration=0.01, **fields):
    nodeid = f"generated_tests/test_sin.py::test_{check}[{device}-{dtype}-{sample}]"
    return dict(
        SIN,
        nodeid=nodeid,
        check=check,
        device=device,
        dtype=dtype,
        sample=sample,
        outcome=outcome,
        reason=reason,
        duration=duration,
        **fields,
    )


RECORDS = [
    record("gradcheck", "cpu", "float64", "passed"),
    record(
        "gradcheck",
        "cuda",
        "float64",
        "skipped",
        "cuda is not available on this machine (torch.cuda.is_available() is False)",
    ),
    record("gradgradcheck", "cpu", "float64", "xfailed", "second derivative wrong (op_specs/sin.yaml:12:5)"),
    record(
        "lowprec",
        "cpu",
        "bfloat16",
        "failed",
        "opcheck.runtime.checks.CheckFailed: opcheck lowprec failed for torch.sin on cpu/bfloat16, sample 'vec'",
    ),
    record("forward_ad", "cpu", "float64", "error", "error in setup: RuntimeError: no fixture"),
    record("forward_ad", "cpu", "complex128", "failed", "AssertionError: boom"),
]


def results_text(records) -> str:
    return json.dumps({"format": "opcheck-results", "version": 1, "tests": records})


def verdicts(results):
    return {(r.check, r.device, r.dtype, r.sample): (r.outcome, r.reason) for r in results}


def test_junit_gives_one_result_per_generated_test_with_reasons():
    results = parse_junit(JUNIT)
    assert verdicts(results) == {
        (r["check"], r["device"], r["dtype"], r["sample"]): (r["outcome"], r["reason"]) for r in RECORDS
    }
    assert {r.spec for r in results} == {"sin"} and {r.op for r in results} == {""}  # JUnit has no op path
    by_check = {(r.check, r.device, r.dtype): r for r in results}
    nodeid = by_check["gradcheck", "cpu", "float64"].nodeid
    assert nodeid == "generated_tests/test_sin.py::test_gradcheck[cpu-float64-vec]"
    # the failure then the teardown error of one test: one result, the failure, both durations
    assert by_check["forward_ad", "cpu", "complex128"].duration == pytest.approx(0.005)


def test_json_gives_the_same_results_as_junit():
    from_json = parse_json(results_text(RECORDS))
    assert verdicts(from_json) == verdicts(parse_junit(JUNIT))
    assert from_json[0] == TestResult(**RECORDS[0])
    assert from_json[0].op == "torch.sin" and from_json[0].source == "op_specs/sin.yaml"


def test_results_json_round_trips_in_node_id_order():
    results = [TestResult(**r) for r in reversed(RECORDS)]
    text = results_json(results)
    data = json.loads(text)
    assert [r["nodeid"] for r in data["tests"]] == sorted(r["nodeid"] for r in RECORDS)
    assert list(data["tests"][0]) == [
        "nodeid",
        "spec",
        "op",
        "source",
        "check",
        "device",
        "dtype",
        "sample",
        "outcome",
        "reason",
        "duration",
    ]
    assert sorted(parse_json(text), key=lambda r: r.nodeid) == sorted(results, key=lambda r: r.nodeid)


@pytest.mark.parametrize(
    "skipped, expected",
    [
        ('<skipped type="pytest.xfail" message="known bug" />', ("xfailed", "known bug")),
        (
            '<skipped message="xfail-marked test passes unexpectedly" />',
            ("failed", "xfail-marked test passes unexpectedly"),
        ),
        ('<skipped message="xfail: old pytest wrote no type" />', ("xfailed", "xfail: old pytest wrote no type")),
        (
            '<skipped type="pytest.skip" message="xfail is just a word here" />',
            ("skipped", "xfail is just a word here"),
        ),
        ('<error message="collection failure">x</error>', ("error", "collection failure")),
        (
            '<failure message="[XPASS(strict)] known bug">[XPASS(strict)] known bug</failure>',
            ("failed", "[XPASS(strict)] known bug"),
        ),
    ],
)
def test_junit_outcome_variants(skipped, expected):
    xml = (
        f'<testsuite><testcase classname="test_k" name="test_gradcheck[cpu-float64-s]">{skipped}</testcase></testsuite>'
    )
    (result,) = parse_junit(xml)
    assert (result.outcome, result.reason) == expected
    assert result.spec == "k"


def test_load_results_picks_the_reader_by_suffix_or_content(tmp_path):
    (tmp_path / "r.xml").write_text(JUNIT)
    (tmp_path / "r.json").write_text(results_text(RECORDS))
    (tmp_path / "junit.txt").write_text(JUNIT)
    (tmp_path / "results.out").write_text(results_text(RECORDS))
    expected = verdicts(parse_json(results_text(RECORDS)))
    for name in ("r.xml", "r.json", "junit.txt", "results.out"):
        assert verdicts(load_results(tmp_path / name)) == expected, name


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("r.xml", "<testsuites><testcase", "r.xml: not valid XML: "),
        ("r.xml", "<html></html>", "r.xml: not a JUnit XML report (root element <html>"),
        ("r.json", "{nope", "r.json: not valid JSON: "),
        ("r.json", "[]", 'r.json: not opcheck results (expected a JSON object with "format": "opcheck-results"'),
        (
            "r.json",
            '{"format": "opcheck-results", "version": 7, "tests": []}',
            "r.json: results format version 7; this opcheck reads versions 1, 2",
        ),
        ("r.json", '{"format": "opcheck-results", "version": 1}', 'r.json: "tests": expected a list of test records'),
        ("r.txt", "hello", "r.txt: expected a JUnit XML file (pytest --junitxml=PATH.xml) or opcheck's JSON results"),
    ],
)
def test_unreadable_results_say_which_file_and_why(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ReportError) as info:
        load_results(tmp_path / name)
    assert str(info.value).startswith(str(tmp_path / message.split(":", 1)[0]) + ":" + message.split(":", 1)[1])


def test_bad_records_are_all_reported_with_their_index():
    bad = [
        RECORDS[0],
        {"spec": "x"},
        dict(RECORDS[1], outcome="exploded"),
        dict(RECORDS[2], duration="slow"),
        dict(RECORDS[3], colour="red"),
        "oops",
    ]
    with pytest.raises(ReportError) as info:
        parse_json(results_text(bad), where="r.json")
    assert str(info.value).splitlines() == [
        "r.json: tests[1]: missing 'check', 'device', 'dtype', 'sample', 'outcome'",
        "r.json: tests[2]: outcome: expected one of failed, passed, skipped, xfailed, xpassed, error, got 'exploded'",
        "r.json: tests[3]: duration: expected a number, got 'slow'",
        "r.json: tests[4]: unknown key(s) 'colour'",
        "r.json: tests[5]: expected an object, got str",
    ]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ReportError, match="nope.json: no such file"):
        load_results(tmp_path / "nope.json")
    with pytest.raises(ReportError, match="is a directory"):
        load_results(tmp_path)
