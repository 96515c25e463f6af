"""run_check per check kind: verdicts, skips, kink re-draws and what a failure says."""

import sys
import warnings

import pytest
import runtime_ops
import torch

import opcheck
from opcheck.engine import route
from opcheck.engine.auto import projections as auto
from opcheck.engine.auto.projections import ProjectionMismatch
from opcheck.runtime import (
    CheckCrashed,
    CheckSkipped,
    LibraryOpcheckFailed,
    OpcheckRedrawWarning,
    Settings,
    UnsupportedButWorks,
    run_check,
)
from opcheck.runtime.context import ItemContext, current_item
from opcheck.runtime.report import Case, write_heatmap
from opcheck.runtime.samples import build_calls
from opcheck.spec.case import CaseId
from opcheck.spec.model import GradcheckFlags, GradgradcheckFlags, Location, OpSpec, Sample, TensorArg

VEC = Sample("vec", args=(TensorArg(shape=(5,)),), location=Location("op_specs/x.yaml", 7, 5))


def spec(op, *samples, **kw):
    return OpSpec(name="x", op=op, source="op_specs/x.yaml", sha256="0", samples=samples or (VEC,), **kw)


@pytest.fixture
def item_context():
    """Run checks as the plugin would: under an item with a node id and settings."""
    tokens = []

    def enter(settings=None, nodeid="generated_tests/test_x.py::test_gradcheck[cpu-float64-vec]"):
        ctx = ItemContext(nodeid=nodeid, rerun=f"pytest '{nodeid}'", settings=settings or Settings())
        tokens.append(current_item.set(ctx))
        return ctx

    yield enter
    for t in reversed(tokens):
        current_item.reset(t)


# ------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("check", ["gradcheck", "forward_ad", "gradgradcheck", "fwgrad_bwgrad"])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_correct_op_passes_every_derivative_check(check, dtype):
    s = spec(
        "torch.sin",
        gradcheck=GradcheckFlags(check_forward_ad=True, check_batched_forward_grad=True),
        gradgradcheck=GradgradcheckFlags(check_batched_grad=True, check_fwd_over_rev=True),
    )
    run_check(s, check, "cpu", dtype, "vec")


@pytest.mark.parametrize(
    "check, op, path",
    [
        ("gradcheck", "runtime_ops:square_wrong", "VJP"),
        ("forward_ad", "runtime_ops:square_wrong_jvp", "JVP"),
        ("gradgradcheck", "runtime_ops:sin_wrong_second_derivative", "VJP of VJP"),
        ("fwgrad_bwgrad", "runtime_ops:sin_wrong_second_derivative", "JVP of VJP"),
    ],
)
def test_each_check_kind_fails_on_its_own_bug_and_names_the_path(check, op, path):
    s = spec(op, gradcheck=GradcheckFlags(check_forward_ad=True, check_batched_grad=False))
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(s, check, "cpu", "float64", "vec")
    assert info.value.path == path
    assert f"check path:  {path} (" in str(info.value)
    assert info.value.mismatch is not None


def test_gradgrad_unsupported_passes_when_it_raises_and_fails_when_it_works():
    run_check(
        spec("runtime_ops:no_double_backward", supports_gradgrad=False), "gradgrad_unsupported", "cpu", "float64", "vec"
    )
    with pytest.raises(
        UnsupportedButWorks,
        match=r"declares `supports_gradgrad: false`, but the second "
        r"derivative \(VJP of VJP\) of torch.sin works: remove",
    ):
        run_check(spec("torch.sin", supports_gradgrad=False), "gradgrad_unsupported", "cpu", "float64", "vec")


def test_forward_ad_unsupported_passes_when_it_raises_and_fails_when_it_works():
    run_check(
        spec("runtime_ops:sin_without_jvp", supports_forward_ad=False),
        "forward_ad_unsupported",
        "cpu",
        "float64",
        "vec",
    )
    with pytest.raises(UnsupportedButWorks, match="remove `supports_forward_ad: false`"):
        run_check(spec("torch.sin", supports_forward_ad=False), "forward_ad_unsupported", "cpu", "float64", "vec")


