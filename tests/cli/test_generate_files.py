"""What `opcheck generate` does to files: which modules it may overwrite or delete, what it refuses
at a module's path, the modes it gives, how it reports a failed write, the temporary files it
cleans up, and that neither the working directory nor a CRLF checkout changes a byte."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opcheck import cli
from opcheck.codegen import GenerationError, apply_plan, plan_generation
from opcheck.codegen.write import generated_source, remove_stale_temp_files
from opcheck.spec import load_specs
from opcheck.spec import model as M
from opcheck.spec.loader import spec_sha256
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
SAMPLE = "devices: [cpu]\nsamples: [{name: v, args: [{shape: [3]}]}]\n"
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX file kinds and modes")


def opcheck(*args, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m opcheck ARGS` in `cwd`, in a process of its own forked with torch imported
    (tests/forked_python.py)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # a hang (a FIFO opened) fails instead of stalling the suite
    return forked_python.run("opcheck", *args, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    specs = tmp_path / "op_specs"
    specs.mkdir()
    (specs / "tanh.yaml").write_text("op: torch.tanh\n" + SAMPLE)
    (specs / "sin.yaml").write_text("op: torch.sin\n" + SAMPLE)
    return tmp_path


def _load(project: Path, *names: str):
    folder = project / "op_specs"
    return load_specs([folder / n for n in names] if names else [folder], root=project)


def _generate(project: Path, *names: str, out: str = "generated_tests"):
    plan = plan_generation(_load(project, *names), project / out, root=project)
    apply_plan(plan)
    return plan


@contextlib.contextmanager
def _no_hang(seconds: int = 30):
    """Fail, rather than wait forever, if the block blocks (opening a FIFO would)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def alarm(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- which modules a run may delete or overwrite (defect 10) --------------------------------------


def test_a_subset_of_specs_deletes_nothing_of_the_others(project):
    _generate(project)
    plan = _generate(project, "sin.yaml")
    assert plan.delete == [] and plan.is_fresh
    assert sorted(p.name for p in (project / "generated_tests").iterdir()) == ["test_sin.py", "test_tanh.py"]


def test_a_module_is_deleted_when_its_spec_file_is_gone(project):
    _generate(project)
    (project / "op_specs" / "tanh.yaml").unlink()
    plan = _generate(project, "sin.yaml")  # even by a run that was not given that spec
    assert [p.name for p in plan.delete] == ["test_tanh.py"]
    assert not (project / "generated_tests" / "test_tanh.py").exists()


def test_a_module_is_deleted_when_its_given_spec_file_no_longer_defines_it(project):
    family = project / "op_specs" / "trig.yaml"
    family.write_text(
        "defaults:\n  devices: [cpu]\n  samples: [{name: v, args: [{shape: [3]}]}]\n"
        "ops:\n  - op: torch.cos\n  - op: torch.tan\n"
    )
    _generate(project)
    family.write_text(family.read_text().replace("  - op: torch.tan\n", ""))
    plan = _generate(project, "trig.yaml")
    assert [p.name for p in plan.delete] == ["test_tan.py"]
    # a spec file not given keeps its modules whatever it says now: that run did not read it
    family.write_text(family.read_text().replace("torch.cos", "torch.cosh"))
    assert _generate(project, "sin.yaml").delete == []
    assert (project / "generated_tests" / "test_cos.py").exists()


def test_out_into_a_folder_of_other_specs_modules_never_clobbers_them(project):
    _generate(project)
    other = project / "other_specs"
    other.mkdir()
    (other / "cube.yaml").write_text("op: torch.exp\nname: cube\n" + SAMPLE)
    plan = plan_generation(load_specs([other], root=project), project / "generated_tests", root=project)
    assert plan.delete == [] and [p.name for p in plan.write] == ["test_cube.py"]  # op_specs' modules stay

    (other / "sin.yaml").write_text("op: torch.sinh\nname: sin\n" + SAMPLE)
    with pytest.raises(GenerationError) as info:
        plan_generation(load_specs([other], root=project), project / "generated_tests", root=project)
    assert str(info.value) == (
        f"{project / 'generated_tests' / 'test_sin.py'} was generated from op_specs/sin.yaml, which still exists, "
        f"and other_specs/sin.yaml now claims its name 'sin': rename one of the two specs (`name:`), delete "
        f"op_specs/sin.yaml if the spec moved, or generate into another folder (--out)"
    )
    assert "torch.sin," in (project / "generated_tests" / "test_sin.py").read_text()


def test_a_spec_that_moved_to_another_file_takes_its_module_over(project):
    _generate(project)
    specs = project / "op_specs"
    (specs / "sin.yaml").unlink()
    (specs / "trig.yaml").write_text("op: torch.sin\n" + SAMPLE)  # the same name, from a new file
    plan = _generate(project)
    assert [p.name for p in plan.write] == ["test_sin.py"] and plan.delete == []
    assert generated_source(project / "generated_tests" / "test_sin.py") == "op_specs/trig.yaml"
    # moved again, while the old file stays and now defines another name: both given, so allowed
    (specs / "trig.yaml").write_text("op: torch.sin\nname: sine\n" + SAMPLE)
    (specs / "more.yaml").write_text("op: torch.sin\n" + SAMPLE)
    plan = _generate(project)
    assert generated_source(project / "generated_tests" / "test_sin.py") == "op_specs/more.yaml"


@pytest.mark.parametrize(
    "source",
    [
        "op_specs/sin.yaml",
        'op_specs/odd name\'s "quote".yaml',
        "op_specs/evil\n import os.yaml",
        "op_specs/coding: latin-1.yaml",
        "op_specs/back\\slash \u00e9\u2028.yaml",
    ],
)
def test_the_header_gives_back_the_exact_source(tmp_path, source):
    # Deletion and overwrite decisions compare the source a header names with the specs' sources.
    spec = M.OpSpec(
        name="demo",
        op="torch.sin",
        source=source,
        sha256="0" * 64,
        devices=("cpu",),
        samples=(M.Sample("v", args=(M.TensorArg(shape=(3,)),)),),
    )
    apply_plan(plan_generation([spec], tmp_path, root=tmp_path))
    assert generated_source(tmp_path / "test_demo.py") == source


# -- what is at a module's path (defect 11) -------------------------------------------------------


def _make(kind: str, path: Path, project: Path) -> None:
    if kind == "folder":
        path.mkdir()
    elif kind == "dangling symlink":
        path.symlink_to(project / "nowhere.py")
    elif kind == "symlink to a generated module":
        target = project / "elsewhere.py"
        target.write_text((project / "generated_tests" / "test_sin.py").read_text())
        path.symlink_to(target)
    elif kind == "FIFO":
        os.mkfifo(path)


KINDS = {
    "folder": "a folder",
    "dangling symlink": "a symbolic link",
    "symlink to a generated module": "a symbolic link",
    "FIFO": "a FIFO (named pipe)",
}


@posix_only
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_non_regular_file_at_a_module_path_is_refused_by_name(project, kind):
    _generate(project)
    module = project / "generated_tests" / "test_tanh.py"
    module.unlink()
    _make(kind, module, project)
    with _no_hang(), pytest.raises(GenerationError) as info:
        plan_generation(_load(project), project / "generated_tests", root=project)
    assert str(info.value).startswith(f"{module} is {KINDS[kind]}, not a regular file; ")
    assert os.path.lexists(module) and not stat.S_ISREG(os.lstat(module).st_mode)  # left as it was


@posix_only
@pytest.mark.parametrize("kind", ["folder", "dangling symlink", "FIFO"])
def test_with_a_cache_present_generate_and_check_report_it_and_never_hang(project, kind):
    assert opcheck("generate", cwd=project).returncode == 0  # records the cache
    module = project / "generated_tests" / "test_tanh.py"
    module.unlink()
    _make(kind, module, project)
    for command in (["generate"], ["generate", "--check"]):
        result = opcheck(*command, cwd=project)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert result.stderr.startswith(f"generated_tests/test_tanh.py is {KINDS[kind]}, not a regular file")
        assert "Traceback" not in result.stderr


@posix_only
def test_files_no_spec_asks_for_are_never_opened(project):
    _generate(project)
    out = project / "generated_tests"
    os.mkfifo(out / "test_pipe.py")
    (out / "test_folder.py").mkdir()
    with _no_hang():
        plan = plan_generation(_load(project), out, root=project)
    assert plan.is_fresh


def test_out_that_is_a_file_is_an_error(project):
    (project / "generated_tests").write_text("")
    with pytest.raises(GenerationError, match="generated_tests is not a folder"):
        plan_generation(_load(project), project / "generated_tests", root=project)


# -- modes (defect 9) -----------------------------------------------------------------------------


@posix_only
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_new_modules_get_the_mode_open_would_give(project, umask):
    old = os.umask(umask)
    try:
        _generate(project)
    finally:
        os.umask(old)
    for module in (project / "generated_tests").glob("test_*.py"):
        assert stat.S_IMODE(module.stat().st_mode) == 0o666 & ~umask, module


@posix_only
def test_a_rewritten_module_keeps_its_mode(project):
    _generate(project)
    module = project / "generated_tests" / "test_tanh.py"
    module.chmod(0o640)
    spec = project / "op_specs" / "tanh.yaml"
    spec.write_text(spec.read_text().replace("[3]", "[5]"))
    old = os.umask(0o077)
    try:
        plan = _generate(project)
    finally:
        os.umask(old)
    assert [p.name for p in plan.write] == ["test_tanh.py"] and "shape=(5,)" in module.read_text()
    assert stat.S_IMODE(module.stat().st_mode) == 0o640


# -- failed writes name the module and the reason (defect 13) ------------------------------------


def _fail(monkeypatch, name: str, code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, name, fail)


@pytest.mark.parametrize(
    "function, code, step",
    [
        ("write", errno.ENOSPC, "while writing it"),
        ("open", errno.EACCES, "while creating a temporary file beside it"),
        ("open", errno.EROFS, "while creating a temporary file beside it"),
        ("replace", errno.EROFS, "while renaming the new text into place"),
    ],
)
def test_a_failed_write_names_the_module_and_the_reason(project, monkeypatch, function, code, step):
    _generate(project)
    module = project / "generated_tests" / "test_tanh.py"
    before = module.read_bytes()
    spec = project / "op_specs" / "tanh.yaml"
    spec.write_text(spec.read_text().replace("[3]", "[5]"))
    plan = plan_generation(_load(project), project / "generated_tests", root=project)
    with monkeypatch.context() as patch:
        _fail(patch, function, code)
        with pytest.raises(GenerationError) as info:
            apply_plan(plan)
    assert str(info.value) == f"cannot write {module}: {os.strerror(code)} ({step})"
    assert module.read_bytes() == before  # the old module is whole
    assert not [p for p in module.parent.iterdir() if p.name.endswith(".tmp")]  # and no temporary file stays


def test_a_failed_delete_names_the_module(project, monkeypatch):
    _generate(project)
    (project / "op_specs" / "tanh.yaml").unlink()
    plan = plan_generation(_load(project), project / "generated_tests", root=project)
    with monkeypatch.context() as patch:
        _fail(patch, "unlink", errno.EROFS)
        with pytest.raises(GenerationError, match=r"^cannot delete .*test_tanh\.py: Read-only file system$"):
            apply_plan(plan)


def test_the_cli_reports_a_full_disk_with_the_module_path(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    _fail(monkeypatch, "write", errno.ENOSPC)
    assert cli.main(["generate"]) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err.startswith("cannot write generated_tests/test_sin.py: No space left on device (while writing it)")
    assert "None" not in err


# -- temporary files left by a killed run (defect 11) ---------------------------------------------


def test_stale_temporary_files_of_the_writers_pattern_are_removed(project):
    out = project / "generated_tests"
    out.mkdir()
    old = time.time() - 3600
    stale = [out / ".test_tanh.py.abc_e9gh.tmp", out / ".test_sin.py.k3j4h5g6.tmp"]
    kept = [
        out / ".test_tanh.py.abc.tmp",
        out / ".notes.py.abcdefgh.tmp",
        out / "test_tanh.py.abcdefgh.tmp",
        out / ".test_tanh.py.ABCDEFGH.tmp",
        out / ".test_tanh.py.abcdefgh.tmp.bak",
    ]
    for path in stale + kept:
        path.write_text("half a module")
        os.utime(path, (old, old))
    fresh = out / ".test_cos.py.abcdefgh.tmp"  # a generate running right now is writing this one
    fresh.write_text("in progress")
    (out / ".test_dir.py.abcdefgh.tmp").mkdir()
    assert remove_stale_temp_files(out) == sorted(stale)
    assert all(p.exists() for p in kept) and fresh.exists() and (out / ".test_dir.py.abcdefgh.tmp").is_dir()
    assert remove_stale_temp_files(project / "no_such_folder") == []


def test_generate_cleans_up_but_check_writes_nothing(project):
    assert opcheck("generate", cwd=project).returncode == 0
    leftover = project / "generated_tests" / ".test_tanh.py.x1y2z3w4.tmp"
    leftover.write_text("half")
    os.utime(leftover, (time.time() - 3600,) * 2)
    assert opcheck("generate", "--check", cwd=project).returncode == 0 and leftover.exists()
    assert "unchanged since the last run" in opcheck("generate", cwd=project).stdout  # the cache still holds
    assert not leftover.exists()


def test_the_writer_leaves_no_temporary_file(project):
    _generate(project)
    names = sorted(p.name for p in (project / "generated_tests").iterdir())
    assert names == ["test_sin.py", "test_tanh.py"]


# -- the same bytes from any working directory, and from a CRLF checkout (defect 13) -------------


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("test_*.py"))}


