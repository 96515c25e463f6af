"""torch.autograd.gradcheck's own words: the first lines the drop-in shares with it.

Every first line (or start of one) that torch words comes from the installed torch at run time,
never from text copied here: from gradcheck's module where it has it (a constant, or a formatter
called with the failure's own values), else by provoking torch's gradcheck, or the helper of it
that raises, on a tiny crafted function or gradient. A provocation runs once per process, and
only when its failure is being reported (functools.cache): none runs at import. A parametrized
line is a Template, torch's text for sentinel values with the sentinels made fields.

The literal text beside each provocation is its fallback, for a torch that unexpectedly does not
raise there, so that a check never breaks; origins() says which each word came from.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from opcheck._records import record
from opcheck.engine.reporting.torch_provocations import (
    answering,
    crash_on_undefined_grad,
    f64,
    item_in_backward,
    item_in_jvp,
    nondeterministic_backward,
    nonzero_for_undefined_grad,
    real_with_complex_tangent,
    stop,
    undefined_tangent_matters,
)

_gc = importlib.import_module("torch.autograd.gradcheck")
"""torch.autograd.gradcheck the module (torch.autograd.gradcheck the attribute is its function)."""

INDEX = 7919
"""An input index torch is given where it prints one: a prime no message holds otherwise."""
TOLERANCE = 0.0123456789
"""A nondet_tol torch is given where it prints one."""
HAVE, GOT = 17, 19
"""Element counts torch is given where it prints two."""

_ORIGINS: dict[str, str] = {}


def origins() -> Mapping[str, str]:
    """Per word asked for so far in this process: "torch" (taken from it) or "fallback"."""
    return dict(_ORIGINS)


# ------------------------------------------------------------------------------------ machinery
@record
class Template:
    """torch's text with fields where a failure's values go."""

    chunks: tuple[str, ...]
    fields: tuple[str, ...]

    @classmethod
    def of(cls, text: str, sentinels: Mapping[str, str]) -> Template | None:
        """text with each sentinel (a value torch was given, as printed) made the named field; None
        unless each occurs exactly once."""
        found = []
        for sentinel, name in sentinels.items():
            if text.count(sentinel) != 1:
                return None
            found.append((text.index(sentinel), sentinel, name))
        chunks, names, at = [], [], 0
        for pos, sentinel, name in sorted(found):
            chunks.append(text[at:pos])
            names.append(name)
            at = pos + len(sentinel)
        chunks.append(text[at:])
        return cls(tuple(chunks), tuple(names))

    def format(self, **values: object) -> str:
        out = [self.chunks[0]]
        for name, chunk in zip(self.fields, self.chunks[1:]):
            out += [str(values[name]), chunk]
        return "".join(out)


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0]


def _raised(provoke: Callable[[], object], expected: type[BaseException]) -> BaseException | None:
    """What provoke() raises, if it is an `expected`; None if it raises nothing or something else.
    The caller's global RNG, grad mode and warnings are left as they were."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            provoke()
        except expected as e:
            return e
        except Exception:  # torch changed: the fallback speaks
            return None
    return None


def _warned(provoke: Callable[[], object]) -> list[str]:
    """The warnings provoke() emits (whatever it raises)."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            provoke()
        except Exception:
            pass
    return [str(w.message) for w in caught]


def _word(name: str, text: str | None, fallback: str) -> str:
    _ORIGINS[name] = "fallback" if text is None else "torch"
    return fallback if text is None else text


def _template(name: str, text: str | None, sentinels: Mapping[str, str], fallback: str) -> Template:
    """The Template of torch's text, or of the fallback (written with the same sentinels)."""
    made = Template.of(text, sentinels) if text is not None else None
    _ORIGINS[name] = "fallback" if made is None else "torch"
    if made is None:
        made = Template.of(fallback, sentinels)
        if made is None:  # pragma: no cover - the fallbacks below hold their sentinels
            raise AssertionError(f"fallback of {name} lacks its sentinels")
    return made


def _message(e: BaseException | None) -> str | None:
    return None if e is None else str(e)


