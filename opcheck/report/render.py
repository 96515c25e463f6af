"""The coverage matrix as Markdown (built here) and as one self-contained HTML page (a Jinja2
template that only places the strings computed here; autoescaped, so a reason is always text)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import jinja2

from opcheck.report.matrix import Cell, Matrix, format_ratio
from opcheck.report.results import ERROR, FAILED

TITLE = "opcheck coverage"
_EMPTY = "-"  # a device this row has no test on
_LEGEND = ("failed", "error", "xpassed", "passed", "xfailed", "skipped")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def headline(matrix: Matrix, source: str) -> str:
    """`r.json: 568 tests of 9 ops on cpu, cuda: 142 passed, 426 skipped`."""
    outcomes = ", ".join(f"{n} {o}" for o, n in matrix.totals if n) or "nothing ran"
    devices = f" on {', '.join(matrix.devices)}" if matrix.devices else ""
    return f"{source}: {_plural(matrix.tests, 'test')} of {_plural(len(matrix.specs), 'op')}{devices}: {outcomes}"


def _device_table(matrix: Matrix) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-device summary, the last row all devices together."""
    shown = matrix.outcomes_present()
    header = ["device", "tests", *shown]
    rows = []
    for device, totals in (*matrix.device_totals, ("all", matrix.totals)):
        counts = dict(totals)
        rows.append([device, str(sum(counts.values())), *(str(counts[o]) for o in shown)])
    return header, rows


# ------------------------------------------------------------------------------------ Markdown
_MD_SPECIAL = re.compile(r"[\\`*<>\[\]|]|(?<!\w)_|_(?!\w)")


def _md(text: str) -> str:
    """Text in Markdown, table cells included: nothing in it is markup (nor raw HTML)."""
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), " ".join(text.split()))


