"""The engine's first call in a process: torch's forward-AD decompositions (TorchScript, about 0.2 s)
are loaded only by a check of forward AD, as torch's gradcheck loads them, and the engine's own
modules that a check may not need load with the first check that does."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys, torch, opcheck
loaded = lambda: "torch._decomp.decompositions_for_jvp" in sys.modules
x = torch.randn(300, dtype=torch.float64, requires_grad=True)  # beyond the full Jacobian: forward-AD projections
opcheck.gradcheck(torch.sin, (x,), fast_mode="auto")
opcheck.gradgradcheck(torch.sin, (x[:20],), fast_mode="auto")
print(loaded())
opcheck.gradcheck(torch.sin, (x,), fast_mode="auto", check_forward_ad=True)
print(loaded())
"""


def _after_passing_sin(modules: tuple[str, ...], then: str) -> str:
    """A script that prints which of `modules` are loaded after a passing check of torch.sin on 5x4,
    then runs `then` (which may print loaded() again)."""
    return f"""
import sys, torch, opcheck
modules = {modules!r}
loaded = lambda: [m for m in modules if m in sys.modules]
x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
assert opcheck.gradcheck(torch.sin, (x,), fast_mode="auto")
print(loaded())
{then}"""


def _printed(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_only_a_check_of_forward_ad_loads_torch_s_forward_ad_decompositions():
    assert _printed(CODE) == ["False", "True"]


REPORT_MODULES = (
    "opcheck.engine.auto.stepwise",
    "opcheck.engine.auto.projections",
    "opcheck.engine.auto.fused_projected",
    "opcheck.engine.reporting.diagnostics",
)

WRONG_ROW_FAILS = """
class WrongRow(torch.autograd.Function):  # sin, whose backward is wrong in its last row
    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return t.sin()

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        grad = g * t.cos()
        grad[-1] *= 2
        return grad

report = opcheck.gradcheck_report(WrongRow.apply, (x,), fast_mode="auto", raise_exception=False)
assert not report.passed and report.mismatch is not None, report
print(loaded())
"""
"""A check of WrongRow on x (5x4) that fails, then the modules loaded."""

LAZY_CODE = _after_passing_sin(
    REPORT_MODULES,
    WRONG_ROW_FAILS
    + """
from opcheck.engine import JacobianMismatch, ProjectionMismatch
print(isinstance(report.mismatch, (JacobianMismatch, ProjectionMismatch)))
""",
)


def test_a_passing_check_loads_neither_the_step_by_step_check_nor_the_failure_report():
    """What only a failure or the fallback needs loads with its first use, so that a process's
    first check does not pay for it; the failure then reports as ever, through the same classes
    the package names."""
    before, after, same = _printed(LAZY_CODE)
    assert before == "[]"
    assert "opcheck.engine.auto.stepwise" in after and "opcheck.engine.reporting.diagnostics" in after
    assert same == "True"


PROJECTION_MODULES = (
    "opcheck.engine.auto.projection_check",
    "opcheck.engine.auto.projections",
    "opcheck.engine.auto.sources",
    "opcheck.engine.auto.pinpoint",
    "opcheck.engine.batching.jvp_columns",
)


def test_a_failure_the_full_check_decides_loads_no_step_by_step_projections():
    """A small call that fails goes to the step-by-step full check of backward, which needs none of
    the projection check's modules, nor forward AD's columns; a call beyond the full check's size
    loads them (J·U from forward AD first), and its failure is the projections'."""
    code = _after_passing_sin(
        PROJECTION_MODULES,
        WRONG_ROW_FAILS
        + """
big = torch.randn(300, dtype=torch.float64, requires_grad=True)
report = opcheck.gradcheck_report(WrongRow.apply, (big,), fast_mode="auto", raise_exception=False)
print(loaded(), type(report.mismatch).__name__)
""",
    )
    before, after_small, after_big = _printed(code)
    assert before == after_small == "[]"
    assert after_big == f"{list(PROJECTION_MODULES)!r} ProjectionMismatch"


ON_USE = ("opcheck.engine.layouts", "opcheck.engine.second_order")

ON_USE_CODE = _after_passing_sin(
    ON_USE,
    """
s = torch.randn(3, 4, dtype=torch.float64).to_sparse().requires_grad_()
assert opcheck.gradcheck(lambda t: t.to_dense(), (s,), fast_mode="auto", masked=True)
assert opcheck.gradgradcheck(torch.sin, (x,), fast_mode="auto")
print(loaded())
""",
)


def test_sparse_inputs_and_second_order_checks_load_their_modules_on_first_use():
    """A first check of dense inputs loads neither the sparse stand-ins nor gradgradcheck's first
    derivative; a check of a sparse input and a gradgradcheck load them and pass."""
    before, after = _printed(ON_USE_CODE)
    assert before == "[]"
    assert after == repr(list(ON_USE))


FORWARD_ON_USE = (
    "opcheck.engine.evaluation.analytical",
    "opcheck.engine.modes.fast",
    "opcheck.engine.comparison.complex_views",
    "opcheck.engine.batching.jvp_columns",
)

FORWARD_ON_USE_CODE = _after_passing_sin(
    FORWARD_ON_USE,
    """
assert opcheck.gradcheck(torch.sin, (x,), fast_mode="auto", check_forward_ad=True)
print(loaded())
assert opcheck.gradcheck(torch.sin, (x,), fast_mode=True)
print(loaded())
assert opcheck.gradcheck(lambda t: torch.complex(t.sin(), t), (x,), fast_mode="auto")
print(loaded())
assert opcheck.gradcheck(torch.sin, (x,), fast_mode="auto", check_forward_ad=True, check_batched_forward_grad=True)
print(loaded())
""",
)


def test_forward_ad_torch_s_fast_mode_and_complex_outputs_load_their_modules_on_first_use():
    """A first check of backward on real outputs, and auto's fused check of forward AD, load none of
    torch's fast mode, the complex outputs' views or forward AD's batched columns (which torch's
    fast mode of backward does not need either); the checks that need them load them and pass."""
    backward, forward, fast, complex_outputs, batched_forward = _printed(FORWARD_ON_USE_CODE)
    assert backward == forward == "[]"
    assert fast == repr(list(FORWARD_ON_USE[:2]))
    assert complex_outputs == repr(list(FORWARD_ON_USE[:3]))
    assert batched_forward == repr(list(FORWARD_ON_USE))
