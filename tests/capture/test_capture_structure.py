"""What made a run's calls what they were, reproduced without saving tensors: the structure of their
values (a mask with rows all off or on, an additive -inf mask, a dominant entry per row, integer
values, a constant) becomes a sample maker, and their layout (a transpose, channels-last, a slice
step, an expanded dim) becomes `strides`. Each run tensor is described as the recorder describes
it, rendered as capture renders it, validated as a spec, built as a test builds it, and described
again: the built tensor has the run's structure."""

from __future__ import annotations

import math

import pytest
import torch

from opcheck.capture import render
from opcheck.capture.recorder import describe_value, tensor_stats
from opcheck.capture.select import Candidate
from opcheck.runtime.samples import build_tensor
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import TensorArg


def _run_tensors() -> dict[str, tuple[torch.Tensor, bool]]:
    """Tensors as a model passes them to an op, and whether it differentiates them."""
    g = torch.Generator().manual_seed(0)
    keys = torch.arange(16)[None, :] < torch.tensor([16, 5, 0, 9])[:, None]
    padding = keys.clone()
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    additive = torch.zeros(4, 16).masked_fill(~keys, float("-inf"))
    logits = torch.randn(5, 10, generator=g)
    logits[torch.arange(5), torch.tensor([1, 3, 0, 9, 4])] += 12.0
    positions = torch.arange(24, dtype=torch.float32).reshape(4, 6) % 7
    scale = torch.full((8,), 0.125)
    return {
        "padding_mask": (padding, False),
        "causal_mask": (causal, False),
        "additive_mask": (additive, False),
        "dominant_logits": (logits, True),
        "integer_positions": (positions, False),
        "constant_scale": (scale, False),
        "transposed": (torch.randn(12, 32, generator=g).t(), True),
        "heads_transposed": (torch.randn(2, 12, 32, generator=g).transpose(1, 2), True),
        "channels_last": (torch.randn(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last), True),
        "slice_step": (torch.randn(4, 16, generator=g)[:, ::2], True),
        "narrowed": (torch.randn(4, 10, generator=g)[:, :6], True),
        "expanded_mask": (keys[:, None, :].expand(4, 16, 16), False),
        "expanded_bias": (torch.randn(16, generator=g).expand(4, 16), False),
    }


RUN = _run_tensors()


def _sample(t: torch.Tensor, differentiated: bool, grad: bool = True) -> tuple[TensorArg, list[str]]:
    """The TensorArg capture writes for `t`, validated as a spec's, and the sample's comments."""
    d = describe_value(t, stats=True)
    d["requires_grad"] = differentiated
    other = describe_value(torch.ones(1, requires_grad=True), stats=True)  # a sample needs a gradient
    c = Candidate([d, other], {}, 1, [], None)
    r = render.render_sample(c, "s", ["test"], grad=grad, values_file=None, structured_only=False)
    text = f"op: torch.add\nname: t\nsamples:\n{render.sample_text(r, 2)}"
    (spec,) = load_spec_text(text, source="op_specs/t.yaml")
    arg, _ = spec.samples[0].args
    return arg, list(r.comments)


def _built(arg: TensorArg, seed: int = 1) -> torch.Tensor:
    return build_tensor(arg, "cpu", "float64", torch.Generator().manual_seed(seed)).detach()


@pytest.mark.parametrize("name", sorted(RUN))
def test_the_built_sample_has_the_run_tensors_layout(name):
    t, differentiated = RUN[name]
    arg, _ = _sample(t, differentiated)
    built = _built(arg)
    assert built.shape == t.shape and built.stride() == t.stride(), (arg, t.stride())
    floating = t.is_floating_point()
    assert arg.requires_grad is (None if differentiated or not floating else False)