def _code(text: str) -> str:
    if "|" in text or "\n" in text:
        return _md(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_cell(cell: Cell | None) -> str:
    if cell is None:
        return _EMPTY
    parts = [f"**{n} {o}**" if o in (FAILED, ERROR) else f"{n} {o}" for o, n in cell.counts]
    refs = "".join(f" [{n}]" for n in cell.notes)
    margin = f" ({_md(cell.margin_text)})" if cell.margin_text else ""
    return ", ".join(parts) + margin + refs


def _md_table(header: list[str], rows: list[list[str]], right: int = 0) -> list[str]:
    """right: how many trailing columns are numbers (right-aligned)."""
    align = ["---"] * (len(header) - right) + ["--:"] * right
    return ["| " + " | ".join(r) + " |" for r in (header, align, *rows)]


def render_markdown(matrix: Matrix, source: str) -> str:
    out = [f"# {TITLE}", "", _md(headline(matrix, source)) + ".", ""]
    header, rows = _device_table(matrix)
    out += _md_table(header, [[_md(c) for c in r] for r in rows], right=len(header) - 1)
    out += [
        "",
        "## Matrix",
        "",
        "One row per op, check and dtype; a cell counts the row's samples on one device; [n] is a note below."
        + (f" {_MARGIN_WORDS}" if matrix.margins else ""),
        "",
    ]
    table, previous = [], None
    for row in matrix.rows:
        label = "" if row.spec == previous else _md(row.spec) + (f" ({_code(row.op)})" if row.op else "")
        previous = row.spec
        table.append([label, _md(row.check), _md(row.dtype), *(_md_cell(c) for c in row.cells)])
    out += _md_table(["op", "check", "dtype", *map(_md, matrix.devices)], table)
    if matrix.notes:
        out += ["", "## Notes", ""]
        for note in matrix.notes:
            out.append(f"{note.number}. {note.outcome}, {_plural(note.tests, 'test')}: {_md(note.text)}")
            indent = " " * len(f"{note.number}. ")  # a nested list under the item
            if note.worst:
                out.append(f"{indent}- worst entry: {_code(note.worst)}")
            out += [f"{indent}- hint: {_md(hint)}" for hint in note.hints]
    if matrix.failures:
        out += ["", "## Failures", ""]
        out += [
            f"- {result.outcome}: {_code(result.nodeid)}" + (f" [{number}]" if number else "")
            for result, number in matrix.failures
        ]
    if matrix.closest:
        out += ["", "## Closest passes", "", _md(closest_words(matrix)), ""]
        rows = [[format_ratio(r.margin or 0.0), _code(r.nodeid), _md(r.margin_where) or _EMPTY] for r in matrix.closest]
        out += _md_table(["error / allowed", "test", "comparison"], rows)
    return "\n".join(out) + "\n"


_MARGIN_WORDS = (
    "A passing cell's (x of bound) is how close its closest pass came: the largest error / allowed "
    "among the comparisons its tests made (1 would fail)."
)


def closest_words(matrix: Matrix) -> str:
    """What the closest-passes list is, and how much of the run it shows."""
    shown = len(matrix.closest)
    of = f"the {shown} closest of {matrix.margins} passes" if matrix.margins > shown else "every pass"
    return (
        f"The passes that came closest to failing, closest first ({of} with a recorded margin): the worst "
        "error / allowed among a test's comparisons, and which comparison it was."
    )


# ------------------------------------------------------------------------------------ HTML
@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _html_cell(cell: Cell | None) -> dict:
    if cell is None:
        return {"css": "none", "text": _EMPTY, "margin": "", "title": "no test", "notes": [], "strong": False}
    return {
        "css": cell.status,
        "text": cell.text,
        "margin": cell.margin_text,
        "title": cell.title,
        "notes": list(cell.notes),
        "strong": cell.status in (FAILED, ERROR),
    }


def _html_rows(matrix: Matrix) -> list[dict]:
    group_sizes: dict[str, int] = {}
    for row in matrix.rows:
        group_sizes[row.spec] = group_sizes.get(row.spec, 0) + 1
    rows, previous = [], None
    for row in matrix.rows:
        first = row.spec != previous
        previous = row.spec
        rows.append(
            {
                "rowspan": group_sizes[row.spec] if first else 0,  # 0: the op cell of the row above spans this one
                "spec": row.spec,
                "op": row.op,
                "op_title": " ".join(p for p in (row.op, f"({row.source})" if row.source else "") if p) or row.spec,
                "check": row.check,
                "dtype": row.dtype,
                "cells": [_html_cell(c) for c in row.cells],
            }
        )
    return rows


_OPEN_MESSAGES = 10
"""Up to this many failures, their messages are shown open; beyond, each opens on a click."""


def _html_notes(matrix: Matrix) -> list[dict]:
    """Each note, with a link to the first of its tests under Failures, where their messages are."""
    first_failure: dict[int, int] = {}
    for i, (_, number) in enumerate(matrix.failures, start=1):
        if number:
            first_failure.setdefault(number, i)
    return [
        {
            "number": n.number,
            "outcome": n.outcome,
            "tests": _plural(n.tests, "test"),
            "text": n.text,
            "worst": n.worst,
            "hints": list(n.hints),
            "failure": first_failure.get(n.number, 0),
            "failure_link": "the failing test" if n.tests == 1 else f"the {n.tests} failing tests",
        }
        for n in matrix.notes
    ]


def _html_failures(matrix: Matrix) -> list[dict]:
    """One per failed or errored test: its node id, its note, and its whole message where the results have it."""
    return [
        {
            "id": i,
            "outcome": r.outcome,
            "nodeid": r.nodeid,
            "note": number or 0,
            "message": r.message,
            "lines": _plural(len(r.message.splitlines()), "line"),
            "open": len(matrix.failures) <= _OPEN_MESSAGES,
        }
        for i, (r, number) in enumerate(matrix.failures, start=1)
    ]


def render_html(matrix: Matrix, source: str) -> str:
    header, device_rows = _device_table(matrix)
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            title=f"{TITLE}: {source}",
            heading=TITLE,
            headline=headline(matrix, source),
            summary_header=header,
            summary_rows=device_rows,
            legend=list(_LEGEND),
            devices=list(matrix.devices),
            rows=_html_rows(matrix),
            notes=_html_notes(matrix),
            failures=_html_failures(matrix),
            margin_words=_MARGIN_WORDS if matrix.margins else "",
            closest=[
                {"ratio": format_ratio(r.margin or 0.0), "nodeid": r.nodeid, "where": r.margin_where}
                for r in matrix.closest
            ],
            closest_words=closest_words(matrix),
        )
    )
