"""Make a no-op `opcheck generate` cheap: remember what the last run read and wrote.

The cache records a fingerprint of the generator itself (opcheck's spec and codegen sources,
templates and schema), the sha256 of every spec file, of every values file the specs name
(`values_file:`), and of every module written. When all of those still match, generation would
produce the same bytes, so nothing is loaded or rendered. `opcheck generate --check` and
`opcheck validate` never use it.

A values file never changes a generated module (the module holds its path), but validation reads
it: a file changed since the last run, to one that no longer fits its spec, must make the next
run validate again. Unchanged spec files name the same values files, so a fresh-check digests
the ones recorded; only `record` reads the specs' YAML to find them.

Paths are recorded relative to the project root, so the cache means the same whichever folder
the command runs from. Only regular files are read: anything else at a module's path (a folder,
a FIFO, a link) is recorded as such, which never matches a recorded digest, so the full run
reports it instead of this module reading it (or waiting forever on a FIFO).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

CACHE_FILE = Path(".opcheck_cache") / "generate.json"
GITIGNORE = "# Written by opcheck generate: the cache is local to this checkout.\n*\n"
_PACKAGE = Path(__file__).resolve().parents[1]
_GENERATOR_SOURCES = ("codegen/*.py", "codegen/templates/*", "spec/*.py", "spec/*.json")
_NOT_A_FILE = "not a regular file"


def _digest(path: Path, *, follow_links: bool) -> str:
    try:
        info = os.stat(path) if follow_links else os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            return _NOT_A_FILE
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:  # gone or unreadable: the full run says which and why
        return f"unreadable: {e.strerror or e}"


def generator_fingerprint(regenerate: str) -> str:
    h = hashlib.sha256(regenerate.encode())
    for pattern in _GENERATOR_SOURCES:
        for path in sorted(_PACKAGE.glob(pattern)):
            h.update(path.relative_to(_PACKAGE).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def spec_files(specs: Path) -> list[Path]:
    if specs.is_dir():
        return sorted(p for p in specs.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [specs]


def _key(path: Path, root: Path | None) -> str:
    if root is None:
        return path.as_posix()
    try:
        return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root))).as_posix()
    except ValueError:  # another drive on Windows
        return Path(os.path.abspath(path)).as_posix()


def values_files(specs: Path, root: Path | None = None) -> list[Path]:
    """The values files the spec files under `specs` name (opcheck.spec.values_file.named_paths)."""
    from opcheck.spec.values_file import named_paths

    base = root if root is not None else Path()
    found: dict[Path, None] = {}
    for path in spec_files(specs):
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except (OSError, UnicodeDecodeError):
            continue  # the full run reports it
        for named in named_paths(text, _key(path, root)):
            found.setdefault(base / named)
    return list(found)


def snapshot(
    specs: Path, out_dir: Path, regenerate: str, *, root: Path | None = None, values: list[Path] | None = None
) -> dict[str, object]:
    """What a run depends on; `values`: the values files the specs name (default: read from the specs)."""
    if values is None:
        values = values_files(specs, root)
    # Spec files may be links (a shared spec); a module's path must be the module itself.
    return {
        "generator": generator_fingerprint(regenerate),
        "specs": {_key(p, root): _digest(p, follow_links=True) for p in spec_files(specs)},
        "values": {_key(p, root): _digest(p, follow_links=True) for p in values},
        "outputs": {_key(p, root): _digest(p, follow_links=False) for p in sorted(out_dir.glob("test_*.py"))}
        if out_dir.is_dir()
        else {},
    }


def is_fresh(
    specs: Path, out_dir: Path, regenerate: str, cache_file: Path = CACHE_FILE, *, root: Path | None = None
) -> bool:
    try:
        if not stat.S_ISREG(os.stat(cache_file).st_mode):  # never open a FIFO in its place
            return False
        recorded = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    named = recorded.get("values") if isinstance(recorded, dict) else None
    if not isinstance(named, dict):
        return False
    base = root if root is not None else Path()
    values = [base / key for key in named]
    return bool(recorded == snapshot(specs, out_dir, regenerate, root=root, values=values))


def record(
    specs: Path, out_dir: Path, regenerate: str, cache_file: Path = CACHE_FILE, *, root: Path | None = None
) -> None:
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        ignore = cache_file.parent / ".gitignore"
        if not ignore.exists():  # as pytest, mypy and ruff do with their caches: git never lists it
            ignore.write_text(GITIGNORE, encoding="utf-8")
        cache_file.write_text(
            json.dumps(snapshot(specs, out_dir, regenerate, root=root), indent=1, sort_keys=True), encoding="utf-8"
        )
    except OSError:
        pass  # a read-only checkout still generates; it just does not skip work next time
