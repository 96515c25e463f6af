""".pre-commit-hooks.yaml, used as a project would: pre-commit runs both hooks on a scratch repo.

The hooks repo is a scratch git repo holding this checkout's manifest, committed there: pre-commit
reads a hooks repo's committed state, and `pre-commit try-repo` commits only staged and tracked
files (`git add -u`), so a manifest not yet committed here would not be the one tested.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / ".pre-commit-hooks.yaml"
SPEC = "op_specs/sin.yaml"
MODULE = "generated_tests/test_sin.py"
VALIDATE = "opcheck validate"
GENERATE_CHECK = "opcheck generate --check"
# pre-commit's status line for a hook: its name padded with dots, then the verdict.
STATUS = re.compile(r"^(?P<name>.+?)\.{3,}(?:\([^)]*\))?(?P<status>Passed|Failed|Skipped)$", re.M)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """This interpreter's bin first on PATH (the `opcheck` a system hook runs), git and pre-commit
    isolated from the user's configuration and caches."""
    if importlib.util.find_spec("pre_commit") is None:
        pytest.fail("pre-commit is not installed: it is in the test extra, pip install -e '.[test]'", pytrace=False)
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT", "OPCHECK_", "PYTEST_"))}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PRE_COMMIT_HOME=str(home / "pre-commit"),
        GIT_CONFIG_GLOBAL=str(home / "gitconfig"),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="opcheck",
        GIT_AUTHOR_EMAIL="opcheck@example.invalid",
        GIT_COMMITTER_NAME="opcheck",
        GIT_COMMITTER_EMAIL="opcheck@example.invalid",
    )
    (home / "gitconfig").write_text("[init]\n\tdefaultBranch = main\n", encoding="utf-8")
    return env


def sh(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def ok(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = sh(argv, cwd, env)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


def commit_all(repo: Path, env: dict[str, str], message: str) -> str:
    ok(["git", "add", "-A"], repo, env)
    ok(["git", "commit", "-q", "-m", message], repo, env)
    return ok(["git", "rev-parse", "HEAD"], repo, env).strip()


@pytest.fixture(scope="module")
def committed(tmp_path_factory, env) -> Path:
    """A project with one spec, its generated module and a .pre-commit-config.yaml using both hooks,
    all committed."""
    hooks = tmp_path_factory.mktemp("hooks")
    ok(["git", "init", "-q"], hooks, env)
    shutil.copy(MANIFEST, hooks / ".pre-commit-hooks.yaml")
    rev = commit_all(hooks, env, "hooks")

    project = tmp_path_factory.mktemp("project")
    ok(["git", "init", "-q"], project, env)
    (project / "op_specs").mkdir()
    shutil.copy(REPO / SPEC, project / SPEC)
    ok(["opcheck", "generate"], project, env)
    assert (project / MODULE).is_file()
    (project / "README.md").write_text("A project with op specs.\n", encoding="utf-8")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hooks.as_posix()}\n    rev: {rev}\n    hooks:\n"
        "      - id: opcheck-validate\n      - id: opcheck-generate-check\n",
        encoding="utf-8",
    )
    commit_all(project, env, "specs and generated tests")
    return project


@pytest.fixture
def project(committed, tmp_path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(committed, copy, symlinks=True)
    return copy


def pre_commit(project: Path, env: dict[str, str], *args: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """pre-commit's exit status and, per hook name, its verdict and the output printed under it."""
    done = sh([sys.executable, "-m", "pre_commit", "run", "--color", "never", *args], project, env)
    out = done.stdout + done.stderr
    lines = list(STATUS.finditer(out))
    hooks = {}
    for m, after in zip(lines, [*lines[1:], None]):
        hooks[m["name"]] = (m["status"], out[m.end() : after.start() if after else len(out)])
    assert set(hooks) == {VALIDATE, GENERATE_CHECK}, out
    return done.returncode, hooks


def edit(project: Path, env: dict[str, str], old: str, new: str) -> None:
    """Change the spec and stage it, as `git commit` would see it."""
    path = project / SPEC
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    ok(["git", "add", SPEC], project, env)


def test_manifest_declares_both_hooks_as_system_hooks_on_opchecks_files():
    hooks = {hook["id"]: hook for hook in yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))}
    assert set(hooks) == {"opcheck-validate", "opcheck-generate-check"}
    assert hooks["opcheck-validate"]["entry"] == "opcheck validate"
    assert hooks["opcheck-generate-check"]["entry"] == "opcheck generate --check"
    for hook in hooks.values():
        assert hook["language"] == "system" and hook["pass_filenames"] is False
        assert re.search(hook["files"], SPEC)
    assert re.search(hooks["opcheck-generate-check"]["files"], MODULE)
    assert not re.search(hooks["opcheck-validate"]["files"], MODULE)


def test_fresh_tree_passes_both_hooks_and_unrelated_changes_skip_them(project, env):
    status, hooks = pre_commit(project, env, "--all-files")
    assert status == 0 and hooks[VALIDATE][0] == hooks[GENERATE_CHECK][0] == "Passed", hooks

    (project / "README.md").write_text("Edited.\n", encoding="utf-8")
    ok(["git", "add", "README.md"], project, env)
    status, hooks = pre_commit(project, env)
    assert status == 0 and hooks[VALIDATE][0] == hooks[GENERATE_CHECK][0] == "Skipped", hooks


def test_spec_changed_without_regenerating_fails_generate_check_naming_the_module(project, env):
    edit(project, env, "check_fwd_over_rev: true", "check_fwd_over_rev: false")
    status, hooks = pre_commit(project, env)
    assert status == 1
    assert hooks[VALIDATE][0] == "Passed", hooks
    verdict, output = hooks[GENERATE_CHECK]
    assert verdict == "Failed"
    assert f"+++ b/{MODULE}" in output and "run `opcheck generate`" in output, output


def test_broken_spec_fails_validate_with_file_line_column_and_key(project, env):
    edit(project, env, "  check_forward_ad: true\n", "  check_forward_ad: true\n  nondet_tl: 1.0e-12\n")
    line = (project / SPEC).read_text(encoding="utf-8").splitlines().index("  nondet_tl: 1.0e-12") + 1
    status, hooks = pre_commit(project, env)
    assert status == 1
    verdict, output = hooks[VALIDATE]
    assert verdict == "Failed"
    assert f"{SPEC}:{line}:3: gradcheck.nondet_tl: unknown key 'nondet_tl'" in output, output
