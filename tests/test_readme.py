"""README.md's instructions, run as written: the set-up commands CI uses and the steps of "Add an op"."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import forked_python

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```$", re.M | re.S)


def section(title: str) -> str:
    """The text of README's `## title` section, up to the next `## ` heading."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, the body dedented by the fence's indentation."""
    out = []
    for m in FENCE.finditer(text):
        indent = len(m["indent"])
        out.append((m["lang"], "".join(line[indent:] for line in m["body"].splitlines(keepends=True))))
    return out


def test_set_up_has_two_commands_and_ci_runs_the_second_in_a_fresh_venv():
    commands = [body.strip() for _, body in blocks(section("Set up"))]
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert main_job.startswith("pip install torch==2.13.0 -e '.[suite]' && ") and "opcheck generate" in main_job
    assert "python -m pytest generated_tests" in main_job
    assert tests.startswith("pip install torch==2.13.0 -e '.[test]' && ")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines(), ".ci/run must run README's test command as written"
    assert re.search(r"-m venv ", ci) and re.search(r"source .*/bin/activate", ci)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's specs, example ops, generated tests and pytest settings."""
    for name in ("op_specs", "examples", "generated_tests"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def run(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """A README command line (`opcheck ...` or `python -m pytest ...`) with this interpreter, in a
    process of its own forked with torch imported (tests/forked_python.py): what the step does, not
    what a fresh interpreter costs."""
    argv = shlex.split(line)
    if argv[0] == "opcheck":
        module, args = "opcheck", argv[1:]
    elif argv[:3] == ["python", "-m", "pytest"]:
        # without hypothesis' plugin, which README's `.[suite]` install does not have: a second of the run
        module, args = "pytest", ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", *argv[3:]]
    else:
        raise AssertionError(f"README step runs something this test does not know: {line!r}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
    return forked_python.run(module, *args, cwd=cwd, env=env, timeout=600)


@pytest.mark.long
def test_add_an_op_steps_work_as_written(project):
    text = section("Add an op")
    (_, scaffold), (lang, spec), (_, validate), (_, generate) = blocks(text)
    assert lang == "yaml"
    path = re.search(r"^2\. Edit `(op_specs/\w+\.yaml)`", text, re.M).group(1)
    name = Path(path).stem

    # 1. scaffold: the example's name is free in the catalog, so no warning
    (command,) = scaffold.strip().splitlines()
    made = run(command, project)
    assert made.returncode == 0 and made.stderr == "", made.stdout + made.stderr
    assert (project / path).is_file()
    assert run("opcheck validate", project).returncode == 0, "the scaffold validates as written"

    # 2. the complete example replaces the scaffold
    (project / path).write_text(spec, encoding="utf-8")

    # 3. it validates, and the typo README describes gives README's message
    ok = run("opcheck validate", project)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    prompt, shown = validate.strip().splitlines()
    assert prompt == "$ opcheck validate"
    typo = re.search(r"a typo such as `([^`]+)` added under `(\w+):`", " ".join(text.split()))
    assert typo, "README no longer says which typo its message comes from"
    lines = spec.splitlines()
    block = lines.index(f"{typo.group(2)}:")
    end = next((i for i in range(block + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    (project / path).write_text("\n".join(lines[:end] + [f"  {typo.group(1)}"] + lines[end:]) + "\n", encoding="utf-8")
    bad = run("opcheck validate", project)
    assert bad.returncode == 1 and shown in bad.stderr.splitlines(), bad.stderr
    (project / path).write_text(spec, encoding="utf-8")

    # 4. generate writes just the new module; pytest runs it on cpu
    first, second = generate.strip().splitlines()
    generated = run(first, project)
    assert generated.returncode == 0 and generated.stdout.startswith("1 written,"), generated.stdout
    module = project / "generated_tests" / f"test_{name}.py"
    assert module.is_file()
    ran = run(second, project)
    summary = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert re.match(r"\d+ passed", summary) and "failed" not in summary and "skipped" not in summary, summary
