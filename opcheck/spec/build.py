"""A schema-checked document → OpSpecs, with the rules about each op and its rules (skips, ...).

A family document (`defaults` + `ops`) is merged here, entry by entry, before the entry is
built; a merged-in value keeps its `defaults...` path and location, so a problem with it is
reported where it was written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from opcheck.spec import model
from opcheck.spec.checker import Checker, strings
from opcheck.spec.flagrules import check_flags
from opcheck.spec.model import (
    CompileFlags,
    FastMode,
    GradcheckFlags,
    GradgradcheckFlags,
    Location,
    LowprecCriterion,
    LowprecPartsRule,
    OpSpec,
    ReducedPrecision,
    Rule,
    ToleranceRule,
    Where,
)
from opcheck.spec.oppath import OP_PATH_RE, OpPathError, import_listed, resolve_op
from opcheck.spec.problems import FlaggedPath, Problem, did_you_mean, format_path
from opcheck.spec.requires import missing_modules
from opcheck.spec.samples import build_sample
from opcheck.spec.signature import check_arguments
from opcheck.spec.sparse import may_be_sparse
from opcheck.spec.validate import is_family
from opcheck.spec.values_file import ValuesFiles
from opcheck.spec.yamlload import MAX_NODES, Node, tagged_paths

NAME_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
_TOLERANCE_KEYS = ("eps", "atol", "rtol", "nondet_tol")
_LOWPREC_RULE_KEYS = ("criterion", "factor", "floor")  # tolerance rule keys the low-precision check alone reads
_Flags = TypeVar("_Flags", GradcheckFlags, GradgradcheckFlags, ReducedPrecision)


@dataclass(frozen=True)
class NameClaim:
    """A spec's name and where it comes from, for the cross-spec uniqueness pass."""

    name: str
    location: Location  # of `name:`'s value, or of `op:`'s value when the name is derived
    path: str
    derived: bool


@dataclass
class Built:
    """What one document yields: its specs (only when it has no problem), names and problems."""

    specs: list[OpSpec]
    claims: list[NameClaim]
    problems: list[Problem]


def build_document(
    root: Node, *, source: str, sha256: str, flagged: set[FlaggedPath], values_files: ValuesFiles | None = None
) -> Built:
    """The specs of a document whose schema problems (and unreadable values) are at `flagged`.

    Only what the schema judged clean is read: a flagged node, anything inside it, and a
    collection with an unsupported tag are never built (their problems are already reported).
    `values_files` reads the files its tensors' `values_file` name (default: relative to the
    working directory as the project root).
    """
    ctx = Checker(flagged | tagged_paths(root), source=source, values_files=values_files)
    specs: list[OpSpec | None] = []
    claims: list[NameClaim] = []
    if root.is_map and is_family(root.value) and _check_expansion(ctx, root):
        return Built([], [], ctx.problems)
    if root.is_map:
        for entry, family in _entries(root):
            spec, claim = _build_op(ctx, entry, family=family, source=source, sha256=sha256)
            specs.append(spec)
            claims.extend([claim] if claim else [])
    built = [spec for spec in specs if spec is not None]
    ok = not ctx.problems and len(built) == len(specs)
    return Built(built if ok else [], claims, ctx.problems)


def derive_name(op: str) -> str:
    """The default `name`: torch.nn.functional.softmax → softmax, torch.ops.aten.mul.Tensor →
    mul_tensor (a `.default` overload adds nothing), examples.ops:Square.apply → square_apply."""
    if ":" in op:
        parts = op.split(":", 1)[1].split(".")
    else:
        parts = op.split(".")
        if parts[:2] == ["torch", "ops"] and len(parts) >= 4:
            parts = parts[3:5] if parts[4:5] != ["default"] else parts[3:4]
        else:
            parts = parts[-1:]
    return re.sub(r"[^a-z0-9_]", "_", "_".join(parts).lower()).strip("_")


