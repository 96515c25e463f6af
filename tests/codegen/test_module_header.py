"""opcheck.module_header: the header codegen writes is the one the writer, the plugin and the
isolation supervisor read, whatever the spec's path and the regenerate command hold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opcheck import module_header
from opcheck.codegen import render
from opcheck.spec.loader import load_spec_text

SHA = "ab" * 32


def _spec(source: str):
    text = "op: torch.sin\nsamples:\n  - name: m\n    args: [{shape: [3]}]\n"
    spec = load_spec_text(text, source="op_specs/x.yaml")[0]
    return replace(spec, source=source, sha256=SHA)


@pytest.mark.parametrize(
    "source",
    ["op_specs/sin.yaml", 'op specs/it\'s "odd".yaml', "spécs/ünïcode.yaml", "a\nb\\c.yaml", "x. Do not edit.yaml"],
)
def test_what_codegen_writes_reads_back_exactly(tmp_path: Path, source: str):
    command = "opcheck generate --out 'gen dir' # not a comment"
    module = tmp_path / "test_x.py"
    module.write_text(render.header(_spec(source), command) + "\nx = 1\n", encoding="utf-8")
    assert module_header.read(module) == module_header.Header(source, SHA, command)
    assert module_header.starts_generated(module)


@settings(max_examples=60, deadline=None)
@given(source=st.text(min_size=1, max_size=40), command=st.text(min_size=1, max_size=40))
def test_any_source_and_command_round_trip(source: str, command: str):
    head = render.header(_spec(source), command).split("\n")
    assert len(head) == module_header.LINES
    assert module_header.parse(head) == module_header.Header(source, SHA, command)


def test_a_file_that_is_not_generated_has_no_header(tmp_path: Path):
    plain = tmp_path / "test_plain.py"
    plain.write_text("# spec sha256: " + SHA + "\n")
    assert module_header.read(plain) is None and not module_header.starts_generated(plain)
    assert module_header.read(tmp_path / "missing.py") is None
    assert not module_header.starts_generated(tmp_path / "missing.py")


def test_an_older_header_without_hash_or_command_reads_with_the_defaults():
    first = f"{module_header.MARKER} from 'op_specs/x.yaml'. Do not edit: change the spec and regenerate."
    assert module_header.parse([first]) == module_header.Header("op_specs/x.yaml", None, "opcheck generate")
    assert module_header.parse([module_header.MARKER]) == module_header.Header(None, None, "opcheck generate")