@functools.cache
def _torch_function(name: str, *params: str) -> Callable[..., Any] | None:
    """gradcheck's module function `name`, if it takes these parameters first (else None)."""
    fn = getattr(_gc, name, None)
    try:
        ok = fn is not None and list(inspect.signature(fn).parameters)[: len(params)] == list(params)
    except (TypeError, ValueError):
        ok = False
    return fn if ok else None


def _from_function(name: str, fn: Callable[..., Any] | None) -> None:
    _ORIGINS[name] = "fallback" if fn is None else "torch"


def _constant(name: str) -> str | None:
    value = getattr(_gc, name, None)
    _ORIGINS[name] = "torch" if isinstance(value, str) else "fallback"
    return value if isinstance(value, str) else None


def _gradcheck(func: Callable[..., Any], inputs: Sequence[Any], **flags: Any) -> Callable[[], object]:
    return lambda: torch.autograd.gradcheck(func, tuple(inputs), **flags)


# ------------------------------------------------------------------------------ argument checks
_FLAGS: dict[tuple[str, str], tuple[dict[str, bool], str]] = {
    ("gradcheck", "forward or backward"): (
        dict(check_forward_ad=False, check_backward_ad=False),
        "Expected at least one of check_forward_ad or check_backward_ad to be True",
    ),
    ("gradcheck", "batched grad"): (
        dict(check_batched_grad=True, check_backward_ad=False, check_forward_ad=True),
        "Setting check_batched_grad=True requires check_backward_ad to be True",
    ),
    ("gradcheck", "batched forward grad"): (
        dict(check_batched_forward_grad=True, check_forward_ad=False),
        "Setting check_batched_forward_grad=True requires check_forward_ad to be True",
    ),
    ("gradgradcheck", "forward or backward"): (
        dict(check_fwd_over_rev=False, check_rev_over_rev=False),
        "Expected at least one of check_fwd_over_rev or check_rev_over_rev to be True",
    ),
    ("gradgradcheck", "undefined grad"): (
        dict(check_undefined_grad=True, check_rev_over_rev=False, check_fwd_over_rev=True),
        "Setting check_undefined_grad=True requires check_rev_over_rev to be True",
    ),
    ("gradgradcheck", "batched grad"): (
        dict(check_batched_grad=True, check_rev_over_rev=False, check_fwd_over_rev=True, check_undefined_grad=False),
        "Setting check_batched_grad=True requires check_rev_over_rev to be True",
    ),
}
FLAG_CASES = tuple(_FLAGS)
"""(checker, case) of every flag combination torch refuses."""


@functools.cache
def flag_error(checker: str, case: str) -> str:
    """What torch's gradcheck or gradgradcheck (`checker`) says of flags it refuses (AssertionError)."""
    flags, fallback = _FLAGS[checker, case]
    check = getattr(torch.autograd, checker)
    return _word(
        f"flags: {checker}: {case}", _message(_raised(lambda: check(stop, (), **flags), AssertionError)), fallback
    )


# ---------------------------------------------------------------------------- inputs and outputs
@functools.cache
def _not_double() -> Template:
    provoke = _gradcheck(
        stop, (None,) * INDEX + (torch.zeros(1, dtype=torch.float32, device="cpu", requires_grad=True),)
    )

    texts = [t for t in _warned(provoke) if str(INDEX) in t]
    fallback = (
        f"Input #{INDEX} requires gradient and is not a double precision floating point or complex. This check "
        "will likely fail if all the inputs are not of double precision floating point or complex. "
    )
    return _template("input not double", texts[0] if texts else None, {str(INDEX): "idx"}, fallback)


def not_double_warning(idx: int) -> str:
    """torch's warning for an input that requires grad and is not float64 or complex128."""
    return _not_double().format(idx=idx)


@functools.cache
def _stride_zero() -> Template:
    expanded = f64(1).expand(2)
    e = _raised(_gradcheck(stop, (None,) * INDEX + (expanded,)), RuntimeError)
    fallback = (
        f"The {INDEX}th input has a dimension with stride 0. gradcheck only supports inputs that are "
        "non-overlapping to be able to compute the numerical gradients correctly. You should call "
        ".contiguous on the input before passing it to gradcheck."
    )
    return _template("input stride 0", _message(e), {str(INDEX): "idx"}, fallback)