@pytest.mark.parametrize(
    "name, maker",
    [
        ("padding_mask", "mask"),
        ("causal_mask", "mask"),
        ("additive_mask", "mask"),
        ("expanded_mask", "mask"),
        ("dominant_logits", "dominant"),
        ("integer_positions", "integer"),
        ("constant_scale", "constant"),
    ],
)
def test_the_built_sample_has_the_run_tensors_value_structure(name, maker):
    t, differentiated = RUN[name]
    arg, _ = _sample(t, differentiated)
    assert arg.maker == maker
    run, ours = tensor_stats(t), tensor_stats(_built(arg).to(t.dtype))
    if maker == "mask":
        assert ours["mask"] and run["mask"]
        assert bool(ours["rows_off"]) == bool(run["rows_off"]) and bool(ours["rows_on"]) == bool(run["rows_on"])
        assert ours.get("mask_values") == run.get("mask_values")
    if maker == "dominant":
        assert ours["dominant"] and run["dominant"]
    if maker == "integer":
        assert ours["integer"] and ours["min"] >= run["min"] and ours["max"] <= run["max"]
    if maker == "constant":
        assert ours["min"] == ours["max"] == run["min"] == run["max"]


def test_a_fully_masked_row_is_in_every_draw_not_by_chance():
    t, _ = RUN["padding_mask"]
    arg, comments = _sample(t, False)
    assert (arg.rows_off, arg.rows_on) == (1, 1)
    assert any("a 0/1 mask, 47% on, 25% of rows all off and 25% all on" in c for c in comments), comments
    for seed in range(20):
        rows = _built(arg, seed).reshape(4, 16)
        assert (~rows.bool().any(-1)).sum() >= 1 and rows.bool().all(-1).sum() >= 1


def test_an_additive_mask_takes_no_gradient_and_keeps_its_inf():
    arg, comments = _sample(*RUN["additive_mask"], grad=False)  # a run asking no gradient at all
    assert arg.mask_values == (-math.inf, 0.0) and arg.requires_grad is False
    assert any("an additive mask (-inf where off)" in c for c in comments)


@pytest.mark.parametrize("name", ["integer_positions", "constant_scale"])
def test_a_differentiated_tensor_is_drawn_around_the_runs_values_and_says_so(name):
    t, _ = RUN[name]
    arg, comments = _sample(t, True)
    assert arg.maker is None and arg.low is not None
    assert any("the tensor is differentiated" in c for c in comments), comments


def test_an_expanded_tensor_that_is_differentiated_gets_memory_of_its_own():
    arg, comments = _sample(RUN["expanded_bias"][0], True)
    assert arg.strides is None  # dim 0 moved outside the 16 elements: contiguous
    assert any("a gradient check perturbs each element in its own memory" in c for c in comments), comments
    arg, _ = _sample(torch.randn(16)[:, None].expand(16, 4), True)
    assert arg.strides == (1, 16)  # the 16 elements keep their order, dim 1 goes outside them


@pytest.mark.parametrize(
    "name, words",
    [
        ("transposed", "transposed"),
        ("heads_transposed", "dims 1 and 2 transposed"),
        ("channels_last", "channels-last"),
        ("slice_step", "dim 1 steps 2 elements where 1 is dense"),
        ("narrowed", "dim 0 steps 10 elements where 6 is dense"),
        ("expanded_mask", "expanded along dim 1"),
    ],
)
def test_the_comment_says_what_the_layout_is(name, words):
    t, differentiated = RUN[name]
    _, comments = _sample(t, differentiated)
    assert any(f"strides {list(t.stride())} in the run ({words}" in c for c in comments), comments


def test_a_reduced_twin_keeps_the_layout_at_its_sizes():
    t = torch.randn(2, 300, 12).transpose(1, 2)[:, :, ::2]  # [2, 12, 150]: no dim over 256, no twin
    assert render.twin(Candidate([describe_value(t, stats=True)], {}, 1, [], None)) is None

    t = torch.randn(2, 600, 12).transpose(1, 2)[:, :, ::2]  # [2, 12, 300]
    (twin,) = render.twin(Candidate([describe_value(t, stats=True)], {}, 1, [], None)).args
    expected = torch.empty(2, 344, 12).transpose(1, 2)[:, :, ::2]  # 300 -> 128 + 300 % 128 = 172
    assert twin["shape"] == list(expected.shape) and twin["stride"] == list(expected.stride())


