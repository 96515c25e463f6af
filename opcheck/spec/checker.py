"""The problem collector the builders share, and small typed readers for schema-checked nodes."""

from __future__ import annotations

import math

from opcheck.spec.problems import KeyPath, Problem, format_path, show
from opcheck.spec.yamlload import Node


class Checker:
    """Collects problems for one document and knows which nodes the schema already flagged.

    Builders only interpret nodes the schema found nothing wrong with (`clean`): a value of the
    wrong shape has been reported once already, and reading it anyway would only add noise.
    """

    def __init__(self, flagged: set[KeyPath]):
        self.problems: list[Problem] = []
        self._flagged = flagged

    def report(self, node: Node, message: str, *, at_key: bool = False) -> None:
        loc = node.key_loc if at_key and node.key_loc else node.loc
        self.problems.append(Problem(loc, format_path(node.path), message))

    def clean(self, node: Node | None) -> bool:
        if node is None:
            return False
        if node.path in self._flagged:
            return False
        children = node.value.values() if node.is_map else node.value if node.is_list else ()
        return all(self.clean(child) for child in children)

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


def strings(node: Node | None) -> tuple[str, ...] | None:
    """A list of strings, or one string, as a tuple (None when absent)."""
    if node is None:
        return None
    items = node.value if node.is_list else [node]
    return tuple(item.value for item in items)