def stride_zero(idx: int) -> str:
    """torch's RuntimeError for an input with a dimension of stride 0."""
    return _stride_zero().format(idx=idx)


@functools.cache
def no_input_requires_grad() -> str:
    """torch's ValueError when no input requires grad."""
    e = _raised(_gradcheck(stop, (torch.zeros(1, device="cpu"),)), ValueError)
    fallback = (
        "gradcheck expects at least one input tensor to require gradient, but none of them have requires_grad=True."
    )
    return _word("no input requires grad", _message(e), fallback)


@functools.cache
def sparse_output() -> str:
    """torch's ValueError for a sparse output."""
    e = _raised(_gradcheck(lambda x: x.to_sparse(), (f64(1),)), ValueError)
    fallback = (
        "Sparse output is not supported at gradcheck yet. "
        "Please call to_dense(masked_grad=...) on the output of fn for gradcheck."
    )
    return _word("sparse output", _message(e), fallback)


@functools.cache
def mkldnn_output() -> str:
    """torch's ValueError for an MKLDNN output."""
    e = _raised(
        _gradcheck(lambda x: x.to_mkldnn(), (torch.zeros(1, dtype=torch.float32, device="cpu", requires_grad=True),)),
        ValueError,
    )
    fallback = (
        "MKLDNN output is not supported at gradcheck yet. "
        "Please call to_dense(masked_grad=...) on the output of fn for gradcheck."
    )
    return _word("MKLDNN output", _message(e), fallback)


@functools.cache
def mkldnn_forward_ad() -> str:
    """torch's ValueError for MKLDNN inputs in a forward-mode AD check (worded anew in 2.14)."""
    x = (
        torch.ones(1, 1, dtype=torch.float32, device="cpu").to_mkldnn().requires_grad_()
        if torch._C._has_mkldnn
        else None
    )
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False, atol=1.0)
    e = _raised(_gradcheck(lambda t: t.to_dense(), (x,), **flags), ValueError) if x is not None else None
    return _word("MKLDNN forward AD", _message(e), "MKLDNN inputs are not support for forward AD gradcheck.")


# ---------------------------------------------------------------------------------- numerical
@functools.cache
def no_differentiable_outputs() -> str:
    """torch's first line when outputs that do not require grad change under perturbation."""
    e = _raised(_gradcheck(lambda x: (2 * x).detach(), (f64(1),)), _gc.GradcheckError)
    text = first_line(str(e)) if e is not None else None
    return _word("no differentiable outputs", text, "Numerical gradient for function expected to be zero")


def outputs_same_dtype_and_shape(output1: torch.Tensor, output2: torch.Tensor, eps: float, idx: Any = None) -> None:
    """torch's check that perturbing an input by eps keeps the outputs' shapes and dtypes: its
    AssertionError where they change."""
    check = _torch_function("_check_outputs_same_dtype_and_shape", "output1", "output2", "eps", "idx")
    if check is not None:
        try:
            check(output1, output2, eps, idx)
        except AssertionError:
            _from_function("_check_outputs_same_dtype_and_shape", check)
            raise
        return
    _from_function("_check_outputs_same_dtype_and_shape", check)
    on_index = f"on index {idx} " if idx is not None else ""
    for what, one, two in (("shape", output1.shape, output2.shape), ("dtype", output1.dtype, output2.dtype)):
        if one != two:
            raise AssertionError(
                f"Expected `func` to return outputs with the same {what} when inputs are perturbed {on_index}by "
                f"{eps}, but got: {what}s {one} and {two}."
            )


@functools.cache
def numerical_complex_output() -> str:
    """torch's ValueError for a complex output of the numerical Jacobian's function (backward)."""

    def provoke() -> object:
        return _gc._get_numerical_jacobian(stop, (f64(1),), (torch.zeros(1, dtype=torch.complex128, device="cpu"),))

    fallback = (
        "Expected output to be non-complex. get_numerical_jacobian no longer supports functions that return "
        "complex outputs."
    )
    return _word("numerical complex output", _message(_raised(provoke, ValueError)), fallback)


