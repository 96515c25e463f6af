"""The committed catalog's modules: the tests the listing names, each building its spec, formatted and
lint-clean, and short.

catalog_ids.txt is the catalog as collected (`--opcheck-device all`): each node id, then a tab and its
skip/skipif/xfail marks where it has any, in collection order (a mark's torch condition is left out,
so the listing is the same on every torch). Results files and `.test_durations` are keyed
by these ids, and seeds are made from them, so a change to any of them shows here as a diff of the
listing to review. It was first written when every (device, dtype, sample) was its own
`pytest.param` line; the modules' present shape kept every id, its order and its marks, and left out
only the tests of (device, dtype) pairs that never run. A change to the catalog rewrites it:

    python tests/codegen/test_catalog_modules.py --update
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from opcheck.spec import load_specs
from opcheck.spec.case import NEVER_RUNS, CaseId
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
CATALOG_IDS = Path(__file__).with_name("catalog_ids.txt")
GENERATED = REPO / "generated_tests"
GOLDEN_EXPECTED = Path(__file__).parent / "golden" / "expected"
MAX_LINES_PER_SPEC_LINE = 5

# A pytest plugin that writes each collected test as catalog_ids.txt lists it.
ROWS_PLUGIN = """
import os


def pytest_collection_modifyitems(session, config, items):
    rows = []
    for item in items:
        marks = [f"{m.name}({m.kwargs.get('reason', '')!s}, strict={m.kwargs.get('strict')})"
                 for m in item.iter_markers() if m.name in ("skip", "skipif", "xfail")]
        rows.append(item.nodeid + ("\\t" + "; ".join(marks) if marks else ""))
    with open(os.environ["CATALOG_ROWS"], "w", encoding="utf-8") as f:
        f.write("\\n".join(rows) + "\\n")
"""


def _rows(path: Path) -> list[tuple[str, str]]:
    """(node id, marks) per line of a catalog listing."""
    return [
        tuple(line.split("\t", 1)) if "\t" in line else (line, "")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line
    ]


def collect() -> list[tuple[str, str]]:
    """The committed catalog as pytest collects it now, every device included."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "catalog_rows.py").write_text(ROWS_PLUGIN, encoding="utf-8")
        out = folder / "rows.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}
        env.update(PYTHONPATH=os.pathsep.join([str(folder), str(REPO)]), CATALOG_ROWS=str(out))
        args = ["generated_tests", "--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
        args += ["-p", "no:hypothesispytest"]  # a second of the run, for a plugin the catalog does not use
        args += ["-p", "catalog_rows", "--opcheck-device", "all", "-o", "addopts="]
        result = forked_python.run("pytest", *args, cwd=REPO, env=env)  # forked with torch imported
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return _rows(out)


@pytest.fixture(scope="module")
def collected() -> list[tuple[str, str]]:
    return collect()


def _never_runs(nodeid: str) -> bool:
    case = CaseId.from_nodeid(nodeid)
    assert case is not None, nodeid
    return (case.device, case.dtype) in NEVER_RUNS


def test_every_test_keeps_its_id_order_and_marks(collected):
    assert len(set(collected)) == len(collected), "a node id is collected twice"
    listed = _rows(CATALOG_IDS)
    if collected != listed:
        added = [row for row in collected if row not in set(listed)]
        removed = [row for row in listed if row not in set(collected)]
        pytest.fail(
            f"the catalog's tests differ from {CATALOG_IDS.name} ({len(added)} new or changed, {len(removed)} "
            f"gone or changed; order: {not added and not removed}); first new: {added[:3]}, first gone: "
            f"{removed[:3]}. If the catalog changed on purpose: python {Path(__file__).relative_to(REPO)} --update"
        )


def test_no_test_of_a_pair_that_never_runs(collected):
    assert not [nodeid for nodeid, _ in collected if _never_runs(nodeid)]
    assert any(CaseId.from_nodeid(nodeid).device == "mps" for nodeid, _ in collected)  # lowprec still has mps


def test_the_listing_itself_is_what_the_comparison_reads():
    rows = _rows(CATALOG_IDS)
    assert rows[0] == ("generated_tests/test_abs.py::test_gradcheck[cpu-float64-vector]", "")
    marked = dict(rows)["generated_tests/test_huber_loss.py::test_fwgrad_bwgrad[cpu-float64-delta_1]"]
    assert marked.startswith("xfail(huber_loss_backward has no forward-AD formula") and marked.endswith(
        "(op_specs/losses.yaml:68:9), strict=True)"
    )


def test_each_module_builds_its_spec():
    specs = {spec.name: spec for spec in load_specs([REPO / "op_specs"], root=REPO)}
    modules = sorted(GENERATED.glob("test_*.py"))
    assert [p.stem.removeprefix("test_") for p in modules] == sorted(specs)
    for path in modules:
        namespace: dict = {}
        exec(compile(path.read_bytes(), str(path), "exec"), namespace)  # noqa: S102 - the committed modules
        spec = specs[path.stem.removeprefix("test_")]
        assert namespace["SPEC"] == spec, path
        # repr() shows what == leaves out: every Location.
        assert repr(namespace["SPEC"]) == repr(spec), path


def test_generated_lines_are_at_most_five_per_spec_line():
    generated = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in GENERATED.glob("test_*.py"))
    specs = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (REPO / "op_specs").glob("*.yaml"))
    assert generated <= MAX_LINES_PER_SPEC_LINE * specs, (generated, specs)


def _ruff() -> str:
    found = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("ruff is not installed")
    return found


SETTINGS = ["--config", str(REPO / "pyproject.toml")]
# Trailing commas no longer keeping a bracket broken: then ruff decides every line break itself, and
# leaves a module alone only if its layout is the one ruff would choose.
STRICT = SETTINGS + [
    "--config",
    "format.skip-magic-trailing-comma=true",
    "--config",
    "lint.isort.split-on-trailing-comma=false",
]


@pytest.mark.parametrize(
    "command",
    [["check", *SETTINGS], ["format", "--check", "--diff", *SETTINGS], ["format", "--check", "--diff", *STRICT]],
    ids=["check", "format", "layout"],
)
def test_generated_modules_pass_ruff_with_the_project_settings(command):
    paths = [str(p) for p in sorted(GENERATED.glob("test_*.py")) + sorted(GOLDEN_EXPECTED.glob("test_*.py"))]
    # The golden folder is excluded from the project's own lint (its files are data); named
    # explicitly, they are checked like the catalog.
    result = subprocess.run([_ruff(), *command, "--no-cache", *paths], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: python {sys.argv[0]} --update  (rewrites {CATALOG_IDS.name} from the catalog)")
    rows = collect()
    CATALOG_IDS.write_text("".join(("\t".join(r) if r[1] else r[0]) + "\n" for r in rows), encoding="utf-8")
    print(f"{CATALOG_IDS}: {len(rows)} tests")
