"""`[tool.opcheck] compile` in pyproject.toml: every spec without a `compile:` key of its own gets
`compile` tests (true) or none (false, the default); `opcheck generate`, `list`, `validate` and
`generate --check` see the specs the setting makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from opcheck import config as project_config
from tests.cli.test_project_config import run

TANH = "op: torch.tanh\ndevices: [cpu]\nsamples:\n  - name: v\n    args: [{shape: [4]}]\n"
PYPROJECT = '[project]\nname = "kernels"\n\n[tool.opcheck]\nspecs = "specs"\nout = "generated"\n'


def project(folder: Path, setting: str | None, spec: str = TANH) -> Path:
    """A project with one spec (tanh.yaml) and, where `setting` is given, `compile = <setting>`."""
    table = PYPROJECT + (f"compile = {setting}\n" if setting is not None else "")
    (folder / "pyproject.toml").write_text(table)
    (folder / "specs").mkdir(exist_ok=True)
    (folder / "specs" / "tanh.yaml").write_text(spec)
    return folder


def generated(folder: Path) -> str:
    return (folder / "generated" / "test_tanh.py").read_text()


@pytest.mark.parametrize("setting", [None, "false"])
def test_without_the_setting_or_with_it_false_a_spec_without_the_key_has_no_compile_tests(
    tmp_path, monkeypatch, capsys, setting
):
    project(tmp_path, setting)
    status, _, err = run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    assert "def test_gradcheck(" in generated(tmp_path) and "test_compile" not in generated(tmp_path)


def test_with_the_setting_true_every_spec_without_the_key_gets_compile_tests(tmp_path, monkeypatch, capsys):
    project(tmp_path, "true")
    status, _, err = run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    module = generated(tmp_path)
    assert "compile=CompileFlags()" in module and "def test_compile(" in module
    status, out, _ = run("list", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0 and "compile" in out.splitlines()[1].split()[3].split(",")


def test_a_specs_own_key_wins_over_the_setting(tmp_path, monkeypatch, capsys):
    project(tmp_path, "true", TANH + "compile: false\n")
    status, _, err = run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    assert "test_compile" not in generated(tmp_path)
    mapping = TANH + "compile: {backends: [inductor]}\n"
    project(tmp_path, "true", mapping)
    assert run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    assert "compile=CompileFlags(backends=('inductor',))" in generated(tmp_path).replace('"', "'")


def test_changing_the_setting_makes_the_modules_stale_and_the_next_generate_writes_them(tmp_path, monkeypatch, capsys):
    project(tmp_path, None)
    assert run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    project(tmp_path, "true")
    status, out, err = run("generate", "--check", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 1 and "is stale" in err and "test_compile" in out
    # the cache recorded the run under the other setting: this one writes
    status, out, err = run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0 and out.startswith("1 written"), out + err
    assert "def test_compile(" in generated(tmp_path)
    status, out, _ = run("generate", "--check", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0 and "is up to date" in out


@pytest.mark.parametrize("value, shown", [('"yes"', "'yes'"), ("1", "1")])
def test_a_value_other_than_true_or_false_is_named_with_its_line(tmp_path, monkeypatch, capsys, value, shown):
    project(tmp_path, value)
    message = f"pyproject.toml:7: [tool.opcheck] compile: expected true or false, got {shown}"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(project_config.ConfigError) as raised:
        project_config.load(tmp_path)
    assert str(raised.value) == message
    status, _, err = run("generate", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and err.startswith(f"opcheck: {message}")
    assert "Traceback" not in err and not (tmp_path / "generated").exists()


def test_generate_from_outside_the_project_reads_the_projects_setting(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "kernels"
    folder.mkdir()
    project(folder, "true")
    status, _, err = run(
        "generate",
        "--specs",
        "kernels/specs",
        "--out",
        "kernels/generated",
        cwd=tmp_path,
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert status == 0, err
    assert "def test_compile(" in generated(folder)
