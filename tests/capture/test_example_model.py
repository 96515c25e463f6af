"""examples/transformer.py, the model `opcheck capture` is demonstrated on, and its custom op.

The op `opcheck_examples::rms_norm` is checked against a plain-torch RMSNorm and with
opcheck.gradcheck at the toy size of its spec ([3, 8], one tile) and at the model's size
([2, 13, 80]: two full tiles and a 16-column tail). Its mutant (mutants.py), whose backward is
wrong on that tail only, passes at the toy size and fails at the model's: why samples at the sizes
a model really uses matter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opcheck
from examples.transformer import BATCH, HIDDEN, SEQ, rms_norm
from tests.capture.mutants import rms_norm_tail

REPO = Path(__file__).resolve().parents[2]
EPS = 1e-6
TOY, MODEL = (3, 8), (BATCH, SEQ, HIDDEN)


def inputs(shape, seed=0):
    """x of `shape` and a weight over its last dim, float64, from a private seeded generator."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
    weight = (torch.rand(shape[-1], dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    return x, weight


def cotangent(shape):
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def reference(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def grads(op, x, weight, grad_out):
    return torch.autograd.grad(op(x, weight, EPS), (x, weight), grad_out)


@pytest.mark.parametrize(
    "command", [["examples/transformer.py"], ["-m", "examples.transformer"]], ids=["path", "module"]
)
def test_example_model_runs_from_the_repo_root(command):
    result = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("loss "), result.stdout


@pytest.mark.parametrize("shape", [TOY, MODEL, (1, 33), (0, 80)], ids=str)
def test_rms_norm_matches_plain_torch(shape):
    x, weight = inputs(shape)
    out = rms_norm(x, weight, EPS)
    torch.testing.assert_close(out, reference(x, weight, EPS))
    grad_out = cotangent(shape)
    torch.testing.assert_close(grads(rms_norm, x, weight, grad_out), grads(reference, x, weight, grad_out))


@pytest.mark.parametrize("shape", [TOY, MODEL], ids=str)
def test_rms_norm_passes_gradcheck(shape):
    assert opcheck.gradcheck(lambda x, w: rms_norm(x, w, EPS), inputs(shape), fast_mode="auto")


def test_mutant_is_the_correct_op_on_one_tile_and_wrong_only_on_the_tail_tile():
    x, weight = inputs(TOY)
    grad_out = cotangent(TOY)
    assert all(map(torch.equal, grads(rms_norm_tail, x, weight, grad_out), grads(rms_norm, x, weight, grad_out)))

    x, weight = inputs(MODEL)
    grad_out = cotangent(MODEL)
    (wrong_x, wrong_w), (right_x, right_w) = (
        grads(rms_norm_tail, x, weight, grad_out),
        grads(rms_norm, x, weight, grad_out),
    )
    assert torch.equal(wrong_w, right_w)
    differs = (wrong_x != right_x).flatten(0, -2).any(0)
    assert differs.nonzero().flatten().tolist() == list(range(64, 80))  # the 16-column tail after 2 tiles of 32


def test_mutant_passes_gradcheck_at_the_toy_size_and_fails_at_the_model_size():
    def op(x, w):
        return rms_norm_tail(x, w, EPS)

    assert opcheck.gradcheck(op, inputs(TOY), fast_mode="auto")
    with pytest.raises(opcheck.GradcheckError):
        opcheck.gradcheck(op, inputs(MODEL), fast_mode="auto")
