"""Plan what generation changes on disk, show it as a diff, or apply it atomically.

What generation may touch in the output folder:
- it writes a module only over nothing or over a regular file whose first line is the generated
  header, and only if that header names the spec's own source, or a source that no longer exists
  (the file is gone, or it was among the specs given and no longer defines the name);
- it deletes a generated module only when its source no longer exists in that sense: a run over
  a subset of the specs (`--specs op_specs/sin.yaml`) leaves the other specs' modules alone;
- it never opens, replaces or deletes anything but a regular file at a module's path (a folder,
  symlink or FIFO there is an error, named), so nothing can hang or follow a link;
- it removes leftovers of its own interrupted writes (`.test_x.py.<8 chars>.tmp`) and nothing else.
"""

from __future__ import annotations

import difflib
import os
import random
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from opcheck import module_header
from opcheck.codegen.render import module_name, render_module
from opcheck.module_header import MARKER as GENERATED_MARKER
from opcheck.spec import model


class GenerationError(Exception):
    """Generation would overwrite or delete a file it did not generate, or cannot write."""


@dataclass
class WritePlan:
    out_dir: Path
    write: dict[Path, str] = field(default_factory=dict)  # new or changed files → new text
    unchanged: list[Path] = field(default_factory=list)
    delete: list[Path] = field(default_factory=list)  # generated files whose spec is gone

    @property
    def is_fresh(self) -> bool:
        return not self.write and not self.delete


# `.<module>.<8 characters>.tmp`: the names _write_atomically gives its temporary files (the same
# alphabet and length as tempfile.mkstemp, which earlier versions used, so their leftovers match too).
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
TEMP_FILE_RE = re.compile(rf"\.test_[^/\\]*\.py\.[{_TEMP_CHARS}]{{8}}\.tmp")
STALE_TEMP_SECONDS = 60.0
"""A temporary file this old is a leftover: a live write holds one for milliseconds."""


@dataclass(frozen=True)
class _Existing:
    """What is at a module's path: nothing, or a regular file and what its first line says."""

    exists: bool
    generated: bool = False
    source: str | None = None  # the spec file its header names, when it is generated
    mode: int | None = None


def is_generated(path: Path) -> bool:
    """Whether `path` is a regular file whose first line is the generated header (never follows links)."""
    try:
        return _existing(path).generated
    except GenerationError:
        return False


def generated_source(path: Path) -> str | None:
    """The spec source a generated module's header names, or None (not generated, or no source given)."""
    try:
        return _existing(path).source
    except GenerationError:
        return None


def plan_generation(
    specs: list[model.OpSpec], out_dir: Path, *, regenerate: str = "opcheck generate", root: Path | None = None
) -> WritePlan:
    """What generating `specs` into `out_dir` writes and deletes; raises GenerationError instead of
    touching a file it must not. Spec sources are relative to `root` (default: the working directory).
    """
    root = Path.cwd() if root is None else root
    given = {spec.source for spec in specs}
    plan = WritePlan(out_dir=out_dir)
    _check_folder(out_dir)
    wanted: set[str] = set()
    for spec in sorted(specs, key=lambda s: s.name):
        path = out_dir / module_name(spec)
        if path.name in wanted:
            raise GenerationError(f"{spec.source}: two specs would both write {path}")
        wanted.add(path.name)
        text = render_module(spec, regenerate=regenerate)
        existing = _existing(path)
        if existing.exists:
            _check_overwrite(path, existing, spec, given, root)
            if _read_text(path) == text:
                plan.unchanged.append(path)
                continue
        plan.write[path] = text
    if out_dir.is_dir():
        for path in sorted(out_dir.glob("test_*.py")):
            if path.name in wanted:
                continue
            try:
                existing = _existing(path)
            except GenerationError:  # a folder, link or FIFO no spec asks for: not ours, left alone
                continue
            if existing.generated and existing.source is not None and _source_gone(existing.source, given, root):
                plan.delete.append(path)
    return plan


def stale_diff(plan: WritePlan, base: Path | None = None) -> str:
    """A unified diff from what is on disk to what generation would write, its paths relative to
    `base` (default: the current directory) as `git apply` reads them there; a path outside `base`
    is written whole."""
    base = Path.cwd() if base is None else base
    chunks: list[str] = []
    for path, text in plan.write.items():
        old = _read_text(path).splitlines(keepends=True) if _existing(path).exists else []
        name = _diff_name(path, base)
        new = text.splitlines(keepends=True)
        chunks.extend(difflib.unified_diff(old, new, fromfile=f"a/{name}", tofile=f"b/{name}"))
    for path in plan.delete:
        old = _read_text(path).splitlines(keepends=True)
        chunks.extend(difflib.unified_diff(old, [], fromfile=f"a/{_diff_name(path, base)}", tofile="/dev/null"))
    return "".join(chunks)


