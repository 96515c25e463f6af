"""`values_file:` while validating: the path rules, what torch.load may and may not do, the
checks against the spec, and that nothing in a file ever runs. (The hostile files and their
messages are pinned in the invalid corpus, tests/spec/invalid/values_file_*.)"""

from __future__ import annotations

import builtins
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from opcheck.spec import SpecError, load_specs
from opcheck.spec import values_file as vf
from opcheck.spec.loader import load_spec_text

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "invalid"
RAN = "opcheck-values-file-ran"  # what tests/spec/invalid/make_values_files.py's pickle would print


def _spec(args: str, *, op: str = "torch.sin") -> str:
    return f"op: {op}\nsamples:\n  - name: s\n    args: {args}\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "op_specs" / "values").mkdir(parents=True)
    return tmp_path


def _load(root: Path, text: str) -> list:
    (root / "op_specs" / "x.yaml").write_text(text, encoding="utf-8")
    return load_specs([root / "op_specs"], root=root)


def _problems(root: Path, text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        _load(root, text)
    return [str(p) for p in info.value.problems]


# -- paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "source", "expected"),
    [
        ("values/x.pt", "op_specs/a.yaml", "op_specs/values/x.pt"),
        ("./values/../values//x.pt", "op_specs/a.yaml", "op_specs/values/x.pt"),
        ("../shared/x.pt", "op_specs/a.yaml", "shared/x.pt"),
        ("x.pt", "a.yaml", "x.pt"),
    ],
)
def test_a_written_path_becomes_the_normalized_path_from_the_project_root(written, source, expected):
    assert vf.project_path(written, source) == expected


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("/x.pt", "expected a path relative to the spec's folder (op_specs/), got the absolute path '/x.pt'"),
        ("C:/x.pt", "got the absolute path 'C:/x.pt'"),
        ("a\\x.pt", "expected a path with / as the separator"),
        ("../../x.pt", "got '../../x.pt', which leads out of the project root (from op_specs/)"),
        ("../..", "which leads out of the project root"),
    ],
)
def test_a_path_a_spec_may_not_name_is_refused(written, message):
    with pytest.raises(ValueError) as info:
        vf.project_path(written, "op_specs/a.yaml")
    assert message in str(info.value)


def test_a_valid_file_is_read_into_the_model_relative_to_the_project_root(project):
    torch.save({"args.0": torch.zeros(2, 3), "args.1": torch.ones(3)}, project / "op_specs" / "values" / "s.pt")
    args = (
        "[{shape: [2, 3], values_file: ./values/s.pt, values_key: args.0}, "
        "{shape: [3], values_file: values/s.pt, values_key: args.1, noncontiguous: true}]"
    )
    (spec,) = _load(project, _spec(args, op="torch.add"))
    first, second = spec.samples[0].args
    assert (first.values_file, first.values_key) == ("op_specs/values/s.pt", "args.0")
    assert (second.values_file, second.values_key, second.noncontiguous) == ("op_specs/values/s.pt", "args.1", True)


def test_a_family_reads_values_files_from_its_defaults_relative_to_its_own_folder(project):
    torch.save(torch.zeros(3), project / "op_specs" / "values" / "v.pt")
    text = textwrap.dedent(
        """\
        defaults:
          samples:
            - name: file
              args: [{shape: [3], values_file: values/v.pt}]
        ops:
          - op: torch.sin
          - op: torch.cos
        """
    )
    specs = _load(project, text)
    assert [s.samples[0].args[0].values_file for s in specs] == ["op_specs/values/v.pt"] * 2


