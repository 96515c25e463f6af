"""The low-precision check gives every backward and forward-AD call its own cotangent and tangent:
a rope kernel whose backward writes into its grad_output (or whose forward-AD rule writes into its
tangent) is judged right on values, and the write itself is reported, naming what was written
into; `writes_grad_outputs=True` declares it. And a reference that computes in float32 inside is
found out: a failure at float32, a finding at bfloat16; a float64 one is left alone."""

import pytest
import torch

from opcheck import LowPrecisionError, lowprec_check, lowprec_report
from tests.lowprec.grad_writers import (
    rope_reference,
    rope_reference_in_float32,
    rope_writing_grad_output,
    rope_writing_tangent,
)


def _x(dtype=torch.float32, shape=(6, 8)):
    g = torch.Generator().manual_seed(3)
    # row 0 is position 0, where the rotation is the identity: 40 of the 48 entries move
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()


@pytest.mark.parametrize("reference", [None, rope_reference], ids=["itself", "float64_reference"])
def test_a_backward_writing_into_its_grad_output_is_reported_not_compared(reference):
    report = lowprec_report(rope_writing_grad_output, (_x(),), reference=reference)
    assert not report.passed and report.failure == "grad_outputs"
    assert report.grad_outputs_written == ("the grad_output of output 0 (40 of 48 entries changed)",)
    text = report.message
    assert text.startswith("the op writes into what autograd hands it: the grad_output of output 0")
    assert "may hand the same gradient tensor to other consumers" in text
    assert "`writes_grad_outputs: true`" in text
    # each call had its own cotangent, so the values are right (with a shared one: errors of order 1)
    assert "within the bound: output 0, VJP: gradient of input 0" in text
    assert all(p.passed and p.max_ratio < 1 for p in report.parts)


def test_a_declared_write_into_grad_output_passes_and_is_reported():
    report = lowprec_report(rope_writing_grad_output, (_x(),), reference=rope_reference, writes_grad_outputs=True)
    assert report.passed and report.failure == ""
    assert report.grad_outputs_written == ("the grad_output of output 0 (40 of 48 entries changed)",)
    assert len(report.findings) == 1 and "declared intended (writes_grad_outputs)" in report.findings[0]
    assert lowprec_check(rope_writing_grad_output, (_x(torch.bfloat16),), writes_grad_outputs=True) is True


def test_a_forward_ad_rule_writing_into_its_tangent_is_reported_not_compared():
    report = lowprec_report(rope_writing_tangent, (_x(),), reference=rope_reference, check_forward_ad=True)
    assert not report.passed and report.failure == "grad_outputs"
    assert report.grad_outputs_written == ("the tangent of input 0 (40 of 48 entries changed)",)
    assert "Forward AD hands an input's tangent to every op that reads the input" in report.message
    assert [p.what for p in report.parts] == ["output 0", "VJP: gradient of input 0", "JVP: tangent of output 0"]
    assert all(p.passed and p.max_ratio < 1 for p in report.parts)
    declared = lowprec_report(
        rope_writing_tangent, (_x(),), reference=rope_reference, check_forward_ad=True, writes_grad_outputs=True
    )
    assert declared.passed and "the tangent of input 0" in declared.findings[0]


def test_a_kernel_that_leaves_what_autograd_hands_it_alone_reports_nothing():
    report = lowprec_report(rope_reference, (_x(),), check_forward_ad=True)
    assert report.passed and report.grad_outputs_written == () and report.findings == ()


def test_a_value_failure_beside_a_declared_write_keeps_the_write_in_its_text():
    def wrong(x):
        return rope_writing_grad_output(x * 1.001)  # the op autograd hands the cotangent to writes

    with pytest.raises(LowPrecisionError) as info:
        lowprec_check(wrong, (_x(),), reference=rope_reference, writes_grad_outputs=True)
    text = str(info.value)
    assert text.startswith("output 0:") and "note: the op writes into what autograd hands it" in text


# ------------------------------------------------------------------------------------ reference precision
def test_a_reference_computing_in_float32_fails_the_float32_check():
    report = lowprec_report(rope_reference, (_x(),), reference=rope_reference_in_float32)
    assert not report.passed and report.failure == "reference" and report.reference_not_float64
    text = report.message
    assert text.startswith("the reference does not compute in float64: its results (output 0, VJP: gradient of")
    assert "96 of 96 entries" in text and "fix: make the reference compute in float64" in text


def test_a_reference_computing_in_float32_is_a_finding_at_bfloat16():
    report = lowprec_report(rope_reference, (_x(torch.bfloat16),), reference=rope_reference_in_float32)
    assert report.passed and report.reference_not_float64
    assert len(report.findings) == 1 and report.findings[0].startswith("the reference does not compute in float64")


@pytest.mark.parametrize(
    "op",
    [
        rope_reference,
        lambda x: torch.softmax(x, -1),
        lambda x: torch.round(x * 4),  # piecewise constant: a few entries move only under the large step
        lambda x: x.clamp(-0.5, 0.5),  # entries that never move, under either step
    ],
    ids=["rope", "softmax", "round", "clamp"],
)
def test_a_float64_reference_is_not_reported(op):
    report = lowprec_report(op, (_x(),), reference=op)
    assert not report.reference_not_float64 and report.findings == ()


def test_a_loss_that_cancels_in_float64_is_not_taken_for_float32():
    # the target's logit 30, the others small: the loss, about 1e-11, is 30 - 30.00000000001 in
    # float64, so the small step does not move it; its gradient does.
    g = torch.Generator().manual_seed(0)
    logits = torch.rand(4, 37, generator=g, dtype=torch.float64) * 4 - 2
    logits[:, 5] = 30
    targets = torch.full((4,), 5)

    def loss(x, t):
        return torch.nn.functional.cross_entropy(x, t)

    report = lowprec_report(loss, (logits.float().requires_grad_(), targets), reference=loss)
    assert not report.reference_not_float64
