"""The schema copy beside the specs: `opcheck new` refers to it relative to the spec and writes it;
`opcheck generate` keeps it fresh and `--check` reports it stale; a file opcheck did not write is
never touched."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from opcheck import cli
from opcheck.codegen.schema_copy import COPY_MARKER, SCHEMA_COPY_NAME
from opcheck.spec import schema_path


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / ".git").mkdir()  # the project root
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _reference(spec: Path) -> Path:
    match = re.match(r"# yaml-language-server: \$schema=(\S+)\n", spec.read_text())
    assert match, spec.read_text()[:200]
    return spec.parent / match[1]


def test_new_refers_to_a_copy_beside_the_spec_that_survives_moving_the_project(project, tmp_path_factory, capsys):
    assert cli.main(["new", "hypot", "--op", "torch.hypot"]) == 0
    out = capsys.readouterr().out
    assert "wrote op_specs/op_spec.schema.json (the spec format's schema, for editors)" in out
    spec = project / "op_specs" / "hypot.yaml"
    assert spec.read_text().startswith(f"# yaml-language-server: $schema={SCHEMA_COPY_NAME}\n")
    copy = json.loads(_reference(spec).read_text())
    assert copy.pop("$comment").startswith(COPY_MARKER)
    assert copy == json.loads(schema_path().read_text())  # the packaged schema, nothing else changed
    moved = tmp_path_factory.mktemp("elsewhere") / "project"
    shutil.copytree(project, moved)
    shutil.rmtree(project)
    assert _reference(moved / "op_specs" / "hypot.yaml").is_file()
    assert "op_spec.schema.json" not in (moved / "op_specs" / "hypot.yaml").read_text().split("\n", 1)[1]


def test_a_second_new_spec_leaves_a_fresh_copy_as_it_is(project, capsys):
    assert cli.main(["new", "hypot", "--op", "torch.hypot"]) == 0
    copy = project / "op_specs" / SCHEMA_COPY_NAME
    before = copy.stat().st_mtime_ns
    capsys.readouterr()
    assert cli.main(["new", "sin", "--op", "torch.sin"]) == 0
    assert "op_spec.schema.json" not in capsys.readouterr().out
    assert copy.stat().st_mtime_ns == before


def test_generate_refreshes_a_stale_copy_and_check_reports_it(project, capsys):
    assert cli.main(["new", "hypot", "--op", "torch.hypot"]) == 0
    assert cli.main(["generate"]) == 0
    copy = project / "op_specs" / SCHEMA_COPY_NAME
    fresh = copy.read_text()
    copy.write_text(fresh.replace('"title": "', '"title": "old '))  # as from another opcheck version
    capsys.readouterr()
    assert cli.main(["generate", "--check"]) == 1
    err = capsys.readouterr().err
    assert "op_specs/op_spec.schema.json is stale: opcheck's schema changed; run `opcheck generate`" in err
    assert cli.main(["generate"]) == 0  # the modules' cache is fresh: the copy is refreshed all the same
    assert copy.read_text() == fresh
    assert cli.main(["generate", "--check"]) == 0
    copy.unlink()
    capsys.readouterr()
    assert cli.main(["generate", "--check"]) == 1
    assert "op_specs/op_spec.schema.json is missing (a spec refers to it)" in capsys.readouterr().err
    assert cli.main(["generate"]) == 0 and copy.read_text() == fresh


def test_a_schema_file_opcheck_did_not_write_is_never_overwritten(project, capsys):
    (project / "op_specs").mkdir()
    mine = project / "op_specs" / SCHEMA_COPY_NAME
    mine.write_text('{"title": "my own schema"}\n')
    assert cli.main(["new", "hypot", "--op", "torch.hypot"]) == 0
    err = capsys.readouterr().err
    assert "op_specs/op_spec.schema.json was not written by opcheck" in err
    for command in (["generate"], ["generate", "--check"]):
        assert cli.main(command) == 0, command
        assert "op_spec.schema.json" not in "".join(capsys.readouterr())
    assert mine.read_text() == '{"title": "my own schema"}\n'


def test_generate_writes_no_copy_where_no_spec_refers_to_one(project, capsys):
    # This repository's own layout: specs that refer to the packaged schema by a path of their own.
    (project / "op_specs").mkdir()
    (project / "op_specs" / "tanh.yaml").write_text(
        "# yaml-language-server: $schema=../opcheck/spec/op_spec.schema.json\n"
        "op: torch.tanh\ndevices: [cpu]\nsamples:\n  - name: v\n    args: [{shape: [4]}]\n"
    )
    assert cli.main(["generate"]) == 0 and cli.main(["generate", "--check"]) == 0
    assert not (project / "op_specs" / SCHEMA_COPY_NAME).exists()