def test_library_opcheck_passes_a_registered_custom_op():
    s = spec("runtime_ops:scaled_sin", Sample("s", args=(TensorArg(shape=(4,)), 2.0)), library_opcheck=True)
    run_check(s, "library_opcheck", "cpu", "float64", "s")
    packet = spec("torch.ops.opcheck_runtime_tests.scaled_sin.default", Sample("s", args=(TensorArg(shape=(4,)), 2.0)))
    run_check(packet, "library_opcheck", "cpu", "float64", "s")


def test_library_opcheck_reports_each_failing_test():
    s = spec("runtime_ops:no_fake", library_opcheck=True)
    with pytest.raises(LibraryOpcheckFailed) as info:
        run_check(s, "library_opcheck", "cpu", "float64", "vec")
    text = str(info.value)
    assert "test_faketensor: FAILED" in text and "test_schema: passed" in text


def test_library_opcheck_skips_ops_outside_torch_ops():
    with pytest.raises(
        CheckSkipped,
        match="library_opcheck applies to torch.ops.* operators and "
        "torch.library custom ops; torch.sin is a builtin_function",
    ):
        run_check(spec("torch.sin"), "library_opcheck", "cpu", "float64", "vec")


# ------------------------------------------------------------------------------------ skips
def test_unavailable_device_skips_with_torchs_own_words(monkeypatch):
    with pytest.raises(
        CheckSkipped,
        match=r"mps is not available on this machine "
        r"\(torch.backends.mps.is_available\(\) is False\)",
    ):
        run_check(spec("torch.sin"), "gradcheck", "mps", "float64", "vec")
    if not torch.cuda.is_available():
        with pytest.raises(
            CheckSkipped,
            match=r"^cuda is not available on this machine "
            r"\(torch.cuda.is_available\(\) is False\)$",
        ):
            run_check(spec("torch.sin"), "gradcheck", "cuda", "float64", "vec")
    monkeypatch.setenv("OPCHECK_UNAVAILABLE_DEVICES", "xpu, cpu")
    with pytest.raises(
        CheckSkipped,
        match=r"cpu is not available on this machine "
        r"\(OPCHECK_UNAVAILABLE_DEVICES lists it\)",
    ):
        run_check(spec("torch.sin"), "gradcheck", "cpu", "float64", "vec")


def test_unknown_device_type_and_check():
    with pytest.raises(CheckSkipped, match="not a device type this torch build knows"):
        run_check(spec("torch.sin"), "gradcheck", "tpu", "float64", "vec")
    with pytest.raises(ValueError, match="unknown check 'gradchek'"):
        run_check(spec("torch.sin"), "gradchek", "cpu", "float64", "vec")


# ------------------------------------------------------------------------------------ kinks
def kink_spec(*samples):
    return spec(
        "runtime_ops:kinked",
        *(samples or (Sample("k", args=(TensorArg(shape=(6,)),)),)),
        gradcheck=GradcheckFlags(check_batched_grad=False),
    )


def first_value(s, check="gradcheck", sample="k"):
    seed = CaseId(s.name, check, "cpu", "float64", sample).seed()
    (call,) = build_calls(s, s.sample(sample), "cpu", "float64", seed)
    return float(call.args[0].detach()[2])


def test_a_draw_next_to_a_kink_is_redrawn_and_the_pass_is_announced(monkeypatch, capsys, item_context):
    s = kink_spec()
    # |x - k| with its kink 0.3 eps from a drawn value: the finite difference straddles it.
    monkeypatch.setattr(runtime_ops, "KINK", first_value(s) + 3e-7)
    ctx = item_context()
    with pytest.warns(OpcheckRedrawWarning, match="passed after 1 re-draw"):
        run_check(s, "gradcheck", "cpu", "float64", "k")
    out = capsys.readouterr().out
    assert "landed next to a non-differentiable point" in out and "eps=1e-06 and eps=5e-07" in out
    case = CaseId("x", "gradcheck", "cpu", "float64", "k")
    assert f"seed {case.seed()}:" in out
    assert f"passing draw: seed {case.seed(1)} (re-draw 1)" in out
    assert ctx.user_properties and ctx.user_properties[0][0] == "opcheck_redraws"


