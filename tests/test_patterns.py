"""Fixed sparse patterns: their masks by hand, and sparsities that are what they claim."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens import Capture
from attnlens.analysis.evaluation import removal
from attnlens.analysis.patterns import PATTERNS, build, removed_mask, sparsity

N = 16


def hand_keep(name: str, n: int, value: int, globals_: set[int]) -> np.ndarray:
    keep = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            near = abs(i - j)
            if name == "strided":
                keep[i, j] = near < value or (i - j) % value == 0
            elif name == "fixed":
                keep[i, j] = i // value == j // value or j % value == value - 1
            elif name == "band":
                keep[i, j] = near <= value
            elif name in ("local", "bigbird"):
                keep[i, j] = near <= value or i in globals_ or j in globals_
            elif name == "sink-window":  # StreamingLLM: the first 4 keys, whatever their tokens, and the window
                keep[i, j] = near <= value or j < 4
            elif name == "no-diagonal":
                keep[i, j] = i != j
    return keep


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_masks_and_sparsity_by_hand(name):
    cls = torch.zeros(2, N, dtype=torch.bool)
    cls[:, 0] = True
    valid = torch.ones(1, N, N, dtype=torch.bool)
    for value in PATTERNS[name].values(N):
        keep = build(name, N, value, cls, torch.Generator().manual_seed(0))
        expected = hand_keep(name, N, value, {0})
        if name == "bigbird":
            # the window and globals, plus exactly `value` more keys per row where that many are left
            assert (keep[0].numpy() | expected).sum() == keep[0].sum() and (keep[0].numpy() >= expected).all()
            extra = keep[0].numpy().sum(1) - expected.sum(1)
            np.testing.assert_array_equal(extra, np.minimum(value, N - expected.sum(1)))
            expected = keep[0].numpy()
        np.testing.assert_array_equal(keep[0].numpy(), expected, err_msg=f"{name}({value})")
        claimed = sparsity(removed_mask(keep, valid), valid)
        assert claimed == pytest.approx(1 - expected.sum() / N**2 if name != "bigbird" else 1 - keep.float().mean().item())


def test_bigbird_random_keys_follow_the_seed():
    cls = torch.zeros(1, N, dtype=torch.bool)
    a, b, c = (build("bigbird", N, 2, cls, torch.Generator().manual_seed(seed)) for seed in (3, 3, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sparsity_counts_only_valid_positions_and_spares_emptied_rows():
    """No-diagonal under a causal mask: query 0 would lose its only key, so it keeps it."""
    n = 8
    valid = torch.ones(1, n, n, dtype=torch.bool).tril()
    keep = build("no-diagonal", n, 0, torch.zeros(1, n, dtype=torch.bool))
    removed = removed_mask(keep, valid)
    assert not removed[0, 0].any() and removed[0, 1:].sum(1).tolist() == [1] * (n - 1)
    assert sparsity(removed, valid) == pytest.approx((n - 1) / (n * (n + 1) / 2))


@pytest.mark.parametrize("name, value", [("local", 2), ("strided", 4), ("band", 1)])
def test_claimed_sparsity_is_the_share_of_zero_attention_weights(minilm_l6, kjv_blocks, name, value):
    """Through the model: the weights the capture sees are zero exactly where the pattern removes."""
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    n = ids.shape[1]
    cls = ids == 101
    keep = build(name, n, value, cls)
    valid = torch.ones(1, n, n, dtype=torch.bool)
    removed = removed_mask(keep, valid)
    with torch.no_grad(), Capture(weights=True, intervene=removal(lambda layer, v: removed[:, None])) as cap:
        minilm_l6.forward(ids)
    for layer in range(minilm_l6.num_layers):
        zero = cap.weights[layer] == 0
        assert torch.equal(zero, removed[:, None].expand_as(zero)), f"layer {layer}"
    assert sparsity(removed, valid) == pytest.approx(float((cap.weights[0] == 0).float().mean()))


def test_patterns_are_distinct_and_name_their_family():
    """No two patterns (at any of their values) keep the same positions; only the global family keeps [CLS]'s column whole."""
    cls = torch.zeros(1, N, dtype=torch.bool)
    cls[:, 0] = True
    seen = {}
    for name, pattern in PATTERNS.items():
        for value in pattern.values(N):
            keep = build(name, N, value, cls, torch.Generator().manual_seed(0))[0]
            key = keep.numpy().tobytes()
            assert key not in seen, f"{name}({value}) repeats {seen.get(key)}"
            seen[key] = f"{name}({value})"
            # a decoder's pattern keeps the first key's column whole (its first query sees that key alone)
            column_whole = bool(keep[:, 0].all()) and (bool(keep[0].all()) or pattern.causal_only)
            assert column_whole == (pattern.family == "global"), f"{name}({value})"