@functools.cache
def complex_ds_dx() -> str:
    """torch's AssertionError for a complex derivative along a complex input's real part."""

    def provoke() -> object:
        complex_out = (torch.zeros(1, dtype=torch.complex128, device="cpu"),)
        return _gc._compute_numerical_jvps_wrt_specific_input(lambda d: complex_out, torch.zeros(1, device="cpu"), True)

    fallback = "Expected ds_dx to be real-valued, not complex"
    return _word("complex ds_dx", _message(_raised(provoke, AssertionError)), fallback)


# --------------------------------------------------------------------------------- analytical
@functools.cache
def _reentrancy() -> Template:
    flags = dict(nondet_tol=TOLERANCE, check_undefined_grad=False)
    e = _raised(_gradcheck(nondeterministic_backward(), (f64(1),), **flags), _gc.GradcheckError)
    fallback = (
        "Backward is not reentrant, i.e., running backward with same input and grad_output multiple times gives "
        "different values, although analytical gradient matches numerical gradient.The tolerance for "
        f"nondeterminism was {TOLERANCE}."
    )
    text = first_line(str(e)) if e is not None else None
    return _template("reentrancy", text, {str(TOLERANCE): "nondet_tol"}, fallback)


def reentrancy(nondet_tol: float) -> str:
    """torch's first line when two backward passes differ by more than nondet_tol."""
    return _reentrancy().format(nondet_tol=nondet_tol)


@functools.cache
def nondeterminism_note() -> str:
    """torch's note on nondeterministic ops (its FAILED_NONDET_MSG's first paragraph), on one line."""
    text = _constant("FAILED_NONDET_MSG")
    paragraph = " ".join(text.strip().split("\n\n", 1)[0].split()) if text else ""
    fallback = (
        "NOTE: If your op relies on non-deterministic operations i.e., it is listed here: "
        "https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html "
        "this failure might be expected."
    )
    return paragraph or fallback


@functools.cache
def gradient_dtype(check_grad_dtypes: bool) -> str:
    """torch's first line for a backward whose gradient has another dtype than its input (2.13 and
    2.14 call it "Analytical gradient has incorrect size": they unpack the two flags swapped)."""
    x = f64(1)

    def provoke() -> object:
        out = answering((torch.zeros(1, dtype=torch.float32, device="cpu"),))
        return _gc._check_analytical_jacobian_attributes((x,), out, 0.0, check_grad_dtypes)

    e = _raised(provoke, _gc.GradcheckError)
    return _word(f"gradient dtype ({check_grad_dtypes})", _message(e), "Analytical gradient has incorrect size")


@functools.cache
def _column_size() -> Template:
    def provoke() -> object:
        return _gc._stack_and_check_tensors([[torch.zeros(HAVE, dtype=torch.float64, device="cpu")]], (f64(GOT),), 1)

    fallback = f"Expected out_jacobian column to have {HAVE} elements, but got {GOT}"
    e = _raised(provoke, AssertionError)
    return _template("out_jacobian column", _message(e), {str(HAVE): "gradient", str(GOT): "input"}, fallback)


def column_size(gradient_numel: int, input_numel: int) -> str:
    """torch's AssertionError for a gradient of another number of elements than its input."""
    return _column_size().format(gradient=gradient_numel, input=input_numel)


@functools.cache
def forward_complex_inputs() -> str:
    """torch's ValueError for complex inputs to its forward-mode analytical Jacobian."""
    x = torch.zeros(1, dtype=torch.complex128, device="cpu", requires_grad=True)
    e = _raised(lambda: _gc._get_analytical_jacobian_forward_ad(stop, (x,), ()), ValueError)
    fallback = "Expected inputs to be non-complex for _get_analytical_jacobian_forward_ad."
    return _word("forward complex inputs", _message(e), fallback)


