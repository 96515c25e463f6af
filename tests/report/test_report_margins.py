"""Margins in the results file and the coverage report: each pass's worst error / allowed is kept
(version 3; older files still load), shown per passing cell, and the closest passes are listed first."""

import json
from dataclasses import replace

import pytest
from report_samples import RESULTS, result

from opcheck.report import build_matrix, render_html, render_markdown
from opcheck.report.matrix import CLOSEST_SHOWN
from opcheck.report.results import ReportError, parse_json, parse_junit, results_json
from opcheck.report.store import merge

WHERE = "VJP: d output 0 / d input 0"


def passed(sample, margin, where=WHERE, spec="sin", check="gradcheck", device="cpu", dtype="float64"):
    return replace(result(spec, check, device, dtype, sample, "passed"), margin=margin, margin_where=where)


def document(records, version=3) -> str:
    return json.dumps({"format": "opcheck-results", "version": version, "tests": records})


# ------------------------------------------------------------------------------------ results file
def test_a_pass_margin_is_written_and_read_back():
    results = [
        passed("a", 0.42),
        passed("b", 0.0, where="output 0"),
        result("sin", "lowprec", "cpu", "float32", "c", "failed", "boom"),
    ]
    data = json.loads(results_json(results))
    assert data["version"] == 3
    records = {r["sample"]: r for r in data["tests"]}
    assert (records["a"]["margin"], records["a"]["margin_where"]) == (0.42, WHERE)
    assert records["b"]["margin"] == 0.0  # an exact pass keeps its margin: 0 is a value, not "none"
    assert "margin" not in records["c"] and "margin_where" not in records["c"]
    assert list(records["a"]).index("margin") == list(records["a"]).index("reason") + 1
    assert sorted(parse_json(results_json(results)), key=lambda r: r.sample) == sorted(results, key=lambda r: r.sample)


@pytest.mark.parametrize("version", [1, 2])
def test_files_written_before_margins_still_load_without_them(version):
    record = dict(spec="sin", check="gradcheck", device="cpu", dtype="float64", sample="a", outcome="passed")
    (loaded,) = parse_json(document([record], version=version))
    assert (loaded.margin, loaded.margin_where) == (None, "")


def test_a_margin_that_is_not_a_number_is_refused():
    record = dict(spec="sin", check="gradcheck", device="cpu", dtype="float64", sample="a", outcome="passed")
    with pytest.raises(ReportError, match=r"r.json: tests\[0\]: margin: expected a number, got 'close'"):
        parse_json(document([dict(record, margin="close")]), where="r.json")


def test_a_later_run_replaces_a_margin_and_keeps_the_others():
    earlier = [passed("a", 0.9), passed("b", 0.2)]
    merged = merge(earlier, [passed("a", 0.3)])
    assert {r.sample: r.margin for r in merged.results} == {"a": 0.3, "b": 0.2}


def test_junit_carries_the_margin_as_a_property_of_passes_only():
    junit = """<testsuites><testsuite name="pytest">
<testcase classname="generated_tests.test_sin" name="test_gradcheck[cpu-float64-a]" time="0.01">
  <properties><property name="opcheck_margin" value="0.42 VJP: d output 0 / d input 0" /></properties>
</testcase>
<testcase classname="generated_tests.test_sin" name="test_gradcheck[cpu-float64-b]" time="0.01">
  <properties><property name="opcheck_margin" value="0.5 output 0" /></properties>
  <error message="failed on teardown with &quot;OSError: disk full&quot;">traceback</error>
</testcase>
<testcase classname="generated_tests.test_sin" name="test_gradcheck[cpu-float64-c]" time="0.01">
  <properties><property name="opcheck_margin" value="not a margin" /></properties>
</testcase>
</testsuite></testsuites>"""
    found = {r.sample: (r.outcome, r.margin, r.margin_where) for r in parse_junit(junit)}
    assert found == {"a": ("passed", 0.42, WHERE), "b": ("error", None, ""), "c": ("passed", None, "")}


# ------------------------------------------------------------------------------------ report
def test_a_passing_cell_shows_its_closest_pass():
    results = [passed("a", 0.1), passed("b", 0.42), passed("c", 0.99, device="cuda")]
    results.append(replace(result("sin", "gradcheck", "cuda", "float64", "d", "failed", "boom"), margin=None))
    cpu, cuda = build_matrix(results).rows[0].cells
    assert (cpu.margin, cpu.margin_text) == (0.42, "0.42 of bound")
    assert cpu.title.startswith("2 passed (0.42 of bound: the closest pass's error / allowed)")
    assert (cuda.status, cuda.margin, cuda.margin_text) == ("failed", 0.99, "")  # a failure says more


def test_the_closest_passes_come_first_and_only_the_closest_are_listed():
    results = [passed(f"s{i:02}", i / 100) for i in range(CLOSEST_SHOWN + 5)] + [passed("x", None)]
    matrix = build_matrix(results)
    assert matrix.margins == CLOSEST_SHOWN + 5
    assert [r.margin for r in matrix.closest] == [i / 100 for i in range(CLOSEST_SHOWN + 4, 4, -1)]


def test_markdown_shows_margins_per_cell_and_a_closest_passes_table():
    results = [passed("a", 0.1), passed("b", 0.42), passed("a", 3.1e-7, where="output 0 | x", check="lowprec")]
    text = render_markdown(build_matrix(results), "r.json")
    assert "| sin (`torch.sin`) | gradcheck | float64 | 2 passed (0.42 of bound) |" in text
    assert "|  | lowprec | float64 | 1 passed (3.1e-07 of bound) |" in text
    closest = text.split("## Closest passes\n", 1)[1].splitlines()
    assert closest[1].startswith("The passes that came closest to failing, closest first (every pass with")
    assert closest[3:8] == [
        "| error / allowed | test | comparison |",
        "| --- | --- | --- |",
        f"| 0.42 | `generated_tests/test_sin.py::test_gradcheck[cpu-float64-b]` | {WHERE} |",
        f"| 0.1 | `generated_tests/test_sin.py::test_gradcheck[cpu-float64-a]` | {WHERE} |",
        "| 3.1e-07 | `generated_tests/test_sin.py::test_lowprec[cpu-float64-a]` | output 0 \\| x |",
    ]


def test_results_without_margins_render_as_before():
    text = render_markdown(build_matrix(RESULTS), "results.json")
    assert "of bound" not in text and "## Closest passes" not in text
    assert "of bound" not in render_html(build_matrix(RESULTS), "results.json")


def test_html_shows_margins_and_the_closest_passes_escaped():
    results = [passed("a", 0.42), passed("b", 0.1, where="<script>alert(1)</script>")]
    page = render_html(build_matrix(results), "r.json")
    assert '2 passed <span class="margin">(0.42 of bound)</span>' in page
    assert "<h2>Closest passes</h2>" in page
    assert page.index("test_gradcheck[cpu-float64-a]</code>") < page.index("test_gradcheck[cpu-float64-b]</code>")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