def _entries(root: Node) -> Iterator[tuple[Node, bool]]:
    """(entry node, is family) for each op of the document; family entries merged over defaults."""
    if not is_family(root.value):
        yield root, False
        return
    ops = root.value.get("ops")
    if ops is None:  # a family without ops has nothing to build (the schema says so)
        return
    defaults = root.value.get("defaults")
    for entry in ops.value if ops.is_list else []:
        if entry.is_map:
            yield _merge(defaults, entry), True


def _check_expansion(ctx: Checker, root: Node) -> bool:
    """Whether merging `defaults` into every op would make more than MAX_NODES values (reported).

    The YAML loader bounds the values of the text, aliases expanded; merging multiplies them by
    the number of ops, and everything after (building, test ids, generated modules) grows with
    the product. It is counted here, before anything is merged.
    """
    ops, defaults = root.value.get("ops"), root.value.get("defaults")
    if ops is None or not ops.is_list or defaults is None:
        return False
    sizes: dict[int, int] = {}
    total = _size(root, sizes) + sum(_merged_size(defaults, entry, sizes) - _size(entry, sizes) for entry in ops.value)
    if total <= MAX_NODES:
        return False
    ctx.report(
        ops,
        f"expected at most {MAX_NODES} values with `defaults` merged into each op, got {total} "
        f"({len(ops.value)} ops, `defaults` has {_size(defaults, sizes)}); share less through "
        f"`defaults` or split the family into several files",
        at_key=True,
    )
    return True


def _size(node: Node, sizes: dict[int, int]) -> int:
    """How many values the node is, itself included (memoized: entries are sized twice)."""
    known = sizes.get(id(node))
    if known is None:
        children = node.value.values() if node.is_map else node.value if node.is_list else ()
        known = sizes[id(node)] = 1 + sum(_size(child, sizes) for child in children)
    return known


def _merged_size(base: Node | None, over: Node, sizes: dict[int, int]) -> int:
    """_size(_merge(base, over)), without merging."""
    if base is None or not (base.is_map and over.is_map):
        return _size(over, sizes)
    return (
        1
        + sum(_size(node, sizes) for key, node in base.value.items() if key not in over.value)
        + sum(_merged_size(base.value.get(key), node, sizes) for key, node in over.value.items())
    )


def _merge(base: Node | None, over: Node) -> Node:
    """`over` merged over `base`: mappings key by key, everything else replaced."""
    if base is None or not (base.is_map and over.is_map):
        return over
    value = dict(base.value)
    for key, node in over.value.items():
        value[key] = _merge(value.get(key), node)
    return Node(value, over.loc, over.path, over.key_loc)


def _build_op(
    ctx: Checker, m: Node, *, family: bool, source: str, sha256: str
) -> tuple[OpSpec | None, NameClaim | None]:
    """One op's spec (None if it has a problem), and its name claim (even then, for the cross pass)."""
    before = ctx.count()
    fields = m.value
    op = _op_path(ctx, fields.get("op"))
    name, claim = _name(ctx, fields.get("name"), fields.get("op"))
    reference = _op_path(ctx, fields.get("reference")) if "reference" in fields else None
    requires = _requires(ctx, fields)
    imports = _imports(ctx, fields)
    # The one gate on importing the op's modules while validating: where a module the op needs
    # is not installed, importing its op or reference would fail, so neither is imported (nor
    # the samples bound to its signature); its tests skip at run time, and the CLI says so.
    if requires is not None and not missing_modules(requires):
        if imports is not None and _imported(ctx, fields, op):
            op, reference = _check_imports(ctx, fields, op, reference)
        else:  # the op cannot be resolved without the modules that register it
            op = reference = None
    variant = _value(ctx, fields, "variant", "function")
    if op and variant == "method":
        _check_method(ctx, fields["variant"], op)
    _check_dtype_lists(ctx, fields, reference)
    samples, sample_names = _samples(ctx, m)
    label = f"op {op!r}" if family else None
    lowprec = _lowprec_dtypes(ctx, fields)
    # Every part is built (and so checked) before deciding: all of a spec's problems show at once.
    parts = dict(
        dtypes=_strings(ctx, fields, "dtypes", ("float64",)),
        lowprec_dtypes=_strings(ctx, fields, "lowprec_dtypes", ()),
        devices=_strings(ctx, fields, "devices", model.KNOWN_DEVICES),
        gradcheck=_gradcheck(ctx, fields.get("gradcheck")),
        gradgradcheck=_flags(ctx, fields.get("gradgradcheck"), GradgradcheckFlags),
        supports_forward_ad=_value(ctx, fields, "supports_forward_ad", True),
        supports_gradgrad=_value(ctx, fields, "supports_gradgrad", True),
        library_opcheck=_value(ctx, fields, "library_opcheck", False),
        compile=_compile(ctx, fields),
        requires=requires or (),
        imports=imports or (),
        reference=reference,
        clone_inputs=_value(ctx, fields, "clone_inputs", False),
        writes_grad_outputs=_writes_grad_outputs(ctx, fields, lowprec, label),
        reduced_precision=_reduced_precision(ctx, fields, lowprec, label),
        **{
            key: _rules(ctx, fields.get(key), key, sample_names, label, lowprec)
            for key in ("tolerances", "skips", "expected_failures")
        },
        lowprec_parts=_lowprec_parts(ctx, fields, sample_names, label, lowprec),
    )
    _check_masked(ctx, fields.get("gradcheck"), fields.get("samples"))
    check_flags(ctx, fields)
    if ctx.count() != before or op is None or name is None or samples is None:
        return None, claim
    spec = OpSpec(
        name=name,
        op=op,
        source=source,
        sha256=sha256,
        samples=samples,
        variant=variant,
        location=fields["op"].key_loc,
        **parts,
    )
    return spec, claim


