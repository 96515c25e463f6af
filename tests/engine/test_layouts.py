"""Sparse and MKLDNN inputs: what the dense stand-ins add beyond torch's verdicts (tested in
test_differential.py against torch): the hints, the positions perturbed, the second order."""

from __future__ import annotations

import corpus
import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck


def _coo(seed=0, shape=(6, 5), density=0.3):
    return corpus._sparse(*shape, seed=seed, density=density)


def test_a_masked_gradient_checked_unmasked_is_explained():
    report = opcheck.gradcheck_report(lambda s: s.to_dense(masked_grad=True), (_coo(),))
    assert not report.passed
    (hint,) = [h for h in report.mismatch.hints if "sparse_coo" in h]
    assert "masked=False" in hint and "check it with masked=True" in hint


def test_a_dense_gradient_checked_masked_is_explained():
    report = opcheck.gradcheck_report(lambda s: s.to_dense(masked_grad=False), (_coo(),), masked=True)
    assert not report.passed
    (hint,) = [h for h in report.mismatch.hints if "sparse_coo" in h]
    assert "masked=True" in hint and "check it with masked=False" in hint


def test_a_wrong_specified_value_is_named_by_its_dense_position():
    x = _coo(seed=3)
    report = opcheck.gradcheck_report(corpus.SparseScaleOneValueWrong.apply, (x,), masked=True)
    assert not report.passed
    last = tuple(x.detach().coalesce().indices()[:, -1].tolist())  # the value the mutant gets wrong
    assert report.mismatch.worst[0].input_index == last
    assert any("1 of the 1 above are specified" in h for h in report.mismatch.hints), report.mismatch.hints


@pytest.mark.parametrize("masked", [True, False])
def test_only_the_numerical_pattern_is_perturbed(masked):
    # torch perturbs the specified values (masked=True) or every position (masked=False); the
    # stand-in's other positions have zero columns and cost no call.
    x = _coo(seed=4, shape=(8, 8), density=0.2)
    nnz = x.detach().coalesce()._nnz()
    report = opcheck.gradcheck_report(
        lambda s: s.to_dense(masked_grad=masked),
        (x,),
        masked=masked,
        check_batched_grad=False,
        check_undefined_grad=False,
    )
    assert report.passed, report.message
    perturbed = nnz if masked else x.numel()
    assert 2 * perturbed <= report.stats.calls <= 2 * perturbed + 4


def test_the_input_as_given_reaches_the_function_at_its_own_values():
    seen = []

    def f(s):
        seen.append((s.layout, s._nnz(), s.is_coalesced()))
        return s.to_dense(masked_grad=False) * 2

    x = corpus._uncoalesced_coo(87)
    assert opcheck.gradcheck(f, (x,), check_batched_grad=False)
    # the first call is the given tensor (uncoalesced, 5 values); perturbed calls get the
    # densified pattern of masked=False (all 9 positions, coalesced)
    assert seen[0] == (torch.sparse_coo, 5, False)
    assert (torch.sparse_coo, 9, True) in seen


@pytest.mark.parametrize(
    "layout, blocksize",
    [(torch.sparse_coo, None), (torch.sparse_csr, None), (torch.sparse_csc, None), (torch.sparse_bsr, (2, 2))],
)
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("scale", [3.0, 3 + 2j], ids=["real", "complex_output"])
def test_the_numerical_loop_moves_the_values_of_a_leaf_as_torch_does(layout, blocksize, masked, scale):
    # No stand-in per call: a leaf of the numerical pattern, one value moved in place at a time;
    # a complex output is checked part by part (imaginary, then real), one loop for each.
    dense = torch.zeros(4, 6, dtype=torch.float64)
    dense[0, 0:2], dense[1, 0:2], dense[2, 4:6], dense[3, 4:6] = 1.0, 2.0, 3.0, 4.0
    x = dense.to_sparse(layout=layout, blocksize=blocksize).requires_grad_()
    leaves = []

    def f(s):
        if s.is_leaf:
            leaves.append(s.detach().to_dense())
        return s.to_dense(masked_grad=masked) * scale

    assert opcheck.gradcheck(f, (x,), masked=masked, check_batched_grad=False, check_undefined_grad=False)
    perturbed = (dense != 0).sum().item() if masked else dense.numel()
    moved = [m for m in ((v - dense).abs() for v in leaves) if m.max() > 0]  # not the call as given
    assert len(moved) == 2 * perturbed * (2 if isinstance(scale, complex) else 1)
    assert all(int((m > 0).sum()) == 1 and abs(float(m.max()) - 1e-6) < 1e-12 for m in moved)
    assert len({tuple(torch.nonzero(m)[0].tolist()) for m in moved}) == perturbed


def test_the_full_checks_rows_come_from_the_input_as_given():
    # torch's rows: backward of the call on the input itself, not of a rebuilt copy of it
    x = _coo(seed=6, shape=(5, 4), density=0.4)
    through = []

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, s):
            ctx.given = s is x
            return s.to_dense() * 2

        @staticmethod
        def backward(ctx, g):
            through.append(ctx.given)
            return (g * 2).sparse_mask(x.detach().coalesce())

    assert opcheck.gradcheck(Scale.apply, (x,), masked=True, check_batched_grad=False, check_undefined_grad=False)
    assert through and all(through), through.count(False)
    rows = 2 * x.numel()  # one backward per output element, twice (reentrancy)
    assert through.count(True) >= rows


def test_sparse_gradgradcheck_of_a_dense_gradient_agrees_with_torch():
    x = _coo(seed=5)
    verdicts = []
    for check in (torch.autograd.gradgradcheck, opcheck.gradgradcheck):
        torch.manual_seed(0)
        try:
            verdicts.append(check(corpus.SparseScaleDenseGrad.apply, (x,)))
        except GradcheckError as e:
            verdicts.append(str(e).splitlines()[0])
        except Exception as e:  # noqa: BLE001 - the exception is the verdict
            verdicts.append(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    assert verdicts[0] == verdicts[1]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="MKL-DNN build is disabled")
def test_an_mkldnn_mismatch_names_dense_positions():
    x = corpus._mkldnn(3, 4, seed=106)
    with pytest.warns(UserWarning):
        report = opcheck.gradcheck_report(corpus.MkldnnDoubleWrongBackward.apply, (x,), atol=4e-1, rtol=1e-2)
    assert not report.passed and report.mismatch.input_shape == (3, 4)
