"""Sparse samples: built reproducibly from the seed, in the layout and geometry the spec says, with
the drawn values at the specified positions only; and the checks that run on them (masked, lowprec)."""

from __future__ import annotations

import math

import pytest
import torch

from opcheck.runtime import LowPrecisionMismatch, run_check
from opcheck.runtime.checks import CheckFailed, engine_call
from opcheck.runtime.lowprec import compare_lowprec, upcast
from opcheck.runtime.makers import draw_values
from opcheck.runtime.policy import Policy
from opcheck.runtime.report import Case
from opcheck.runtime.samples import build_calls, build_tensor, describe_value
from opcheck.runtime.sparse import sparsify
from opcheck.runtime.tolerances import resolve_tolerances
from opcheck.spec.case import CaseId
from opcheck.spec.model import CHECKS, COMPILE, LIBRARY_OPCHECK, LOWPREC, GradcheckFlags, OpSpec, Sample, TensorArg

T = TensorArg
LAYOUTS = {
    "sparse_coo": torch.sparse_coo,
    "sparse_csr": torch.sparse_csr,
    "sparse_csc": torch.sparse_csc,
    "sparse_bsr": torch.sparse_bsr,
    "sparse_bsc": torch.sparse_bsc,
}


def gen(seed=0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def build(arg: TensorArg, seed=0, dtype="float64") -> torch.Tensor:
    return build_tensor(arg, "cpu", dtype, gen(seed))


def specified(t: torch.Tensor) -> torch.Tensor:
    """A bool mask of the dense positions t specifies (a value of 1 at each, read back dense)."""
    ones = t.detach()
    if t.layout == torch.sparse_coo:
        ones = torch.sparse_coo_tensor(ones._indices(), torch.ones_like(ones._values()), t.shape, check_invariants=True)
    else:
        rows = t.layout in (torch.sparse_csr, torch.sparse_bsr)
        compressed, plain = (
            (ones.crow_indices(), ones.col_indices()) if rows else (ones.ccol_indices(), ones.row_indices())
        )
        ones = torch.sparse_compressed_tensor(
            compressed, plain, torch.ones_like(ones.values()), t.shape, layout=t.layout, check_invariants=True
        )
    return ones.to_dense() != 0


ARGS = [
    T((8, 8), layout="sparse_coo", density=0.25),
    T((6, 8, 3), layout="sparse_coo", dense_dim=1, nnz=5),
    T((4, 5, 6), layout="sparse_coo", nnz=7),
    T((8, 8), layout="sparse_csr", nnz=13),
    T((3, 6, 8), layout="sparse_csc", nnz=10),
    T((4, 6), layout="sparse_bsr", blocksize=(2, 3), nnz=3),
    T((2, 4, 6, 2), layout="sparse_bsc", blocksize=(2, 3), nnz=2, dense_dim=1),
    T((6, 8, 2), layout="sparse_csr", dense_dim=1, density=0.3),
]


# ------------------------------------------------------------------------------------ building
@pytest.mark.parametrize("arg", ARGS, ids=lambda a: f"{a.layout}{list(a.shape)}")
def test_layout_geometry_and_count_are_the_specs(arg):
    t = build(arg)
    g = arg.geometry()
    assert t.layout == LAYOUTS[arg.layout] and t.shape == arg.shape and t.dtype == torch.float64
    assert t.requires_grad and t.is_leaf
    assert t.dense_dim() == arg.dense_dim
    assert t._nnz() == arg.specified_count()  # per batch for compressed layouts, in blocks for bsr/bsc
    if arg.layout == "sparse_coo":
        assert t.is_coalesced() and t.sparse_dim() == len(arg.shape) - arg.dense_dim
    else:
        assert t.values().shape[: len(g.batch_shape)] == g.batch_shape
    if arg.blocksize:
        assert tuple(t.values().shape[len(g.batch_shape) + 1 :][:2]) == arg.blocksize
    # Every batch specifies the same number of elements: count them in the dense form.
    per_batch = specified(t).reshape(g.batches, -1).sum(-1) if g.batch_shape else specified(t).sum().reshape(1)
    cell = arg.specified_count() * (arg.blocksize[0] * arg.blocksize[1] if arg.blocksize else 1)
    assert per_batch.tolist() == [cell * math.prod(g.dense_shape)] * g.batches


@pytest.mark.parametrize("arg", ARGS, ids=lambda a: f"{a.layout}{list(a.shape)}")
def test_the_drawn_values_sit_at_the_specified_positions_and_nowhere_else(arg):
    t = build(arg, seed=5).detach()
    dense = draw_values(arg, torch.float64, gen(5))  # the values are drawn first, like a dense tensor's
    mask = specified(t)
    assert torch.equal(t.to_dense(), torch.where(mask, dense, torch.zeros_like(dense)))


@pytest.mark.parametrize("arg", ARGS, ids=lambda a: f"{a.layout}{list(a.shape)}")
def test_same_seed_same_pattern_and_values_other_seed_other_pattern(arg):
    a, b, c = build(arg, seed=3), build(arg, seed=3), build(arg, seed=4)
    assert torch.equal(a.detach().to_dense(), b.detach().to_dense())
    assert torch.equal(specified(a), specified(b))
    assert not torch.equal(specified(a), specified(c))


def test_the_pattern_is_drawn_after_the_values_and_before_the_next_argument():
    sparse, dense = T((6, 6), layout="sparse_csr", nnz=9), T((6, 2))
    spec = OpSpec(
        name="t", op="torch.mm", source="op_specs/t.yaml", sha256="0", samples=(Sample("s", args=(sparse, dense)),)
    )
    (call,) = build_calls(spec, spec.samples[0], "cpu", "float64", seed=11)
    g = gen(11)
    values = draw_values(sparse, torch.float64, g)
    expected = sparsify(values, sparse, g)
    assert torch.equal(call.args[0].detach().to_dense(), expected.to_dense())
    assert torch.equal(call.args[1].detach(), draw_values(dense, torch.float64, g))


def test_density_defaults_to_half_and_rounds_to_the_nearest_count():
    assert build(T((8, 8), layout="sparse_coo"))._nnz() == 32
    assert build(T((64, 64), layout="sparse_csr", density=0.05))._nnz() == 205
    assert build(T((3, 3), layout="sparse_coo", density=0.01))._nnz() == 1
    assert build(T((0, 4), layout="sparse_csr"))._nnz() == 0  # an empty grid


def test_exact_zeros_at_specified_positions_stay_specified():
    arg = T((3, 3), layout="sparse_coo", density=1.0)
    values = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 5.0], [6.0, 7.0, 0.0]], dtype=torch.float64)
    t = sparsify(values, arg, gen())
    assert t._nnz() == 9 and int((t._values() == 0).sum()) == 3


