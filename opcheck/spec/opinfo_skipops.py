"""The skips and expected failures of torch's gradient tests that its test files hold, not op_db.

From torch 2.14 on, test/test_ops_gradients.py and test/test_ops_fwd_gradients.py hold the entries'
device-agnostic skips and expected failures of those tests (`skipOps` lists, which the tests add to
the entries' decorators when they run; moved there by pytorch#177259; torch 2.13's op_db still
holds them). The test files are not part of the installed torch, so the lists are kept here, for
`opcheck import-opinfo`. They need checking at each torch release: an expected failure that a
later torch fixes shows as an unexpected pass of the imported spec (expected failures are strict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opcheck.spec import torch_condition

SKIP_OPS_SINCE = ">=2.14"
"""torch releases whose gradient test files, not op_db, hold the entries' device-agnostic skips and
expected failures of those tests (moved by pytorch#177259; torch 2.13's op_db still holds them)."""


@dataclass(frozen=True)
class SkipOpsRule:
    """One item of a `skipOps` list in torch's gradient test files: `xfail("cov")`,
    `skip("round", variant_name="decimals_3")`, `xfail("logcumsumexp", dtypes=(torch.complex128,))`.

    torch's `skipOps` adds it to the entry's decorators as a DecorateInfo of that one test, on
    every device, skipping with "Skipped!" or expecting the test to fail.
    """

    kind: str  # "skip" | "xfail"
    name: str
    variant: str = ""
    dtypes: tuple[str, ...] | None = None  # None: every dtype

    def names(self, info: Any) -> bool:
        return info.name == self.name and (info.variant_test_name or "") == self.variant


def _skip(name: str, variant: str = "", dtypes: tuple[str, ...] | None = None) -> SkipOpsRule:
    return SkipOpsRule("skip", name, variant, dtypes)


def _xfail(name: str, variant: str = "", dtypes: tuple[str, ...] | None = None) -> SkipOpsRule:
    return SkipOpsRule("xfail", name, variant, dtypes)


# torch 2.14's test/test_ops_gradients.py and test/test_ops_fwd_gradients.py, in their order, for
# the four tests opcheck makes (each file names this set `_bwd_grad_all` / `_fwd_grad_all`; in 2.14
# the two are the same). The tests of in-place variants have lists of their own, not copied here.
_GRADIENT_TESTS_ALL = (
    _skip("as_strided"),
    _skip("as_strided_copy"),
    _skip("round", "decimals_3"),
    _skip("round", "decimals_neg_3"),
    _skip("__rpow__"),
    _skip("polygamma", "polygamma_n_1"),
    _skip("polygamma", "polygamma_n_2"),
    _skip("polygamma", "polygamma_n_3"),
    _skip("polygamma", "polygamma_n_4"),
    _xfail("bfloat16"),
    _xfail("float"),
    _xfail("half"),
    _xfail("cfloat"),
    _xfail("chalf"),
    _skip("normal"),
    _skip("normal", "number_mean"),
    _skip("linalg.lstsq"),
)
SKIP_OPS_RULES: dict[tuple[str, str, str], tuple[SkipOpsRule, ...]] = {
    ("test_ops_gradients.py", "TestBwdGradients", "test_fn_grad"): (
        *_GRADIENT_TESTS_ALL,
        _xfail("cov"),
        _xfail("istft"),
        _xfail("native_group_norm"),
        _skip("sparse.sampled_addmm"),
        _skip("sparse.mm", "reduce"),
        _xfail("as_strided_scatter"),
        _skip("nn.functional.max_unpool1d"),
        _skip("nn.functional.max_unpool2d"),
        _skip("nn.functional.max_unpool3d"),
        _xfail("linalg.norm", "subgradients_at_zero"),
    ),
    ("test_ops_gradients.py", "TestBwdGradients", "test_fn_gradgrad"): (
        *_GRADIENT_TESTS_ALL,
        _xfail("cov"),
        _skip("sparse.sampled_addmm"),
        _skip("sparse.mm", "reduce"),
        _xfail("native_layer_norm"),
        _skip("nn.functional.max_unpool1d"),
        _skip("nn.functional.max_unpool2d"),
        _skip("nn.functional.max_unpool3d"),
        _xfail("cat"),
        _xfail("nn.functional.ctc_loss", dtypes=("float64",)),
        _xfail("nn.functional.linear_cross_entropy", "chunked_none"),
        _xfail("nn.functional.linear_cross_entropy", "chunked"),
        _xfail("linalg.norm"),
        _xfail("linalg.norm", "subgradients_at_zero"),
        _skip("masked.logaddexp"),
    ),
    ("test_ops_fwd_gradients.py", "TestFwdGradients", "test_fn_fwgrad_bwgrad"): (
        *_GRADIENT_TESTS_ALL,
        _skip("cov"),
        _skip("sparse.sampled_addmm"),
        _skip("sparse.mm", "reduce"),
        _xfail("as_strided", "partial_views", dtypes=("complex64", "complex128")),
        _skip("as_strided_scatter"),
        _xfail("triangular_solve"),
        _skip("svd_lowrank", dtypes=("complex128",)),
        _skip("pca_lowrank", dtypes=("complex128",)),
        _xfail("polar"),
        _xfail("logcumsumexp", dtypes=("complex128",)),
        _xfail("scatter_reduce", "prod"),
        _xfail("linalg.norm", "subgradients_at_zero"),
    ),
    ("test_ops_fwd_gradients.py", "TestFwdGradients", "test_forward_mode_AD"): (
        *_GRADIENT_TESTS_ALL,
        _xfail("cov"),
        _skip("sparse.sampled_addmm"),
        _skip("sparse.mm", "reduce"),
        _xfail("as_strided", "partial_views"),
        _xfail("as_strided_scatter"),
        _skip("native_layer_norm"),
        _skip("native_batch_norm"),
        _skip("_native_batch_norm_legit"),
        _skip("_batch_norm_with_update"),
        _skip("nn.functional.scaled_dot_product_attention"),
        _xfail("bernoulli"),
        _xfail("logcumsumexp", dtypes=("complex128",)),
        _xfail("nn.functional.feature_alpha_dropout", "with_train"),
        _skip("nn.functional.multi_head_attention_forward"),
        _xfail("scatter_reduce", "prod"),
        _xfail("linalg.norm", "subgradients_at_zero"),
    ),
}
"""The `skipOps` lists of torch's gradient tests, by (test file, test class, test name)."""


def skip_ops_rules(info: Any, torch_version: str | None = None) -> list[tuple[str, str, str, SkipOpsRule]]:
    """(test file, test class, test name, rule) for each skipOps rule of torch's gradient test files
    that names the entry, where the torch of `torch_version` (default: the installed one) keeps
    them there; none for a torch whose op_db holds them itself."""
    version = torch_condition.installed() if torch_version is None else torch_version
    if not torch_condition.satisfies(version, SKIP_OPS_SINCE):
        return []
    return [(*test, rule) for test, rules in SKIP_OPS_RULES.items() for rule in rules if rule.names(info)]