# ------------------------------------------------------------------------------ end to end
MODEL = {
    "masked_model/__init__.py": "",
    "masked_model/ops.py": '''
        """Two kernels as a model uses them, each with a backward that is wrong in one situation only."""

        import torch


        class MaskedSoftmax(torch.autograd.Function):
            """softmax over the last dim where mask is true; a row with no key on gives 0."""

            @staticmethod
            def forward(ctx, scores, mask, buggy):
                probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
                ctx.save_for_backward(scores, mask, probs)
                ctx.buggy = buggy
                return probs

            @staticmethod
            def backward(ctx, grad):
                scores, mask, probs = ctx.saved_tensors
                if ctx.buggy:  # recomputed with a finite fill: uniform, not 0, on a row all off
                    probs = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
                return probs * (grad - (grad * probs).sum(-1, keepdim=True)), None, None


        def masked_softmax(scores, mask):
            return MaskedSoftmax.apply(scores, mask, False)


        def masked_softmax_buggy(scores, mask):
            return MaskedSoftmax.apply(scores, mask, True)


        class ScaleCols(torch.autograd.Function):
            """x * w, w over the last dim."""

            @staticmethod
            def forward(ctx, x, w, buggy):
                ctx.save_for_backward(x, w)
                ctx.buggy = buggy
                return x * w

            @staticmethod
            def backward(ctx, grad):
                x, w = ctx.saved_tensors
                if ctx.buggy:  # a kernel reading element (r, c) at r * stride(0) + c: the last dim's stride is 1
                    x = x.as_strided(x.shape, (x.stride(0), 1), x.storage_offset())
                return grad * w, (grad * x).sum(0), None


        def scale_cols(x, w):
            return ScaleCols.apply(x, w, False)


        def scale_cols_buggy(x, w):
            return ScaleCols.apply(x, w, True)
    ''',
    "train.py": """
        import torch

        from masked_model.ops import masked_softmax, masked_softmax_buggy, scale_cols, scale_cols_buggy

        torch.manual_seed(0)
        batch, length, width = 3, 16, 6
        scores = torch.randn(batch, length, length, requires_grad=True)
        lengths = torch.tensor([16, 5, 0])  # the last sequence is all padding
        keys = torch.arange(length)[None, :] < lengths[:, None]
        mask = keys[:, None, :].expand(batch, length, length)  # one key mask for every query
        hidden = torch.randn(length, width, requires_grad=True)
        weight = torch.rand(length, requires_grad=True)
        for softmax, scale in ((masked_softmax, scale_cols), (masked_softmax_buggy, scale_cols_buggy)):
            probs = softmax(scores, mask)
            out = scale(hidden.t(), weight)  # a transposed view
            (probs.sum() + out.pow(2).sum()).backward()
    """,
    # what the authors tested by hand: every row with a key on, contiguous inputs
    "op_specs/toy_softmax.yaml": """
        op: masked_model.ops:masked_softmax_buggy
        name: toy_softmax
        dtypes: [float64]
        supports_forward_ad: false
        samples:
          - name: random_mask
            args: [{shape: [3, 16, 16]}, {shape: [3, 16, 16], dtype: bool}]
    """,
    "op_specs/toy_scale.yaml": """
        op: masked_model.ops:scale_cols_buggy
        name: toy_scale
        dtypes: [float64]
        supports_forward_ad: false
        samples:
          - name: rows
            args: [{shape: [6, 16]}, {shape: [16]}]
    """,
}
OPS = [f"masked_model.ops:{op}{bug}" for op in ("masked_softmax", "scale_cols") for bug in ("", "_buggy")]


