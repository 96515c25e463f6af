"""Markdown (exact) and HTML (self-contained, escaped) renderings of the matrix."""

import re
from html.parser import HTMLParser

from report_samples import GOLDEN_MARKDOWN, RESULTS, result

from opcheck.report import build_matrix, render_html, render_markdown
from opcheck.report.render import _code, _md


def test_markdown_golden():
    assert render_markdown(build_matrix(RESULTS), "results.json") == GOLDEN_MARKDOWN


def test_markdown_without_failures_or_notes_has_no_such_sections():
    text = render_markdown(build_matrix([result("sin", "gradcheck", "cpu", "float64", "a", "passed")]), "r.xml")
    assert "## Notes" not in text and "## Failures" not in text
    assert "r.xml: 1 test of 1 op on cpu: 1 passed." in text
    assert "| sin (`torch.sin`) | gradcheck | float64 | 1 passed |" in text


def test_markdown_escaping_keeps_text_text():
    assert _md("a|b <script>alert(1)</script> *x* [l](u) `c` \\ is_available _x_") == (
        r"a\|b \<script\>alert(1)\</script\> \*x\* \[l\](u) \`c\` \\ is_available \_x\_"
    )
    assert _md("two\nlines") == "two lines"
    assert _code("torch.ops.aten.mul.Tensor") == "`torch.ops.aten.mul.Tensor`"
    assert _code("a`b") == "``a`b``"
    assert _code("a|b") == r"a\|b"


class _Collector(HTMLParser):
    """Tags, attributes and text of a page; checks that every opened element is closed."""

    VOID = {"meta", "br", "link", "img", "hr", "input"}

    def __init__(self):
        super().__init__()
        self.open, self.tags, self.attrs, self.text, self.errors = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if not self.open or self.open.pop() != tag:
            self.errors.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> _Collector:
    collector = _Collector()
    collector.feed(page)
    collector.close()
    assert not collector.errors and not collector.open, (collector.errors, collector.open)
    return collector


def test_html_is_one_self_contained_page():
    page = render_html(build_matrix(RESULTS), "results.json")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert not re.search(r"https?://|<script|<link|@import|url\(", page)
    html = parse(page)
    assert html.tags.count("style") == 1 and "script" not in html.tags
    # every href is an in-page anchor
    assert all(value.startswith(("#note-", "#failure-")) for name, value in html.attrs if name == "href")


def test_html_says_everything_in_text_and_tooltips():
    page = render_html(build_matrix(RESULTS), "results.json")
    html = parse(page)
    text = " ".join(" ".join(html.text).split())
    assert "results.json: 10 tests of 2 ops on cpu, cuda: 1 failed, 3 passed, 4 skipped, 1 xfailed, 1 error" in text
    assert "1 failed, 1 passed 4" in text  # the cell's words and its note number, readable without colour
    titles = [value for name, value in html.attrs if name == "title"]
    assert "1 failed, 1 passed\n1 failed (b): CheckFailed: lowprec | atol=1e-2 <off>" in titles
    assert "torch.sin (op_specs/sin.yaml)" in titles
    assert '<td class="failed" title="1 failed, 1 passed' in page
    assert (
        '<li id="note-3" value="3"><span class="outcome skipped">skipped</span> 4 tests: cuda is not available' in page
    )
    assert "<code>generated_tests/test_sin.py::test_lowprec[cpu-bfloat16-b]</code>" in page
    assert 'rowspan="2"' in page


def test_html_escapes_a_malicious_reason_everywhere():
    evil = '<script>alert(1)</script>" onmouseover="alert(2)'
    results = [
        result("sin", "gradcheck", "cpu", "float64", "a", "failed", evil),
        result("sin", "gradcheck", "cpu", "float64", "b", "skipped", evil),
        result("x<b>", "gradcheck", "cpu", "float64", "a", "passed", op="<img src=x onerror=alert(3)>"),
    ]
    page = render_html(build_matrix(results), "<r>.json")
    assert "<script>" not in page and "<img" not in page and "<b>" not in page
    assert 'onmouseover="' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34; onmouseover=&#34;alert(2)" in page
    html = parse(page)
    assert "script" not in html.tags and "img" not in html.tags
    assert evil in " ".join(html.text)  # shown as text
    assert not any(name.startswith("on") for name, _ in html.attrs)
