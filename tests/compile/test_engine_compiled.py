"""opcheck.engine.compiled: the runs' copies, what is compared, and the rounding-order criterion."""

from __future__ import annotations

import torch

from opcheck.engine.compiled import (
    ROUNDING_ULPS,
    CompiledFunction,
    _differs,
    compile_report,
    copies,
)


def test_copies_keep_aliasing_strides_and_the_gaps_between_elements():
    buf = torch.arange(12.0, dtype=torch.float64)
    strided = buf.as_strided((3, 2), (4, 2), 1)  # gaps hold the values the op must not read
    other = torch.ones(2, requires_grad=True)
    a, b, c, n = copies([strided, strided, other, 3])
    assert a is b and a is not strided and n == 3
    assert (a.stride(), a.storage_offset()) == ((4, 2), 1) and torch.equal(a, strided)
    assert torch.equal(torch.tensor(a.untyped_storage().tolist()[:8]), torch.tensor(buf.untyped_storage().tolist()[:8]))
    assert c.requires_grad and c.is_leaf and c.data_ptr() != other.data_ptr()


def test_rounding_order_passes_and_a_real_difference_names_its_entries():
    e = torch.linspace(-3, 3, 20, dtype=torch.float64).reshape(4, 5)
    eps = torch.finfo(torch.float64).eps
    assert _differs(e, e * (1 + 4 * eps)) is None
    g = e.clone()
    g[2, 3] *= 1 + 1e-9  # far below any tolerance a finite-difference check has, far above reordering
    text = _differs(e, g)
    assert text is not None and text.startswith(f"1 of 20 entries differ beyond rounding order ({ROUNDING_ULPS} ulps")
    assert "[2, 3]: compiled" in text
    assert "compiled Tensor[5, 4] float64, eagerly Tensor[4, 5] float64" in (_differs(e, e.t().contiguous()) or "")


def test_nan_where_eager_has_nan_is_equal_and_elsewhere_it_differs():
    e = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float32)
    assert _differs(e, e.clone()) is None
    assert _differs(e, torch.tensor([float("nan"), float("nan"), float("inf")])) is not None


def test_aot_eager_compares_outputs_the_vjp_the_jvp_and_the_written_inputs():
    def scale_into(x, out):
        out.copy_(x.detach() * 3)
        return x.sin()

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = torch.zeros(3, 4, dtype=torch.float64)
    compiled = CompiledFunction(scale_into, "aot_eager", dynamic=None, fullgraph=False)
    report = compile_report(scale_into, (x, out), compiled=compiled, check_forward_ad=True)
    assert report.passed, report.error
    assert report.compared == ("output 0", "VJP of input 0", "JVP of output 0", "input 1 after the call")
    assert report.graphs.compiled >= 1 and report.graphs.ran >= 1
    assert torch.equal(out, torch.zeros(3, 4, dtype=torch.float64))  # every run has its own copies


def test_a_compiled_function_that_writes_differently_fails_on_the_written_input():
    calls = []

    def writes(x, out):
        calls.append(1)
        out.add_(1 if torch.compiler.is_compiling() else 0)
        return x * 2

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    compiled = CompiledFunction(writes, "aot_eager", dynamic=None, fullgraph=False)
    report = compile_report(writes, (x, torch.zeros(3, dtype=torch.float64)), compiled=compiled)
    assert not report.passed and report.what == "input 1 after the call"
    assert "3 of 3 entries differ" in (report.error or "")


def test_forward_ad_that_compile_lacks_is_a_note_not_a_failure(monkeypatch):
    # What compile does with dual tensors varies by torch (dynamo runs them eagerly on some,
    # functionalized copies lack forward-AD formulas on others) and is not the op author's to
    # change: reported, never judged. The compiled side's forward AD is made to raise, then to
    # give no tangent; eager's is left alone.
    from opcheck.engine import compiled as engine

    eager_jvp = engine._jvp
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def raising(fn, inputs, tangents):
        if isinstance(fn, engine._Bound):
            raise NotImplementedError("Trying to use forward AD with aten::copy that does not support it.")
        return eager_jvp(fn, inputs, tangents)

    def dropping(fn, inputs, tangents):
        found = eager_jvp(fn, inputs, tangents)
        return [None] * len(found) if isinstance(fn, engine._Bound) else found

    for jvp, note in ((raising, "raised NotImplementedError"), (dropping, "carries no tangent")):
        monkeypatch.setattr(engine, "_jvp", jvp)
        compiled = CompiledFunction(torch.sin, "aot_eager", dynamic=None, fullgraph=False)
        report = compile_report(torch.sin, (x,), compiled=compiled, check_forward_ad=True)
        assert report.passed, report.error
        assert "JVP of output 0" not in report.compared
        assert any(note in n for n in report.notes), report.notes
