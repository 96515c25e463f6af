"""Sparse tensor arguments and `gradcheck.masked`: what loads, and every rule a schema cannot say.

Each rule's message is checked for where it points (file:line:col and key path) as well as what
it says; tests/spec/invalid/sparse_*.yaml pin the full text of several at once.
"""

from __future__ import annotations

import pytest

from opcheck.spec import SpecError, load_spec_text
from opcheck.spec.model import GradcheckFlags, SparseGeometry, TensorArg
from opcheck.spec.sparse import specified_per_batch


def _load(text: str):
    return load_spec_text(text, source="s.yaml")


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        _load(text)
    return str(info.value).splitlines()


def _one_arg(arg: str, *, op: str = "torch.Tensor.to_dense", extra: str = "") -> str:
    """A spec whose only sample's first argument (line 5, from column 12) is `arg`."""
    return f"op: {op}\nvariant: method\ngradcheck: {{masked: true}}\nsamples:\n  - {{name: a, args: [{arg}]}}\n{extra}"


def _problem(arg: str, **kw) -> str:
    [line] = _problems(_one_arg(arg, **kw))
    return line


def _at(arg: str, needle: str) -> str:
    """file:line:col of `needle` in the argument as _one_arg places it, and the path of the argument."""
    return f"s.yaml:5:{len('  - {name: a, args: [') + 1 + arg.index(needle)}: samples[0].args[0]"


# ------------------------------------------------------------------------------ what loads
def test_sparse_keys_load_into_the_tensor_model():
    [spec] = _load(_one_arg("{shape: [2, 4, 6, 3], layout: sparse_bsr, blocksize: [2, 3], nnz: 3, dense_dim: 1}"))
    assert spec.samples[0].args[0] == TensorArg(
        shape=(2, 4, 6, 3), layout="sparse_bsr", nnz=3, blocksize=(2, 3), dense_dim=1
    )
    assert spec.gradcheck == GradcheckFlags(masked=True)
    [spec] = _load(_one_arg("{shape: [8, 8], layout: sparse_coo, density: 1}"))
    arg = spec.samples[0].args[0]
    assert arg.density == 1.0 and isinstance(arg.density, float) and arg.nnz is None and arg.dense_dim == 0


def test_defaults_leave_a_dense_tensor_and_its_flags_as_they_were():
    arg = TensorArg(shape=(3,))
    assert (arg.layout, arg.density, arg.nnz, arg.blocksize, arg.dense_dim) == ("strided", None, None, None, 0)
    assert not arg.is_sparse and GradcheckFlags().masked is False


def test_explicit_values_define_the_pattern_and_exact_counts_per_batch_are_fine():
    [spec] = _load(_one_arg("{shape: [2, 2, 2], layout: sparse_csr, values: [[[1, 0], [0, 0]], [[0, 0], [0, 3]]]}"))
    assert spec.samples[0].args[0].values == (((1, 0), (0, 0)), ((0, 0), (0, 3)))


@pytest.mark.parametrize(
    "arg, batch, sparse, dense, grid",
    [
        (TensorArg((4, 5, 6), layout="sparse_coo"), (), (4, 5, 6), (), (4, 5, 6)),
        (TensorArg((4, 5, 6), layout="sparse_coo", dense_dim=1), (), (4, 5), (6,), (4, 5)),
        (TensorArg((3, 4, 6), layout="sparse_csr"), (3,), (4, 6), (), (4, 6)),
        (TensorArg((2, 3, 4, 6, 5), layout="sparse_bsc", blocksize=(2, 3), dense_dim=1), (2, 3), (4, 6), (5,), (2, 2)),
    ],
)
def test_geometry_splits_batch_sparse_and_dense_dims(arg, batch, sparse, dense, grid):
    g = arg.geometry()
    assert (g.batch_shape, g.sparse_shape, g.dense_shape, g.grid_shape) == (batch, sparse, dense, grid)


