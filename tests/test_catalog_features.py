"""The op catalog in op_specs/: it covers enough real torch ops, and every spec feature is used.

The catalog is the spec format's widest user, so "some spec uses X" for every feature means a
change that breaks X in the loader, the generator or the runtime shows up in the generated suite
(tests/test_catalog.py runs it). Each test below names the feature it looks for.

Most features are read from the loaded model (opcheck.spec.load_specs). A few cannot be: the
model keeps values, not whether a key was written, so `fast_mode: auto`,
`check_undefined_grad: true` and `check_grad_dtypes: true` (all three defaults) and YAML
anchors/aliases are looked up in the YAML text itself.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest
import torch
import yaml

from opcheck.spec import load_specs
from opcheck.spec.model import (
    COMPRESSED_LAYOUTS,
    GRADGRADCHECK,
    LAYOUTS,
    MAKERS,
    DtypeArg,
    GradcheckFlags,
    OpSpec,
    TensorArg,
    TensorListArg,
    TupleArg,
)
from opcheck.spec.oppath import resolve_op

REPO = Path(__file__).resolve().parents[1]
SPEC_DIR = REPO / "op_specs"
MIN_TORCH_OPS = 60


@pytest.fixture(scope="module")
def specs() -> list[OpSpec]:
    return load_specs([SPEC_DIR], root=REPO)


@pytest.fixture(scope="module")
def documents() -> dict[str, object]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(SPEC_DIR.glob("*.yaml"))}


# ------------------------------------------------------------------------------ helpers
def tensors(spec: OpSpec):
    """Every TensorArg of every args/kwargs sample, at any depth (lists, tuples, kwargs)."""

    def walk(arg):
        if isinstance(arg, TensorArg):
            yield arg
        elif isinstance(arg, (TensorListArg, TupleArg)):
            for item in arg.items:
                yield from walk(item)

    for sample in spec.samples:
        for arg in list(sample.args) + [value for _, value in sample.kwargs]:
            yield from walk(arg)


def args(spec: OpSpec):
    for sample in spec.samples:
        yield from sample.args
        yield from (value for _, value in sample.kwargs)


def users(specs, predicate) -> list[str]:
    return [s.name for s in specs if predicate(s)]


def written(documents, block: str, key: str) -> list[object]:
    """Every value written for `key` inside a `block:` mapping anywhere in the spec files."""
    found = []

    def walk(node, parent=None):
        if isinstance(node, dict):
            if parent == block and key in node:
                found.append(node[key])
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, parent)

    for doc in documents.values():
        walk(doc)
    return found


# ------------------------------------------------------------------------------ op count
def torch_op_of(spec: OpSpec) -> str | None:
    """The torch op a spec tests, normalized so that aliases of one op count once; None if none.

    - torch.ops.<ns>.<op>.<overload>: the op's schema name without namespace ("rsqrt");
    - torch.Tensor.<m>: "<m>" when torch.<m> exists (the same op), else "Tensor.<m>";
    - torch.<path>: the path after "torch." ("sin", "linalg.qr", "nn.functional.pad");
    - a user module's function counts only when it declares the torch op it wraps
      (examples.catalog.wraps sets `wraps_torch_op`), as that op.
    The catalog's own example ops (examples/ops.py) wrap nothing and do not count, nor do the
    torch.ops operators they register (a spec's `imports:` runs the code registering them).
    """
    op = spec.op
    if spec.imports:
        return None
    if ":" in op:
        wrapped = getattr(resolve_op(op), "wraps_torch_op", None)
        return torch_op_name(wrapped) if wrapped else None
    return torch_op_name(op) if op.startswith("torch.") else None


def torch_op_name(path: str) -> str:
    if path.startswith("torch.ops."):
        overload = resolve_op(path)
        return overload._schema.name.split("::", 1)[1]
    name = path[len("torch.") :]
    if name.startswith("Tensor."):
        method = name[len("Tensor.") :]
        return method if hasattr(torch, method) else name
    return name


def test_catalog_covers_at_least_60_distinct_torch_ops(specs):
    ops = {torch_op_of(s) for s in specs} - {None}
    assert len(ops) >= MIN_TORCH_OPS, sorted(ops)


def test_op_count_normalizes_aliases_and_credits_only_declared_wrappers():
    def spec(op):
        return OpSpec(name="x", op=op, source="op_specs/x.yaml", sha256="0", samples=())

    assert torch_op_of(spec("torch.ops.aten.rsqrt.default")) == "rsqrt"
    assert torch_op_of(spec("torch.Tensor.expm1")) == "expm1"
    assert torch_op_of(spec("torch.Tensor.expand")) == "Tensor.expand"
    assert torch_op_of(spec("torch.nn.functional.pad")) == "nn.functional.pad"
    assert torch_op_of(spec("examples.catalog:eigh_symmetric")) == "linalg.eigh"
    assert torch_op_of(spec("examples.ops:Cube.apply")) is None


def test_every_wrapper_in_the_catalog_declares_its_torch_op(specs):
    from examples import catalog

    for s in specs:
        if s.op.startswith("examples.catalog:"):
            wrapped = getattr(resolve_op(s.op), "wraps_torch_op", None)
            assert wrapped and callable(resolve_op(wrapped)), s.name
    assert catalog.eigh_symmetric.wraps_torch_op == "torch.linalg.eigh"


# ------------------------------------------------------------------------------ samples and arguments
def test_every_maker_is_used(specs):
    used = {t.maker for s in specs for t in tensors(s)}
    assert set(MAKERS) <= used, sorted(set(MAKERS) - used)


def test_avoid_with_a_margin_is_used(specs):
    assert users(specs, lambda s: any(t.avoid for t in tensors(s)))
    assert users(specs, lambda s: any(t.avoid and t.margin != 0.1 for t in tensors(s)))


def test_explicit_values_are_used_for_floats_indices_and_masks(specs):
    for dtype in (None, "int64", "bool"):
        assert users(
            specs, lambda s, dtype=dtype: any(t.values is not None and t.dtype == dtype for t in tensors(s))
        ), dtype


def test_layout_and_shape_variants_are_used(specs):
    assert users(specs, lambda s: any(t.noncontiguous for t in tensors(s))), "noncontiguous"
    assert users(specs, lambda s: any(t.strides for t in tensors(s))), "strides"
    assert users(specs, lambda s: any(t.mask_values and -math.inf in t.mask_values for t in tensors(s))), "-inf mask"
    assert users(specs, lambda s: any(t.shape == () for t in tensors(s))), "zero-dim"
    assert users(specs, lambda s: any(0 in t.shape for t in tensors(s))), "empty"
    assert users(specs, lambda s: any(len(t.shape) >= 3 for t in tensors(s))), "batched"


def test_sparse_layouts_and_both_gradient_semantics_are_used(specs):
    sparse = [t for s in specs for t in tensors(s) if t.is_sparse]
    assert {t.layout for t in sparse} == set(LAYOUTS) - {"strided"}, "every sparse layout"
    assert any(t.dense_dim for t in sparse), "a hybrid tensor (dense_dim)"
    assert any(t.layout in COMPRESSED_LAYOUTS and t.geometry().batch_shape for t in sparse), "batched compressed"
    assert any(t.blocksize for t in sparse) and any(t.nnz is not None for t in sparse), "blocksize, nnz"
    assert any(t.density is not None for t in sparse) and any(t.values is not None for t in sparse), "density, values"
    assert any(t.maker == "positive" for t in sparse), "maker: positive on a sparse tensor"
    assert any(math.prod(t.shape) >= 64 * 64 for t in sparse), "a realistic size"
    with_sparse = [s for s in specs if any(t.is_sparse for t in tensors(s))]
    assert {s.gradcheck.masked for s in with_sparse} == {True, False}, "masked: true and false"
    assert any(s.lowprec_dtypes for s in with_sparse), "a low-precision check of a sparse input"
    assert any(GRADGRADCHECK in s.checks() for s in with_sparse), "a second derivative through a sparse input"


def test_integer_and_bool_arguments_are_used(specs):
    assert users(specs, lambda s: any(t.dtype == "int64" for t in tensors(s)))
    assert users(specs, lambda s: any(t.dtype == "bool" for t in tensors(s)))


def test_tensor_lists_tuples_dtypes_and_kwargs_are_used(specs):
    assert users(specs, lambda s: any(isinstance(a, TensorListArg) for a in args(s))), "tensor list"
    assert users(specs, lambda s: any(isinstance(a, TupleArg) for a in args(s))), "{tuple: ...}"
    assert users(specs, lambda s: any(isinstance(a, DtypeArg) for a in args(s))), "{dtype: ...}"
    assert users(specs, lambda s: any(sample.kwargs for sample in s.samples)), "kwargs"


def test_generator_and_opinfo_samples_are_used(specs):
    generators = [sample.generator for s in specs for sample in s.samples if sample.generator]
    assert any(g.startswith("examples.catalog:") for g in generators), generators
    assert any(sample.opinfo for s in specs for sample in s.samples)


# ------------------------------------------------------------------------------ ops, variants, dtypes
def test_op_path_kinds_are_used(specs):
    assert users(specs, lambda s: s.variant == "method"), "variant: method"
    overloads = users(specs, lambda s: s.op.startswith("torch.ops.aten."))
    assert overloads and all(
        isinstance(resolve_op(s.op), torch._ops.OpOverload) for s in specs if s.name in overloads
    ), "overload path"
    registered = [s for s in specs if s.op.startswith("torch.ops.") and s.imports]
    assert registered and all(
        isinstance(resolve_op(s.op, imports=s.imports), torch._ops.OpOverloadPacket) for s in registered
    ), "a torch.ops operator a listed module registers"
    assert users(specs, lambda s: s.op.startswith("examples.catalog:")), "user module path"


def test_dtypes_are_used(specs):
    assert users(specs, lambda s: "complex128" in s.dtypes)
    lowprec = {d for s in specs for d in s.lowprec_dtypes}
    assert {"float32", "float16", "bfloat16", "complex64"} <= lowprec, lowprec


def test_library_opcheck_and_reference_are_used(specs):
    assert users(specs, lambda s: s.library_opcheck)
    assert users(specs, lambda s: s.reference and s.dtypes), "reference next to float64 dtypes"


def test_every_triton_spec_requires_triton(specs):
    # triton installs on Linux x86_64 only: elsewhere a Triton spec without `requires: [triton]`
    # would make `opcheck validate` fail and its tests crash, instead of a note and skips.
    triton = users(specs, lambda s: s.op.startswith("examples.triton_kernels:"))
    assert triton and users(specs, lambda s: s.requires) == triton
    assert users(specs, lambda s: s.requires == ("triton",)) == triton


# ------------------------------------------------------------------------------ flags
def test_gradcheck_flags_are_used(specs, documents):
    g = [s.gradcheck for s in specs]
    assert {f.fast_mode for f in g} >= {"true", "false"}, "fast_mode true/false"
    assert "auto" in [str(v) for v in written(documents, "gradcheck", "fast_mode")], "fast_mode: auto written"
    assert any(f.nondet_tol > 0 for f in g), "nondet_tol"
    for key in ("eps", "atol", "rtol"):
        assert any(getattr(f, key) is not None for f in g), key
    assert any(not f.check_batched_grad for f in g), "check_batched_grad: false"
    assert any(f.check_forward_ad for f in g), "check_forward_ad"
    assert any(f.check_batched_forward_grad for f in g), "check_batched_forward_grad"
    # defaults: only their being written shows (see the module docstring)
    assert written(documents, "gradcheck", "check_undefined_grad"), "check_undefined_grad"
    assert written(documents, "gradcheck", "check_grad_dtypes"), "check_grad_dtypes"


def test_gradgradcheck_flags_are_used(specs):
    g = [s.gradgradcheck for s in specs]
    assert any(not f.enabled for f in g), "enabled: false"
    assert any(f.check_batched_grad for f in g), "check_batched_grad"
    assert any(f.check_fwd_over_rev for f in g), "check_fwd_over_rev"
    assert any(f.gen_non_contig_grad_outputs for f in g), "gen_non_contig_grad_outputs"


def test_declared_unsupported_derivatives_are_used(specs):
    assert users(specs, lambda s: not s.supports_forward_ad)
    assert users(specs, lambda s: not s.supports_gradgrad)


# ------------------------------------------------------------------------------ rules
def test_tolerance_rules_are_used_with_reasons(specs):
    rules = [r for s in specs for r in s.tolerances]
    assert rules
    assert all(r.reason for r in rules), [str(r.location) for r in rules if not r.reason]
    assert any("lowprec" in r.where.check for r in rules), "a low-precision tolerance"
    assert any(set(r.where.check) & {"gradgradcheck", "fwgrad_bwgrad"} for r in rules), "a gradient tolerance"
    for key in ("atol", "nondet_tol"):
        assert any(getattr(r, key) is not None for r in rules), key


def test_skips_and_expected_failures_are_used_with_reasons(specs):
    assert [r for s in specs for r in s.skips]
    assert [r for s in specs for r in s.expected_failures]
    assert all(r.reason for s in specs for r in s.skips + s.expected_failures)


def test_every_expected_failure_runs_on_cpu(specs):
    """An expected failure is strict; scoped to CPU-visible tests, CI here proves it still fails."""
    for s in specs:
        for rule in s.expected_failures:
            hits = [
                (check, sample.name)
                for check in s.checks()
                for dtype in s.dtypes_for(check)
                for sample in s.samples
                if rule.where.matches_case(device="cpu", dtype=dtype, check=check, sample=sample.name)
            ]
            assert hits, f"{s.name}: expected failure at {rule.location} matches no CPU test"


# ------------------------------------------------------------------------------ YAML structure
def test_families_and_yaml_anchors_are_used():
    texts = {p.name: p.read_text() for p in sorted(SPEC_DIR.glob("*.yaml"))}
    tokens = [type(t) for text in texts.values() for t in yaml.scan(text)]
    assert yaml.AnchorToken in tokens and yaml.AliasToken in tokens
    families = [
        name
        for name, text in texts.items()
        if isinstance(yaml.safe_load(text), dict) and {"defaults", "ops"} <= set(yaml.safe_load(text))
    ]
    assert families


def test_model_fields_checked_here_still_exist():
    """Renamed model fields would make the checks above vacuous instead of failing."""
    names = {f.name for f in fields(OpSpec)}
    assert {
        "gradcheck",
        "gradgradcheck",
        "tolerances",
        "skips",
        "expected_failures",
        "reference",
        "requires",
        "library_opcheck",
        "supports_forward_ad",
        "supports_gradgrad",
        "variant",
    } <= names
    assert {f.name for f in fields(TensorArg)} >= {
        "maker",
        "avoid",
        "margin",
        "values",
        "noncontiguous",
        "layout",
        "density",
        "nnz",
        "blocksize",
        "dense_dim",
    }
    assert "masked" in {f.name for f in fields(GradcheckFlags)}
