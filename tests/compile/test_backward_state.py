"""opcheck.engine.compiled.backward_reads and state_report: which Python numbers a backward reads
that compile binds, and the comparison that changes them between a forward and its backward."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from opcheck.engine.compiled import CompiledFunction, backward_reads, state_report

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

config = {"scale": 2.0, "exact": True}
settings = types.SimpleNamespace(temperature=0.5)
LIMIT = 3.0  # a constant by its name
shift = 0.25  # read by the forward as well


class Reads(torch.autograd.Function):
    """A backward reading a dict's item, an object's attribute, a bool, a constant, and a number the
    forward reads too."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * 1.0 + shift

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        g = grad * config["scale"] * settings.temperature * LIMIT + shift * 0
        return g if config["exact"] else g.round()


def reads(x: torch.Tensor) -> torch.Tensor:
    return Reads.apply(x)


def _x() -> torch.Tensor:
    return torch.randn(3, 4, dtype=torch.float64, requires_grad=True)


def test_the_numbers_only_the_backward_reads_are_found_with_where_they_live():
    found = {r.name: r for r in backward_reads(reads, [_x()])}
    assert set(found) == {f"{__name__}.config['scale']", f"{__name__}.settings.temperature"}
    assert found[f"{__name__}.config['scale']"].value == 2.0
    assert found[f"{__name__}.settings.temperature"].changed(1) == 1.0  # half again, at least 0.5


def test_an_op_with_no_python_backward_reads_nothing():
    assert backward_reads(torch.sin, [_x()]) == []


def test_the_values_are_put_back_whether_or_not_the_comparison_fails():
    found = backward_reads(reads, [_x()])
    compiled = CompiledFunction(reads, "aot_eager", dynamic=None, fullgraph=False)
    report = state_report(reads, [_x()], compiled=compiled, reads=found)
    assert not report.passed and report.what == "VJP of input 0"
    assert "config['scale'] 2.0 -> 3.0 -> 4.0" in (report.error or "")
    assert config["scale"] == 2.0 and settings.temperature == 0.5


def test_a_value_kept_on_ctx_at_the_forward_passes():
    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            ctx.scale = config["scale"]

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad * ctx.scale

    found = backward_reads(Kept.apply, [_x()])
    assert [r.name for r in found] == [f"{__name__}.config['scale']"]  # setup_context runs with grad only
    compiled = CompiledFunction(Kept.apply, "aot_eager", dynamic=None, fullgraph=False)
    assert state_report(Kept.apply, [_x()], compiled=compiled, reads=found).passed
