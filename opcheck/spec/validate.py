"""JSON Schema validation of a spec document, with errors phrased for the person who wrote it.

The schema (op_spec.schema.json, beside this module) is the same one editors use, so what the
editor underlines and what `opcheck validate` says agree. jsonschema finds the errors; this
module places each one at the YAML node it concerns and says "expected X, got Y".
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, relevance

from opcheck.spec.model import Location
from opcheck.spec.problems import FlaggedPath, KeyOf, KeyPath, Problem, did_you_mean, format_path, show
from opcheck.spec.yamlload import Node

Schema = dict[str, Any]
"""A (sub)schema: JSON read into dicts."""


def schema_path() -> Path:
    """The JSON Schema of the spec format (for editors: `# yaml-language-server: $schema=...`)."""
    return Path(__file__).with_name("op_spec.schema.json")


@functools.cache
def schema() -> Schema:
    loaded: Schema = json.loads(schema_path().read_text(encoding="utf-8"))
    return loaded


def _is_int(checker: object, instance: object) -> bool:
    # JSON Schema counts 3.0 as an integer; a shape of [3.0] is a typo here, not an integer.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _ecma_pattern(validator: Any, pattern: str, instance: object, schema: Schema) -> Iterator[ValidationError]:
    # ECMA-262's `$` (what editors use) is the end of the string; Python's also matches before a
    # final newline, which would let "name\n" through.
    if validator.is_type(instance, "string") and not re.search(_ecma_to_python(pattern), str(instance)):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def _ecma_to_python(pattern: str) -> str:
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern


@functools.cache
def _validator() -> Draft202012Validator:
    cls = jsonschema.validators.extend(
        Draft202012Validator,
        validators={"pattern": _ecma_pattern},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int),
    )
    return cls(schema())


def is_family(document: dict[str, Any]) -> bool:
    """A document is a family (`defaults` + `ops`) when it has either key, one op's spec otherwise.

    The validator and the builder both read a document this way, so the builder only reads what
    the validator checked.
    """
    return "ops" in document or "defaults" in document


def schema_problems(root: Node) -> list[tuple[FlaggedPath, Problem]]:
    """Every schema violation in the document, as (key path of the offending node, problem).

    The path is what the builder must not read (see Checker.clean): the node that is wrong, with
    everything inside it. A problem with a key (unknown, missing, badly named) ends in KeyOf(key):
    its mapping is not read whole, and an unknown key's value, which no schema judged, not at all;
    the mapping's other keys stay readable.
    """
    errors = _validator().iter_errors(root.plain())
    return list(_explain_all(errors, root))


def _explain_all(errors: Iterable[ValidationError], root: Node) -> Iterator[tuple[FlaggedPath, Problem]]:
    errors = list(errors)
    # A value of the wrong type fails every other keyword too; say only that its type is wrong.
    mistyped = {tuple(e.absolute_path) for e in errors if e.validator == "type"}
    for error in errors:
        if error.validator != "type" and tuple(error.absolute_path) in mistyped:
            continue
        yield from _explain(error, root)


def _explain(error: ValidationError, root: Node) -> Iterator[tuple[FlaggedPath, Problem]]:
    path: KeyPath = tuple(error.absolute_path)
    node = root.at(path)
    kind = error.validator
    if kind in ("anyOf", "oneOf") and error.context:
        yield from _explain_all(_best_branch(error), root)
    elif kind == "additionalProperties":
        for key in _unknown_keys(error):
            yield (
                path + (KeyOf(key),),
                _problem(node.value[key].key_loc, path + (key,), _unknown_key_message(key, error.schema, path)),
            )
    elif kind == "required":
        for key in error.validator_value:
            if key not in error.instance:
                yield path + (KeyOf(key),), _problem(node.loc, path, f"missing required key {key!r}")
    elif "propertyNames" in error.absolute_schema_path:
        key = error.instance  # the offending key itself; the error's path is its mapping's
        yield (
            path + (KeyOf(key),),
            _problem(node.value[key].key_loc, path + (key,), f"expected {describe(error.schema)}, got {show(key)}"),
        )
    elif kind in ("enum", "const"):
        yield path, _problem(node.loc, path, _choice_message(error))
    elif kind == "uniqueItems":
        yield from _duplicate_items(node, path)
    elif kind == "minItems":
        yield (
            path,
            _problem(
                node.loc,
                path,
                f"expected at least {_items(error.validator_value)}, "
                f"got {_items(len(error.instance)) if error.instance else 'an empty list'}",
            ),
        )
    elif kind == "maxItems":
        yield (
            path,
            _problem(
                node.loc, path, f"expected at most {_items(error.validator_value)}, got {_items(len(error.instance))}"
            ),
        )
    elif kind == "maximum":
        yield (
            path,
            _problem(
                node.loc,
                path,
                f"expected {describe(error.schema)} of at most {error.validator_value}, got {show(error.instance)}",
            ),
        )
    elif kind in ("type", "minimum", "exclusiveMinimum", "pattern", "minLength"):
        yield path, _problem(node.loc, path, f"expected {describe(error.schema)}, got {show(error.instance)}")
    else:  # a keyword this module does not phrase yet: jsonschema's own words are still precise
        yield path, _problem(node.loc, path, error.message)


def _problem(loc: Location, path: KeyPath, message: str) -> Problem:
    return Problem(loc, format_path(path), message)


# -- alternatives ------------------------------------------------------------------------------


def _best_branch(error: ValidationError) -> list[ValidationError]:
    """The errors of the alternative the writer most likely meant.

    jsonschema's best_match descends into one error; here all errors of the chosen branch are
    kept, so a tensor mapping with two typos reports both. A branch is likelier the more of the
    instance's keys it knows (exactly, or nearly: a typo still shows intent), then the fewer
    problems it has at the instance itself, then the deeper its errors reach; jsonschema's
    relevance breaks the remaining ties, then the branch order.
    """
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    if not error.absolute_path and isinstance(error.instance, dict):
        # The document itself: read it the way the builder does (a family when it has `ops` or
        # `defaults`, one op otherwise), so that every part the builder reads has been checked.
        family = 1 if is_family(error.instance) else 0
        if family in branches:
            return branches[family]
    alternatives = error.schema[error.validator]
    depth = len(error.absolute_path)
    # The branch best_match would descend into (it takes the least of the context by relevance).
    preferred = min(error.context, key=relevance).relative_schema_path[0]

    def score(index: int) -> tuple[bool, float, int, int, int, bool, int]:
        errs = branches[index]
        at_root = [e for e in errs if len(e.absolute_path) == depth]
        wrong_type = any(e.validator == "type" for e in at_root)
        known = _known_keys(error.instance, _deref(alternatives[index]))
        if isinstance(error.instance, dict) and not known:
            return (wrong_type, 0, 0, 0, 0, False, index)  # nothing shows intent: the first fitting branch
        deepest = max(len(e.absolute_path) for e in errs)
        return (wrong_type, -known, len(at_root), -deepest, len(errs), index != preferred, index)

    return branches[min(branches, key=score)]


def _known_keys(instance: Any, branch: Schema) -> float:
    """How well a branch's keys cover the instance's: 1 per exact key, the similarity of a near one."""
    if not isinstance(instance, dict):
        return 0.0
    names = list(branch.get("properties", {}))
    return sum(_similarity(key, names) for key in instance)


def _similarity(key: str, names: list[str]) -> float:
    if key in names:
        return 1.0
    ratios = [difflib.SequenceMatcher(None, key, name).ratio() for name in names]
    best = max(ratios, default=0.0)
    return best if best >= 0.6 else 0.0  # difflib.get_close_matches' default cutoff


@functools.cache
def _def(name: str) -> Schema:
    found: Schema = schema()["$defs"][name]
    return found


def _deref(sub: Schema) -> Schema:
    """Follows local `$ref`s ("#/$defs/name"), the only kind the spec schema uses."""
    while isinstance(sub, dict) and "$ref" in sub:
        sub = _def(sub["$ref"].rsplit("/", 1)[-1])
    return sub


# -- messages ----------------------------------------------------------------------------------


def _unknown_keys(error: ValidationError) -> list[str]:
    known = error.schema.get("properties", {})
    return [k for k in error.instance if k not in known]


def _unknown_key_message(key: str, mapping_schema: Schema, path: KeyPath) -> str:
    allowed = list(mapping_schema.get("properties", {}))
    if path == ("defaults",) and key in ("op", "name"):
        return f"unknown key {key!r}: `{key}` belongs in each entry of `ops`, not in `defaults`"
    hint = did_you_mean(key, allowed)
    if hint:
        return f"unknown key {key!r}{hint}"
    return f"unknown key {key!r} (expected one of: {', '.join(allowed)})"


def _choice_message(error: ValidationError) -> str:
    choices = error.validator_value if error.validator == "enum" else [error.validator_value]
    listed = ", ".join(_literal(c) for c in choices)
    strings = [c for c in choices if isinstance(c, str)]
    return f"expected one of {listed}, got {show(error.instance)}{did_you_mean(error.instance, strings)}"


def _items(count: int) -> str:
    return f"{count} item{'' if count == 1 else 's'}"


def _literal(value: Any) -> str:
    return show(value) if not isinstance(value, str) else value


def _duplicate_items(node: Node, path: KeyPath) -> Iterator[tuple[FlaggedPath, Problem]]:
    seen: dict[str, Node] = {}
    for item in node.value:
        key = json.dumps(item.plain(), sort_keys=True)
        if key in seen:
            first = seen[key].loc
            yield (
                item.path,
                _problem(
                    item.loc, item.path, f"{show(item.plain())} is listed twice (first at {first.line}:{first.col})"
                ),
            )
        else:
            seen[key] = item


_NOUNS = {
    "integer": "integer",
    "number": "number",
    "string": "string",
    "boolean": "boolean",
    "object": "mapping",
    "array": "list",
    "null": "null",
}


def describe(sub: Schema, plural: bool = False) -> str:
    """A noun phrase for what a schema accepts: "a list of non-negative integers"."""
    sub = _deref(sub)
    if "title" in sub:
        title: str = sub["title"]
        if not plural:
            return title
        if "(" not in title and title.startswith(("a ", "an ")):  # "a tensor mapping" -> "tensor mappings"
            return title.split(" ", 1)[1] + "s"
    if "enum" in sub:
        listed = ", ".join(_literal(c) for c in sub["enum"])
        return f"values among {listed}" if plural else f"one of {listed}"
    types = sub.get("type", [])
    types = [types] if isinstance(types, str) else types
    if types == ["array"] and "items" in sub:
        phrase = f"list{'s' if plural else ''} of {describe(sub['items'], plural=True)}"
        return phrase if plural else f"a {phrase}"
    words = [_qualified(sub, _NOUNS.get(t, t), plural) for t in types]
    if not words:
        return "values" if plural else "a value"
    phrase = " or ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " or " + words[-1]
    return phrase


def _qualified(sub: Schema, noun: str, plural: bool) -> str:
    if sub.get("minLength") == 1:
        noun = f"non-empty {noun}"
    elif sub.get("minimum") == 0:
        noun = f"non-negative {noun}"
    elif sub.get("exclusiveMinimum") == 0 or sub.get("minimum") == 1:
        noun = f"positive {noun}"
    if noun == "null":
        return "null" if not plural else "nulls"
    if plural:
        return noun + "s"
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