@pytest.mark.parametrize(
    "arg, count",
    [
        (TensorArg((8, 8), layout="sparse_coo"), 32),  # density 0.5 by default
        (TensorArg((64, 64), layout="sparse_csr", density=0.05), 205),  # 204.8 rounded
        (TensorArg((4, 4), layout="sparse_coo", density=0.01), 1),  # at least one
        (TensorArg((4, 6), layout="sparse_bsr", blocksize=(2, 3), density=1.0), 4),  # blocks
        (TensorArg((3, 4, 4), layout="sparse_csr", nnz=5), 5),  # per batch
        (TensorArg((0, 4), layout="sparse_csr"), 0),  # an empty grid specifies nothing
    ],
)
def test_specified_count_rounds_the_density_of_the_grid(arg, count):
    assert arg.specified_count() == count


def test_specified_per_batch_counts_cells_with_any_nonzero():
    geometry = SparseGeometry.of((2, 2, 4), "sparse_bsr", (2, 2), 0)
    values = (((0, 1, 0, 0), (2, 0, 0, 0)), ((0, 0, 0, 0), (0, 0, 0, 5)))
    assert specified_per_batch(values, geometry) == [1, 1]
    hybrid = SparseGeometry.of((2, 2, 2), "sparse_csr", None, 1)  # no batch; a dense dim of 2
    assert specified_per_batch((((0, 0), (0, 1)), ((0, 0), (0, 0))), hybrid) == [1]


# ------------------------------------------------------------------------------ each rule
def test_bsr_and_bsc_need_a_blocksize():
    arg = "{shape: [4, 6], layout: sparse_bsc}"
    assert _problem(arg) == (
        f"{_at(arg, 'sparse_bsc')}.layout: layout 'sparse_bsc' needs `blocksize: [rows, cols]`, each "
        "dividing its sparse dim (sparse dims [4, 6])"
    )


def test_blocksize_must_divide_the_sparse_dims_not_the_dense_ones():
    arg = "{shape: [4, 6, 5], layout: sparse_bsr, blocksize: [2, 4], dense_dim: 1}"
    assert _problem(arg) == (
        f"{_at(arg, '[2, 4]')}.blocksize: blocksize [2, 4] must divide the sparse dims [4, 6]: 6 is not a multiple of 4"
    )
    assert _problem("{shape: [2, 4, 6], layout: sparse_bsr, blocksize: [3, 3]}").endswith(
        "blocksize [3, 3] must divide the sparse dims [4, 6]: 4 is not a multiple of 3"
    )


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "sparse_csc", "strided"])
def test_blocksize_only_for_block_layouts(layout):
    arg = f"{{shape: [4, 6], layout: {layout}, blocksize: [2, 2]}}"
    line = _problem(arg)
    assert line.startswith(f"{_at(arg, 'blocksize')}.blocksize: ")  # at the key
    if layout == "strided":
        assert "`blocksize` describes a sparse tensor, and this one is strided: set `layout`" in line
    else:
        assert line.endswith(f"`blocksize` applies to sparse_bsr and sparse_bsc; this tensor is {layout}")


@pytest.mark.parametrize(
    "density, expected",
    [
        ("0", "expected a positive number, got 0"),
        ("-0.5", "expected a positive number, got -0.5"),
        ("1.5", "expected a positive number of at most 1, got 1.5"),
        (".nan", "expected a finite number, got .nan"),
    ],
)
def test_density_in_0_1(density, expected):
    arg = f"{{shape: [4, 6], layout: sparse_coo, density: {density}}}"
    assert _problem(arg) == f"{_at(arg, density)}.density: {expected}"


def test_density_and_nnz_are_exclusive():
    arg = "{shape: [4, 6], layout: sparse_coo, density: 0.5, nnz: 3}"
    assert _problem(arg) == (
        f"{_at(arg, 'nnz')}.nnz: `density` and `nnz` both say how many elements are specified; keep one"
    )