def _diff_name(path: Path, base: Path) -> str:
    """`path` relative to `base` where it lies below it (both resolved), else absolute without its
    leading slash, so that `a/` and `b/` prefix it as git's diffs do."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(base.resolve()).as_posix()
    except ValueError:
        return resolved.as_posix().lstrip("/")


def apply_plan(plan: WritePlan) -> None:
    """Write and delete what `plan` says; GenerationError names the module and the reason if that fails."""
    try:
        plan.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GenerationError(f"cannot create the folder {plan.out_dir}: {_reason(e)}") from None
    for path, text in plan.write.items():
        _write_atomically(path, text)
    for path in plan.delete:
        try:
            path.unlink()
        except FileNotFoundError:
            pass  # already gone: what the plan wanted
        except OSError as e:
            raise GenerationError(f"cannot delete {path}: {_reason(e)}") from None


def remove_stale_temp_files(out_dir: Path, *, older_than: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Delete the temporary files an interrupted run (SIGKILL, power loss) left in `out_dir`.

    Only regular files named exactly as this writer names them, and only ones older than
    `older_than` seconds, so that a generate running at the same time keeps its own.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(out_dir))
    except OSError:  # no folder yet, or unreadable: then there is nothing of ours to clean
        return removed
    now = time.time()
    for entry in sorted(entries, key=lambda e: e.name):
        if not TEMP_FILE_RE.fullmatch(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and now - info.st_mtime >= older_than:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue  # cleaning up is a courtesy; the write that follows reports a folder it cannot use
    return removed


# -- what is on disk -------------------------------------------------------------------------------

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _existing(path: Path) -> _Existing:
    """Look at `path` without following a link or opening anything but a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return _Existing(exists=False)
    except OSError as e:
        raise GenerationError(f"cannot read {path}: {_reason(e)}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise GenerationError(
            f"{path} is {kind}, not a regular file; opcheck writes a generated module only "
            f"where there is nothing or a module it generated: remove or rename it"
        )
    header = module_header.parse([_first_line(path)])
    return _Existing(
        exists=True,
        generated=header is not None,
        source=header.source if header is not None else None,
        mode=stat.S_IMODE(info.st_mode),
    )


def _first_line(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace", newline=None) as f:
            return f.readline().rstrip("\n")
    except OSError as e:
        raise GenerationError(f"cannot read {path}: {_reason(e)}") from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise GenerationError(f"cannot read {path}: {_reason(e)}") from None


def _check_folder(out_dir: Path) -> None:
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise GenerationError(f"{out_dir} is not a folder; pass --out a folder for the generated modules")


def _source_gone(source: str, given: set[str], root: Path) -> bool:
    """Whether the spec a module was generated from no longer exists.

    A source among the specs given was loaded: the module's name is not among the ones it defines
    now (or the caller would want the module). A source not given is gone only if its file is;
    whether it still defines the name is not known without loading it, so its module stays.
    """
    return source in given or not (root / source).is_file()


def _check_overwrite(path: Path, existing: _Existing, spec: model.OpSpec, given: set[str], root: Path) -> None:
    if not existing.generated:
        raise GenerationError(
            f"{path} exists and was not generated by opcheck (its first line is not "
            f"'{GENERATED_MARKER} ...'); rename the spec ({spec.source}) or move that file"
        )
    if (
        existing.source is not None
        and existing.source != spec.source
        and not _source_gone(existing.source, given, root)
    ):
        raise GenerationError(
            f"{path} was generated from {existing.source}, which still exists, and {spec.source} now claims "
            f"its name {spec.name!r}: rename one of the two specs (`name:`), delete {existing.source} if the "
            f"spec moved, or generate into another folder (--out)"
        )


# -- writing ---------------------------------------------------------------------------------------


def _write_atomically(path: Path, text: str) -> None:
    # Write beside the target and rename over it: a reader (or a crash) never sees half a file.
    # The file gets the mode open(path, "w") would give it (0666 less the umask), or keeps the
    # mode of the module it replaces; tempfile.mkstemp would make every module 0600.
    data = text.encode("utf-8")
    existing = _existing(path)
    tmp, fd = _create_temp(path)
    step = "writing it"
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if existing.mode is not None:
                step = "setting its mode"
                _chmod(fd, tmp, existing.mode)
        finally:
            os.close(fd)
        step = "renaming the new text into place"
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise GenerationError(f"cannot write {path}: {_reason(e)} (while {step})") from None
        raise


def _create_temp(path: Path) -> tuple[Path, int]:
    flags = (
        os.O_WRONLY
        | os.O_CREAT
        | os.O_EXCL
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_BINARY", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    rng = random.SystemRandom()
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{''.join(rng.choice(_TEMP_CHARS) for _ in range(8))}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)  # the kernel applies the umask, as for open(..., "w")
        except FileExistsError:
            continue
        except OSError as e:
            raise GenerationError(
                f"cannot write {path}: {_reason(e)} (while creating a temporary file beside it)"
            ) from None
    raise GenerationError(f"cannot write {path}: no free temporary file name beside it")


def _chmod(fd: int, tmp: Path, mode: int) -> None:
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:  # Windows: only the read-only bit means anything there
        os.chmod(tmp, mode)


def _reason(e: OSError) -> str:
    # The errno's words ("No space left on device", "Read-only file system"), not e.filename:
    # that may be None (a failed write) or the temporary file's name, which the user never chose.
    return e.strerror or str(e) or type(e).__name__
