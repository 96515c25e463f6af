"""torch_words: torch's wording, taken from the installed torch (the differential tests compare
whole first lines: test_differential.py and test_torch_gradcheck_cases.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from opcheck.engine import aux_checks
from opcheck.engine.batching import Evaluator
from opcheck.engine.context import CheckContext
from opcheck.engine.flags import CheckFlags
from opcheck.engine.reporting import torch_words
from opcheck.engine.reporting.torch_provocations import answering

gc_module = importlib.import_module("torch.autograd.gradcheck")

_CACHED = [f for f in vars(torch_words).values() if hasattr(f, "cache_clear")]


@pytest.fixture
def fresh_words():
    """torch_words with nothing provoked yet, and so again after the test (which may patch torch)."""
    for f in _CACHED:
        f.cache_clear()
    torch_words._ORIGINS.clear()
    yield
    for f in _CACHED:
        f.cache_clear()
    torch_words._ORIGINS.clear()


def _x(n: int = 3) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.float64, requires_grad=True)


def _raises(kind, fn, *args):
    with pytest.raises(kind) as raised:
        fn(*args)
    return str(raised.value)


WORDS = {
    **{f"flags: {c}: {k}": (lambda c=c, k=k: torch_words.flag_error(c, k)) for c, k in torch_words.FLAG_CASES},
    "input not double": lambda: torch_words.not_double_warning(3),
    "input stride 0": lambda: torch_words.stride_zero(2),
    "no input requires grad": torch_words.no_input_requires_grad,
    "sparse output": torch_words.sparse_output,
    "MKLDNN output": torch_words.mkldnn_output,
    "MKLDNN forward AD": torch_words.mkldnn_forward_ad,
    "no differentiable outputs": torch_words.no_differentiable_outputs,
    "_check_outputs_same_dtype_and_shape": lambda: _raises(
        AssertionError, torch_words.outputs_same_dtype_and_shape, torch.zeros(1), torch.zeros(2), 1e-6
    ),
    "numerical complex output": torch_words.numerical_complex_output,
    "complex ds_dx": torch_words.complex_ds_dx,
    "reentrancy": lambda: torch_words.reentrancy(0.0),
    "FAILED_NONDET_MSG": torch_words.nondeterminism_note,
    "gradient dtype (True)": lambda: torch_words.gradient_dtype(True),
    "gradient dtype (False)": lambda: torch_words.gradient_dtype(False),
    "out_jacobian column": lambda: torch_words.column_size(4, 3),
    "forward complex inputs": torch_words.forward_complex_inputs,
    "forward AD dtype": torch_words.forward_dtype,
    "_get_notallclose_msg": lambda: torch_words.jacobian_mismatch(0, 1, None, False, False),
    "FAST_FAIL_SLOW_OK_MSG": torch_words.fast_mode_slow_ok,
    "_get_failed_batched_grad_test_msg": lambda: torch_words.batched_mismatch(0, 1, False),
    "batched failure (backward)": lambda: torch_words.batched_failure(RuntimeError("x"), False),
    "batched failure (forward)": lambda: torch_words.batched_failure(RuntimeError("x"), True),
    "FAILED_BATCHED_GRAD_MSG": lambda: torch_words.batched_note(False),
    "FAILED_BATCHED_GRAD_MSG_FWD_AD": lambda: torch_words.batched_note(True),
    "_test_backward_mul_by_grad_output": lambda: torch_words.zero_grad_output(torch.ones(3), _x(), False),
    "no tensors requiring grad": torch_words.no_tensors_requiring_grad,
    "undefined grad crash": torch_words.undefined_grad_crash,
    "undefined grad warning": torch_words.undefined_grad_warning,
    "undefined grad nonzero": torch_words.undefined_grad_nonzero,
    "undefined tangent": lambda: torch_words.undefined_tangent(0, _x(), torch.ones(3), torch.zeros(3)),
}


def test_every_word_is_taken_from_the_installed_torch(fresh_words):
    if not torch._C._has_mkldnn:
        pytest.skip("an MKL-DNN build provokes the MKLDNN words")
    for word in WORDS.values():
        word()
    origins = torch_words.origins()
    assert set(origins) == set(WORDS)
    assert {name for name, origin in origins.items() if origin != "torch"} == set()


def test_words_are_torchs_for_the_values_given(fresh_words):
    assert torch_words.stride_zero(12).startswith("The 12th input has a dimension with stride 0.")
    assert torch_words.not_double_warning(5).startswith("Input #5 requires gradient")
    assert torch_words.reentrancy(0.25).endswith("The tolerance for nondeterminism was 0.25.")
    # torch's own order: the gradient's element count, then the input's
    assert torch_words.column_size(4, 3) == "Expected out_jacobian column to have 4 elements, but got 3"
    assert torch_words.batched_failure(RuntimeError("boom"), True) == "While computing batched gradients, got: boom"
    line = torch_words.undefined_tangent(1, torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0]))
    with pytest.raises(GradcheckError) as torchs:
        raise gc_module.GradcheckError(
            "Mismatch in tangent values for output with index: ",
            1,
            " when input: ",
            torch.tensor([1.0]),
            " has an undefined tangent value. ",
            " Got: ",
            torch.tensor([2.0]),
            " but expected: ",
            torch.tensor([3.0]),
        )
    assert line == str(torchs.value)


def test_words_follow_the_installed_torch_not_a_copy(fresh_words, monkeypatch):
    # A torch that words its messages anew: every word follows it.
    def reworded_outputs(outputs):
        raise ValueError("Sparse outputs are refused here (reworded).")

    def reworded_inputs(tupled_inputs):
        raise RuntimeError(f"Input {len(tupled_inputs) - 1} is expanded (reworded).")

    monkeypatch.setattr(gc_module, "_check_outputs", reworded_outputs)
    assert torch_words.sparse_output() == "Sparse outputs are refused here (reworded)."
    monkeypatch.setattr(gc_module, "_check_inputs", reworded_inputs)
    monkeypatch.setattr(gc_module, "FAILED_NONDET_MSG", "\n\nNOTE: reworded\nnote.\n\nmore")

    def reworded_mismatch(analytical, numerical, output_idx, input_idx, *rest):
        return f"Block {output_idx}, {input_idx} differs,\n"

    monkeypatch.setattr(gc_module, "_get_notallclose_msg", reworded_mismatch)
    assert torch_words.stride_zero(4) == "Input 4 is expanded (reworded)."
    assert torch_words.nondeterminism_note() == "NOTE: reworded note."
    assert torch_words.jacobian_mismatch(2, 3, None, False, False) == "Block 2, 3 differs,"
    assert set(torch_words.origins().values()) == {"torch"}


def test_a_torch_that_does_not_raise_gets_the_fallback(fresh_words, monkeypatch):
    monkeypatch.setattr(gc_module, "_check_outputs", lambda outputs: None)
    monkeypatch.setattr(gc_module, "_check_jacobians_equal", lambda *args: True)
    assert torch_words.sparse_output().startswith("Sparse output is not supported at gradcheck yet.")
    assert torch_words.reentrancy(0.5).startswith("Backward is not reentrant")
    assert torch_words.origins()["sparse output"] == torch_words.origins()["reentrancy"] == "fallback"


def test_template_fields():
    t = torch_words.Template.of("a 7 b 9 c", {"9": "second", "7": "first"})
    assert t is not None and t.format(first="x", second="y") == "a x b y c"
    assert torch_words.Template.of("a 7 b 7", {"7": "n"}) is None  # ambiguous
    assert torch_words.Template.of("a b", {"7": "n"}) is None  # absent


def test_a_provocation_leaves_the_callers_state_alone(fresh_words):
    torch.manual_seed(3)
    state = torch.get_rng_state()
    filters = list(warnings.filters)
    with torch.no_grad():
        assert torch_words.reentrancy(0.0).startswith("Backward is not reentrant")
        assert torch_words.batched_failure(RuntimeError("x"), False).startswith("While computing batched")
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), state)
    assert warnings.filters == filters
    assert set(torch_words.origins().values()) == {"torch"}


def test_nothing_is_provoked_at_import_or_on_a_passing_call():
    script = (
        "import torch, opcheck\n"
        "from opcheck.engine.reporting import torch_words\n"
        "assert not torch_words.origins(), torch_words.origins()\n"
        "x = torch.rand(3, dtype=torch.float64, requires_grad=True)\n"
        "assert opcheck.gradcheck(torch.sin, (x,), check_forward_ad=True, check_batched_grad=True)\n"
        "assert opcheck.gradgradcheck(torch.sin, (x,), fast_mode=True)\n"
        "assert not torch_words.origins(), torch_words.origins()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _zero_grad_output_line(grad: torch.Tensor, inp: torch.Tensor, masked: bool) -> tuple[str, str]:
    """(torch's first line, opcheck's) for a backward that returns `grad` for `inp` with every
    grad_output zero."""
    with pytest.raises(GradcheckError) as torchs:
        gc_module._test_backward_mul_by_grad_output([answering((grad,))], (inp,), masked)
    ctx = CheckContext(CheckFlags(), Evaluator())
    with pytest.raises(GradcheckError) as opchecks:
        aux_checks.check_backward_mul_by_grad_output(ctx, [answering((grad,))], (inp,), masked)
    return str(torchs.value).splitlines()[0], str(opchecks.value).splitlines()[0]


def _coo(sparse_dim: int) -> torch.Tensor:
    return torch.zeros(2, 3, dtype=torch.float64).to_sparse(sparse_dim)


@pytest.mark.parametrize(
    "grad, inp, masked",
    [
        pytest.param(torch.ones(3, dtype=torch.float64), _x(), False, id="not_multiplied"),
        pytest.param(torch.full((3,), 1e-3, dtype=torch.float64), _x(), True, id="not_multiplied_masked"),
        pytest.param(torch.zeros(3, dtype=torch.float32), _x(), False, id="dtype"),
        pytest.param(torch.zeros(4, dtype=torch.float64), _x(), False, id="size"),
        pytest.param(torch.zeros(3, dtype=torch.float64).to_sparse(), _x(), False, id="layout"),
        pytest.param(_coo(1), _coo(2).requires_grad_(), False, id="sparse_dim"),
    ],
)
def test_zero_grad_output_first_lines_are_torchs(grad, inp, masked):
    expected, got = _zero_grad_output_line(grad, inp, masked)
    assert got == expected


def test_zero_grad_output_asks_torchs_own_check(fresh_words, monkeypatch):
    def reworded(outputs, inputs, masked):
        raise gc_module.GradcheckError("zero grad_output: reworded")

    monkeypatch.setattr(gc_module, "_test_backward_mul_by_grad_output", reworded)
    ctx = CheckContext(CheckFlags(), Evaluator())
    with pytest.raises(GradcheckError, match="^zero grad_output: reworded\ncheck: zero grad_output"):
        aux_checks.check_backward_mul_by_grad_output(ctx, [answering((torch.ones(3),))], (_x(),), False)
