"""Test results of a pytest run of generated tests, read from a JUnit XML file or from the JSON that
`pytest --opcheck-results PATH` writes.

One `TestResult` per generated test, whichever the source. Both readers derive the same outcome
and the same reason for the same run: a skip's or xfail's reason, or the first line of a failure
(pytest's "crash" message, the line JUnit puts in `message=`). Tests that are not generated
opcheck tests are left out.

The JSON also keeps, for a failure or an error, its whole message and what the report's notes
show of it: the worst entry it names and its hints (opcheck.report.failure); and for a passing
gradient check or low-precision test its margin: the worst error / allowed among the comparisons
it made (at most 1; opcheck.engine.margins says which comparisons count), and which comparison
that was. Version 1 and 2 files, written before those fields, are read as results without them.
JUnit XML has the margin too, as the test's `opcheck_margin` property (opcheck.runtime.margins).

What JUnit cannot say: a non-strict XPASS is written as a plain pass there; JUnit has no op
path or spec file (only the module name, which is `test_<spec name>`); and pytest shortens the
failure message it writes there (the element's text is a traceback), so a failure read from
JUnit has only its first line.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from opcheck.runtime.margins import MARGIN_PROPERTY, parse_margin
from opcheck.spec.case import CaseId, spec_of_module

RESULTS_FORMAT = "opcheck-results"
RESULTS_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
"""Version 2 added `worst`, `hint` and `message` to the records; version 3 `margin` and `margin_where`."""

PASSED, FAILED, SKIPPED, XFAILED, XPASSED, ERROR = "passed", "failed", "skipped", "xfailed", "xpassed", "error"
OUTCOMES = (FAILED, PASSED, SKIPPED, XFAILED, XPASSED, ERROR)
"""Every outcome, in the order pytest's summary line lists them."""
PASSES = (PASSED, XPASSED)
"""The outcomes whose test passed its checks: the ones a margin is recorded for."""

_PRECEDENCE = (PASSED, SKIPPED, XFAILED, XPASSED, ERROR, FAILED)
"""When one test reports several phases (a call failure, then a teardown error), the later in this
tuple wins: a failure stays a failure, a pass followed by a teardown error is an error."""

_ERROR_MESSAGE = re.compile(r'^failed on (?P<when>setup|teardown) with "(?P<reason>.*)"$', re.DOTALL)
_XPASS_STRICT_OLD = "xfail-marked test passes unexpectedly"  # JUnit's <skipped> for a failed xfail report


class ReportError(Exception):
    """Results that cannot be read: the message says which file and what is wrong."""


@dataclass(frozen=True)
class TestResult:
    """The outcome of one generated test: `test_<check>[<device>-<dtype>-<sample>]` of one spec."""

    __test__ = False  # not a pytest test class, whatever its name

    spec: str
    check: str
    device: str
    dtype: str
    sample: str
    outcome: str
    reason: str = ""  # skip/xfail reason, or the failure's first line; "" for a pass
    nodeid: str = ""
    op: str = ""  # unknown ("") when read from JUnit XML
    source: str = ""  # the spec file; unknown ("") when read from JUnit XML
    duration: float = 0.0
    worst: str = ""  # a failure's worst entry, as opcheck.report.failure reads it from the message
    hint: str = ""  # a failure's hints, one per line
    message: str = ""  # a failure's or an error's whole message, when it has more than its first line
    margin: float | None = None  # a pass's worst error / allowed; None: not recorded
    margin_where: str = ""  # which comparison that was, in the engine's words

    def to_json(self) -> dict:
        """The record: every field, but the failure details and the margin only where there are some."""
        record = asdict(self)
        record["duration"] = round(self.duration, 6)
        return {
            key: record[key]
            for key in _RECORD_ORDER
            if key not in _OPTIONAL or (record[key] if key != "margin" else record[key] is not None)
        }


_OPTIONAL = ("worst", "hint", "message", "margin", "margin_where")
_RECORD_ORDER = (
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
    "margin",
    "margin_where",
    "worst",
    "hint",
    "message",
    "duration",
)


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def error_reason(when: str, message: str) -> str:
    """A setup/teardown error's reason, the same from both sources."""
    return f"error in {when}: {first_line(message)}"


def worse(a: tuple[str, str] | None, b: tuple[str, str] | None) -> tuple[str, str] | None:
    """Of two (outcome, reason) of the same test, the one its single cell shows."""
    if a is None or b is None:
        return a or b
    return b if _PRECEDENCE.index(b[0]) > _PRECEDENCE.index(a[0]) else a