def test_the_working_directory_changes_nothing(project):
    # A spec naming the project's own module: importable from the root, wherever the command runs.
    (project / "localops.py").write_text("import torch\n\ndef double(x):\n    return 2 * x\n")
    (project / "op_specs" / "double.yaml").write_text("op: localops:double\n" + SAMPLE)
    assert opcheck("generate", cwd=project).returncode == 0
    expected = _tree(project / "generated_tests")
    header = expected["test_sin.py"].decode().splitlines()[:3]
    assert header[0].startswith("# @generated by opcheck from op_specs/sin.yaml.")
    assert header[2] == "# regenerate: opcheck generate"

    parent = opcheck(
        "generate",
        "--check",
        "--specs",
        f"{project.name}/op_specs",
        "--out",
        f"{project.name}/generated_tests",
        cwd=project.parent,
    )
    assert parent.returncode == 0, parent.stdout + parent.stderr
    (project / "sub").mkdir()
    below = opcheck(
        "generate", "--no-cache", "--specs", "../op_specs", "--out", "../generated_tests", cwd=project / "sub"
    )
    assert below.returncode == 0 and "0 written, 3 unchanged, 0 deleted" in below.stdout, below.stderr
    assert _tree(project / "generated_tests") == expected

    # A folder other than the default is named in the header as seen from the project root.
    other = opcheck(
        "generate", "--specs", f"{project.name}/op_specs", "--out", f"{project.name}/gen", cwd=project.parent
    )
    assert other.returncode == 0, other.stderr
    assert "# regenerate: opcheck generate --out gen\n" in (project / "gen" / "test_sin.py").read_text()


