"""The results file across runs: one record per test id, updated by each run rather than replaced.

A run records the tests it ran (whatever their outcome) in place of their earlier records and keeps
every other record, so a run of a few tests (`-k`, `-m`, a node id, one module, `--lf`) leaves the
rest of the coverage report as the last run that ran them left it. A test left out because this
machine lacks its device keeps its earlier record; it is recorded as skipped only where there is
none. Records are dropped only for tests known to be gone: those a module this run collected
whole no longer has (`Known`), and those of a generated module that was deleted.

The file is replaced atomically (a temporary file in its folder, then a rename) and only when its
content changes. An existing file that is not opcheck results is never overwritten: it is moved
aside (`NAME.unreadable`), and one that cannot be read at all stops the writing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from opcheck.report.results import ReportError, TestResult, parse_json, results_json

UNREADABLE_SUFFIX = ".unreadable"


class ResultsFileError(Exception):
    """The results file is there but cannot be read, so it cannot be updated without losing it."""


@dataclass(frozen=True)
class Earlier:
    """What the results file held before this run wrote it."""

    results: tuple[TestResult, ...] = ()
    text: str | None = None  # None: there was no file
    moved_to: Path | None = None  # where a file that held no opcheck results was moved
    problem: str = ""  # why it was moved


@dataclass(frozen=True)
class Merged:
    results: tuple[TestResult, ...]
    recorded: int  # records from this run
    kept: int  # records kept from earlier runs
    dropped: int  # earlier records of tests that no longer exist


def read_earlier(path: Path) -> Earlier:
    """The results already at `path`; a file that is not opcheck results is moved aside (and
    ResultsFileError raised when even that fails, or when the file cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # nothing there (writing says why it cannot)
        return Earlier()
    except UnicodeDecodeError as e:
        return _move_aside(path, f"not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        raise ResultsFileError(f"cannot read {path} to update it: {e.strerror or e}") from None
    if not text.strip():  # nothing to lose: an empty file
        return Earlier(text=text)
    try:
        return Earlier(results=tuple(parse_json(text, where=str(path))), text=text)
    except ReportError as e:
        return _move_aside(path, str(e).removeprefix(f"{path}: ").splitlines()[0])


def _move_aside(path: Path, problem: str) -> Earlier:
    backup = path.with_name(path.name + UNREADABLE_SUFFIX)
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}{UNREADABLE_SUFFIX}.{n}")
    try:
        os.rename(path, backup)
    except OSError as e:
        raise ResultsFileError(
            f"{path} holds no opcheck results ({problem}) and cannot be moved aside to {backup}: "
            f"{e.strerror or e}; move or delete it"
        ) from None
    return Earlier(moved_to=backup, problem=problem)


@dataclass(frozen=True)
class Known:
    """The generated tests of the modules this run collected whole, by module (the node id's path);
    a module collected in part (a node id on the command line, `--lf`) is not among them."""

    modules: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, nodeids: Iterable[str], partial: Callable[[str], bool] = lambda module: False) -> Known:
        modules: dict[str, set[str]] = {}
        for nodeid in nodeids:
            module, sep, _ = nodeid.partition("::")
            if sep and not partial(module):
                modules.setdefault(module, set()).add(nodeid)
        return cls({module: frozenset(ids) for module, ids in modules.items()})

    def to_json(self) -> dict[str, list[str]]:
        return {module: sorted(ids) for module, ids in self.modules.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, list[str]]) -> Known:
        return cls({module: frozenset(ids) for module, ids in data.items()})


def still_there(known: Known | None, root: Path | None) -> Callable[[str], bool]:
    """Whether the test of a record may still exist: False only for a test its module, collected
    whole, no longer has, and for one whose module was deleted from a folder that is still there
    (opcheck generate deletes the module of a removed spec; a folder that is gone altogether is
    more likely another rootdir's path than a removed spec)."""

    def exists(nodeid: str) -> bool:
        module, sep, _ = nodeid.partition("::")
        if not sep:
            return True
        if known is not None and module in known.modules:
            return nodeid in known.modules[module]
        if root is not None:
            path = root / module
            return path.exists() or not path.parent.is_dir()
        return True

    return exists


def merge(
    earlier: Iterable[TestResult],
    ran: Iterable[TestResult],
    unavailable: Iterable[TestResult] = (),
    exists: Callable[[str], bool] = lambda nodeid: True,
) -> Merged:
    """This run's results over the earlier ones, by node id (see the module's docstring)."""
    ran = list(ran)
    ran_ids = {r.nodeid for r in ran}
    kept: dict[str, TestResult] = {}
    dropped = 0
    for r in earlier:
        if r.nodeid in ran_ids:
            continue
        if exists(r.nodeid):
            kept[r.nodeid] = r  # a file with one id twice keeps the last, as a dict would
        else:
            dropped += 1
    new_skips = [r for r in unavailable if r.nodeid not in ran_ids and r.nodeid not in kept]
    recorded = ran + new_skips
    return Merged(tuple(recorded) + tuple(kept.values()), len(recorded), len(kept), dropped)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: readers see the old file or the new one, never a part."""
    path = Path(os.path.realpath(path))  # a symlink stays one: its target is what is replaced
    os.makedirs(path.parent, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for any new file
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():  # keep the permissions the user gave the file
            os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def save(
    path: Path,
    ran: Iterable[TestResult],
    unavailable: Iterable[TestResult] = (),
    exists: Callable[[str], bool] = lambda nodeid: True,
) -> tuple[Earlier, Merged]:
    """Update the results file at `path` with this run's results; written only when it changes."""
    earlier = read_earlier(path)
    merged = merge(earlier.results, ran, unavailable, exists)
    text = results_json(list(merged.results))
    if text != earlier.text:
        write_atomically(path, text)
    return earlier, merged
