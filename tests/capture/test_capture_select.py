"""Deduplication and the per-op cap of `opcheck capture` (opcheck.capture.recorder / select)."""

import torch

from opcheck.capture.recorder import Recorder
from opcheck.capture.select import choose, merge_runs


def _recorded(calls, path="op"):
    """The candidates of `calls` (args tuples) recorded in one process."""
    recorder = Recorder(None, None)
    for args in calls:
        recorder.record(path, args, {})
    data = {
        "ops": {
            p: {"records": [r.as_json() for r in c.records.values()], "calls": c.calls} for p, c in recorder.ops.items()
        }
    }
    return merge_runs([data])[path]


def test_calls_differing_only_in_values_collapse_and_their_statistics_merge():
    found = _recorded([(torch.full((2, 3), v), 1) for v in (-1.0, 0.5, 4.0)])
    assert len(found) == 1
    (c,) = found
    assert c.count == 3
    stats = c.args[0]["stats"]
    assert (stats["min"], stats["max"]) == (-1.0, 4.0)
    assert stats["nonneg"] is False  # false of one call is false of the merged record


def test_shape_dtype_stride_and_plain_arguments_each_make_a_new_sample():
    x = torch.ones(4, 6)
    found = _recorded(
        [
            (x, 1),
            (x, 0),  # another dim
            (torch.ones(4, 7), 1),  # another shape
            (x.t(), 1),  # non-contiguous
            (x.double(), 1),  # another dtype
            (x, 1),  # the first again
        ]
    )
    assert len(found) == 5
    assert sorted(c.count for c in found) == [1, 1, 1, 1, 2]


def test_requires_grad_merges_a_tensor_any_call_differentiates_is_differentiated():
    x = torch.ones(4, 6)
    found = _recorded([(x, 1), (x.clone().requires_grad_(), 1), (x, 1)])
    assert len(found) == 1 and found[0].count == 3
    assert found[0].args[0]["requires_grad"] is True


def test_merging_two_processes_adds_counts_and_keeps_one_candidate():
    recorder = Recorder(None, None)
    recorder.record("op", (torch.zeros(3),), {})
    one = {"ops": {"op": {"records": [r.as_json() for r in recorder.ops["op"].records.values()]}}}
    merged = merge_runs([one, one])["op"]
    assert len(merged) == 1 and merged[0].count == 2


def test_the_cap_keeps_what_differs_and_says_why_each_other_call_was_dropped():
    calls = [(torch.ones(4, 64),)] * 5  # the most frequent
    calls += [(torch.ones(4, 32),)]  # 32-aligned, at most 64
    calls += [(torch.ones(4, 80),)]  # more than one 64-wide tile, 16-aligned: a tail
    calls += [(torch.ones(2, 4, 64),)]  # rank 3
    calls += [(torch.ones(0, 64),)]  # empty
    calls += [(torch.ones(4, 96),)]  # 32-aligned and over 64
    found = _recorded(calls)
    choice = choose(found, cap=3)
    kept = [tuple(c.args[0]["shape"]) for c, _ in choice.kept]
    assert kept[0] == (4, 64)  # the most frequent call first
    assert len(kept) == 3
    dropped = {tuple(c.args[0]["shape"]): why for c, why in choice.dropped}
    assert len(dropped) == 3
    assert all("past the cap of 3" in why or "adds nothing" in why for why in dropped.values())
    # Every kept sample after the first adds a feature the earlier ones lack.
    reasons = [why for _, why in choice.kept[1:]]
    assert all(reasons) and all("most frequent" not in " ".join(r) for r in reasons)


def test_candidates_that_add_nothing_are_dropped_whatever_the_cap():
    found = _recorded([(torch.ones(4, 8),), (torch.ones(4, 8),), (torch.ones(12, 8),)])
    choice = choose(found, cap=8)
    # 12 is 4-aligned where 4 is 4-aligned too, both at most 64: nothing new
    assert [tuple(c.args[0]["shape"]) for c, _ in choice.kept] == [(4, 8)]
    assert choice.dropped[0][1] == "adds nothing the kept samples do not have"


def test_remainders_ranks_broadcasts_and_argument_values_are_what_is_kept():
    found = _recorded(
        [
            (torch.ones(8, 128), torch.ones(8, 128)),
            (torch.ones(8, 128), torch.ones(8, 128)),  # the most frequent
            (torch.ones(8, 128), torch.ones(1, 128)),  # broadcast
            (torch.ones(8, 4544), torch.ones(8, 4544)),  # 4544 = 35*128 + 64: a 64 remainder
        ]
    )
    choice = choose(found, cap=8)
    assert len(choice.kept) == 3
    words = " ".join(" ".join(why) for _, why in choice.kept)
    assert "broadcast along dim 0" in words
    assert "4544 (a multiple of 64, not 128)" in words


def test_statistics_see_masks_dominant_rows_and_integers():
    logits = torch.zeros(3, 5)
    logits[:, 2] = 9.0
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    found = _recorded([(logits, mask, torch.arange(6.0))])
    stats = [d["stats"] for d in found[0].args]
    assert stats[0]["dominant"] is True
    assert stats[1]["mask"] and stats[1]["rows_off"] and stats[1]["rows_on"]
    assert stats[2]["integer"] and stats[2]["nonneg"]


def test_an_argument_no_spec_can_write_is_counted_with_the_reason():
    recorder = Recorder(None, None)
    recorder.record("op", (torch.ones(2), torch.nn.Linear(2, 2)), {})
    calls = recorder.ops["op"]
    assert not calls.records
    (reason,) = calls.unsupported
    assert "torch.nn.modules.linear.Linear" in reason
