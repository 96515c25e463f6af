"""Where captured samples go, and how: a new spec file, or new items at the end of an existing spec's
`samples:` list, every other byte of that file kept (its comments too).

A sample whose name the spec already has is left as the user wrote it unless `--force`, which
replaces that item's lines; one capture wrote and nobody has edited since (its comment holds the
digest of its lines) is capture's own, and a later capture replaces it. Writes are atomic (a
temporary file beside the target, then a rename); an existing file is replaced only when its bytes
are still those read, and only inside the specs folder capture was given.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml


class WriteError(ValueError):
    """A spec capture cannot extend (the message names the file and why)."""


@dataclass(frozen=True)
class SamplesList:
    """The `samples:` list of an existing spec file, as text positions."""

    indent: int  # the column of its items' `-`
    items: tuple[tuple[str | None, int, int], ...]  # (name, first line, end line) per item, 0-based, end exclusive
    end: int  # the line new items go before (0-based)
    names: frozenset[str]
    # Per item capture wrote: the first line of the comments capture wrote above it, which a
    # replacement (--force) replaces too.
    comments: tuple[tuple[str, int], ...] = ()
    # The items capture wrote that are still as it wrote them (their lines hash to the digest its
    # comment holds): capture's own, which a later capture may replace.
    own: frozenset[str] = frozenset()


def find_samples(text: str, source: str) -> SamplesList:
    """The samples list of a spec's text (WriteError when there is none to extend in block style)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise WriteError(f"{source}: not readable YAML ({str(e).splitlines()[0]}); fix it first") from None
    if not isinstance(root, yaml.MappingNode):
        raise WriteError(f"{source}: not a spec (a mapping of keys)")
    seq = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "samples"), None)
    if not isinstance(seq, yaml.SequenceNode) or not seq.value:
        raise WriteError(f"{source}: no `samples:` list to add to")
    if seq.flow_style:
        raise WriteError(
            f"{source}:{seq.start_mark.line + 1}: `samples:` is a flow list ([...]); capture appends to a block "
            "list (one `- name: ...` item a line); rewrite it as one"
        )
    lines = text.splitlines(keepends=True)
    starts = [item.start_mark.line for item in seq.value]
    end = seq.end_mark.line if seq.end_mark.column == 0 else seq.end_mark.line + 1
    # Comment and blank lines just before the next key belong to it, not to the last sample.
    while end - 1 > starts[-1] and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    items = []
    for i, item in enumerate(seq.value):
        name = None
        if isinstance(item, yaml.MappingNode):
            name = next((v.value for k, v in item.value if k.value == "name" and isinstance(v, yaml.ScalarNode)), None)
        stop = starts[i + 1] if i + 1 < len(starts) else end
        # Likewise, comment and blank lines just before the next item are that item's.
        while stop - 1 > starts[i] and (not lines[stop - 1].strip() or lines[stop - 1].lstrip().startswith("#")):
            stop -= 1
        items.append((name, starts[i], stop))
    indent = _dash_column(lines[starts[0]], seq.start_mark.column)
    comments, own = [], set()
    for name, start, stop in items:
        line, first, digest = start, None, None
        while line - 1 >= 0 and lines[line - 1].lstrip().startswith("#"):
            line -= 1
            mark = _DIGEST.match(lines[line])
            if mark and digest is None:
                digest = mark.group(1)
            if _CAPTURED.match(lines[line]):  # capture's block starts here; the user's comments above stay
                first = line
                break
        if name is not None and first is not None:
            comments.append((name, first))
            if digest is not None and digest == item_digest(lines[start:stop]):
                own.add(name)
    names = frozenset(n for n, _, _ in items if n is not None)
    return SamplesList(indent, tuple(items), end, names, tuple(comments), frozenset(own))


_CAPTURED = re.compile(r"^\s*# \d+ calls?(, first at .*)?; ")
"""The first comment line capture writes above a sample it wrote (render.render_sample)."""
_DIGEST = re.compile(r"^\s*# captured as ([0-9a-f]{12})\b")
"""The last comment line capture writes above a sample: the digest of the item's lines as written."""


def item_digest(lines: list[str]) -> str:
    """The digest of a sample item's lines, blind to indentation, line ends and blank lines (a spec
    re-indented stays capture's own; any other edit makes the sample the user's)."""
    text = "\n".join(line.strip() for line in lines if line.strip())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _dash_column(line: str, fallback: int) -> int:
    stripped = line.lstrip(" ")
    return len(line) - len(stripped) if stripped.startswith("-") else fallback


def extend(text: str, found: SamplesList, new: list[tuple[str, str]], replace: dict[str, str]) -> str:
    """`text` with the `new` items (name, item text) after its last sample, and the items named in
    `replace` (name -> item text) put where those items were."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    out: list[str] = []
    above = dict(found.comments)
    replaced = {name: (above.get(name, start), stop) for name, start, stop in found.items if name in replace}
    i = 0
    while i < len(lines):
        hit = next((name for name, (start, _) in replaced.items() if start == i), None)
        if hit is not None:
            out.append(replace[hit])
            i = replaced[hit][1]
            continue
        if i == found.end:
            out += [item for _, item in new]
        out.append(lines[i])
        i += 1
    if found.end >= len(lines):
        out += [item for _, item in new]
    return "".join(out)


def inside(path: Path, folder: Path) -> bool:
    """Whether `path` (resolved, links followed) lies inside `folder` (resolved)."""
    real, base = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, base]) == base
