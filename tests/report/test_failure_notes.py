"""A failing test's note says what failed, where (its worst entry) and what to look at (its hints);
the Failures section holds the whole messages and does not say the notes again."""

import json
import re
from html.parser import HTMLParser

import pytest
from report_modules import module
from report_samples import result

from opcheck.cli import main
from opcheck.report import build_matrix, load_results, render_html, render_markdown

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
        return 3 * g * x  # 1.5 times the gradient


def square_wrong(x):
    return _SquareWrong.apply(x)


def sin_via_bfloat16(x):
    # the float32 kernel computes in bfloat16
    return torch.sin(x.to(torch.bfloat16)).to(x.dtype) if x.dtype == torch.float32 else torch.sin(x)
"""

SQ = module(
    "OpSpec(name='sq', op='wrong_ops:square_wrong', source='op_specs/sq.yaml', sha256='0', "
    "samples=(Sample('vec', args=(TensorArg(shape=(4,)),)),), gradcheck=GradcheckFlags(check_batched_grad=False))",
    {"gradcheck": [("cpu", "float64", "vec")]},
)
LP = module(
    "OpSpec(name='lp', op='wrong_ops:sin_via_bfloat16', source='op_specs/lp.yaml', sha256='0', "
    "samples=(Sample('vec', args=(TensorArg(shape=(40,)),)),), lowprec_dtypes=('float32',))",
    {"lowprec": [("cpu", "float32", "vec")]},
)

ENGINE_WORST = "d output 0 / d input 0, d out["
ENGINE_HINT = "analytical ≈ 1.5 × numerical everywhere: a constant factor is missing or extra"
LOWPREC_WORST = "output 0, ["
LOWPREC_HINT = "errors of the size of bfloat16 rounding"


class _Sections(HTMLParser):
    """The text of each note (`<li id="note-N">`) and of the Failures list, outside and inside <pre>."""

    def __init__(self):
        super().__init__()
        self.notes: dict[str, list[str]] = {}
        self.failures: list[str] = []
        self.messages: list[str] = []
        self._where = None
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "li" and (attrs.get("id") or "").startswith("note-"):
            self._where = self.notes.setdefault(attrs["id"], [])
        elif tag == "ul" and attrs.get("class") == "failures":
            self._where = self.failures
        elif tag == "pre":
            self._in_pre = True

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_pre = False
        elif tag == "ul" or (tag == "li" and self._where is not self.failures):  # a note ends with its <li>
            self._where = None

    def handle_data(self, data):
        if self._in_pre:
            self.messages.append(data)
        elif self._where is not None:
            self._where.append(data)


def sections(page: str) -> _Sections:
    parsed = _Sections()
    parsed.feed(page)
    parsed.close()
    return parsed


def _text(parts) -> str:
    return " ".join(" ".join(parts).split())


@pytest.fixture
def failing(pytester):
    pytester.syspathinsert()
    pytester.makepyfile(wrong_ops=WRONG_OPS, test_sq=SQ, test_lp=LP)
    return pytester


@pytest.mark.long
@pytest.mark.parametrize("xdist", [False, True])
def test_results_record_the_worst_entry_and_hints_of_each_failure(failing, xdist):
    if xdist:
        pytest.importorskip("xdist")
    runner = failing.runpytest_subprocess if xdist else failing.runpytest
    runner("--opcheck-results", "r.json", *(["-n", "2"] if xdist else [])).assert_outcomes(failed=2)
    records = {r["nodeid"]: r for r in json.loads((failing.path / "r.json").read_text())["tests"]}
    sq = records["test_sq.py::test_gradcheck[cpu-float64-vec]"]
    lp = records["test_lp.py::test_lowprec[cpu-float32-vec]"]
    assert sq["worst"].startswith(ENGINE_WORST) and "abs err" in sq["worst"]
    assert sq["hint"].startswith(ENGINE_HINT)
    assert lp["worst"].startswith(LOWPREC_WORST) and "baseline error" in lp["worst"]
    assert lp["hint"].startswith(LOWPREC_HINT)
    for record in (sq, lp):  # the whole message, as pytest reports it
        assert record["message"].startswith(record["reason"] + "\n")
        assert "worst entries" in record["message"] and "\nhint: " in record["message"]


def test_html_notes_show_the_worst_entry_and_hint_and_failures_do_not_repeat_them(failing):
    failing.runpytest("--opcheck-results", "r.json").assert_outcomes(failed=2)
    assert main(["report", str(failing.path / "r.json"), "--html", str(failing.path / "c.html")]) == 0
    page = (failing.path / "c.html").read_text()
    parsed = sections(page)
    notes = [_text(parts) for parts in parsed.notes.values()]
    (engine,) = [n for n in notes if "opcheck gradcheck failed" in n]
    (lowprec,) = [n for n in notes if "opcheck lowprec failed" in n]
    assert f"worst entry: {ENGINE_WORST}" in engine and f"hint: {ENGINE_HINT}" in engine
    assert f"worst entry: {LOWPREC_WORST}" in lowprec and f"hint: {LOWPREC_HINT}" in lowprec
    # Failures: each test's node id and a link to its note; the whole message only in its <pre>
    failures = _text(parsed.failures)
    assert "test_sq.py::test_gradcheck[cpu-float64-vec]" in failures
    assert "opcheck gradcheck failed" not in failures and "opcheck lowprec failed" not in failures
    assert "worst entry" not in failures and "hint" not in failures
    messages = "".join(parsed.messages)
    assert messages.count("opcheck gradcheck failed for wrong_ops:square_wrong") == 1
    assert "rerun:" in messages and "worst entries:" in messages
    # each note links to its test under Failures, which links back
    assert len(re.findall(r'href="#failure-\d+"', page)) == 2 and len(re.findall(r'id="failure-\d+"', page)) == 2


def test_failures_of_results_without_messages_list_the_tests_only():
    """A results file of version 1 (or JUnit XML) has only each failure's first line: the note says it."""
    reason = "CheckFailed: opcheck gradcheck failed for torch.sin on cpu/float64, sample 'b'"
    results = [result("sin", "gradcheck", "cpu", "float64", "b", "failed", reason)]
    parsed = sections(render_html(build_matrix(results), "r.json"))
    (note,) = parsed.notes.values()
    assert reason in _text(note) and "worst entry" not in _text(note)
    assert reason not in _text(parsed.failures) and not parsed.messages
    assert "generated_tests/test_sin.py::test_gradcheck[cpu-float64-b]" in _text(parsed.failures)