def test_explicit_values_specify_their_nonzero_cells():
    t = build(T((2, 3), layout="sparse_csr", values=((0.0, 1.5, 0.0), (-2.0, 0.0, 0.0))))
    assert t._nnz() == 2 and specified(t).tolist() == [[False, True, False], [True, False, False]]
    assert t.to_dense().tolist() == [[0.0, 1.5, 0.0], [-2.0, 0.0, 0.0]]
    # A block with any nonzero is specified whole, zeros included; so is a hybrid position.
    b = build(T((2, 4), layout="sparse_bsr", blocksize=(2, 2), values=((1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0))))
    assert b._nnz() == 1 and b.values().tolist() == [[[1.0, 0.0], [0.0, 0.0]]]
    h = build(
        T((2, 2, 2), layout="sparse_coo", dense_dim=1, values=(((0.0, 3.0), (0.0, 0.0)), ((0.0, 0.0), (0.0, 0.0))))
    )
    assert h._nnz() == 1 and h._values().tolist() == [[0.0, 3.0]]


@pytest.mark.parametrize("dtype", ["complex128", "float32", "bfloat16", "int64", "bool"])
def test_other_dtypes_keep_the_layout(dtype):
    arg = T((4, 6), layout="sparse_csr", dtype=dtype if dtype in ("int64", "bool") else None, nnz=6)
    t = build(arg, dtype=dtype)
    assert t.layout == torch.sparse_csr and t.dtype == getattr(torch, dtype) and t._nnz() == 6
    assert t.requires_grad == (dtype not in ("int64", "bool"))


def test_maker_positive_and_avoid_apply_to_the_values():
    t = build(T((8, 8), layout="sparse_coo", maker="positive", nnz=20))
    assert bool((t._values() >= 0.25).all())
    t = build(T((8, 8), layout="sparse_csr", avoid=(0.0,), margin=0.5, nnz=20))
    assert bool((t.values().abs() >= 0.5).all())


def test_describe_names_layout_nnz_blocks_batches_and_dense_dims():
    assert (
        describe_value(build(T((8, 8), layout="sparse_csr", nnz=13)))
        == "Tensor[8, 8] float64 (requires_grad, sparse_csr, nnz=13)"
    )
    assert (
        describe_value(build(T((2, 4, 6, 2), layout="sparse_bsc", blocksize=(2, 3), nnz=1, dense_dim=1)))
        == "Tensor[2, 4, 6, 2] float64 (requires_grad, sparse_bsc, nnz=1 block per batch, blocksize=2x3, dense_dim=1)"
    )
    assert (
        describe_value(build(T((6, 8, 3), layout="sparse_coo", dense_dim=1, nnz=5)))
        == "Tensor[6, 8, 3] float64 (requires_grad, sparse_coo, nnz=5, dense_dim=1)"
    )


