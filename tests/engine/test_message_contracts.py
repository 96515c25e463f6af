"""No room reads the engine's messages back: outside opcheck/engine, no regular expression in
opcheck's code matches the engine's words.

What a failure names is handed over as values (opcheck.failure_facts); the messages are for people.
The test collects the engine's messages from real failures, finds every regular expression written
out in opcheck's modules outside the engine, and fails on one that matches a line of those messages
by its literal words (a pattern of character classes alone, such as a file-name filter, says
nothing about the engine's words).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from test_failure_facts import _wrong_backward

import opcheck
from opcheck.engine.lowprec.check import lowprec_report

try:  # Python 3.11+
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_parse  # type: ignore[no-redef]

PACKAGE = Path(opcheck.__file__).parent
ENGINE = PACKAGE / "engine"
RE_FUNCTIONS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split"}
WORD = re.compile(r"[A-Za-z]{3,}")


def regex_literals(source: str) -> list[tuple[int, str]]:
    """(line, pattern) of each `re.<function>(<string literal>, ...)` in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.func.attr in RE_FUNCTIONS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def literal_runs(pattern: str) -> list[str]:
    """The runs of literal characters in a pattern ("worst entries" in r"worst entries\\b.*:")."""
    runs: list[str] = []

    def walk(items) -> None:
        run = ""
        for op, arg in items:
            if op == sre_parse.LITERAL:
                run += chr(arg)
                continue
            runs.append(run)
            run = ""
            if op == sre_parse.SUBPATTERN:
                walk(arg[-1])
            elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
                walk(arg[2])
            elif op == sre_parse.BRANCH:
                for branch in arg[1]:
                    walk(branch)
        runs.append(run)

    walk(sre_parse.parse(pattern))
    return [r for r in runs if WORD.search(r)]


def reads_engine_words(pattern: str, lines: list[str]) -> str | None:
    """The first line of the engine's messages the pattern finds by one of its literal words; None if none."""
    compiled, runs = re.compile(pattern), literal_runs(pattern)
    if not runs:
        return None
    for line in lines:
        found = compiled.search(line)
        if found and any(run in line for run in runs):
            return line
    return None


# ------------------------------------------------------------------------- the engine's words
def _message(check, *args, **kwargs) -> str:
    with pytest.raises((opcheck.GradcheckError, AssertionError)) as info:
        check(*args, **kwargs)
    return str(info.value)


@pytest.fixture(scope="module")
def engine_lines() -> list[str]:
    """Lines of the engine's messages: a wrong entry in each mode, a projection report, a low-precision part."""
    x, y = (torch.linspace(0.5, 1.5, 6, dtype=torch.float64).requires_grad_() for _ in range(2))
    big = tuple(torch.linspace(0.5, 1.5, 400, dtype=torch.float64).requires_grad_() for _ in range(2))
    wrong = _wrong_backward()
    messages = [_message(opcheck.gradcheck, wrong, (x, y), fast_mode=mode) for mode in (False, True, "auto")]
    messages.append(_message(opcheck.gradcheck, _wrong_backward(), big, fast_mode="auto", jacobian_budget=1000))
    low = tuple(torch.linspace(1, 2, 64, dtype=torch.float32).requires_grad_() for _ in range(2))
    report = lowprec_report(_wrong_backward(scale=1.001), low, reference=lambda a, b: a * b)
    assert report.error is not None
    messages.append(str(report.error))
    lines = [line for message in messages for line in message.splitlines() if line.strip()]
    assert any(line.startswith("hint: ") for line in lines) and any("worst entries" in line for line in lines)
    return lines


def _modules_outside_the_engine() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if ENGINE not in p.parents)


def test_no_regular_expression_outside_the_engine_reads_its_messages(engine_lines):
    offenders = []
    for path in _modules_outside_the_engine():
        for lineno, pattern in regex_literals(path.read_text(encoding="utf-8")):
            line = reads_engine_words(pattern, engine_lines)
            if line is not None:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {pattern!r} reads {line!r}")
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_patterns_that_read_the_engine_s_words(engine_lines):
    source = 'import re\nA = re.compile(r"worst entries\\b.*:")\nB = re.findall(r"\\binputs? (\\d+)\\b", text)\n'
    found = regex_literals(source)
    assert [lineno for lineno, _ in found] == [2, 3]
    assert all(reads_engine_words(pattern, engine_lines) is not None for _, pattern in found)
    # character classes alone, or words the engine never writes, read nothing of it
    assert reads_engine_words(r"[^A-Za-z0-9_.-]+", engine_lines) is None
    assert reads_engine_words(r"^\s*\[\s*tool\s*\.\s*opcheck\s*\]", engine_lines) is None
    assert len(_modules_outside_the_engine()) > 50