@functools.cache
def forward_dtype() -> str:
    """torch's first line for a tangent whose dtype does not fit its output (check_grad_dtypes)."""
    flags = dict(check_forward_ad=True, check_backward_ad=False, check_grad_dtypes=True, check_undefined_grad=False)
    e = _raised(_gradcheck(real_with_complex_tangent(), (f64(1),), **flags), _gc.GradcheckError)
    return _word("forward AD dtype", _message(e), "Forward AD gradient has dtype mismatch.")


def jacobian_mismatch(
    output_idx: int,
    input_idx: int,
    complex_indices: Sequence[int] | None,
    test_imag: bool,
    is_forward_ad: bool,
) -> str:
    """torch's first line for a Jacobian block that fails allclose (its _get_notallclose_msg)."""
    fmt = _torch_function("_get_notallclose_msg", "analytical", "numerical", "output_idx", "input_idx")
    _from_function("_get_notallclose_msg", fmt)
    if fmt is not None:
        return first_line(fmt(None, None, output_idx, input_idx, complex_indices, test_imag, is_forward_ad))
    idx = input_idx if is_forward_ad else output_idx
    part = ("imaginary" if test_imag else "real") if complex_indices and idx in complex_indices else None
    element = "inputs" if is_forward_ad else "outputs"
    prefix = f"While considering the {part} part of complex {element} only, " if part else ""
    mode = "computed with forward mode " if is_forward_ad else ""
    return f"{prefix}Jacobian {mode}mismatch for output {output_idx:d} with respect to input {input_idx:d},"


@functools.cache
def fast_mode_slow_ok() -> str:
    """The first sentence of torch's note for a fast-mode failure whose full blocks match."""
    text = _constant("FAST_FAIL_SLOW_OK_MSG")
    sentence = " ".join(text.strip().split(".", 1)[0].split()) + "." if text else ""
    return sentence or "Fast gradcheck failed but element-wise differences are small."


# ------------------------------------------------------------------------------ batched checks
def batched_mismatch(output_idx: int, input_idx: int, is_forward_ad: bool) -> str:
    """torch's first line for a vmapped gradient that differs from the one-at-a-time ones."""
    fmt = _torch_function("_get_failed_batched_grad_test_msg", "output_idx", "input_idx", "res", "exp")
    _from_function("_get_failed_batched_grad_test_msg", fmt)
    if fmt is not None:
        return first_line(fmt(output_idx, input_idx, None, None, is_forward_ad))
    return f"For output {output_idx} and input {input_idx}:"


@functools.cache
def _batched_failure_prefix(forward: bool) -> str:
    if forward:
        flags = dict(check_forward_ad=True, check_backward_ad=False, check_batched_forward_grad=True)
        provoke = _gradcheck(item_in_jvp(), (f64(1),), check_undefined_grad=False, fast_mode=True, **flags)
    else:
        provoke = _gradcheck(item_in_backward(), (f64(1),), check_batched_grad=True, check_undefined_grad=False)
    e = _raised(provoke, _gc.GradcheckError)
    cause = str(e.__cause__) if e is not None and e.__cause__ is not None else ""
    text = str(e) if e is not None else ""
    prefix = text[: text.index(cause)] if cause and cause in text else None
    return _word(
        f"batched failure ({'forward' if forward else 'backward'})", prefix, "While computing batched gradients, got: "
    )


def batched_failure(ex: BaseException, forward: bool) -> str:
    """torch's text, before its note, when vmap over the backward (or the JVP) raises `ex`."""
    return _batched_failure_prefix(forward) + str(ex)


@functools.cache
def batched_note(forward: bool) -> str:
    """The first line of torch's note on a failed batched-gradient check."""
    text = _constant("FAILED_BATCHED_GRAD_MSG_FWD_AD" if forward else "FAILED_BATCHED_GRAD_MSG")
    if text and text.strip():
        return first_line(text)
    if forward:
        return "gradcheck failed while testing batched gradient computation with forward-mode AD."
    return "gradcheck or gradgradcheck failed while testing batched gradient computation."