def test_dense_samples_draw_exactly_what_they_drew_before():
    # Sparse support adds no draw to a strided tensor: its values are the generator's first draw.
    expected = torch.rand((4, 5), generator=gen(3), dtype=torch.float64) * 4 - 2
    assert torch.equal(build(T((4, 5)), seed=3).detach(), expected)


# ------------------------------------------------------------------------------------ checks
@pytest.mark.parametrize("masked", [False, True])
def test_masked_reaches_every_engine_call(masked):
    spec = OpSpec(
        name="t",
        op="torch.sin",
        source="op_specs/t.yaml",
        sha256="0",
        samples=(Sample("s", args=(T((3,)),)),),
        gradcheck=GradcheckFlags(masked=masked),
    )
    for check in CHECKS:
        if check in (LOWPREC, LIBRARY_OPCHECK, COMPILE):
            continue
        case = Case.of(spec, check, "cpu", "float64", spec.samples[0])
        tol = resolve_tolerances(spec, check, "cpu", "float64", "s")
        _, kwargs = engine_call(case, tol, Policy(True, "test"))
        assert kwargs["masked"] is masked, check


def _sparse_spec(op, *samples, masked, **kw):
    return OpSpec(
        name="sp",
        op=op,
        source="op_specs/sp.yaml",
        sha256="0",
        samples=samples,
        devices=("cpu",),
        gradcheck=GradcheckFlags(masked=masked, check_batched_grad=False),
        **kw,
    )


COO = Sample("coo", args=(T((6, 8), layout="sparse_coo", density=0.3), T((8, 3))))


def test_the_spec_chooses_the_semantics_and_the_wrong_one_fails():
    # torch.sparse.mm's gradient is masked to the input's pattern: right with masked, wrong without.
    run_check(_sparse_spec("torch.sparse.mm", COO, masked=True), "gradcheck", "cpu", "float64", "coo")
    with pytest.raises(CheckFailed, match="checked with masked=False"):
        run_check(_sparse_spec("torch.sparse.mm", COO, masked=False), "gradcheck", "cpu", "float64", "coo")
    # torch.mm's is dense: the other way round.
    run_check(_sparse_spec("torch.mm", COO, masked=False), "gradcheck", "cpu", "float64", "coo")
    with pytest.raises(CheckFailed, match="checked with masked=True"):
        run_check(_sparse_spec("torch.mm", COO, masked=True), "gradcheck", "cpu", "float64", "coo")


def test_failure_describes_the_sparse_sample():
    with pytest.raises(CheckFailed) as info:
        run_check(_sparse_spec("torch.sparse.mm", COO, masked=False), "gradcheck", "cpu", "float64", "coo")
    assert "call: mm(Tensor[6, 8] float64 (requires_grad, sparse_coo, nnz=14), Tensor[8, 3] float64" in str(info.value)


def test_lowprec_casts_a_sparse_input_with_its_pattern():
    t = build(T((6, 8), layout="sparse_csr", nnz=9), dtype="float32")
    up = upcast(t, "cpu")
    assert up.layout == torch.sparse_csr and up.dtype == torch.float64 and up.requires_grad and up.is_leaf
    assert torch.equal(up.detach().to_dense(), t.detach().to_dense().double())
    assert torch.equal(up.col_indices(), t.col_indices())


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "sparse_csc"])
def test_lowprec_passes_a_right_sparse_kernel(layout):
    sample = Sample("s", args=(T((6, 8), layout=layout, nnz=12), T((8, 3))))
    run_check(
        _sparse_spec("torch.mm", sample, masked=False, lowprec_dtypes=("float32",)), "lowprec", "cpu", "float32", "s"
    )


def test_lowprec_catches_a_sparse_gradient_wrong_in_float32():
    sample = Sample("s", args=(T((6, 8), layout="sparse_coo", nnz=12), T((8, 3))))
    spec = _sparse_spec("runtime_ops:sparse_mm_wrong_in_float32", sample, masked=True, lowprec_dtypes=("float32",))
    run_check(spec, "gradcheck", "cpu", "float64", "s")  # the float64 path is right
    with pytest.raises(LowPrecisionMismatch, match="gradient of input 0 differs"):
        run_check(spec, "lowprec", "cpu", "float32", "s")


def test_compare_lowprec_reads_sparse_gradients_dense():
    sample = Sample("s", args=(T((6, 8), layout="sparse_coo", nnz=12), T((8, 3))))
    spec = _sparse_spec("torch.sparse.mm", sample, masked=True, lowprec_dtypes=("float32",))
    case = CaseId("sp", "lowprec", "cpu", "float32", "s")
    (call,) = build_calls(spec, sample, "cpu", "float32", case.seed())
    tol = resolve_tolerances(spec, "lowprec", "cpu", "float32", "s")
    assert compare_lowprec(call, case, attempt=0, tolerances=tol, check_forward_ad=False) is None