# -- op, name, variant -------------------------------------------------------------------------


def _op_path(ctx: Checker, node: Node | None) -> str | None:
    """The op path as written (the schema checked its form; _check_imports, what it names)."""
    return node.value if ctx.clean(node) else None


def _requires(ctx: Checker, fields: dict[str, Node]) -> tuple[str, ...] | None:
    """The `requires:` modules, () without the key; None when it cannot be read (already reported)."""
    node = fields.get("requires")
    return () if node is None else strings(node) if ctx.clean(node) else None


def _imports(ctx: Checker, fields: dict[str, Node]) -> tuple[str, ...] | None:
    """The `imports:` modules, () without the key; None when it cannot be read (already reported)."""
    node = fields.get("imports")
    return () if node is None else strings(node) if ctx.clean(node) else None


def _imported(ctx: Checker, fields: dict[str, Node], op: str | None) -> bool:
    """Imports each module `imports:` lists, in order, reporting the ones that fail where they are
    listed; whether all of them were imported."""
    node = fields.get("imports")
    if node is None:
        return True
    for item in node.value:
        try:
            import_listed(item.value, op or "")
        except OpPathError as e:
            ctx.report(item, str(e))
            return False
        except Exception as e:  # the import machinery itself failing: reported, never a traceback
            ctx.report(item, f"importing {item.value!r} failed: {type(e).__name__}: {e}")
            return False
    return True


def _check_imports(
    ctx: Checker, fields: dict[str, Node], op: str | None, reference: str | None
) -> tuple[str | None, str | None]:
    """What needs the op's modules imported: the op and the reference resolve to callables, a
    library_opcheck op is a torch.library one, the samples fit the op's signature. The op and the
    reference, each None where it does not resolve (reported where it is written)."""
    op = _resolved(ctx, fields["op"]) if op else None
    reference = _resolved(ctx, fields["reference"]) if reference else None
    if op and _value(ctx, fields, "library_opcheck", False) and not _is_library_op(op):
        ctx.report(
            fields["library_opcheck"],
            f"library_opcheck checks torch.ops.* operators and torch.library custom ops; {op!r} is neither",
        )
    if op:
        check_arguments(ctx, op, fields.get("samples"))
    return op, reference


def _resolved(ctx: Checker, node: Node) -> str | None:
    """The op path if it resolves to a callable (reported where it is written otherwise)."""
    try:
        resolve_op(node.value)
    except OpPathError as e:
        ctx.report(node, str(e))
        return None
    except Exception as e:  # resolve_op wraps import errors; this guards the rest of the import machinery
        ctx.report(node, f"resolving {node.value!r} failed: {type(e).__name__}: {e}")
        return None
    op: str = node.value
    return op


