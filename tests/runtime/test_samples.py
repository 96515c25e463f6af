"""Samples: seeded, deterministic per id, every TensorArg option and maker, escape hatches."""

import hashlib

import pytest
import torch

from opcheck.runtime.makers import SampleError
from opcheck.runtime.samples import build_calls, build_tensor, describe_call, is_random
from opcheck.spec.case import CaseId
from opcheck.spec.model import DtypeArg, OpSpec, Sample, TensorArg, TensorListArg, TupleArg


def spec_with(*samples, op="torch.sin", **kw):
    return OpSpec(name="t", op=op, source="op_specs/t.yaml", sha256="0", samples=tuple(samples), **kw)


def build(arg, dtype="float64", seed=0):
    return build_tensor(arg, "cpu", dtype, torch.Generator().manual_seed(seed))


def call_of(sample, seed=1, dtype="float64", op="torch.sin", **kw):
    (call,) = build_calls(spec_with(sample, op=op, **kw), sample, "cpu", dtype, seed)
    return call


# ------------------------------------------------------------------------------------ seeds
def test_seed_is_sha256_of_spec_name_and_id():
    case = CaseId("softmax", "gradcheck", "cpu", "float64", "rows")
    assert case.name == "test_gradcheck[cpu-float64-rows]"
    digest = hashlib.sha256(b"softmax::test_gradcheck[cpu-float64-rows]").digest()
    assert case.seed() == int.from_bytes(digest[:8], "little") & (2**63 - 1)


def test_seed_differs_by_id_spec_and_attempt():
    case = CaseId("softmax", "gradcheck", "cpu", "float64", "rows")
    seeds = {
        case.seed(),
        CaseId("sin", "gradcheck", "cpu", "float64", "rows").seed(),
        case.seed(attempt=1),
        CaseId("softmax", "gradcheck", "cuda", "float64", "rows").seed(),
        CaseId("softmax", "gradgradcheck", "cpu", "float64", "rows").seed(),
    }
    assert len(seeds) == 5


def test_same_id_same_tensors_different_id_different_tensors():
    sample = Sample("s", args=(TensorArg(shape=(3, 4)), TensorListArg((TensorArg(shape=(2,)),))))
    spec = spec_with(sample, op="runtime_ops:weighted_sum")
    seed = CaseId("t", "gradcheck", "cpu", "float64", "s").seed()
    a = build_calls(spec, sample, "cpu", "float64", seed)[0]
    b = build_calls(spec, sample, "cpu", "float64", seed)[0]
    other = build_calls(spec, sample, "cpu", "float64", CaseId("t", "gradcheck", "cpu", "float64", "x").seed())[0]
    assert torch.equal(a.args[0], b.args[0]) and torch.equal(a.args[1][0], b.args[1][0])
    assert not torch.equal(a.args[0], other.args[0])