def test_markdown_notes_list_the_worst_entry_and_hints():
    failed = result("sin", "gradcheck", "cpu", "float64", "b", "failed", "CheckFailed: boom")
    results = [
        type(failed)(**{**failed.__dict__, "worst": "d out[1] / d in[1]: analytical 2, numerical 1", "hint": "h1\nh2"})
    ]
    text = render_markdown(build_matrix(results), "r.json")
    assert (
        "1. failed, 1 test: CheckFailed: boom\n"
        "   - worst entry: `d out[1] / d in[1]: analytical 2, numerical 1`\n"
        "   - hint: h1\n"
        "   - hint: h2\n"
    ) in text


def test_a_version_1_results_file_still_reads(tmp_path):
    record = {
        "nodeid": "generated_tests/test_sin.py::test_gradcheck[cpu-float64-a]",
        "spec": "sin",
        "op": "torch.sin",
        "source": "op_specs/sin.yaml",
        "check": "gradcheck",
        "device": "cpu",
        "dtype": "float64",
        "sample": "a",
        "outcome": "failed",
        "reason": "CheckFailed: boom",
        "duration": 0.5,
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": "opcheck-results", "version": 1, "tests": [record]}))
    (r,) = load_results(path)
    assert (r.outcome, r.reason, r.worst, r.hint, r.message) == ("failed", "CheckFailed: boom", "", "", "")