def test_a_wrong_gradient_is_not_mistaken_for_a_kink():
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpcheckRedrawWarning)
        with pytest.raises(opcheck.GradcheckError) as info:
            run_check(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", "vec")
    assert "re-draw" not in str(info.value) and "non-differentiable" not in str(info.value)


def test_kinks_in_every_draw_fail_after_the_bounded_redraws():
    s = spec("runtime_ops:sawtooth", gradcheck=GradcheckFlags(check_batched_grad=False))
    with pytest.raises(
        opcheck.GradcheckError, match="every one of 4 draws landed next to a non-differentiable point .* `avoid:`"
    ):
        run_check(s, "gradcheck", "cpu", "float64", "vec")


def test_a_kink_in_explicit_values_cannot_be_redrawn(monkeypatch):
    s = kink_spec(Sample("fixed", args=(TensorArg(shape=(2,), values=(0.5, 1.0)),)))
    monkeypatch.setattr(runtime_ops, "KINK", 0.5 + 3e-7)
    with pytest.raises(opcheck.GradcheckError, match="explicit values, so it cannot be re-drawn"):
        run_check(s, "gradcheck", "cpu", "float64", "fixed")


# ------------------------------------------------------------------------------------ failures
def test_failure_message_has_every_field(item_context):
    item_context(nodeid="generated_tests/test_x.py::test_gradcheck[cpu-float64-rows]")
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(
            OpSpec(
                name="x",
                op="runtime_ops:square_wrong",
                source="op_specs/x.yaml",
                sha256="0",
                samples=(
                    Sample(
                        "rows",
                        args=(TensorArg(shape=(2, 3), noncontiguous=True),),
                        location=Location("op_specs/x.yaml", 12, 7),
                    ),
                ),
            ),
            "gradcheck",
            "cpu",
            "float64",
            "rows",
        )
    text = str(info.value)
    seed = CaseId("x", "gradcheck", "cpu", "float64", "rows").seed()
    for expected in [
        "opcheck gradcheck failed for runtime_ops:square_wrong on cpu/float64, sample 'rows'",
        "op:          runtime_ops:square_wrong (spec 'x', op_specs/x.yaml)",
        "sample:      'rows' at op_specs/x.yaml:12:7",
        "call: square_wrong(Tensor[2, 3] float64 (requires_grad, noncontiguous))",
        "check path:  VJP (backward)",
        "device:      cpu",
        "dtype:       float64",
        f"seed:        {seed} (sha256 of 'x::test_gradcheck[cpu-float64-rows]')",
        "tolerances:  eps=1e-06, atol=1e-05, rtol=0.001, nondet_tol=0 (gradient table for float64)",
        "policy:      auto: full Jacobian (36 entries <= budget 1048576)",
        "rerun:       pytest 'generated_tests/test_x.py::test_gradcheck[cpu-float64-rows]'",
        "engine report:\nJacobian mismatch for output 0 with respect to input 0,",
        "worst entries:",
        "analytical ≈ 1.5 × numerical everywhere",
    ]:
        assert expected in text, expected
    assert info.value.check == "backward" and info.value.path == "VJP"


def test_without_pytest_the_rerun_command_is_built_from_the_id():
    current_item.set(None)  # as a library call: this test's own item is not the failing case
    with pytest.raises(
        opcheck.GradcheckError,
        match=r"rerun: +pytest 'generated_tests/test_x.py::"
        r"test_gradcheck\[cpu-float64-vec\]'",
    ):
        run_check(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", "vec")


def test_heatmap_of_the_failing_block(tmp_path, item_context):
    pytest.importorskip("matplotlib")
    item_context(settings=Settings(plot_dir=str(tmp_path / "plots")))
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", "vec")
    png = tmp_path / "plots" / "test_x.py_test_gradcheck_cpu-float64-vec.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"heatmap:     {png}" in str(info.value)


@pytest.fixture
def drawn_labels(monkeypatch):
    """The axis labels and title of every figure write_heatmap saves."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen = []
    save = Figure.savefig

    def spy(fig, *a, **k):
        ax = fig.axes[0]
        seen.append(dict(x=ax.get_xlabel(), y=ax.get_ylabel(), title=ax.get_title(), colorbar=fig.axes[1].get_ylabel()))
        return save(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def test_heatmap_of_a_jvp_projection_failure(tmp_path, item_context, drawn_labels):
    # auto beyond the budget: J·U from the VJP of the VJP, which backward's rows confirm where they
    # were taken, disagrees with finite differences, a (k, m) block
    item_context(settings=Settings(policy="auto", budget=1, plot_dir=str(tmp_path / "plots")))
    with pytest.raises(opcheck.GradcheckError) as info:
        run_check(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", "vec")
    assert isinstance(info.value.mismatch, ProjectionMismatch)
    png = tmp_path / "plots" / "test_x.py_test_gradcheck_cpu-float64-vec.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (drawn,) = drawn_labels
    assert drawn["y"] == "direction u_l along input 0 (shape (5,))"
    assert drawn["x"] == "output 0 element (shape (5,))"
    assert f"auto: {auto.JVP_STAGE} (J·U from the VJP of the VJP, which backward's rows match" in drawn["title"]
    assert "finite differences" in drawn["colorbar"]


def test_heatmap_of_a_vjp_projection_failure(tmp_path, drawn_labels):
    # a right jvp and a wrong backward: the VJP stage fails, a (k', k) block of cotangent-direction pairs
    # (J·U from forward AD: its JVPs batch)
    class SquareWrongBackward(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.x = inputs[0]

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2.001 * g * x

        @staticmethod
        def jvp(ctx, t):
            return 2 * ctx.x * t

    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradcheck_report(SquareWrongBackward.apply, (x,), fast_mode="auto", jacobian_budget=1)
    assert isinstance(r.mismatch, ProjectionMismatch) and r.mismatch.comparison == auto.VJP_STAGE
    assert tuple(r.mismatch.analytical.shape) == (route.COTANGENTS, route.DIRECTIONS)
    case = Case.of(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", VEC)
    path = write_heatmap(r.mismatch, case, str(tmp_path))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    (drawn,) = drawn_labels
    assert drawn["y"] == "cotangent v_i of output 0 (shape (6, 4))"
    assert drawn["x"] == "direction u_l along input 0 (shape (6, 4))"
    assert f"auto: {auto.VJP_STAGE} (J·U from forward AD)" in drawn["title"]
    assert drawn["colorbar"] == "|(Jᵀv_i)ᵀu_l - v_iᵀ(J u_l)|"


def test_heatmap_of_a_jacobian_block_keeps_element_axes(drawn_labels, tmp_path):
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    r = opcheck.gradcheck_report(runtime_ops.square_wrong, (x,))
    case = Case.of(spec("runtime_ops:square_wrong"), "gradcheck", "cpu", "float64", VEC)
    write_heatmap(r.mismatch, case, str(tmp_path))
    (drawn,) = drawn_labels
    assert (drawn["x"], drawn["y"]) == ("output 0 element (shape (5,))", "input 0 element (shape (5,))")
    assert drawn["colorbar"] == "|analytical - numerical|" and "auto:" not in drawn["title"]


def test_opinfo_failure_names_the_sample_index():
    pytest.importorskip("expecttest")
    s = spec(
        "runtime_ops:exp_wrong_on_scalars",
        Sample("oi", opinfo="exp"),
        gradcheck=GradcheckFlags(check_batched_grad=False),
    )
    with pytest.raises(
        opcheck.GradcheckError, match=r"OpInfo 'exp' sample 2 of 3\n.*call: exp_wrong_on_scalars\(Tensor\[\] float64"
    ):
        run_check(s, "gradcheck", "cpu", "float64", "oi")


def test_crash_in_the_op_is_reported_with_context_and_cause():
    with pytest.raises(CheckCrashed, match="the check raised RuntimeError for runtime_ops:raises") as info:
        run_check(spec("runtime_ops:raises"), "gradcheck", "cpu", "float64", "vec")
    assert "kernel exploded" in str(info.value) and isinstance(info.value.__cause__, RuntimeError)


def test_bad_sample_and_no_differentiable_input_say_so():
    bad = spec("torch.sin", Sample("bad", args=(TensorArg(shape=(3,), maker="spd"),)))
    with pytest.raises(CheckCrashed, match=r"could not build sample 'bad'(.|\n)*args\[0\]: maker 'spd' makes matrices"):
        run_check(bad, "gradcheck", "cpu", "float64", "bad")
    ints = spec("torch.neg", Sample("ints", args=(TensorArg(shape=(3,), dtype="int64"),)))
    with pytest.raises(CheckCrashed, match="has no tensor that requires grad"):
        run_check(ints, "gradcheck", "cpu", "float64", "ints")


def test_opinfo_without_expecttest_skips_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "expecttest", None)  # import expecttest -> ImportError
    with pytest.raises(
        CheckSkipped,
        match=r"opinfo: exp needs the expecttest package \(pip install "
        r"expecttest\), which is not installed",
    ):
        run_check(spec("torch.exp", Sample("oi", opinfo="exp")), "gradcheck", "cpu", "float64", "oi")


def test_an_opinfo_op_without_expecttest_skips_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "expecttest", None)
    s = spec("opinfo:exp", Sample("v", args=(TensorArg(shape=(3,)),)))
    with pytest.raises(CheckSkipped, match=r"op opinfo:exp: torch's OpInfo database needs the expecttest package"):
        run_check(s, "gradcheck", "cpu", "float64", "v")


def test_a_generator_that_raises_is_reported_with_its_traceback():
    s = spec("torch.sin", Sample("g", generator="runtime_ops:generator_that_raises"))
    with pytest.raises(CheckCrashed, match="could not build sample 'g'(.|\n)*RuntimeError: no sample for you") as info:
        run_check(s, "gradcheck", "cpu", "float64", "g")
    assert isinstance(info.value, AssertionError) and isinstance(info.value.__cause__, RuntimeError)


def test_heatmap_ticks_on_entries_and_the_wrong_entry_marked(tmp_path, item_context, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen = []
    save = Figure.savefig

    def spy(fig, *a, **k):
        ax = fig.axes[0]
        fig.canvas.draw()  # tick locations are fixed at draw time
        seen.append(dict(x=list(ax.get_xticks()), y=list(ax.get_yticks()),
                         marked=[tuple(p) for p in ax.collections[0].get_offsets().tolist()],
                         extent=tuple(ax.images[0].get_extent())))  # fmt: skip
        return save(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    item_context(settings=Settings(plot_dir=str(tmp_path / "plots")))
    matrix = Sample("m", args=(TensorArg(shape=(4, 5)),), location=Location("op_specs/x.yaml", 7, 5))
    with pytest.raises(opcheck.GradcheckError):
        run_check(spec("runtime_ops:one_wrong_entry", matrix), "gradcheck", "cpu", "float64", "m")
    (drawn,) = seen
    # the block is 20 x 20 (input element x output element); element [0, 3] is flat index 3
    assert drawn["extent"] == (-0.5, 19.5, 19.5, -0.5)
    assert drawn["marked"] == [(3.0, 3.0)]  # (column, row): the one wrong entry and nothing else
    for ticks in (drawn["x"], drawn["y"]):
        assert ticks and all(float(t).is_integer() for t in ticks)
