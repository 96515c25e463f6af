"""Helpers for the op catalog in op_specs/: wrappers that make an op's gradient well defined under
finite differences, and sample generators for inputs that a plain uniform draw cannot make.

A wrapper is tagged with the torch op it exercises (`wraps`), so that the catalog's op count
(tests/test_catalog_features.py) can credit the torch op and not the wrapper.

Why wrappers: gradcheck perturbs every input entry on its own, so a perturbed symmetric matrix is
no longer symmetric. torch.linalg.eigh and torch.linalg.cholesky read only one triangle, while
their backward formulas return the gradient of the symmetric (Hermitian) problem; torch's own
OpInfo tests pass `A + Aᴴ` for the same reason (gradcheck_wrapper_hermitian_input). And
eigenvectors are unique only up to sign (phase for complex), so only gauge-invariant functions
of them have a gradient.
"""

from __future__ import annotations

import torch


def wraps(torch_op: str):
    """Mark a wrapper as a test of `torch_op` (a dotted path such as "torch.linalg.eigh")."""

    def mark(fn):
        fn.wraps_torch_op = torch_op
        return fn

    return mark


@wraps("torch.linalg.eigh")
def eigh_symmetric(a: torch.Tensor, UPLO: str = "L"):
    """Eigenvalues of the Hermitian A + Aᴴ, and V diag(1..n) Vᴴ: a function of the eigenvectors
    that does not change when a column of V flips sign (or phase), so it has a gradient."""
    h = a + a.mH
    values, vectors = torch.linalg.eigh(h, UPLO=UPLO)
    weights = torch.arange(1, h.shape[-1] + 1, dtype=values.dtype, device=h.device)
    projector = (vectors * weights.to(vectors.dtype)) @ vectors.mH
    return values, projector


@wraps("torch.linalg.cholesky")
def cholesky_hermitian(a: torch.Tensor, upper: bool = False):
    """The Cholesky factor of A + Aᴴ (positive definite when A is)."""
    return torch.linalg.cholesky(a + a.mH, upper=upper)


def separated_spectrum(device, dtype, generator):
    """A batch of matrices Q diag(1, 2, 3, 4) Qᵀ / 2 with a random orthogonal (unitary) Q.

    After eigh_symmetric's A + Aᴴ the eigenvalues are exactly 1, 2, 3, 4: gaps of 1, so the
    eigenvector derivatives (which divide by eigenvalue gaps) are well conditioned whatever the
    seed, unlike a uniform symmetric draw whose closest gap can be tiny.
    """
    raw = torch.randn(2, 4, 4, generator=generator, dtype=torch.float64)
    if dtype.is_complex:
        raw = torch.complex(raw, torch.randn(2, 4, 4, generator=generator, dtype=torch.float64))
    q, _ = torch.linalg.qr(raw)
    spectrum = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    a = (q * spectrum.to(q.dtype)) @ q.mH / 2
    return (a.to(dtype=dtype, device=device),), {}


def distinct_singular_values(device, dtype, generator):
    """U diag(3, 2, 1) Vᵀ for random orthonormal U (5x3) and V (3x3): a matrix whose singular
    values are 1 apart, so svd-based gradients (which divide by s_i² - s_j²) stay well posed."""
    u, _ = torch.linalg.qr(torch.randn(5, 3, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    s = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)
    a = (u * s) @ v.mT
    return (a.to(dtype=dtype, device=device),), {}


def attention_reference(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """scaled_dot_product_attention written out in plain ops: softmax(Q Kᵀ / √d) V (float64-capable),
    the reference for the fused attention kernels' low-precision check."""
    if dropout_p:
        raise ValueError("attention_reference is deterministic: dropout_p must be 0")
    d = query.shape[-1]
    scores = query @ key.mT * (scale if scale is not None else d**-0.5)
    if is_causal:
        n, m = scores.shape[-2], scores.shape[-1]
        attn_mask = torch.ones(n, m, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return torch.softmax(scores, dim=-1) @ value