def _is_library_op(op: str) -> bool:
    if op.startswith("torch.ops."):
        return True
    import torch  # only reached for specs that ask for library_opcheck

    custom = getattr(getattr(torch, "_library", None), "custom_ops", None)
    kinds = (torch._ops.OpOverload, torch._ops.OpOverloadPacket) + ((custom.CustomOpDef,) if custom else ())
    return isinstance(resolve_op(op), kinds)


def _check_dtype_lists(ctx: Checker, fields: dict[str, Node], reference: str | None) -> None:
    """An op with no float64 path (dtypes: []) is checked only against a reference, at low precision."""
    dtypes, lowprec = fields.get("dtypes"), fields.get("lowprec_dtypes")
    has_lowprec = ctx.readable(lowprec) and bool(lowprec.value)  # a refused dtype is still one listed
    if ctx.clean(dtypes) and dtypes.value == []:
        if not has_lowprec:
            ctx.report(
                dtypes,
                "empty: with no gradient-check dtype, list the kernel's dtypes in lowprec_dtypes "
                "(and give a float64 `reference`)",
            )
        elif reference is None and "reference" not in fields:
            ctx.report(
                dtypes,
                "empty: the low-precision check then needs `reference:`, a float64 implementation "
                "of the same math to compare against",
            )
    if "reference" in fields and not has_lowprec:
        ctx.report(fields["reference"], "`reference` is used only by the low-precision check; add lowprec_dtypes")


def _name(ctx: Checker, name_node: Node | None, op_node: Node | None) -> tuple[str | None, NameClaim | None]:
    if name_node is not None:
        if not ctx.clean(name_node):
            return None, None
        # The schema checks this pattern too; a name ends up in a file name and in Python source,
        # so it is checked again here, whatever the schema says.
        if not NAME_RE.match(name_node.value):
            ctx.report(name_node, f"expected a lowercase identifier ([a-z][a-z0-9_]*), got {name_node.value!r}")
            return None, None
        return name_node.value, NameClaim(name_node.value, name_node.loc, format_path(name_node.path), False)
    if not (ctx.clean(op_node) and OP_PATH_RE.match(op_node.value)):
        return None, None  # the op's own problem is reported; a name derived from it would mislead
    name = derive_name(op_node.value)
    if not NAME_RE.match(name):
        ctx.report(op_node, f"cannot derive a name from op {op_node.value!r} (got {name!r}); set `name:`")
        return None, None
    return name, NameClaim(name, op_node.loc, format_path(op_node.path), True)


def _check_method(ctx: Checker, variant_node: Node, op: str) -> None:
    if op.startswith("torch.ops."):
        ctx.report(
            variant_node,
            f"variant 'method' needs an op path ending in a Tensor method "
            f"(torch.Tensor.mul); {op!r} is an operator, call it as a function",
        )
        return
    attr = re.split(r"[.:]", op)[-1]
    import torch  # only specs with variant: method need it; the rest of the loader stays light

    if not hasattr(torch.Tensor, attr):
        hint = did_you_mean(attr, [n for n in dir(torch.Tensor) if not n.startswith("_")])
        ctx.report(
            variant_node, f"variant 'method' calls args[0].{attr}(...), but torch.Tensor has no method {attr!r}{hint}"
        )


# -- samples and rules -------------------------------------------------------------------------


def _samples(ctx: Checker, m: Node) -> tuple[tuple[model.Sample, ...] | None, set[str] | None]:
    """The samples (None on a problem) and the names a `where` may use (None: can't be known)."""
    node = m.value.get("samples")
    if node is None:
        ctx.report(m, "missing required key 'samples'")  # the schema says so too, but not for a family entry
        return None, None
    if not node.is_list:
        return None, None
    built: list[model.Sample | None] = []
    first: dict[str, Node] = {}
    for sample in (s for s in node.value if s.is_map):
        name_node = sample.value.get("name")
        if ctx.clean(name_node):
            if name_node.value in first:
                at = first[name_node.value].loc
                ctx.report(name_node, f"duplicate sample name {name_node.value!r} (first at {at.line}:{at.col})")
            first.setdefault(name_node.value, name_node)
        if ctx.readable(sample):  # built only when clean; its clean arguments are checked anyway
            built.append(build_sample(ctx, sample))
    samples = tuple(sample for sample in built if sample is not None)
    if not ctx.clean(node) or len(samples) != len(built):
        return None, set(first)
    return samples, set(first)