def test_values_do_not_depend_on_the_device_they_are_moved_to():
    # Drawn on the CPU and then moved: the meta device gets the same shape/dtype, and the CPU
    # values equal a fresh CPU generator's draw, so a CUDA run sees the same numbers.
    arg = TensorArg(shape=(4, 5), noncontiguous=True)
    t = build_tensor(arg, "meta", "float64", torch.Generator().manual_seed(3))
    assert t.device.type == "meta" and t.shape == (4, 5) and t.stride() == (10, 2)
    expected = torch.rand((4, 5), generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 4 - 2
    assert torch.equal(build(arg, seed=3), expected)


# ------------------------------------------------------------------------------------ options
def test_range_dtype_and_requires_grad_defaults():
    t = build(TensorArg(shape=(200,), low=-3, high=-1))
    assert t.dtype == torch.float64 and t.requires_grad and t.is_leaf
    assert float(t.detach().min()) >= -3 and float(t.detach().max()) < -1
    assert build(TensorArg(shape=(5,), requires_grad=False)).requires_grad is False
    assert build(TensorArg(shape=(5,)), dtype="complex128").dtype == torch.complex128


def test_integer_and_bool_arguments_for_indices_and_masks():
    idx = build(TensorArg(shape=(50,), dtype="int64", low=0, high=4))
    assert idx.dtype == torch.int64 and not idx.requires_grad
    assert set(idx.tolist()) <= {0, 1, 2, 3}
    default = build(TensorArg(shape=(100,), dtype="int32"))
    assert int(default.min()) >= 0 and int(default.max()) <= 9
    mask = build(TensorArg(shape=(40,), dtype="bool"))
    assert mask.dtype == torch.bool and 0 < int(mask.sum()) < 40
    with pytest.raises(SampleError, match="requires_grad: true needs a floating-point"):
        build(TensorArg(shape=(3,), dtype="int64", requires_grad=True))


def test_noncontiguous_is_a_strided_view_with_nan_in_the_gaps():
    t = build(TensorArg(shape=(4, 6), noncontiguous=True))
    assert not t.is_contiguous() and t.stride() == (12, 2) and t.is_leaf and t.requires_grad
    assert torch.isfinite(t).all()
    base = t.detach().as_strided((4, 12), (12, 1))
    assert torch.isnan(base[:, 1::2]).all()
    ints = build(TensorArg(shape=(3, 4), dtype="int64", noncontiguous=True))
    assert not ints.is_contiguous()
    # one element or empty: nothing to make noncontiguous (as torch.testing.make_tensor)
    assert build(TensorArg(shape=(1,), noncontiguous=True)).is_contiguous()
    assert build(TensorArg(shape=(0, 3), noncontiguous=True)).shape == (0, 3)


def test_explicit_values_and_shape_check():
    t = build(TensorArg(shape=(2, 2), values=((1.0, 2.0), (3.0, 4.5))))
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.5]]
    with pytest.raises(SampleError, match=r"values: have shape \[3\], but shape says \[2\]"):
        build(TensorArg(shape=(2,), values=(1.0, 2.0, 3.0)))


def test_lowprec_dtype_is_the_default_for_unspecified_tensors_only():
    call = call_of(
        Sample("s", args=(TensorArg(shape=(3,)), TensorArg(shape=(3,), dtype="float64"))),
        dtype="bfloat16",
        op="torch.add",
    )
    assert call.args[0].dtype == torch.bfloat16 and call.args[1].dtype == torch.float64


# ------------------------------------------------------------------------------------ makers
def test_positive():
    t = build(TensorArg(shape=(500,), maker="positive")).detach()
    assert float(t.min()) >= 0.25
    c = build(TensorArg(shape=(100,), maker="positive"), dtype="complex128").detach()
    assert float(c.real.min()) > 0
    with pytest.raises(SampleError, match="low > 0"):
        build(TensorArg(shape=(3,), maker="positive", low=-1))


def test_symmetric_and_hermitian():
    t = build(TensorArg(shape=(2, 4, 4), maker="symmetric")).detach()
    assert torch.equal(t, t.mT)
    c = build(TensorArg(shape=(4, 4), maker="symmetric"), dtype="complex128").detach()
    assert torch.allclose(c, c.mH)


@pytest.mark.parametrize("dtype", ["float64", "complex128", "float32"])
def test_spd_is_positive_definite_and_well_conditioned(dtype):
    a = (
        build(TensorArg(shape=(3, 6, 6), maker="spd"), dtype=dtype)
        .detach()
        .to(torch.complex128 if "complex" in dtype else torch.float64)
    )
    assert torch.allclose(a, a.mH, atol=1e-6)
    eig = torch.linalg.eigvalsh(a)
    assert float(eig.min()) >= 6 - 1e-3  # A Aᴴ + n I: every eigenvalue at least n
    assert float((eig.max(-1).values / eig.min(-1).values).max()) < 20


