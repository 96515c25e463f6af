"""Load spec files: YAML → schema → model per document, then one pass across all of them.

Nothing stops at the first problem: every file is read, validated and built, the cross-spec
rules run over everything that yielded a name, and only then is one SpecError raised with the
whole list.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from opcheck.spec.build import Built, NameClaim, build_document
from opcheck.spec.case import cases_of
from opcheck.spec.model import Location, OpSpec
from opcheck.spec.problems import Problem, SpecError
from opcheck.spec.validate import schema_problems
from opcheck.spec.values_file import ValuesFiles
from opcheck.spec.yamlload import load_yaml

SPEC_SUFFIXES = (".yaml", ".yml")


def load_specs(paths: Iterable[Path], *, root: Path) -> list[OpSpec]:
    """Every spec in `paths` (files, or directories meaning their *.yaml / *.yml files, sorted).

    Sources and locations are relative to `root`, in posix form. Raises SpecError listing every
    problem of every file.
    """
    problems: list[Problem] = []
    results: list[Built] = []
    values_files = ValuesFiles(root)
    for file, source in _spec_files(paths, root, problems):
        try:
            data = file.read_bytes()
        except OSError as e:
            problems.append(Problem(Location(source), "", f"cannot read: {e.strerror or e}"))
            continue
        text = _decode(data, source, problems)
        if text is not None:
            results.append(_load_document(text, source, spec_sha256(data), values_files))
    return _finish(results, problems)


def load_spec_text(text: str, *, source: str, root: Path | None = None) -> list[OpSpec]:
    """The specs in one YAML text (for tests and fuzzing); sha256 is spec_sha256 of its UTF-8 bytes.

    `source` is the text's path relative to `root` (default: the working directory), which the
    values files its tensors name are read from.
    """
    sha256 = spec_sha256(text.encode("utf-8", "surrogatepass"))
    return _finish([_load_document(text, source, sha256, ValuesFiles(root if root is not None else Path.cwd()))], [])


def spec_sha256(data: bytes) -> str:
    """The hash a generated module's header records for its spec file's bytes.

    Line endings are normalised first (CRLF and CR → LF): a checkout with CRLF line endings
    (git's core.autocrlf on Windows) holds the same spec, and `generate --check` must agree. For a
    file with LF endings this is the sha256 of its bytes, as it always was.
    """
    return hashlib.sha256(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")).hexdigest()


def spec_names(paths: Iterable[Path], *, root: Path) -> dict[str, tuple[NameClaim, str | None]]:
    """Every spec name the files in `paths` claim, with the op of that spec where it builds.

    Unlike load_specs this never raises: a folder with broken specs still tells which names are
    taken (for `opcheck new`). The first claim of a name wins, as in the uniqueness rule.
    """
    names: dict[str, tuple[NameClaim, str | None]] = {}
    values_files = ValuesFiles(root)
    for file, source in _spec_files(paths, root, []):
        try:
            text = _decode(file.read_bytes(), source, [])
        except OSError:
            continue
        if text is None:
            continue
        built = _load_document(text, source, "", values_files)
        ops = {(spec.name, spec.location): spec.op for spec in built.specs}
        for claim in built.claims:
            op = next((o for (n, _), o in ops.items() if n == claim.name), None)
            names.setdefault(claim.name, (claim, op))
    return names


def generated_test_ids(spec: OpSpec) -> list[str]:
    """The names of the tests generated for a spec (CaseId.name of each of its cases)."""
    return [case.name for case in cases_of(spec)]


def cross_spec_problems(claims: list[NameClaim], specs: list[OpSpec]) -> list[Problem]:
    """The rules across specs: names unique (each one is a test module), test ids unique and clean."""
    # Specs sharing a name share a test module, so all their ids collide: the name says it once.
    counts = Counter(claim.name for claim in claims)
    return _duplicate_names(claims) + _bad_test_ids([spec for spec in specs if counts[spec.name] <= 1])


def _load_document(text: str, source: str, sha256: str, values_files: ValuesFiles) -> Built:
    document = load_yaml(text, source)
    if document.root is None:
        return Built([], [], document.problems)
    # A value YAML could not read is reported once, by the loader; judging its placeholder adds noise.
    flagged = [
        (path, problem)
        for path, problem in schema_problems(document.root)
        if not any(path[: len(t)] == t for t in document.tainted)
    ]
    built = build_document(
        document.root,
        source=source,
        sha256=sha256,
        flagged={path for path, _ in flagged} | document.tainted,
        values_files=values_files,
    )
    problems = document.problems + [problem for _, problem in flagged] + built.problems
    return Built(built.specs if not problems else [], built.claims, problems)


def _finish(results: list[Built], problems: list[Problem]) -> list[OpSpec]:
    specs = [spec for result in results for spec in result.specs]
    claims = [claim for result in results for claim in result.claims]
    problems = problems + [p for result in results for p in result.problems]
    problems += cross_spec_problems(claims, specs)
    if problems:
        raise SpecError(problems)
    return specs


def _duplicate_names(claims: list[NameClaim]) -> list[Problem]:
    first: dict[str, NameClaim] = {}
    problems = []
    for claim in claims:
        other = first.setdefault(claim.name, claim)
        if other is not claim:
            how = " (derived from `op`; set `name:` to tell them apart)" if claim.derived else ""
            problems.append(
                Problem(
                    claim.location,
                    claim.path,
                    f"duplicate spec name {claim.name!r}: {other.location} and {claim.location}{how}",
                )
            )
    return problems


def _bad_test_ids(specs: list[OpSpec]) -> list[Problem]:
    # Unique names and sample names already make ids unique; this is the last line of defence
    # for the contract codegen and xdist rely on, checked on the ids themselves.
    first: dict[tuple[str, str], OpSpec] = {}
    problems = []
    for spec in specs:
        for case in cases_of(spec):
            key = (case.module, case.name)
            if not case.is_clean():
                problems.append(
                    Problem(spec.location, "", f"test id {case.name!r} has characters outside [A-Za-z0-9_.-]")
                )
            elif key in first:
                problems.append(
                    Problem(
                        spec.location,
                        "",
                        f"test id {case.module}::{case.name} is generated twice (also by {first[key].location})",
                    )
                )
            else:
                first[key] = spec
    return problems


def _spec_files(paths: Iterable[Path], root: Path, problems: list[Problem]) -> list[tuple[Path, str]]:
    files, seen = [], set()
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file())
            if not found:
                problems.append(Problem(Location(_relative(path, root)), "", "no *.yaml or *.yml spec files here"))
        elif path.is_file():
            found = [path]
        else:
            problems.append(Problem(Location(_relative(path, root)), "", "no such file or directory"))
            continue
        for file in found:
            key = os.path.realpath(file)  # the same file named twice is loaded once, not a duplicate
            if key not in seen:
                seen.add(key)
                files.append((file, _relative(file, root)))
    return files


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root))).as_posix()
    except ValueError:  # another drive on Windows
        return Path(os.path.abspath(path)).as_posix()


def _decode(data: bytes, source: str, problems: list[Problem]) -> str | None:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        problems.append(Problem(Location(source, line, col), "", "not UTF-8 text: a spec file must be UTF-8"))
        return None
