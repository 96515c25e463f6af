"""Safe YAML → Node tree: every value knows its file:line:col and its key path.

PyYAML composes the node graph (so anchors and aliases are resolved by PyYAML itself); this
module turns that graph into `Node`s itself instead of using PyYAML's constructors, because it
must see what constructors hide: duplicate keys, where each value and each key was written, and
which keys came in through a `<<` merge (those may be overridden; written-twice keys may not).

Scalars follow the YAML 1.2 core schema rather than PyYAML's YAML 1.1 default, so `1e-4` is a
float, `010` is ten, and `no`, `on`, `2024-01-01` stay strings. Only plain data is ever built:
any tag outside the core schema is rejected, so a spec can never construct Python objects.

Hostile input is bounded before it costs much: nesting (MAX_DEPTH, checked while composing, and
before libyaml sees the text), values after expanding aliases and merges (MAX_NODES), integer
literals (MAX_INT_DIGITS) and floats (float64's range).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import yaml
from yaml.composer import Composer
from yaml.error import Mark
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.nodes import Node as YamlNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from opcheck.spec.model import Location
from opcheck.spec.problems import KeyPath, Problem, format_path, show

_TAG = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
SEQ, MAP, MERGE = _TAG + "seq", _TAG + "map", _TAG + "merge"

# Real specs nest a dozen levels deep (`values` of a 63-dim tensor: under 70); the limits only
# stop pathological input (alias bombs, thousands of nested brackets) before it exhausts the
# stack or the memory.
MAX_DEPTH = 100
MAX_NODES = 100_000
# float64 reaches 1.8e308 (309 digits): no longer integer means anything to an op, and Python
# refuses to print integers past 4300 digits, which would break every message that shows one.
MAX_INT_DIGITS = 309


class _CoreResolver(BaseResolver):
    """YAML 1.2 core schema implicit tags, plus the `<<` merge key."""


_INT_RE = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL_RE = re.compile(r"^(?:~|null|Null|NULL|)$")

# Order matters: resolvers sharing a first character are tried in the order added (int before float).
_CoreResolver.add_implicit_resolver(BOOL, _BOOL_RE, list("tTfF"))
_CoreResolver.add_implicit_resolver(NULL, _NULL_RE, ["~", "n", "N", ""])
_CoreResolver.add_implicit_resolver(INT, _INT_RE, list("-+0123456789"))
_CoreResolver.add_implicit_resolver(FLOAT, _FLOAT_RE, list("-+0123456789."))
_CoreResolver.add_implicit_resolver(MERGE, re.compile(r"^<<$"), ["<"])


class _TooDeep(Exception):
    """A node nested deeper than MAX_DEPTH: where it starts and its key path."""

    def __init__(self, mark: Mark, path: KeyPath):
        super().__init__(path)
        self.mark, self.path = mark, path


class _DepthGuard:
    """PyYAML's Composer recurses once per level; this stops it at MAX_DEPTH, with the key path.

    Both composers below use PyYAML's pure-Python Composer through this guard. libyaml's own
    (Cython) composer is never used: it recurses in C and overflows the C stack (a segfault,
    not an exception) on deep enough input, where libyaml has no nesting limit of its own.
    """

    # Per level: a sequence index, a mapping's key node (for its value), None (for a key); Composer
    # passes `index` on as it got it.
    _path: list[int | YamlNode | None]

    # The `type: ignore`s: this is a mixin, and every class it is mixed into is a Composer and a parser.
    def compose_node(self, parent: YamlNode | None, index: int | YamlNode | None) -> YamlNode | None:
        if parent is None:  # the document itself
            return Composer.compose_node(self, parent, index)  # type: ignore[arg-type]
        path = self._path
        path.append(index)
        if len(path) > MAX_DEPTH:
            mark = self.peek_event().start_mark  # type: ignore[attr-defined]
            raise _TooDeep(
                mark,
                tuple(
                    part if isinstance(part, int) else part.value if isinstance(part, ScalarNode) else "<key>"
                    for part in path
                ),
            )
        node = Composer.compose_node(self, parent, index)  # type: ignore[arg-type]
        path.pop()  # not on an exception: that ends the document
        return node


class _Composer(_DepthGuard, Reader, Scanner, Parser, Composer, _CoreResolver):
    """PyYAML's pure-Python front end up to the node graph; no constructor on purpose."""

    def __init__(self, text: str):
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _CoreResolver.__init__(self)
        self._path = []


