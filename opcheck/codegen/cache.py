"""Make a no-op `opcheck generate` cheap: remember what the last run read and wrote.

The cache records a fingerprint of the generator itself (opcheck's spec and codegen sources,
templates and schema), the sha256 of every spec file, and the sha256 of every module written.
When all of those still match, generation would produce the same bytes, so nothing is loaded or
rendered. `opcheck generate --check` and `opcheck validate` never use it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CACHE_FILE = Path(".opcheck_cache") / "generate.json"
_PACKAGE = Path(__file__).resolve().parents[1]
_GENERATOR_SOURCES = ("codegen/*.py", "codegen/templates/*", "spec/*.py", "spec/*.json")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def snapshot(specs: Path, out_dir: Path, regenerate: str) -> dict:
    return {
        "generator": generator_fingerprint(regenerate),
        "specs": {p.as_posix(): _digest(p) for p in spec_files(specs)},
        "outputs": {p.as_posix(): _digest(p) for p in sorted(out_dir.glob("test_*.py"))} if out_dir.is_dir() else {},
    }


def is_fresh(specs: Path, out_dir: Path, regenerate: str, cache_file: Path = CACHE_FILE) -> bool:
    try:
        recorded = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return recorded == snapshot(specs, out_dir, regenerate)


def record(specs: Path, out_dir: Path, regenerate: str, cache_file: Path = CACHE_FILE) -> None:
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(snapshot(specs, out_dir, regenerate), indent=1, sort_keys=True),
                              encoding="utf-8")
    except OSError:
        pass  # a read-only checkout still generates; it just does not skip work next time