def test_triangular_makers_keep_the_diagonal_away_from_zero():
    low = build(TensorArg(shape=(5, 5), maker="lower_triangular")).detach()
    up = build(TensorArg(shape=(2, 4, 6), maker="upper_triangular")).detach()
    assert torch.equal(low, low.tril()) and torch.equal(up, up.triu())
    for m in (low, up):
        d = m.diagonal(dim1=-2, dim2=-1).abs()
        assert float(d.min()) >= 1.0 and float(d.max()) < 2.0
    c = build(TensorArg(shape=(4, 4), maker="lower_triangular"), dtype="complex128").detach()
    assert float(c.diagonal().abs().min()) >= 1.0


def test_unit_norm_over_the_last_dim():
    t = build(TensorArg(shape=(3, 7), maker="unit_norm")).detach()
    assert torch.allclose(torch.linalg.vector_norm(t, dim=-1), torch.ones(3, dtype=torch.float64))
    with pytest.raises(SampleError, match="unit_norm"):
        build(TensorArg(shape=(), maker="unit_norm"))


@pytest.mark.parametrize("shape", [(5, 5), (6, 3), (3, 6), (2, 4, 4)])
def test_orthogonal(shape):
    q = build(TensorArg(shape=shape, maker="orthogonal")).detach()
    assert q.shape == shape
    small = min(shape[-2:])
    gram = q.mT @ q if shape[-2] >= shape[-1] else q @ q.mT
    assert torch.allclose(gram, torch.eye(small, dtype=torch.float64).expand_as(gram), atol=1e-12)


def test_unitary_for_complex():
    q = build(TensorArg(shape=(4, 4), maker="orthogonal"), dtype="complex128").detach()
    assert torch.allclose(q.mH @ q, torch.eye(4, dtype=torch.complex128), atol=1e-12)


def test_matrix_makers_reject_vectors_and_non_square():
    with pytest.raises(SampleError, match="at least 2 dims"):
        build(TensorArg(shape=(4,), maker="spd"))
    with pytest.raises(SampleError, match="square"):
        build(TensorArg(shape=(3, 4), maker="symmetric"))
    with pytest.raises(SampleError, match="floating-point values"):
        build(TensorArg(shape=(3,), dtype="int64", maker="positive"))


@pytest.mark.parametrize("dtype", ["float64", "bfloat16", "complex128"])
def test_avoid_keeps_every_value_margin_away(dtype):
    arg = TensorArg(shape=(2000,), low=-1, high=1, avoid=(0.0, 0.5), margin=0.2)
    t = build(arg, dtype=dtype).detach().to(torch.complex128 if "complex" in dtype else torch.float64)
    for p in (0.0, 0.5):
        assert float((t - p).abs().min()) >= 0.2
    # still spread over the allowed part of the range
    real = t.real if t.is_complex() else t
    assert float(real.min()) < -0.8 and float(real.max()) > 0.8


def test_avoid_that_cannot_be_met_or_combined_says_so():
    with pytest.raises(SampleError, match="could not keep values"):
        build(TensorArg(shape=(10,), low=-0.1, high=0.1, avoid=(0.0,), margin=0.5))
    with pytest.raises(SampleError, match="avoid: applies to elementwise values"):
        build(TensorArg(shape=(3, 3), maker="spd", avoid=(0.0,)))


# ------------------------------------------------------------------------------------ structure
def test_lists_tuples_dtypes_literals_and_kwargs():
    sample = Sample(
        "s",
        args=(
            TensorListArg((TensorArg(shape=(2,)), TensorArg(shape=(3,), requires_grad=False))),
            TupleArg((0, 1)),
            DtypeArg("float32"),
            (1, 2),
            [3, (4, 5)],
            None,
            "mean",
        ),
        kwargs=(("weights", TensorArg(shape=(2,))), ("dim", -1)),
    )
    call = call_of(sample, op="runtime_ops:weighted_sum")
    lst, tup, dt, lit, nested, none, text = call.args
    assert isinstance(lst, list) and [t.shape for t in lst] == [(2,), (3,)]
    assert tup == (0, 1) and dt is torch.float32 and lit == [1, 2] and nested == [3, [4, 5]]
    assert none is None and text == "mean"
    assert call.kwargs["dim"] == -1 and call.kwargs["weights"].requires_grad
    # gradcheck sees the tensors that require grad, inside the list and the kwargs too
    inputs = call.gradcheck_inputs()
    assert len(inputs) == 2 and inputs[0] is lst[0] and inputs[1] is call.kwargs["weights"]
    assert "Tensor[2] float64 (requires_grad)" in call.description and "dim=-1" in call.description


