"""At collection, one warning (StaleModulesWarning) names every collected generated module whose
spec file now hashes differently from its header's `# spec sha256:` (or is gone), with the command
that regenerates them; each spec file is read once per session."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from opcheck.plugins.items import is_generated_item, spec_path

SPEC_HASHES_KEY: pytest.StashKey[dict[Path, str | None]] = pytest.StashKey()
"""Spec file → its sha256 (None: unreadable), so each spec is hashed once per session."""


class StaleModulesWarning(UserWarning):
    """Generated modules whose spec changed (or is gone) since they were generated."""


@dataclass(frozen=True)
class StaleModule:
    module: str  # as pytest names it: relative to the rootdir
    source: str  # the spec file the header names
    missing: bool  # the spec file is gone, rather than changed
    regenerate: str


def stale_modules(config: pytest.Config, modules: Iterable[Path]) -> list[StaleModule]:
    """The generated modules among `modules` whose header's spec sha256 no longer matches its spec file.

    A module without the generated header, or whose header records no hash, is not judged; none
    is without the suite's packages (the engine alone), where a generated module cannot run at all.
    """
    modules = sorted(set(modules))
    if not modules:  # a run of other tests pays for none of the imports below
        return []
    from opcheck import _suite

    if _suite.missing():
        return []
    from opcheck import module_header
    from opcheck.spec.loader import spec_sha256

    hashes = config.stash.setdefault(SPEC_HASHES_KEY, {})
    stale = []
    for module in modules:
        header = module_header.read(module)
        if header is None or header.source is None or header.sha256 is None:
            continue
        source = header.source
        spec = spec_path(source, module, config.rootpath)
        if spec is not None and spec not in hashes:
            try:
                hashes[spec] = spec_sha256(spec.read_bytes())
            except OSError:
                hashes[spec] = None
        current = hashes.get(spec) if spec is not None else None
        if current == header.sha256:
            continue
        stale.append(
            StaleModule(
                module=_relative(module, config.rootpath),
                source=source,
                missing=current is None,
                regenerate=header.regenerate,
            )
        )
    return stale


def stale_message(stale: list[StaleModule]) -> str:
    """One message naming every stale module, what changed, and the command(s) that regenerate them."""
    commands = " or ".join(f"`{c}`" for c in dict.fromkeys(m.regenerate for m in stale))
    count = f"{len(stale)} generated module{'s' if len(stale) != 1 else ''}"
    lines = [f"opcheck: {count} out of date with {'their specs' if len(stale) != 1 else 'its spec'}; run {commands}:"]
    for m in stale:
        why = "does not exist" if m.missing else "changed since the module was generated"
        lines.append(f"  {m.module}: {m.source} {why}")
    return "\n".join(lines)


def warn_stale(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get("workerid") != "gw0":  # xdist: every worker collects the same
        return
    stale = stale_modules(config, (item.path for item in items if is_generated_item(item)))
    if not stale:
        return
    message = stale_message(stale)
    try:
        warnings.warn_explicit(
            StaleModulesWarning(message), StaleModulesWarning, filename=str(config.rootpath / stale[0].module), lineno=1
        )
    except StaleModulesWarning:  # `-W error` or `filterwarnings = error`: end the run with the message alone
        raise pytest.UsageError(message) from None


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.relpath(path, root)).as_posix()
    except ValueError:  # another drive on Windows
        return str(path)