def _check_masked(ctx: Checker, gradcheck: Node | None, samples: Node | None) -> None:
    """`masked: true` changes only how gradients of sparse inputs are compared: with no sparse
    tensor in any sample it is a mistake. Generator and OpInfo samples may make sparse tensors
    themselves, so a spec with one is not judged, nor one whose samples hold a schema problem (it
    may be a misspelled `layout`). A sample's other problems leave its layouts as written."""
    masked = gradcheck.value.get("masked") if ctx.readable(gradcheck) and gradcheck.is_map else None
    if not (ctx.clean(masked) and masked.value is True and ctx.clean(samples) and samples.is_list):
        return
    if any("generator" in s.value or "opinfo" in s.value or may_be_sparse(s) for s in samples.value if s.is_map):
        return
    ctx.report(
        masked,
        "has no effect: no sample has a sparse tensor (a `layout` such as "
        "sparse_coo or sparse_csr); masked only changes how the gradients of sparse "
        "inputs are compared",
        at_key=True,
    )


def _rules(
    ctx: Checker,
    node: Node | None,
    key: str,
    sample_names: set[str] | None,
    label: str | None,
    lowprec: tuple[str, ...] | None,
) -> tuple[ToleranceRule | Rule, ...]:
    if node is None or not node.is_list:
        return ()
    rules: list[ToleranceRule | Rule] = []
    for rule in node.value:
        # Parts the schema rejected may reach here in other shapes (null, a list): skip them,
        # their problem is already reported.
        if not (ctx.readable(rule) and rule.is_map):
            continue
        _check_where_samples(ctx, rule.value.get("where"), sample_names, label)
        if ctx.clean(rule):
            where = _where(rule.value.get("where"))
            # A missing reason is a schema problem of this or (for a mapping that looks more like
            # a family) the other branch; either way the document is already rejected.
            reason = rule.value.get("reason")
            rules.append(
                _tolerance_rule(ctx, rule, where, lowprec, label)
                if key == "tolerances"
                else Rule(where=where, reason=reason.value if reason is not None else "", location=rule.loc)
            )
    return tuple(rules)


def _where(node: Node | None) -> Where:
    if node is None or not node.is_map:
        return Where()
    fields = {key: strings(node.value.get(key)) for key in ("device", "dtype", "check", "sample")}
    torch = node.value.get("torch")  # its form is the schema's (torchCondition)
    return Where(
        **{key: value for key, value in fields.items() if value is not None},
        torch=torch.value if torch is not None else None,
    )


def _check_where_samples(ctx: Checker, where: Node | None, sample_names: set[str] | None, label: str | None) -> None:
    """The samples a rule's `where` names, where they and the spec's sample names can be read."""
    if sample_names is None or not (ctx.readable(where) and where.is_map):
        return
    node = where.value.get("sample")
    if ctx.clean(node):
        _check_sample_names(ctx, node, sample_names, label)


def _check_sample_names(ctx: Checker, node: Node | None, sample_names: set[str], label: str | None) -> None:
    """A `where` naming a sample that does not exist would silently match nothing."""
    for item in (node.value if node.is_list else [node]) if node is not None else []:
        if item.value not in sample_names:
            known = ", ".join(sorted(sample_names)) or "none"
            owner = f" of {label}" if label else ""
            ctx.report(
                item,
                f"unknown sample {item.value!r}{did_you_mean(item.value, sorted(sample_names))} "
                f"(samples{owner}: {known})",
            )