def test_nnz_at_most_the_grid_per_batch_and_in_blocks():
    arg = "{shape: [3, 4, 6], layout: sparse_csr, nnz: 25}"
    assert _problem(arg) == (
        f"{_at(arg, '25')}.nnz: expected at most 24 (sparse dims [4, 6] hold 24 positions per batch), got 25"
    )
    assert _problem("{shape: [4, 6], layout: sparse_bsc, blocksize: [2, 3], nnz: 5}").endswith(
        "nnz: expected at most 4 (sparse dims [4, 6] hold 2 x 2 blocks of [2, 3]), got 5"
    )
    assert _problem("{shape: [4, 6, 3], layout: sparse_coo, dense_dim: 1, nnz: 25}").endswith(
        "nnz: expected at most 24 (sparse dims [4, 6] hold 24 positions), got 25"
    )
    _load(_one_arg("{shape: [3, 4, 6], layout: sparse_csr, nnz: 24}"))  # the whole grid is fine


@pytest.mark.parametrize(
    "arg, at, message",
    [
        (
            "{shape: [4, 6], layout: sparse_coo, dense_dim: 2}",
            "2}",
            "a sparse_coo tensor needs at least 1 sparse dim ahead of its 2 dense dims; shape [4, 6] has 2 dims",
        ),
        (
            "{shape: [], layout: sparse_coo}",
            "sparse_coo",
            "a sparse_coo tensor needs at least 1 sparse dim; shape [] has 0 dims",
        ),
        (
            "{shape: [4, 6], layout: sparse_csr, dense_dim: 1}",
            "1}",
            "a sparse_csr tensor needs 2 sparse dims (batch dims may come before them) ahead of its 1 dense dim; "
            "shape [4, 6] has 2 dims",
        ),
        (
            "{shape: [6], layout: sparse_csc}",
            "sparse_csc",
            "a sparse_csc tensor needs 2 sparse dims (batch dims may come before them); shape [6] has 1 dim",
        ),
    ],
)
def test_dense_dim_leaves_enough_sparse_dims(arg, at, message):
    key = "dense_dim" if "dense_dim" in arg else "layout"
    assert _problem(arg) == f"{_at(arg, at)}.{key}: {message}"


def test_dense_dim_beyond_the_rank_is_reported_too():
    assert "shape [4] has 1 dim" in _problem("{shape: [4], layout: sparse_coo, dense_dim: 3}")


def test_noncontiguous_is_refused_for_sparse_layouts():
    arg = "{shape: [4, 6], layout: sparse_csr, noncontiguous: true}"
    assert _problem(arg) == (
        f"{_at(arg, 'noncontiguous')}.noncontiguous: a sparse_csr tensor has no strides to make non-contiguous; "
        "`noncontiguous` applies to strided tensors"
    )
    _load(_one_arg("{shape: [4, 6], layout: sparse_csr, noncontiguous: false}"))


def test_only_the_positive_maker_works_with_a_sparse_layout():
    arg = "{shape: [4, 4], layout: sparse_coo, maker: symmetric}"
    assert _problem(arg) == (
        f"{_at(arg, 'symmetric')}.maker: maker 'symmetric' structures a dense matrix, which leaving elements "
        "unspecified would break; with a sparse layout only maker 'positive' works"
    )
    _load(_one_arg("{shape: [4, 4], layout: sparse_coo, maker: positive}"))


@pytest.mark.parametrize("key", ["density: 0.5", "nnz: 2"])
def test_values_decide_the_pattern_so_density_and_nnz_are_refused(key):
    arg = f"{{shape: [2, 2], layout: sparse_coo, values: [[1, 0], [0, 2]], {key}}}"
    name = key.split(":")[0]
    assert _problem(arg).startswith(f"{_at(arg, name)}.{name}: `{name}` has no effect when `values` are given")


def test_values_of_a_batched_compressed_tensor_specify_the_same_count_per_batch():
    arg = "{shape: [2, 2, 2], layout: sparse_csr, values: [[[1, 0], [0, 2]], [[0, 0], [0, 3]]]}"
    assert _problem(arg) == (
        f"{_at(arg, '[[[')}.values: a sparse_csr tensor specifies the same number of elements in every "
        "batch, but the nonzero values specify 2, 1 in its 2 batches"
    )
    assert _problem(
        "{shape: [2, 2, 4], layout: sparse_bsr, blocksize: [2, 2], "
        "values: [[[1, 0, 0, 2], [0, 0, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 3]]]}"
    ).endswith(
        "specifies the same number of blocks in every batch, but the nonzero values specify 2, 1 in its 2 batches"
    )