class _Front(Protocol):
    """A YAML front end up to the node graph, as _compose_with uses it."""

    def get_single_node(self) -> YamlNode | None: ...

    def dispose(self) -> None: ...


_CComposer: Callable[[str], _Front] | None = None
if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser

    class _LibyamlComposer(_DepthGuard, Composer, CParser, _CoreResolver):
        """libyaml's scanner and parser (its events), composed by the guarded Composer above."""

        def __init__(self, text: str):
            CParser.__init__(self, text)
            Composer.__init__(self)
            _CoreResolver.__init__(self)
            self._path = []

    _CComposer = _LibyamlComposer


@dataclass(eq=False)
class Node:
    """A YAML value: a dict of Nodes, a list of Nodes, or a scalar; with where it was written.

    `path` is where the value sits in its document; a value merged in from a family's `defaults`
    keeps its `defaults...` path, so a problem with it is reported where it was written.
    """

    value: Any
    loc: Location
    path: KeyPath
    key_loc: Location | None = None  # where the key naming this value was written, if any
    # A mapping or list written with a tag outside the core schema: reported, and its contents
    # judged by the schema, but no builder reads it (see tagged_paths).
    unsupported_tag: str | None = None

    @property
    def is_map(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_list(self) -> bool:
        return isinstance(self.value, list)

    def get(self, key: str) -> Node | None:
        return self.value.get(key) if self.is_map else None

    def plain(self) -> Any:
        """Plain dicts/lists/scalars, for the JSON Schema validator."""
        if self.is_map:
            return {k: v.plain() for k, v in self.value.items()}
        if self.is_list:
            return [v.plain() for v in self.value]
        return self.value

    def at(self, path: KeyPath) -> Node:
        """The node at a key path below this one (the path must exist)."""
        node = self
        for part in path:
            node = node.value[part]
        return node


@dataclass
class YamlDocument:
    """A parsed document: its root (None when unreadable or empty) and its problems.

    `tainted` holds the paths of values that could not be read as written (a scalar with an
    unsupported tag or out of range, a cycle, a value past a limit): they stand in the tree as
    placeholders, and later stages must not judge them. A collection with an unsupported tag is
    reported but not tainted: its contents are read as written, and judged like any other.
    """

    root: Node | None
    problems: list[Problem]
    tainted: set[KeyPath]


def load_yaml(text: str, source: str) -> YamlDocument:
    """Parse one YAML document."""
    try:
        root = _compose(text)
    except _TooDeep as e:
        loc = Location(source, e.mark.line + 1, e.mark.column + 1)
        return YamlDocument(None, [Problem(loc, format_path(e.path), f"nesting deeper than {MAX_DEPTH} levels")], set())
    except yaml.MarkedYAMLError as e:
        return YamlDocument(None, [_malformed(e, source)], set())
    except yaml.reader.ReaderError as e:
        return YamlDocument(None, [_unreadable(e, text, source)], set())
    except RecursionError:
        return YamlDocument(None, [Problem(Location(source), "", "malformed YAML: nesting too deep")], set())
    if root is None:
        empty = Problem(Location(source, 1, 1), "", "empty spec: expected a mapping with `op:` and `samples:`")
        return YamlDocument(None, [empty], set())
    converter = _Converter(source)
    tree = converter.convert(root)
    return YamlDocument(tree, converter.problems, converter.tainted)


def _compose(text: str) -> YamlNode | None:
    # libyaml parses ~3x faster; anything it rejects is parsed again by the pure-Python front
    # end, whose messages (and checks, e.g. unprintable characters) are the reference. Text that
    # may nest too deep never reaches libyaml: builds without its nesting limit take time and
    # memory per level, and the pure-Python parser stops at the first node past MAX_DEPTH.
    if _CComposer is not None and not Reader.NON_PRINTABLE.search(text) and nesting_bound(text, MAX_DEPTH) <= MAX_DEPTH:
        try:
            return _compose_with(_CComposer, text)
        except yaml.YAMLError:
            pass
    return _compose_with(_Composer, text)


def _compose_with(cls: Callable[[str], _Front], text: str) -> YamlNode | None:
    composer = cls(text)  # the pure-Python reader rejects unprintable characters right here
    try:
        return composer.get_single_node()
    finally:
        composer.dispose()


# -- how deep a text may nest, before any parser sees it ---------------------------------------

# A line's indentation and its leading indicators (`- `, `? `, `: `): where its innermost block
# collection may start.
_LEADING = re.compile(r"^ *(?:[-?:](?:[ \t]+|$))*", re.M)
_SPECIAL = re.compile(r"[\[\]{}\"'#|>]")
_DOUBLE_QUOTED_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_SINGLE_QUOTED_REST = re.compile(r"(?:[^']|'')*'")
_BLOCK_SCALAR_HEADER = re.compile(r"[|>][-+0-9]*[ \t]*(?:#[^\n]*)?(?:\n|\Z)")


def nesting_bound(text: str, limit: int) -> int:
    """An upper bound of how deep the document nests, for deciding which parser may read it.

    Block collections nest at most two levels per column (a mapping and the sequence under one
    of its keys may share a column), so the widest leading indentation bounds them; flow
    collections are counted by their brackets, outside quoted scalars, block scalars and
    comments. It stops counting once past `limit`. A misread (say, a quote that YAML reads as
    part of a plain scalar) can only make the guarded composer, not the stack, stop the input.
    """
    widest = max((m.end() - m.start() for m in _LEADING.finditer(text)), default=0)
    block = 2 * (widest + 1)
    depth = deepest = pos = 0
    while block + deepest <= limit and (m := _SPECIAL.search(text, pos)):
        i, char = m.start(), m.group()
        pos = i + 1
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
        elif char == "#":
            if i == 0 or text[i - 1] in " \t\n":  # a comment; elsewhere `#` is part of a scalar
                end = text.find("\n", i)
                pos = len(text) if end < 0 else end
        elif _starts_scalar(text, i):
            if char in "\"'":
                rest = (_DOUBLE_QUOTED_REST if char == '"' else _SINGLE_QUOTED_REST).match(text, pos)
                if rest is None:  # unterminated: every parser rejects the text
                    break
                pos = rest.end()
            elif depth == 0 and (header := _BLOCK_SCALAR_HEADER.match(text, i)):
                pos = _block_scalar_end(text, i, header.end())
    return block + deepest


def _starts_scalar(text: str, i: int) -> bool:
    """Whether a quote or block indicator at `i` begins a scalar (not one inside a plain scalar)."""
    j = i - 1
    while True:
        while j >= 0 and text[j] in " \t":
            j -= 1
        if j < 0 or text[j] in "\n[{,:":
            return True
        if text[j] in "-?" and j < i - 1 and (j == 0 or text[j - 1] in " \t\n"):
            return True
        word = j
        while word >= 0 and text[word] not in " \t\n":
            word -= 1
        if text[word + 1] not in "&!":  # an anchor or a tag may stand before the scalar
            return False
        j = word


def _block_scalar_end(text: str, indicator: int, pos: int) -> int:
    """Where a block scalar (`|`, `>`) ends: at the first non-blank line indented no deeper than
    the collection holding it."""
    line_start = text.rfind("\n", 0, indicator) + 1
    leading = _LEADING.match(text, line_start).end()  # type: ignore[union-attr]  # it matches the empty string
    if leading == indicator:  # `- |`: the sequence's dash is the holder
        holder = (
            max(
                text.rfind("-", line_start, indicator),
                text.rfind("?", line_start, indicator),
                text.rfind(":", line_start, indicator),
            )
            - line_start
        )
    else:  # `key: |` or `- key: |`: the key's mapping
        holder = leading - line_start
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos:end]
        if line.strip(" ") and len(line) - len(line.lstrip(" ")) <= holder:
            return pos
        pos = end + 1
    return len(text)