def test_problems_from_another_folder_say_what_they_are_relative_to(project):
    (project / "op_specs" / "bad.yaml").write_text("op: torch.sinn\n" + SAMPLE)
    result = opcheck("validate", "--specs", f"{project.name}/op_specs", cwd=project.parent)
    assert result.returncode == 1
    assert result.stderr.startswith("op_specs/bad.yaml:1:5: op: ")
    assert result.stderr.rstrip().endswith(
        f"1 problem(s) found (paths are relative to the project root, {project.name})."
    )


def test_project_root_is_the_nearest_marked_folder_else_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b" / "op_specs").mkdir(parents=True)
    (tmp_path / "a" / "setup.cfg").write_text("")
    assert cli.project_root(Path("a/b/op_specs")) == tmp_path / "a"
    assert cli.project_root(Path("a/b/op_specs/x.yaml")) == tmp_path / "a"
    (tmp_path / "a" / "b" / ".git").mkdir()
    assert cli.project_root(Path("a/b/op_specs")) == tmp_path / "a" / "b"
    (tmp_path / "c").mkdir()
    if not any(os.path.lexists(d / m) for d in (tmp_path, *tmp_path.parents) for m in cli.ROOT_MARKERS):
        assert cli.project_root(Path("c")) == tmp_path


def test_line_endings_do_not_change_the_spec_hash(tmp_path):
    lf = b"op: torch.tanh\ndevices: [cpu]\nsamples: [{name: v, args: [{shape: [3]}]}]\n"
    assert spec_sha256(lf) == hashlib.sha256(lf).hexdigest()  # the committed headers stay as they are
    crlf, cr = lf.replace(b"\n", b"\r\n"), lf.replace(b"\n", b"\r")
    assert spec_sha256(crlf) == spec_sha256(cr) == spec_sha256(lf)
    hashes = []
    for name, data in (("lf", lf), ("crlf", crlf)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tanh.yaml").write_bytes(data)
        [spec] = load_specs([tmp_path / name / "tanh.yaml"], root=tmp_path / name)
        hashes.append(spec.sha256)
    assert hashes == [hashlib.sha256(lf).hexdigest()] * 2


def test_a_crlf_checkout_is_up_to_date(project):
    assert opcheck("generate", cwd=project).returncode == 0
    for spec in (project / "op_specs").glob("*.yaml"):
        spec.write_bytes(spec.read_bytes().replace(b"\n", b"\r\n"))
    for module in (project / "generated_tests").glob("*.py"):  # git's autocrlf converts these too
        module.write_bytes(module.read_bytes().replace(b"\n", b"\r\n"))
    result = opcheck("generate", "--check", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_committed_specs_hash_as_their_bytes():
    for spec in sorted((REPO / "op_specs").glob("*.yaml")):
        data = spec.read_bytes()
        if b"\r" not in data:
            assert spec_sha256(data) == hashlib.sha256(data).hexdigest(), spec
