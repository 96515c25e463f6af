"""Differential test: opcheck's gradcheck/gradgradcheck must agree with torch's.

Every case of ``corpus.py`` is run, with the same flags and freshly made inputs,
through ``torch.autograd.gradcheck`` (or ``gradgradcheck``) and through
``opcheck``'s, in slow mode and (unless the case is slow-only) in fast mode.
Each run is reduced to a verdict:

* ``True``  -- returned True;
* ``False`` -- raised ``GradcheckError`` (raise_exception=True) or returned
  False (raise_exception=False);
* the exception class name for anything else that escapes.

The test asserts that torch's verdict equals the one recorded in the corpus
(so the corpus documents real torch behaviour) and that opcheck's verdict
equals torch's.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from types import SimpleNamespace

import corpus
import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import opcheck

CASES = corpus.CASES

TORCH = SimpleNamespace(
    name="torch",
    gradcheck=torch.autograd.gradcheck,
    gradgradcheck=torch.autograd.gradgradcheck,
)
OPCHECK = SimpleNamespace(
    name="opcheck",
    gradcheck=opcheck.gradcheck,
    gradgradcheck=opcheck.gradgradcheck,
)


@dataclasses.dataclass
class Outcome:
    verdict: corpus.Verdict
    detail: str  # first line of the exception message (after its type, for one not a GradcheckError)
    warning_categories: list[type[Warning]]
    warning_lines: list[str]  # the first line of each warning's message


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].rstrip() if text.strip() else ""


def run_case(impl, case, mode: str, *, raise_exception: bool = True) -> Outcome:
    """Run one case through one implementation and classify the outcome."""
    inputs = case.make_inputs()  # fresh tensors for every run
    kwargs = dict(case.flags)
    kwargs["fast_mode"] = mode == "fast"
    kwargs["raise_exception"] = raise_exception
    if case.checker == "gradgradcheck":
        kwargs["grad_outputs"] = case.make_grad_outputs() if case.make_grad_outputs else None
    check = getattr(impl, case.checker)

    detail = ""
    # torch draws gradgradcheck's grad_outputs and check_batched_grad's probes from
    # the global RNG: give both implementations the same stream, and restore it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = check(case.func, inputs, **kwargs)
            except GradcheckError as exc:  # opcheck.GradcheckError is a subclass
                detail = _first_line(str(exc))
                verdict = False if raise_exception else "GradcheckError despite raise_exception=False"
            except Exception as exc:  # noqa: BLE001 - the exception type *is* the verdict
                detail = f"{type(exc).__name__}: {_first_line(str(exc))}"
                verdict = type(exc).__name__
            else:
                if result is True:
                    verdict = True
                elif result is False and not raise_exception:
                    verdict = False
                else:
                    verdict = f"returned {result!r} with raise_exception={raise_exception}"
    return Outcome(verdict, detail, [w.category for w in caught], [_first_line(str(w.message)) for w in caught])


def _params(cases, predicate=lambda case, mode: True):
    return [
        pytest.param(case, mode, id=f"{case.id}-{mode}")
        for case in cases
        for mode in case.modes()
        if predicate(case, mode)
    ]


def _describe(impl, outcome):
    return f"{impl.name}: {outcome.verdict!r}" + (f" ({outcome.detail})" if outcome.detail else "")


@pytest.mark.parametrize("case, mode", _params(CASES))
def test_same_verdict_as_torch(case, mode):
    expected = case.expected_for(mode)
    reference = run_case(TORCH, case, mode)
    candidate = run_case(OPCHECK, case, mode)

    assert reference.verdict == expected, f"corpus expectation for {case.id} [{mode}] is {expected!r} but " + _describe(
        TORCH, reference
    )
    assert candidate.verdict == reference.verdict, (
        f"{case.id} [{mode}]: " + _describe(OPCHECK, candidate) + " vs " + _describe(TORCH, reference)
    )
    if case.warns is not None:
        for impl, outcome in ((TORCH, reference), (OPCHECK, candidate)):
            assert any(issubclass(c, case.warns) for c in outcome.warning_categories), (
                f"{impl.name} did not emit {case.warns.__name__} for {case.id} [{mode}]; "
                f"got {outcome.warning_categories}"
            )


@pytest.mark.parametrize("case, mode", _params(CASES, lambda case, mode: case.expected_for(mode) is not True))
def test_raise_exception_false(case, mode):
    """With raise_exception=False a GradcheckError failure becomes a False return,
    while any other exception still propagates unchanged."""
    expected = case.expected_for(mode)
    reference = run_case(TORCH, case, mode, raise_exception=False)
    candidate = run_case(OPCHECK, case, mode, raise_exception=False)
    assert reference.verdict == expected, _describe(TORCH, reference)
    assert candidate.verdict == expected, _describe(OPCHECK, candidate) + " vs " + _describe(TORCH, reference)


# ---------------------------------------------------------------------------
# Guards on the corpus and the harness themselves.
# ---------------------------------------------------------------------------


def test_corpus_is_big_and_covers_both_verdicts():
    assert len(CASES) >= 40
    verdicts = [case.expected_for(mode) for case in CASES for mode in case.modes()]
    assert True in verdicts and False in verdicts
    assert any(isinstance(v, str) for v in verdicts), "no exception-type verdicts left"
    assert any(case.expected_fast is not None for case in CASES), "no slow/fast divergence left"
    assert {case.checker for case in CASES} == {"gradcheck", "gradgradcheck"}
    assert any(case.expected is False and case.checker == "gradgradcheck" for case in CASES)


def test_case_ids_are_unique_and_well_formed():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    for case_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]+", case_id), case_id


def _tensors(inputs):
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return [x for x in inputs if isinstance(x, torch.Tensor)]


def _storage(x):
    """What holds a tensor's numbers (None for MKLDNN's opaque buffer)."""
    if x.layout == torch.sparse_coo:
        return x._values()
    if x.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return x.values()
    return x if x.layout == torch.strided else None


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_make_inputs_is_fresh_deterministic_and_leaves_global_rng_alone(case):
    state = torch.get_rng_state()
    first, second = case.make_inputs(), case.make_inputs()
    assert torch.equal(torch.get_rng_state(), state), "make_inputs touched the global RNG"
    a, b = _tensors(first), _tensors(second)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x is not y
        if _storage(x) is not None:
            assert _storage(x).data_ptr() != _storage(y).data_ptr() or x.numel() == 0
        assert torch.equal(x.detach().to_dense(), y.detach().to_dense())
        assert x.numel() <= 64 or case.id == "one_wrong_entry_32x32"


def test_harness_catches_a_lying_checker():
    """The differential test must be able to fail: an implementation that always
    passes, or that fails with the wrong exception type, gets a different verdict."""
    by_id = {case.id: case for case in CASES}

    def always_true(func, inputs, **kwargs):
        return True

    def runtime_error(func, inputs, **kwargs):
        raise RuntimeError("not a GradcheckError")

    liar = SimpleNamespace(name="liar", gradcheck=always_true, gradgradcheck=always_true)
    wrong_type = SimpleNamespace(name="wrong_type", gradcheck=runtime_error, gradgradcheck=runtime_error)
    for case_id in ("missing_factor", "gg_wrong_double_backward", "broadcast_wrong_dim"):
        case = by_id[case_id]
        assert run_case(liar, case, "slow").verdict != case.expected
    assert run_case(wrong_type, by_id["missing_factor"], "slow").verdict == "RuntimeError"


LAYOUT_CASES = [c for c in CASES if c.id.startswith(("sparse_", "mkldnn_"))]


@pytest.mark.parametrize("case, mode", _params(CASES))
def test_same_first_line_as_torch(case, mode):
    """The first line of every failure (or the exception and its text) is torch's, so `match=`
    patterns written against torch keep working."""
    assert run_case(OPCHECK, case, mode).detail == run_case(TORCH, case, mode).detail


@pytest.mark.parametrize("case, mode", _params([c for c in CASES if c.warns is not None]))
def test_same_warnings_as_torch(case, mode):
    """The first line of every warning torch's check emits (of the category the case names) is
    among opcheck's, so `pytest.warns(match=...)` patterns written against torch keep working."""
    reference, candidate = run_case(TORCH, case, mode), run_case(OPCHECK, case, mode)
    expected = {line for line, c in zip(reference.warning_lines, reference.warning_categories) if c is case.warns}
    assert expected and expected <= set(candidate.warning_lines), (expected, candidate.warning_lines)


def test_gradgradcheck_draws_its_grad_outputs_as_torch_does():
    # From the global generator, like torch: seeded the same way, both check the same function
    # and leave the generator in the same state.
    x = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).requires_grad_()
    states = []
    for check in (torch.autograd.gradgradcheck, opcheck.gradgradcheck):
        torch.manual_seed(123)
        assert check(torch.sin, (x,), gen_non_contig_grad_outputs=True)
        states.append(torch.get_rng_state())
    assert torch.equal(*states)


def test_layout_cases_cover_every_layout():
    layouts = set()
    for case in LAYOUT_CASES:
        for t in _tensors(case.make_inputs()):
            layouts.add(t.layout)
    assert {torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc} <= layouts
    assert any(c.expected is False for c in LAYOUT_CASES) and any(c.expected is True for c in LAYOUT_CASES)
