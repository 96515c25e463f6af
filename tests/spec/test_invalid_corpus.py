"""The invalid-spec corpus: each tests/spec/invalid/<case>.yaml (or <case>/ folder, loaded as one
run) must fail with exactly the text pinned in tests/spec/invalid/<case>.expected.

After an intended change to the messages, regenerate the pinned files and review the diff:

    OPCHECK_REGEN=1 python -m pytest -q tests/spec/test_invalid_corpus.py
"""

import os
from pathlib import Path

import pytest

from opcheck.spec import SpecError, load_specs

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
CORPUS = HERE / "invalid"
REGEN = os.environ.get("OPCHECK_REGEN") == "1"


def _cases() -> list[Path]:
    # a case is a spec file or a project folder; Python's bytecode cache (written where a case's
    # module was imported) is neither
    return sorted(
        p for p in CORPUS.iterdir() if p.suffix == ".yaml" or (p.is_dir() and not p.name.startswith(("__", ".")))
    )


def _errors(case: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_specs([case], root=ROOT)
    return str(info.value) + "\n"


@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.stem)
def test_invalid_spec_reports_pinned_errors(case: Path):
    expected_file = case.with_suffix(".expected") if case.is_file() else case.with_name(case.name + ".expected")
    actual = _errors(case)
    if REGEN:
        expected_file.write_text(actual, encoding="utf-8")
    assert expected_file.exists(), f"no {expected_file.name}; regenerate with OPCHECK_REGEN=1 (see module docstring)"
    assert actual == expected_file.read_text(encoding="utf-8")


def test_corpus_is_large_and_every_pinned_file_has_its_case():
    cases = _cases()
    assert len(cases) >= 45
    pinned = {p.stem for p in CORPUS.glob("*.expected")}
    assert pinned == {c.stem if c.is_file() else c.name for c in cases}
