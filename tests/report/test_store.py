"""The results file across runs: merged by test id, replaced atomically, never lost when unreadable."""

import json
import os
import stat

import pytest
from report_samples import result

from opcheck.report import store
from opcheck.report.results import parse_json, results_json
from opcheck.report.store import Known, ResultsFileError, merge, read_earlier, save, still_there, write_atomically

A = result("sin", "gradcheck", "cpu", "float64", "a", "passed")
B = result("sin", "gradcheck", "cpu", "float64", "b", "failed", "CheckFailed: boom")
B_PASSED = result("sin", "gradcheck", "cpu", "float64", "b", "passed")
C_SKIPPED = result("sin", "gradcheck", "cuda", "float64", "a", "skipped", "no cuda")
C_PASSED = result("sin", "gradcheck", "cuda", "float64", "a", "passed")


def test_a_run_replaces_what_it_ran_and_keeps_the_rest():
    merged = merge([A, B], [B_PASSED])
    assert sorted(merged.results, key=lambda r: r.nodeid) == [A, B_PASSED]
    assert (merged.recorded, merged.kept, merged.dropped) == (1, 1, 0)


def test_an_unavailable_device_records_a_skip_only_where_nothing_was_recorded():
    assert merge([C_PASSED], [], [C_SKIPPED]).results == (C_PASSED,)
    merged = merge([A], [], [C_SKIPPED])
    assert set(merged.results) == {A, C_SKIPPED} and (merged.recorded, merged.kept) == (1, 1)
    assert merge([], [C_PASSED], [C_SKIPPED]).results == (C_PASSED,)  # it ran after all (a named node id)


def test_records_of_tests_that_no_longer_exist_are_dropped():
    merged = merge([A, B], [], exists=lambda nodeid: nodeid != B.nodeid)
    assert merged.results == (A,) and (merged.recorded, merged.kept, merged.dropped) == (0, 1, 1)


def test_still_there(tmp_path):
    (tmp_path / "generated_tests").mkdir()
    (tmp_path / "generated_tests" / "test_sin.py").write_text("")
    known = Known.of([A.nodeid, "tests/test_other.py::test_x", "junk"])
    assert set(known.modules) == {"generated_tests/test_sin.py", "tests/test_other.py"}
    exists = still_there(known, tmp_path)
    assert exists(A.nodeid) and not exists(B.nodeid)  # its module was collected whole, without `b`
    assert not exists("generated_tests/test_gone.py::test_gradcheck[cpu-float64-a]")  # a deleted module
    assert exists("elsewhere/test_x.py::test_gradcheck[cpu-float64-a]")  # no such folder: another rootdir?
    assert exists("no-module-in-this-id")
    partial = Known.of([A.nodeid], partial=lambda module: module == "generated_tests/test_sin.py")
    assert partial.modules == {} and still_there(partial, tmp_path)(B.nodeid)
    assert Known.from_json(json.loads(json.dumps(known.to_json()))) == known
    assert still_there(None, None)(B.nodeid)


def test_a_missing_or_empty_file_has_no_earlier_results(tmp_path):
    assert read_earlier(tmp_path / "r.json") == store.Earlier()
    (tmp_path / "r.json").write_text("\n")
    assert read_earlier(tmp_path / "r.json").results == ()


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"{", "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"\xff\xfe", "not UTF-8 text (invalid start byte at byte 0)"),
        (b'{"format": "opcheck-results", "version": 2, "tests": [{"spec": "x"}]}', "tests[0]: missing "),
    ],
)
def test_a_file_that_holds_no_results_is_moved_aside(tmp_path, content, problem):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    earlier = read_earlier(path)
    assert earlier.results == () and earlier.problem.startswith(problem)
    assert earlier.moved_to == tmp_path / "r.json.unreadable"
    assert earlier.moved_to.read_bytes() == content and not path.exists()


def test_a_file_that_cannot_be_read_is_left_alone_and_not_written(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text(results_json([A]))

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(path), "read_text", refuse)
    with pytest.raises(ResultsFileError, match=r"cannot read .*r\.json to update it: Permission denied"):
        save(path, [B])
    monkeypatch.undo()
    assert parse_json(path.read_text()) == [A]


def test_a_file_that_cannot_be_moved_aside_stops_the_writing(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("not results")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(ResultsFileError, match=r"holds no opcheck results .* cannot be moved aside to .*: Permission"):
        save(path, [B])
    assert path.read_text() == "not results"


def test_writing_is_atomic_and_keeps_the_files_permissions(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    write_atomically(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, "newer")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_the_file_is_written_only_when_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "r.json"
    save(path, [A, B])
    writes = []
    monkeypatch.setattr(store, "write_atomically", lambda p, text: writes.append(text))
    _, merged = save(path, [A])
    assert writes == [] and (merged.recorded, merged.kept) == (1, 1)
    save(path, [B_PASSED])
    assert len(writes) == 1


def test_a_symlinked_results_file_stays_a_symlink(tmp_path):
    target = tmp_path / "shared" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    write_atomically(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