@pytest.mark.parametrize("key", ["density: 0.5", "nnz: 2", "dense_dim: 1"])
def test_sparse_keys_on_a_strided_tensor_are_refused(key):
    name = key.split(":")[0]
    arg = f"{{shape: [4, 6], {key}}}"
    assert _problem(arg) == (
        f"{_at(arg, name)}.{name}: `{name}` describes a sparse tensor, and this one is strided: set "
        f"`layout` (sparse_coo, sparse_csr, sparse_csc, sparse_bsr, sparse_bsc) or drop `{name}`"
    )


def test_an_unknown_layout_gets_a_did_you_mean():
    arg = "{shape: [4, 6], layout: sparse_crs}"
    assert _problem(arg) == (
        f"{_at(arg, 'sparse_crs')}.layout: expected one of strided, sparse_coo, sparse_csr, sparse_csc, "
        "sparse_bsr, sparse_bsc, got 'sparse_crs'; did you mean 'sparse_csr'?"
    )


def test_every_problem_of_a_sparse_tensor_is_reported_at_once():
    lines = _problems(
        _one_arg("{shape: [4, 4], layout: sparse_bsr, noncontiguous: true, maker: spd, density: 0.5, nnz: 2}")
    )
    assert [line.split(": ")[1] for line in lines] == [  # sorted by column
        "samples[0].args[0].layout",
        "samples[0].args[0].noncontiguous",
        "samples[0].args[0].maker",
        "samples[0].args[0].nnz",
    ]


# ------------------------------------------------------------------------------ masked
def test_masked_without_any_sparse_tensor_has_no_effect():
    assert _problems(
        "op: torch.sin\ngradcheck: {check_batched_grad: false, masked: true}\n"
        "samples: [{name: a, args: [{shape: [3]}]}]\n"
    ) == [
        "s.yaml:2:40: gradcheck.masked: has no effect: no sample has a sparse tensor (a `layout` such as sparse_coo "
        "or sparse_csr); masked only changes how the gradients of sparse inputs are compared"
    ]


def test_masked_is_judged_per_op_and_reported_where_defaults_wrote_it():
    text = (
        "defaults:\n  gradcheck: {masked: true}\nops:\n"
        "  - op: torch.sin\n    samples: [{name: a, args: [{shape: [3]}]}]\n"
        "  - op: torch.Tensor.to_dense\n    variant: method\n"
        "    samples: [{name: a, args: [{shape: [3], layout: sparse_coo}]}]\n"
    )
    assert _problems(text) == [
        "s.yaml:2:15: defaults.gradcheck.masked: has no effect: no sample has a sparse tensor (a `layout` such as "
        "sparse_coo or sparse_csr); masked only changes how the gradients of sparse inputs are compared"
    ]


@pytest.mark.parametrize(
    "sample",
    [
        "{name: g, generator: 'opcheck_spec_fixture:make_inputs'}",
        "{name: o, opinfo: sin}",
    ],
)
def test_masked_is_not_judged_when_a_sample_may_make_sparse_tensors_itself(sample):
    [spec] = _load(
        f"op: torch.sin\ngradcheck: {{masked: true}}\nsamples:\n  - {sample}\n  - {{name: d, args: [{{shape: [3]}}]}}\n"
    )
    assert spec.gradcheck.masked


def test_masked_false_and_sparse_tensors_in_lists_and_kwargs_are_fine():
    [spec] = _load(
        "op: torch.cat\ngradcheck: {masked: false}\nsamples: [{name: a, args: [[{shape: [3], layout: sparse_coo}]]}]\n"
    )
    assert not spec.gradcheck.masked
    [spec] = _load(
        "op: torch.Tensor.to_dense\nvariant: method\ngradcheck: {masked: true}\n"
        "samples: [{name: a, args: [[{shape: [3, 3], layout: sparse_coo}]]}]\n"
    )
    assert spec.gradcheck.masked
