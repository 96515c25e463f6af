"""docs/ci.md's example workflow and pre-commit config: the commands they run exist as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opcheck.cli import _parser

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "ci.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)
BLOCKS = [(m["lang"], m["body"]) for m in FENCE.finditer(DOC)]
(WORKFLOW,) = [yaml.safe_load(body) for lang, body in BLOCKS if lang == "yaml" and "\njobs:" in body]
(PRE_COMMIT_CONFIG,) = [yaml.safe_load(body) for lang, body in BLOCKS if lang == "yaml" and body.startswith("repos:")]


def expand(line: str, matrix: dict) -> list[str]:
    """A `run:` line once per value of the matrix axis it names (the line itself if none)."""
    names = re.findall(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", line)
    if not names:
        return [line]
    (name,) = set(names)
    return [re.sub(r"\$\{\{\s*matrix\.\w+\s*\}\}", str(value), line) for value in matrix[name]]


def commands() -> list[tuple[str, list[str]]]:
    """(job, argv) of every command the workflow's `run:` steps run, then the doc's other command blocks."""
    out = []
    for job_name, job in WORKFLOW["jobs"].items():
        matrix = job.get("strategy", {}).get("matrix", {})
        for step in job["steps"]:
            for line in step.get("run", "").replace("\\\n", " ").splitlines():
                out += [(job_name, shlex.split(expanded)) for expanded in expand(line, matrix) if line.strip()]
    for lang, body in BLOCKS:
        if lang == "":
            out += [("", shlex.split(line)) for line in body.splitlines() if line.strip()]
    return out


def ran(prefix: list[str]) -> list[list[str]]:
    return [argv for _, argv in commands() if argv[: len(prefix)] == prefix]


def test_workflow_validates_specs_and_checks_generated_tests_before_the_gradient_jobs():
    specs = [argv for job, argv in commands() if job == "specs"]
    assert ["opcheck", "validate"] in specs and ["opcheck", "generate", "--check"] in specs
    assert WORKFLOW["jobs"]["gradients"]["needs"] == "specs"


@pytest.mark.parametrize("argv", ran(["opcheck"]), ids="-".join)
def test_opcheck_commands_parse_with_opchecks_cli(argv, capsys):
    try:
        _parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"docs/ci.md runs `{shlex.join(argv)}`, which opcheck rejects: {capsys.readouterr().err}")


def test_pytest_options_exist_and_the_groups_cover_the_splits(tmp_path):
    help_text = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    ).stdout
    runs = ran(["python", "-m", "pytest"])
    assert runs
    for argv in runs:
        for option in {a.split("=")[0] for a in argv if a.startswith("--")}:
            assert re.search(rf"^\s+{re.escape(option)}(?=[=\s,])", help_text, re.M), f"pytest has no {option}: {argv}"
    sharded = [argv for argv in runs if "--splits" in argv]
    splits = {int(argv[argv.index("--splits") + 1]) for argv in sharded}
    groups = sorted(int(argv[argv.index("--group") + 1]) for argv in sharded)
    assert len(splits) == 1 and groups == list(range(1, splits.pop() + 1)), sharded


def test_installs_the_readmes_torch_and_an_extra_pyproject_has():
    readme_torch = re.search(r"torch==[\d.]+", (REPO / "README.md").read_text(encoding="utf-8")).group(0)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    installs = ran(["pip", "install"])
    torch = [argv for argv in installs if any(a.startswith("torch") for a in argv)]
    assert torch and all(readme_torch in argv for argv in torch), torch
    assert all(argv[argv.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu" for argv in torch)
    for argv in installs:
        for extra in re.findall(r"^\.\[(\w+)\]$", argv[-1]):
            assert extra in extras, argv


def test_uploaded_artifact_holds_the_files_the_run_writes():
    (job,) = [job for job in WORKFLOW["jobs"].values() if "--splits" in str(job)]
    uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact@")]
    (upload,) = uploads
    uploaded = set(upload["with"]["path"].split())
    written = set()
    for argv in [argv for _, argv in commands()]:
        for flag in ("--opcheck-results", "--html", "--markdown"):
            if flag in argv:
                written.add(argv[argv.index(flag) + 1])
    assert written and written <= uploaded, (written, uploaded)


def test_pre_commit_example_names_the_manifests_hooks():
    manifest = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    (repo,) = PRE_COMMIT_CONFIG["repos"]
    assert [hook["id"] for hook in repo["hooks"]] == [hook["id"] for hook in manifest]
