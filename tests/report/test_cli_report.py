"""`opcheck report RESULTS [--markdown PATH] [--html PATH]`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_samples import GOLDEN_MARKDOWN, RESULTS

from opcheck.report.results import results_json

REPO = Path(__file__).resolve().parents[2]


def opcheck(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "opcheck", *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = tmp_path / "results.json"
    path.write_text(results_json(RESULTS))
    return path


def test_prints_markdown_without_output_options(results):
    done = opcheck("report", results.name, cwd=results.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == GOLDEN_MARKDOWN and done.stderr == ""


def test_writes_markdown_and_html(results):
    done = opcheck("report", "results.json", "--markdown", "out/r.md", "--html", "r.html", cwd=results.parent)
    assert done.returncode == 1 and "cannot write out/r.md" in done.stderr  # no such folder
    (results.parent / "out").mkdir()
    done = opcheck("report", "results.json", "--markdown", "out/r.md", "--html", "r.html", cwd=results.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote out/r.md\nwrote r.html\n"
    assert (results.parent / "out" / "r.md").read_text() == GOLDEN_MARKDOWN
    assert (results.parent / "r.html").read_text().startswith("<!DOCTYPE html>")
    only_html = opcheck("report", "results.json", "--html", "again.html", cwd=results.parent)
    assert only_html.returncode == 0 and only_html.stdout == "wrote again.html\n"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("missing.json", None, "opcheck report: missing.json: no such file"),
        ("bad.json", "{", "opcheck report: bad.json: not valid JSON: "),
        ("bad.xml", "<testsuite><testcase>", "opcheck report: bad.xml: not valid XML: "),
        (
            "other.xml",
            '<testsuite><testcase classname="t" name="test_x"/></testsuite>',
            "opcheck report: other.xml: no generated opcheck tests in it",
        ),
        (
            "records.json",
            json.dumps({"format": "opcheck-results", "version": 1, "tests": [{"spec": "x"}]}),
            "opcheck report: records.json: tests[0]: missing 'check'",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_1(tmp_path, name, text, message):
    if text is not None:
        (tmp_path / name).write_text(text)
    done = opcheck("report", name, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(message) and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_usage():
    done = opcheck("report", "--help", cwd=REPO)
    assert done.returncode == 0
    assert "RESULTS" in done.stdout and "--markdown PATH" in done.stdout and "--html PATH" in done.stdout
    assert opcheck("report", cwd=REPO).returncode == 2  # RESULTS is required
