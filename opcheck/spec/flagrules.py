"""Flags that are set but cannot take effect: another key of the spec turns their check off.

OpSpec.checks() decides which tests a spec generates; a flag whose check is not generated is
dropped without a word unless it is reported here, where it is written, naming the key that
turns it off. In a family, a flag from `defaults` is the family's default: an op that opts out
of its check (say `supports_forward_ad: false`) is not told about it; a key in `defaults` that
turns off a flag of `defaults` still is.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcheck.spec.checker import Checker
from opcheck.spec.problems import show
from opcheck.spec.yamlload import Node


@dataclass(frozen=True)
class _Disabler:
    """A key whose value turns a check off."""

    path: tuple[str, ...]
    value: object

    def found(self, ctx: Checker, fields: dict[str, Node]) -> Node | None:
        """The key's node where it is written with the disabling value (the schema fixed its type)."""
        node = _lookup(fields, self.path)
        return node if ctx.clean(node) and node.value == self.value else None

    def written(self) -> str:
        value = "[]" if self.value == [] else show(self.value)
        return f"{'.'.join(self.path)}: {value}"


@dataclass(frozen=True)
class _FlagRule:
    flag: tuple[str, str]
    effect: str  # what the flag would do, for the message
    disablers: tuple[_Disabler, ...]


_NO_FORWARD_AD = _Disabler(("supports_forward_ad",), False)
_NO_GRADGRAD = _Disabler(("supports_gradgrad",), False)
_GRADGRAD_OFF = _Disabler(("gradgradcheck", "enabled"), False)
_NO_GRAD_DTYPES = _Disabler(("dtypes",), [])

_RULES = (
    _FlagRule(
        ("gradcheck", "check_forward_ad"),
        "no forward_ad test is generated and the low-precision check takes no JVP "
        "(forward_ad_unsupported asserts that forward AD raises, gives no tangent or fails)",
        (_NO_FORWARD_AD,),
    ),
    _FlagRule(("gradcheck", "check_batched_forward_grad"), "no forward_ad test is generated", (_NO_FORWARD_AD,)),
    _FlagRule(
        ("gradgradcheck", "check_fwd_over_rev"),
        "no fwgrad_bwgrad test is generated",
        (_NO_FORWARD_AD, _GRADGRAD_OFF, _NO_GRADGRAD, _NO_GRAD_DTYPES),
    ),
    _FlagRule(
        ("gradgradcheck", "check_batched_grad"),
        "no gradgradcheck test is generated",
        (_GRADGRAD_OFF, _NO_GRADGRAD, _NO_GRAD_DTYPES),
    ),
)


def check_flags(ctx: Checker, fields: dict[str, Node]) -> None:
    """Reports each flag set to true whose check another key of the same op turns off."""
    for rule in _RULES:
        flag = _lookup(fields, rule.flag)
        if not ctx.clean(flag) or flag.value is not True:
            continue
        from_defaults = _from_defaults(flag)
        found = [(d, d.found(ctx, fields)) for d in rule.disablers]
        disablers = [(d, node) for d, node in found if node is not None and (_from_defaults(node) or not from_defaults)]
        if disablers:
            keys = [f"`{d.written()}` (line {(node.key_loc or node.loc).line})" for d, node in disablers]
            said = keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} and {keys[-1]}"
            ctx.report(
                flag,
                f"true has no effect with {said}: {rule.effect}; remove the flag, or the key that turns it off",
                at_key=True,
            )


def _lookup(fields: dict[str, Node], path: tuple[str, ...]) -> Node | None:
    node: Node | None = None
    value: object = fields
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        node = value[key]
        value = node.value if node.is_map else None
    return node


def _from_defaults(node: Node) -> bool:
    return bool(node.path) and node.path[0] == "defaults"