# ----------------------------------------------------------------- zero and undefined gradients
def zero_grad_output(grad: torch.Tensor, inp: torch.Tensor, masked: bool | None) -> str | None:
    """torch's first line for the gradient backward returned for `inp` with every grad_output zero,
    asked of torch's own check (None if that check passes it)."""
    check = _torch_function("_test_backward_mul_by_grad_output", "outputs", "inputs", "masked")
    _from_function("_test_backward_mul_by_grad_output", check)
    if check is None:
        return None
    e = _raised(lambda: check([answering((grad,))], (inp,), masked), _gc.GradcheckError)
    return first_line(str(e)) if e is not None else None


@functools.cache
def no_tensors_requiring_grad() -> str:
    """torch's message when a gradient check is given no input that requires grad."""
    e = _raised(lambda: _gc._test_backward_mul_by_grad_output([], (), False), _gc.GradcheckError)
    return _word("no tensors requiring grad", _message(e), "no Tensors requiring grad found in input")


@functools.cache
def _undefined_grad_crash() -> tuple[str | None, str | None]:
    """(torch's first line, its warning) when backward raises for undefined grad_outputs."""
    provoke = _gradcheck(crash_on_undefined_grad(), (f64(1),))
    e = _raised(provoke, _gc.GradcheckError)
    warned = [w for w in _warned(provoke) if "check_undefined_grad=False" in w]
    return (first_line(str(e)) if e is not None else None), (warned[0] if warned else None)


def undefined_grad_crash() -> str:
    """torch's first line when backward raises for undefined grad_outputs."""
    fallback = (
        "Expected backward function to handle undefined output grads. Please look at "
        '"Notes about undefined output gradients" in "tools/autograd/derivatives.yaml"'
    )
    return _word("undefined grad crash", _undefined_grad_crash()[0], fallback)


def undefined_grad_warning() -> str:
    """torch's warning beside a failed undefined-grad_output check."""
    fallback = (
        "Backwards compatibility: New undefined gradient support checking feature is enabled by default, "
        "but it may break existing callers of this function. If this is true for you, you can call this "
        'function with "check_undefined_grad=False" to disable the feature'
    )
    return _word("undefined grad warning", _undefined_grad_crash()[1], fallback)


@functools.cache
def undefined_grad_nonzero() -> str:
    """torch's first line when backward returns nonzero gradients for undefined grad_outputs."""
    e = _raised(_gradcheck(nonzero_for_undefined_grad(), (f64(1),)), _gc.GradcheckError)
    fallback = (
        "Expected all input grads to be undefined or zero when all output grads are undefined or zero. Please "
        'look at "Notes about undefined output gradients" in "tools/autograd/derivatives.yaml"'
    )
    return _word("undefined grad nonzero", first_line(str(e)) if e is not None else None, fallback)


@functools.cache
def _tangent_words() -> tuple[str, ...]:
    """The words between the values in torch's undefined-tangent failure: it raises its
    GradcheckError with nine arguments, words and values alternating, so its message is their tuple."""
    flags = dict(check_forward_ad=True, check_backward_ad=False)
    e = _raised(_gradcheck(undefined_tangent_matters(), (f64(1), f64(1)), **flags), _gc.GradcheckError)
    args = e.args if e is not None else ()
    words = tuple(args[k] for k in (0, 2, 4, 5, 7)) if len(args) == 9 else ()
    fallback = (
        "Mismatch in tangent values for output with index: ",
        " when input: ",
        " has an undefined tangent value. ",
        " Got: ",
        " but expected: ",
    )
    ok = len(words) == 5 and all(isinstance(w, str) for w in words)
    _ORIGINS["undefined tangent"] = "torch" if ok else "fallback"
    return words if ok else fallback


def undefined_tangent(output_idx: int, inp: torch.Tensor, got: torch.Tensor, expected: torch.Tensor) -> str:
    """torch's first line when a zero tangent and an undefined one give different output tangents."""
    w = _tangent_words()
    return first_line(str(_gc.GradcheckError(w[0], output_idx, w[1], inp, w[2], w[3], got, w[4], expected)))