def test_as_function_recomposes_the_call():
    sample = Sample(
        "s",
        args=(TensorListArg((TensorArg(shape=(2,)), TensorArg(shape=(3,)))),),
        kwargs=(("weights", TensorArg(shape=(2,))),),
    )
    call = call_of(sample, op="runtime_ops:weighted_sum")
    fn, inputs = call.as_function(), call.gradcheck_inputs()
    assert len(inputs) == 3
    replaced = [torch.ones_like(x) for x in inputs]
    assert float(fn(*replaced)) == pytest.approx(5 * 2)  # (2 + 3 ones) * (sum of 2 ones)
    assert torch.autograd.gradcheck(fn, inputs)


def test_index_and_mask_arguments_are_not_gradcheck_inputs():
    sample = Sample(
        "s",
        args=(
            TensorArg(shape=(5, 3)),
            TensorArg(shape=(4,), dtype="int64", low=0, high=5),
            TensorArg(shape=(5, 3), dtype="bool"),
            0.5,
        ),
    )
    call = call_of(sample, op="runtime_ops:take_rows")
    assert call.gradcheck_inputs() == (call.args[0],)
    assert call.run().shape == (4, 3)


def test_method_variant_calls_the_method_of_the_first_argument():
    sample = Sample("s", args=(TensorArg(shape=(3, 4)), 1))
    call = call_of(sample, op="torch.Tensor.cumsum", variant="method")
    assert torch.equal(call.run(), call.args[0].cumsum(1))


def test_generator_escape_hatch_gets_device_dtype_and_a_seeded_generator():
    sample = Sample("g", generator="runtime_ops:sample_generator")
    a, b = call_of(sample, seed=5, op="torch.cumsum"), call_of(sample, seed=5, op="torch.cumsum")
    assert torch.equal(a.args[0], b.args[0]) and a.kwargs == {"dim": 1}
    assert not torch.equal(a.args[0], call_of(sample, seed=6, op="torch.cumsum").args[0])
    plain = call_of(Sample("p", generator="runtime_ops:sample_generator_plain"), op="torch.mul")
    assert plain.args[1] == 2.0 and plain.gradcheck_inputs() == (plain.args[0],)  # floats made differentiable


def test_is_random():
    assert is_random(Sample("s", args=(TensorArg(shape=(2,)),)))
    assert not is_random(Sample("s", args=(TensorArg(shape=(2,), values=(1.0, 2.0)), 3)))
    assert is_random(Sample("s", generator="a:b")) and is_random(Sample("s", opinfo="sin"))


def test_describe_call_names_shapes_dtypes_options_and_kwargs():
    sample = Sample("s", args=(TensorArg(shape=(4, 4), maker="spd"),), kwargs=(("upper", False),))
    call = call_of(sample, op="torch.linalg.cholesky")
    assert (
        describe_call(call.args, call.kwargs, sample)
        == "(Tensor[4, 4] float64 (requires_grad, maker=spd), upper=False)"
    )


def test_opinfo_samples_are_seeded_and_all_used():
    pytest.importorskip("expecttest")
    sample = Sample("oi", opinfo="exp")
    spec = spec_with(sample, op="torch.exp")
    a = build_calls(spec, sample, "cpu", "float64", 11)
    b = build_calls(spec, sample, "cpu", "float64", 11)
    assert len(a) == 3 and [c.label for c in a][-1] == "OpInfo 'exp' sample 2 of 3"
    assert all(torch.equal(x.args[0], y.args[0]) for x, y in zip(a, b))
    with pytest.raises(LookupError, match="did you mean 'exp'"):
        build_calls(spec_with(Sample("x", opinfo="epx")), Sample("x", opinfo="epx"), "cpu", "float64", 1)