@pytest.mark.long
def test_a_model_whose_ops_are_wrong_only_for_a_fully_masked_row_and_a_transposed_input(tmp_path, monkeypatch):
    from opcheck.spec import load_specs
    from tests.capture.scratch import NO_HYPOTHESIS, capture, opcheck, project, pytest_in, shown

    tmp = project(tmp_path, MODEL)
    monkeypatch.syspath_prepend(str(tmp))
    result = capture(tmp, OPS, ["python", "train.py"])  # no --values: nothing but the specs is written
    assert result.returncode == 0, shown(result)
    specs = {s.name: s for s in load_specs([tmp / "op_specs"], root=tmp)}
    _, mask = specs["toy_softmax"].samples[1].args
    assert (mask.maker, mask.rows_off, mask.strides) == ("mask", 1, (16, 0, 1))
    x, _ = specs["toy_scale"].samples[1].args
    assert x.strides == (1, 6)
    assert not (tmp / "op_specs" / "values").exists()

    generated = opcheck(tmp, "generate")
    assert generated.returncode == 0, shown(generated)
    only_gradcheck = ["-k", "gradcheck and not grad_"]
    run = pytest_in(tmp, "-q", "-p", "no:cacheprovider", *NO_HYPOTHESIS, "generated_tests", *only_gradcheck)
    failed = sorted(line.split()[1].split("::")[1] for line in run.stdout.splitlines() if line.startswith("FAILED"))
    # the hand-written toys pass the buggy ops; the captured samples fail them; the right ops pass all
    assert failed == [
        "test_gradcheck[cpu-float64-3x16x16_3x16x16]",
        "test_gradcheck[cpu-float64-6x16_16]",
    ], shown(run)
    assert "test_toy_softmax.py::test_gradcheck[cpu-float64-3x16x16_3x16x16]" in run.stdout
    assert "test_toy_scale.py::test_gradcheck[cpu-float64-6x16_16]" in run.stdout
    assert " passed" in run.stdout and "nan" not in run.stdout.lower(), shown(run)


def test_capture_with_values_replaces_its_own_sample_and_keeps_one_the_user_edited(tmp_path):
    from opcheck.spec import load_specs
    from tests.capture.scratch import capture, project, shown

    tmp = project(
        tmp_path,
        {
            "run.py": """
                import torch
                import torch.nn.functional as F

                mask = torch.arange(8)[None, :] < torch.tensor([8, 0, 3])[:, None]
                F.softmax(torch.randn(3, 8).masked_fill(~mask, float("-inf")), dim=-1)
            """
        },
    )
    first = capture(tmp, ["torch.nn.functional.softmax"], ["python", "run.py"])
    assert first.returncode == 0, shown(first)
    spec_file = tmp / "op_specs" / "softmax.yaml"
    assert "# captured as " in spec_file.read_text()

    again = capture(tmp, ["torch.nn.functional.softmax"], ["python", "run.py"], "--values")
    assert again.returncode == 0, shown(again)
    assert "replaced capture's own earlier sample(s), unedited since: 3x8" in again.stdout, shown(again)
    assert "kept yours" not in again.stdout
    (spec,) = load_specs([tmp / "op_specs"], root=tmp)
    assert [s.name for s in spec.samples] == ["3x8"]
    assert spec.samples[0].args[0].values_file == "op_specs/values/softmax/3x8.pt"

    text = spec_file.read_text()
    spec_file.write_text(text.replace("values_key: args.0}", "values_key: args.0, requires_grad: true}"))
    third = capture(tmp, ["torch.nn.functional.softmax"], ["python", "run.py"], "--values")
    assert third.returncode == 1, shown(third)  # nothing written
    assert "3x8: the spec has a sample of that name; kept yours (--force replaces it)" in third.stdout, shown(third)
    assert "requires_grad: true" in spec_file.read_text()
