"""The problem collector the builders share, and small typed readers for schema-checked nodes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeGuard, overload

from opcheck.spec.problems import FlaggedPath, KeyOf, KeyPath, Problem, format_path, show
from opcheck.spec.values_file import ValuesFiles
from opcheck.spec.yamlload import Node


class Checker:
    """Collects problems for one document and knows which nodes the schema already flagged.

    Builders only interpret nodes the schema found nothing wrong with (`clean`): a value of the
    wrong shape has been reported once already, and reading it anyway would only add noise, or
    fail on a shape no builder expects. A rule that needs only a node's form (a list's length, a
    mapping's keys) reads it when it is `readable`, so that a problem inside the node does not
    hide a problem of its form.
    """

    def __init__(self, flagged: set[FlaggedPath], *, source: str = "", values_files: ValuesFiles | None = None):
        self.problems: list[Problem] = []
        # The document's path relative to the project root, and the reader of the values files
        # its tensors name (paths relative to the spec's folder; opcheck.spec.values_file).
        self.source = source
        self.values_files = values_files if values_files is not None else ValuesFiles(Path.cwd())
        # A problem with a key (see KeyOf) leaves the key's value unread; its mapping holds a
        # problem even where no child node shows it (a missing key).
        self._flagged = frozenset(
            path[:-1] + (path[-1].key,) if path and isinstance(path[-1], KeyOf) else path for path in flagged
        )
        self._holders = frozenset(path[:-1] for path in flagged if path)
        self._bad_keys = frozenset(path for path in flagged if path and isinstance(path[-1], KeyOf))
        self._whole_memo: dict[int, tuple[Node, bool]] = {}

    def report(self, node: Node, message: str, *, at_key: bool = False) -> None:
        loc = node.key_loc if at_key and node.key_loc else node.loc
        self.problems.append(Problem(loc, format_path(node.path), message))

    def clean(self, node: Node | None) -> TypeGuard[Node]:
        """Whether a builder may read the node: the schema judged all of it and found nothing wrong.

        Not clean: a flagged node, anything inside one (its contents were judged against no
        schema, or the wrong one: the value of an unknown key, the items of a mapping written
        as a list), and anything holding one.
        """
        return node is not None and not self._inside_flagged(node.path) and self._whole(node)

    def readable(self, node: Node | None) -> TypeGuard[Node]:
        """Whether a builder may read the node's own form (a list's length, a mapping's keys),
        whatever is wrong inside it: the schema found nothing wrong with the node itself (its
        type, its length), and no node around it is flagged.

        What depends only on that form (how many arguments a sample passes, which keywords it
        names) is judged even where one of the items or values has a problem of its own.
        """
        return node is not None and node.path not in self._flagged and not self._inside_flagged(node.path)

    def key_clean(self, node: Node) -> bool:
        """Whether the schema found nothing wrong with the key the node is the value of (the
        value itself aside): not unknown, nor badly named."""
        path = node.path
        return not path or isinstance(path[-1], int) or path[:-1] + (KeyOf(path[-1]),) not in self._bad_keys

    def _inside_flagged(self, path: KeyPath) -> bool:
        return any(path[:i] in self._flagged for i in range(len(path)))

    def _whole(self, node: Node) -> bool:
        """No problem at or below the node (memoized: builders ask about nested nodes repeatedly)."""
        known = self._whole_memo.get(id(node))
        if known is None:
            children = node.value.values() if node.is_map else node.value if node.is_list else ()
            ok = (
                node.path not in self._flagged
                and node.path not in self._holders
                # A family entry holds nodes merged in from `defaults`, written (and flagged) there.
                and all(
                    self._whole(child) and (child.path[:-1] == node.path or not self._inside_flagged(child.path))
                    for child in children
                )
            )
            known = self._whole_memo[id(node)] = (node, ok)  # the node is kept: its id stays its own
        return known[1]

    def count(self) -> int:
        return len(self.problems)

    def finite(self, node: Node | None) -> float | None:
        """The node's number as a float, reporting inf/nan (tolerances and ranges must be finite)."""
        if node is None:
            return None
        try:
            value = float(node.value)
        except OverflowError:  # an integer literal beyond float range
            value = math.inf
        if not math.isfinite(value):
            self.report(node, f"expected a finite number, got {show(node.value)}")
            return None
        return value


@overload
def strings(node: Node) -> tuple[str, ...]: ...


@overload
def strings(node: None) -> None: ...


@overload
def strings(node: Node | None) -> tuple[str, ...] | None: ...


def strings(node: Node | None) -> tuple[str, ...] | None:
    """A list of strings, or one string, as a tuple (None when absent)."""
    if node is None:
        return None
    items = node.value if node.is_list else [node]
    return tuple(item.value for item in items)