def _tolerance_rule(
    ctx: Checker, rule: Node, where: Where, lowprec: tuple[str, ...] | None, label: str | None
) -> ToleranceRule:
    f = rule.value
    if not any(key in f for key in _TOLERANCE_KEYS + _LOWPREC_RULE_KEYS):
        ctx.report(rule, f"a tolerance rule needs at least one of {', '.join(_TOLERANCE_KEYS + _LOWPREC_RULE_KEYS)}")
    _check_lowprec_rule_keys(ctx, rule, where, lowprec, label)
    numbers = {key: ctx.finite(f.get(key)) for key in _TOLERANCE_KEYS + ("factor", "floor")}
    criterion = LowprecCriterion.parse(f["criterion"].value).value if "criterion" in f else None
    reason = f["reason"].value if "reason" in f else None
    return ToleranceRule(where=where, criterion=criterion, reason=reason, location=rule.loc, **numbers)


def _check_lowprec_rule_keys(
    ctx: Checker, rule: Node, where: Where, lowprec: tuple[str, ...] | None, label: str | None
) -> None:
    """criterion, factor and floor are read by the low-precision check alone: in a rule that
    matches no low-precision test they would be dropped without a word. (The rule's other keys
    apply to every test it matches, as always.)"""
    for key in (k for k in _LOWPREC_RULE_KEYS if k in rule.value):
        if lowprec == ():
            why = f"{label or 'the spec'} has no lowprec_dtypes, so no test reads it; add lowprec_dtypes, or remove it"
        elif where.check and model.LOWPREC not in where.check:
            why = (
                f"this rule's where.check ({', '.join(where.check)}) leaves out lowprec; "
                f"add lowprec to where.check, or move {key} to a rule of its own"
            )
        elif lowprec and where.dtype and not set(where.dtype) & set(lowprec):
            why = (
                f"this rule's where.dtype ({', '.join(where.dtype)}) has none of lowprec_dtypes "
                f"({', '.join(lowprec)}); name one of them, or move {key} to a rule of its own"
            )
        else:
            continue
        ctx.report(rule.value[key], f"applies to the lowprec check only; {why}", at_key=True)


def _lowprec_dtypes(ctx: Checker, fields: dict[str, Node]) -> tuple[str, ...] | None:
    """The spec's lowprec_dtypes, () without them; None when they cannot be read (already reported)."""
    node = fields.get("lowprec_dtypes")
    return () if node is None else strings(node) if ctx.clean(node) else None


def _reduced_precision(
    ctx: Checker, fields: dict[str, Node], lowprec: tuple[str, ...] | None, label: str | None
) -> ReducedPrecision:
    """The `reduced_precision:` switches, which hold only while the low-precision tests run."""
    node = fields.get("reduced_precision")
    if node is not None and lowprec == ():
        none = f" ({label} has none)" if label else ""
        ctx.report(
            node,
            "its switches are set only while the low-precision check runs, and that check does not "
            f"run without lowprec_dtypes{none}; add them",
            at_key=True,
        )
    return _flags(ctx, node, ReducedPrecision)


def _writes_grad_outputs(
    ctx: Checker, fields: dict[str, Node], lowprec: tuple[str, ...] | None, label: str | None
) -> bool:
    """`writes_grad_outputs:`, which only the low-precision check reads (it finds the write)."""
    node = fields.get("writes_grad_outputs")
    if node is not None and node.value is True and lowprec == ():
        none = f" ({label} has none)" if label else ""
        ctx.report(
            node,
            "the low-precision check is the one that finds a write into grad_output, and it does not "
            f"run without lowprec_dtypes{none}; add them",
            at_key=True,
        )
    return bool(_value(ctx, fields, "writes_grad_outputs", False))