def _malformed(e: yaml.MarkedYAMLError, source: str) -> Problem:
    mark = e.problem_mark or e.context_mark
    loc = Location(source, mark.line + 1, mark.column + 1) if mark else Location(source)
    problem = e.problem or e.context or "malformed YAML"
    if e.context and e.problem:
        where = f" at {e.context_mark.line + 1}:{e.context_mark.column + 1}" if e.context_mark else ""
        if e.problem.startswith("but "):  # PyYAML splits "expected X, but found Y" in two
            problem = f"{e.context}{where}, {e.problem}"
        else:
            problem = f"{e.problem} ({e.context}{where})"
    return Problem(loc, "", f"malformed YAML: {problem}")


def _unreadable(e: yaml.reader.ReaderError, text: str, source: str) -> Problem:
    before = text[: e.position]
    line = before.count("\n") + 1
    col = e.position - (before.rfind("\n") + 1) + 1
    char = e.character if isinstance(e.character, int) else ord(e.character)
    return Problem(
        Location(source, line, col), "", f"malformed YAML: character U+{char:04X} is not allowed in YAML text"
    )


def _loc(source: str, ynode: YamlNode) -> Location:
    mark = ynode.start_mark
    return Location(source, mark.line + 1, mark.column + 1)


class _Converter:
    """Walks PyYAML's node graph once per position (aliases are expanded), collecting problems."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[Problem] = []
        self.tainted: set[KeyPath] = set()
        self._count = 0
        self._active: set[int] = set()  # ids of the nodes being converted: an alias to one is a cycle

    def report(self, loc: Location, path: KeyPath, message: str) -> None:
        self.problems.append(Problem(loc, format_path(path), message))

    def taint(self, loc: Location, path: KeyPath, message: str) -> None:
        """Report a value that could not be read as written; what stands in its place is a guess."""
        self.report(loc, path, message)
        self.tainted.add(path)

    def convert(self, ynode: YamlNode, path: KeyPath = (), key_loc: Location | None = None) -> Node:
        loc = _loc(self.source, ynode)
        refusal = self._refusal(ynode, path)
        if refusal is not None:
            if refusal:
                self.taint(loc, path, refusal)
            else:
                self.tainted.add(path)
            return Node(None, loc, path, key_loc)
        self._active.add(id(ynode))
        tag = None
        value: Any
        try:
            if isinstance(ynode, MappingNode):
                tag = self._check_tag(ynode, MAP, loc, path)
                value = self._mapping(ynode, path)
            elif isinstance(ynode, SequenceNode):
                tag = self._check_tag(ynode, SEQ, loc, path)
                value = [self.convert(item, path + (i,)) for i, item in enumerate(ynode.value)]
            else:  # PyYAML composes no other kind of node
                value = self._scalar(cast(ScalarNode, ynode), loc, path)
        finally:
            self._active.discard(id(ynode))
        return Node(value, loc, path, key_loc, tag)

    def _refusal(self, ynode: YamlNode, path: KeyPath) -> str | None:
        """Why this node is not converted ("" once the node limit was reported), or None."""
        self._count += 1
        if self._count > MAX_NODES:
            return (
                f"too many values (over {MAX_NODES}, after expanding aliases)" if self._count == MAX_NODES + 1 else ""
            )
        if len(path) > MAX_DEPTH:  # the composer stops deeper text; this is an alias's doing
            return f"nesting deeper than {MAX_DEPTH} levels (after expanding aliases)"
        if id(ynode) in self._active:
            return "an alias refers to a value that contains it (a cycle)"
        return None

    def _mapping(self, ynode: MappingNode, path: KeyPath) -> dict[str, Node]:
        merged: dict[str, Node] = {}
        own: dict[str, Node] = {}
        written_at: dict[str, Location] = {}
        for key_node, value_node in ynode.value:
            if key_node.tag == MERGE:
                self._merge_into(merged, value_node, path)
                continue
            key_loc = _loc(self.source, key_node)
            key = self._key(key_node, key_loc, path)
            if key is None:
                continue
            if key in own:
                first = written_at[key]
                self.report(key_loc, path + (key,), f"duplicate key {key!r} (first at {first.line}:{first.col})")
                continue
            own[key] = self.convert(value_node, path + (key,), key_loc)
            written_at[key] = key_loc
        # Written keys override merged ones (YAML merge semantics); merged keys come first.
        return {**merged, **own}

    def _merge_into(self, merged: dict[str, Node], value_node: YamlNode, path: KeyPath) -> None:
        sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        for source in sources:
            if not isinstance(source, MappingNode):
                self.report(
                    _loc(self.source, source),
                    path,
                    "'<<' merges a mapping or a list of mappings (e.g. `<<: *defaults`)",
                )
                continue
            # Converted under this mapping's path: the merged keys live here now.
            converted = self.convert(source, path)
            if not converted.is_map:  # refused (a cycle, past the node limit): reported, tainted
                continue
            for key, node in converted.value.items():
                merged.setdefault(key, node)  # earlier sources win, as YAML specifies

    def _key(self, key_node: YamlNode, key_loc: Location, path: KeyPath) -> str | None:
        if isinstance(key_node, ScalarNode) and key_node.tag == STR:
            key: str = key_node.value
            return key
        got = show(self._scalar(key_node, key_loc, path)) if isinstance(key_node, ScalarNode) else "a collection"
        self.report(key_loc, path, f"expected a string key, got {got}")
        return None

    def _check_tag(self, ynode: YamlNode, expected: str, loc: Location, path: KeyPath) -> str | None:
        """The collection's tag if it is not the plain one (reported).

        Reported, not tainted: the mapping or list is still read as written, so the schema judges
        what is inside it (a tag must not hide the rest of a document's problems).
        """
        if ynode.tag == expected:
            return None
        tag: str = ynode.tag
        self.report(loc, path, f"unsupported YAML tag {_short(tag)!r}")
        return tag

    def _scalar(self, ynode: ScalarNode, loc: Location, path: KeyPath) -> Any:
        text, tag = ynode.value, ynode.tag
        if tag == STR:
            return text
        parse = _SCALAR_PARSERS.get(tag)
        if parse is None:
            self.taint(loc, path, f"unsupported YAML tag {_short(tag)!r}")
            return text
        try:
            return parse(text)
        except _OutOfRange as e:
            self.taint(loc, path, str(e))
        except ValueError:
            self.taint(loc, path, f"{show(text)} is not a valid {_short(tag)}")
        return text


def tagged_paths(root: Node) -> set[KeyPath]:
    """The paths of the collections written with an unsupported tag, anywhere below `root`."""
    paths: set[KeyPath] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node.unsupported_tag is not None:
            paths.add(node.path)
        stack.extend(node.value.values() if node.is_map else node.value if node.is_list else ())
    return paths


def _short(tag: str) -> str:
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag


class _OutOfRange(ValueError):
    """A well-formed number beyond a limit; the message says which."""


def _parse_int(text: str) -> int:
    if not _INT_RE.match(text):
        raise ValueError(text)
    based = text.startswith(("0o", "0x"))
    digits = len(text) - 2 if based else len(text.lstrip("+-"))
    if digits > MAX_INT_DIGITS:  # checked before int(): Python itself refuses past 4300 digits
        raise _OutOfRange(f"expected an integer of at most {MAX_INT_DIGITS} digits, got {show(text)} ({digits} digits)")
    if based:
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _parse_float(text: str) -> float:
    if not _FLOAT_RE.match(text) and not _INT_RE.match(text):
        raise ValueError(text)
    lowered = text.lower()
    if lowered.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if lowered == ".nan":
        return math.nan
    # float() turns 1e400 into inf without a word: a number written as finite must stay finite.
    try:
        value = float(_parse_int(text)) if _INT_RE.match(text) else float(text)
    except (_OutOfRange, OverflowError):
        value = math.inf
    if math.isinf(value):
        raise _OutOfRange(f"expected a number within float64's range (about ±1.8e308), got {show(text)}")
    return value


def _parse_bool(text: str) -> bool:
    if not _BOOL_RE.match(text):
        raise ValueError(text)
    return text.lower() == "true"


def _parse_null(text: str) -> None:
    if not _NULL_RE.match(text):
        raise ValueError(text)
    return None


_SCALAR_PARSERS: dict[str, Callable[[str], Any]] = {
    INT: _parse_int,
    FLOAT: _parse_float,
    BOOL: _parse_bool,
    NULL: _parse_null,
}