# ------------------------------------------------------------------------------------ reading
def load_results(path: Path) -> list[TestResult]:
    """The generated tests' results in a JUnit XML file (`.xml`) or an `--opcheck-results` file (`.json`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory, not a results file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read: {e}") from None
    kind = path.suffix.lower()
    if kind not in (".xml", ".json"):
        kind = ".xml" if text.lstrip().startswith("<") else ".json" if text.lstrip().startswith("{") else ""
    if kind == ".xml":
        return parse_junit(text, where=str(path))
    if kind == ".json":
        return parse_json(text, where=str(path))
    raise ReportError(
        f"{path}: expected a JUnit XML file (pytest --junitxml=PATH.xml) or opcheck's JSON results "
        f"(pytest --opcheck-results PATH.json)"
    )


def parse_junit(text: str, where: str = "<junit>") -> list[TestResult]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ReportError(f"{where}: not valid XML: {e}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(
            f"{where}: not a JUnit XML report (root element <{root.tag}>, expected <testsuites> or <testsuite>)"
        )
    found: dict[str, dict] = {}
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parsed = CaseId.parse(spec_of_module(classname), name) if classname else None
        if parsed is None:
            continue
        nodeid = f"{classname.replace('.', '/')}.py::{name}"
        entry = found.setdefault(nodeid, dict(asdict(parsed), nodeid=nodeid, duration=0.0, verdict=None))
        entry["duration"] += _float(case.get("time"))
        # A test that failed in its call and errored in teardown has two <testcase> elements.
        entry["verdict"] = worse(entry["verdict"], _junit_verdict(case))
        entry["margin"] = entry.get("margin") or _junit_margin(case)
    return [_result(entry) for entry in found.values()]


def _junit_margin(case: ET.Element) -> tuple[float, str] | None:
    for prop in case.iter("property"):
        if prop.get("name") == MARGIN_PROPERTY:
            return parse_margin(prop.get("value", ""))
    return None


def _junit_verdict(case: ET.Element) -> tuple[str, str]:
    for child in case:
        message = child.get("message") or ""
        if child.tag == "failure":
            return FAILED, first_line(message or child.text or "")
        if child.tag == "error":
            m = _ERROR_MESSAGE.match(message)
            return (ERROR, error_reason(m["when"], m["reason"]) if m else first_line(message or child.text or ""))
        if child.tag == "skipped":
            kind = child.get("type")
            if message == _XPASS_STRICT_OLD:
                return FAILED, message
            if kind == "pytest.xfail" or (kind is None and message.startswith("xfail")):
                return XFAILED, first_line(message)
            return SKIPPED, first_line(message)
    return PASSED, ""


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _result(entry: dict) -> TestResult:
    outcome, reason = entry.pop("verdict")
    margin = entry.pop("margin", None)
    if margin is not None and outcome in PASSES:
        entry.update(margin=margin[0], margin_where=margin[1])
    return TestResult(outcome=outcome, reason=reason, **entry)


_REQUIRED = ("spec", "check", "device", "dtype", "sample", "outcome")
_NUMBERS = ("duration", "margin")
_TYPES = {f.name: (float, int) if f.name in _NUMBERS else str for f in fields(TestResult)}


def parse_json(text: str, where: str = "<json>") -> list[TestResult]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        raise ReportError(
            f'{where}: not opcheck results (expected a JSON object with "format": '
            f'"{RESULTS_FORMAT}", as `pytest --opcheck-results PATH` writes)'
        )
    if data.get("version") not in READABLE_VERSIONS:
        raise ReportError(
            f"{where}: results format version {data.get('version')!r}; this opcheck reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    tests = data.get("tests")
    if not isinstance(tests, list):
        raise ReportError(f'{where}: "tests": expected a list of test records')
    problems, results = [], []
    for i, record in enumerate(tests):
        problem = _record_problem(record)
        if problem:
            problems.append(f"{where}: tests[{i}]: {problem}")
        else:
            results.append(TestResult(**record))
    if problems:
        raise ReportError("\n".join(problems))
    return results


def _record_problem(record) -> str | None:
    if not isinstance(record, dict):
        return f"expected an object, got {type(record).__name__}"
    missing = [k for k in _REQUIRED if k not in record]
    if missing:
        return f"missing {', '.join(map(repr, missing))}"
    unknown = sorted(set(record) - set(_TYPES))
    if unknown:
        return f"unknown key(s) {', '.join(map(repr, unknown))}"
    for key, value in record.items():
        if not isinstance(value, _TYPES[key]) or isinstance(value, bool):
            return f"{key}: expected {'a number' if key in _NUMBERS else 'a string'}, got {value!r}"
    if record["outcome"] not in OUTCOMES:
        return f"outcome: expected one of {', '.join(OUTCOMES)}, got {record['outcome']!r}"
    return None


# ------------------------------------------------------------------------------------ writing
def results_json(results: list[TestResult]) -> str:
    """The `--opcheck-results` file: one record per test, in node id order (the same for every run)."""
    ordered = sorted(results, key=lambda r: r.nodeid)
    return (
        json.dumps(
            {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "tests": [r.to_json() for r in ordered]}, indent=1
        )
        + "\n"
    )