def test_a_link_out_of_the_project_is_refused(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "x.pt"
    torch.save(torch.zeros(3), outside)
    os.symlink(outside, project / "op_specs" / "values" / "link.pt")
    (problem,) = _problems(project, _spec("[{shape: [3], values_file: values/link.pt}]"))
    assert problem.endswith(
        "values_file: values/link.pt: a link leads it out of the project root; values files live inside the project"
    )


def test_load_spec_text_reads_values_files_from_its_root(project):
    torch.save(torch.zeros(3), project / "op_specs" / "values" / "v.pt")
    (spec,) = load_spec_text(_spec("[{shape: [3], values_file: values/v.pt}]"), source="op_specs/x.yaml", root=project)
    assert spec.samples[0].args[0].values_file == "op_specs/values/v.pt"


# -- what torch.load may do ------------------------------------------------------------------------


def test_the_corpus_pickles_are_refused_without_running_anything(capfd):
    with pytest.raises(SpecError) as info:
        load_specs([CORPUS / "values_file_not_weights_only"], root=REPO)
    assert len(info.value.problems) == 2
    assert all("Unsupported global" in p.message and "print" in p.message for p in info.value.problems)
    out, err = capfd.readouterr()
    assert RAN not in out + err


class _CreatesFile:
    """Its loading would create the file at `path`: what a hostile values file would do."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_file_whose_loading_would_create_a_file_creates_none(project, how):
    marker = project / "PWNED"
    path = project / "op_specs" / "values" / "hostile.pt"
    if how == "pickle":
        path.write_bytes(pickle.dumps(_CreatesFile(marker), protocol=2))
    else:
        torch.save(_CreatesFile(marker), path)
    (problem,) = _problems(project, _spec("[{shape: [3], values_file: values/hostile.pt}]"))
    assert "values/hostile.pt: torch.load(weights_only=True) cannot load it: " in problem
    assert "open" in problem and "\n" not in problem
    assert not marker.exists()
    # ... and the same file at run time
    from opcheck.runtime import file_values
    from opcheck.runtime.makers import SampleError
    from opcheck.runtime.project_root import set_project_root
    from opcheck.spec.model import TensorArg

    set_project_root(project)
    try:
        with pytest.raises(SampleError, match="cannot load it"):
            file_values.file_values(TensorArg(shape=(3,), values_file="op_specs/values/hostile.pt"), torch.float64)
    finally:
        set_project_root(None)
    assert not marker.exists()


def test_a_truncated_file_and_one_that_is_no_torch_file_name_the_file_and_torchs_reason(project):
    values = project / "op_specs" / "values"
    torch.save(torch.zeros(3), values / "whole.pt")
    data = (values / "whole.pt").read_bytes()
    (values / "truncated.pt").write_bytes(data[: len(data) // 2])
    (values / "text.pt").write_text("not a tensor\n")
    (values / "empty.pt").write_bytes(b"")
    problems = _problems(
        project,
        _spec(
            "[{shape: [3], values_file: values/truncated.pt}, {shape: [3], values_file: values/text.pt}, "
            "{shape: [3], values_file: values/empty.pt}]",
            op="torch.addcmul",
        ),
    )
    assert len(problems) == 3
    for problem, name in zip(problems, ("truncated", "text", "empty")):
        assert f"values_file: values/{name}.pt: torch.load(weights_only=True) cannot load it: " in problem
        assert not problem.endswith("cannot load it: ") and "\n" not in problem and "Traceback" not in problem
    assert "failed reading zip archive" in problems[0]


def test_torchs_reason_is_its_first_line_without_advice_or_colours():
    message = (
        "Weights only load failed. This file can still be loaded, to do so you have two options, "
        "\x1b[1mdo those steps only if you trust the source of the checkpoint\x1b[0m. \n\t(1) In PyTorch 2.6, "
        "we changed the default.\n\t(2) Alternatively, to load with `weights_only=True` please check.\n\t"
        "WeightsUnpickler error: Unsupported global: GLOBAL os.system was not an allowed global by default. "
        "Please use `torch.serialization.add_safe_globals([system])`.\n\nCheck the documentation of torch.load"
    )
    reason = vf.load_reason(Exception(message))
    assert reason == "Unsupported global: GLOBAL os.system was not an allowed global by default."
    below = "Weights only load failed. Please file an issue: WeightsUnpickler error: \n\nUnsupported operand 149\n"
    assert vf.load_reason(Exception(below)) == "Unsupported operand 149"
    assert vf.load_reason(EOFError()) == "EOFError (the file ends early, or is empty)"
    assert vf.load_reason(ValueError("\x1b[31mred\x07 text")) == "ValueError: red\\x07 text"
    assert (
        vf.load_reason(RuntimeError("Invalid magic number; corrupt file?\nmore"))
        == "Invalid magic number; corrupt file?"
    )


def test_files_over_the_size_limit_are_refused_before_torch_reads_them(project, monkeypatch):
    values = project / "op_specs" / "values"
    torch.save(torch.zeros(3), values / "small.pt")
    with zipfile.ZipFile(values / "bomb.pt", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/data.pkl", b"\0" * 100_000)  # a few hundred bytes on disk
    monkeypatch.setattr(vf, "MAX_FILE_BYTES", 50_000)
    loaded = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda path, **kw: loaded.append(Path(path).name) or real_load(path, **kw))
    (problem,) = _problems(
        project,
        _spec(
            "[{shape: [3], values_file: values/bomb.pt}, {shape: [3], values_file: values/small.pt}]", op="torch.add"
        ),
    )
    assert problem.endswith(
        "values_file: values/bomb.pt: its records unpack to 100000 bytes; a values file may have at most 50000 bytes"
    )
    monkeypatch.setattr(vf, "MAX_FILE_BYTES", 100)
    (problem,) = _problems(project, _spec("[{shape: [3], values_file: values/small.pt}]"))
    assert "values_file: values/small.pt: it has " in problem and problem.endswith(
        "a values file may have at most 100 bytes"
    )
    assert loaded == ["small.pt"]  # the first load's: never the bomb, never a file past the limit


# -- against the spec -------------------------------------------------------------------------------


def test_a_missing_key_lists_the_first_keys_and_suggests_one(project):
    torch.save({f"args.{i}": torch.zeros(3) for i in range(8)}, project / "op_specs" / "values" / "s.pt")
    (problem,) = _problems(project, _spec("[{shape: [3], values_file: values/s.pt, values_key: args_7}]"))
    assert problem.endswith(
        "values_key: values/s.pt: it has no entry 'args_7'; its keys are 'args.0', 'args.1', 'args.2', "
        "'args.3', 'args.4' and 3 more; did you mean 'args.7'?"
    )


def test_a_file_read_by_many_tensors_is_read_once_per_load(project, monkeypatch):
    torch.save({"a": torch.zeros(3), "b": torch.ones(3)}, project / "op_specs" / "values" / "s.pt")
    reads = []
    real = vf.read
    monkeypatch.setattr(vf, "read", lambda root, path: reads.append(path) or real(root, path))
    args = (
        "[{shape: [3], values_file: values/s.pt, values_key: a}, {shape: [3], values_file: values/s.pt, values_key: b}]"
    )
    _load(project, _spec(args, op="torch.add"))
    assert reads == ["op_specs/values/s.pt"]


def test_validation_imports_torch_only_for_a_spec_that_names_a_values_file(project):
    torch.save(torch.zeros(3), project / "op_specs" / "values" / "v.pt")
    # `requires:` a missing module: the op (and torch with it) is not imported while validating.
    head = "op: nosuch_values_mod.f\nrequires: [nosuch_values_mod]\nsamples:\n  - name: s\n    args: "
    code = textwrap.dedent(
        """\
        import sys
        from pathlib import Path
        from opcheck.spec.loader import load_spec_text
        load_spec_text(sys.argv[1], source="op_specs/x.yaml", root=Path(sys.argv[2]))
        print("torch" in sys.modules)
        """
    )

    def imports_torch(args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, head + args, str(project)], capture_output=True, text=True, cwd=REPO
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert imports_torch("[{shape: [3]}]") == "False"
    assert imports_torch("[{shape: [3], values_file: values/v.pt}]") == "True"


def test_named_paths_finds_every_values_file_a_spec_names():
    text = textwrap.dedent(
        """\
        defaults:
          samples:
            - name: a
              args: [{shape: [3], values_file: values/a.pt}, [{shape: [3], values_file: ../b.pt}]]
        ops:
          - op: torch.sin
            samples:
              - {name: c, kwargs: {x: {shape: [3], values_file: values/a.pt}}}
              - {name: d, args: [{shape: [3], values_file: /abs.pt}, {shape: [3], values_file: 3}]}
        """
    )
    assert vf.named_paths(text, "op_specs/f.yaml") == ["op_specs/values/a.pt", "b.pt"]
    assert vf.named_paths("[: not yaml", "op_specs/f.yaml") == []
