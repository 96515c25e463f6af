"""`opcheck report`: a coverage matrix (ops x checks x dtypes x devices) of a pytest run of
generated tests, from a JUnit XML file or from `pytest --opcheck-results PATH`, as Markdown or as
a self-contained HTML page.

    results = load_results(Path("results.json"))
    matrix = build_matrix(results)
    render_markdown(matrix, source="results.json"); render_html(matrix, source="results.json")

Nothing here imports torch or pytest.
"""

from opcheck.report.matrix import Cell, Matrix, Note, Row, build_matrix
from opcheck.report.render import render_html, render_markdown
from opcheck.report.results import OUTCOMES, ReportError, TestResult, load_results, parse_json, parse_junit

__all__ = [
    "OUTCOMES",
    "Cell",
    "Matrix",
    "Note",
    "ReportError",
    "Row",
    "TestResult",
    "build_matrix",
    "load_results",
    "parse_json",
    "parse_junit",
    "render_html",
    "render_markdown",
]