def _lowprec_parts(
    ctx: Checker,
    fields: dict[str, Node],
    sample_names: set[str] | None,
    label: str | None,
    dtypes: tuple[str, ...] | None,
) -> tuple[LowprecPartsRule, ...]:
    """The `lowprec_parts:` rules; the schema checked their keys, parts and where: fields."""
    node = fields.get("lowprec_parts")
    if node is None or not node.is_list:
        return ()
    if dtypes == () and node.value:
        ctx.report(node, "the low-precision check does not run without lowprec_dtypes; add them", at_key=True)
    rules: list[LowprecPartsRule] = []
    for rule in node.value:
        if not (ctx.readable(rule) and rule.is_map):
            continue
        _check_where_samples(ctx, rule.value.get("where"), sample_names, label)
        if dtypes:
            _check_lowprec_dtypes(ctx, rule.value.get("where"), dtypes)
        if not ctx.clean(rule):
            continue  # its problems are reported; its `where` is checked all the same
        where = _where(rule.value.get("where"))
        parts, reason = rule.value.get("parts"), rule.value.get("reason")
        rules.append(
            LowprecPartsRule(
                where=where,
                parts=strings(parts) if parts is not None else model.LOWPREC_PARTS,
                reason=reason.value if reason is not None else None,
                location=rule.loc,
            )
        )
    return tuple(rules)


def _check_lowprec_dtypes(ctx: Checker, where: Node | None, dtypes: tuple[str, ...]) -> None:
    """A lowprec_parts rule's dtype outside lowprec_dtypes would silently match nothing."""
    node = where.value.get("dtype") if ctx.readable(where) and where.is_map else None
    for item in (node.value if node.is_list else [node]) if ctx.clean(node) else []:
        if item.value not in dtypes:
            ctx.report(
                item, f"dtype {item.value!r} is not in lowprec_dtypes ({', '.join(dtypes)}); the rule matches no test"
            )


# -- flags and plain values --------------------------------------------------------------------


def _gradcheck(ctx: Checker, node: Node | None) -> GradcheckFlags:
    flags = _flags(ctx, node, GradcheckFlags)
    if node is None or not node.is_map or not ctx.clean(node):
        return flags
    fast_mode = node.value.get("fast_mode")
    # YAML reads `fast_mode: true` as a bool; the model keeps the three spellings as strings.
    mode = flags.fast_mode if fast_mode is None else FastMode.parse(str(fast_mode.value).lower()).value
    eps, atol, rtol, nondet_tol = (ctx.finite(node.value.get(key)) for key in _TOLERANCE_KEYS)
    return replace(
        flags,
        fast_mode=mode,
        eps=eps,
        atol=atol,
        rtol=rtol,
        nondet_tol=flags.nondet_tol if nondet_tol is None else nondet_tol,
    )


def _compile(ctx: Checker, spec: dict[str, Node]) -> CompileFlags | None:
    """The `compile:` block; `true`/`false` are the defaults switched on/off; None without the key.
    Its `dtypes` are the spec's own: the op runs at them (eagerly, the compiled run's reference)."""
    node = spec.get("compile")
    if node is None or not ctx.clean(node):
        return None
    if not node.is_map:
        return CompileFlags(enabled=bool(node.value))
    fields = node.value
    off = fields.get("cases_off")
    dtypes = _strings(ctx, fields, "dtypes", ())
    declared = _strings(ctx, spec, "dtypes", ("float64",)) + _strings(ctx, spec, "lowprec_dtypes", ())
    for item, dtype in zip(fields["dtypes"].value if dtypes else (), dtypes):
        if dtype not in declared:
            ctx.report(
                item,
                f"{dtype} is not one of the spec's dtypes or lowprec_dtypes ({', '.join(declared) or 'none'}): "
                "the compile check runs the op at the dtypes the spec declares it runs at",
            )
    return CompileFlags(
        backends=_strings(ctx, fields, "backends", CompileFlags.backends),
        dtypes=dtypes,
        fullgraph=_value(ctx, fields, "fullgraph", False),
        cases_off=tuple((key, reason.value) for key, reason in off.value.items()) if off is not None else (),
    )


def _flags(ctx: Checker, node: Node | None, cls: type[_Flags]) -> _Flags:
    if node is None or not node.is_map or not ctx.clean(node):
        return cls()
    return cls(**{key: value.value for key, value in node.value.items()})


def _value(ctx: Checker, fields: dict[str, Node], key: str, default: Any) -> Any:
    node = fields.get(key)
    return node.value if ctx.clean(node) else default


def _strings(ctx: Checker, fields: dict[str, Node], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    node = fields.get(key)
    return strings(node) if ctx.clean(node) else default
