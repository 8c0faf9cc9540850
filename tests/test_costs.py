"""Attention FLOPs counted on the pairs each layer computes (attnlens.analysis.costs), against a brute force.

The brute force is an explicit loop over the rows of one text: each query row counts the keys its
layer lets it see (every key, the keys at or before it, those inside its window; a text of L < n
tokens has L rows over L keys), and is priced on the same terms as the papers' cost model: QKᵀ
2·keys·d, softmax 3·keys, the map 2·k·(keys − k) + (keys − k) for the keys a partial row rebuilds,
weights·V 2·keys·d; a window keeps the seen keys within w of the query.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnlens.analysis.plan.choices import EXACT, Choice, changes_pairs, flops, flops_on, options
from attnlens.analysis.reconstruct.cost import partial_ratio


def sees(structure: str, i: int, j: int, window: int) -> bool:
    """Whether query ``i`` of a layer of this ``structure`` sees key ``j``."""
    return {
        "bidirectional": True,
        "causal": j <= i,
        "sliding": 0 <= i - j < window,  # a causal sliding window of `window` keys, the query's own included
        "local": abs(i - j) <= window // 2,  # an encoder's local window (ModernBERT), `window` wide
    }[structure]


def brute(structure: str, choice: Choice, length: int, head_dim: int, window: int = 8) -> float:
    """One head's FLOPs on a text of ``length`` tokens, row by row."""
    causal = structure in ("causal", "sliding")
    total = 0.0
    for i in range(length):
        keys = [j for j in range(length) if sees(structure, i, j, window)]
        if choice.kind == "window":
            keys = [j for j in keys if (0 <= i - j <= choice.size if causal else abs(i - j) <= choice.size)]
        m = len(keys)
        if choice.kind == "partial" and m > choice.size:
            k = choice.size
            total += 2 * k * head_dim + 2 * k * (m - k) + (m - k) + 3 * m + 2 * m * head_dim
        else:
            total += 2 * m * head_dim + 3 * m + 2 * m * head_dim
    return total


def pairs_of(structure: str, n: int, window: int = 8) -> np.ndarray:
    return np.array([[sees(structure, i, j, window) for j in range(n)] for i in range(n)])


CHOICES = [EXACT, Choice("partial", 4), Choice("partial", 16), Choice("window", 2), Choice("window", 20)]


@pytest.mark.parametrize("structure", ["bidirectional", "causal", "sliding", "local"])
def test_every_choice_costs_what_a_row_by_row_count_gives(structure):
    n, head_dim = 40, 16
    pairs = pairs_of(structure, n)
    causal = structure in ("causal", "sliding")
    lengths = np.array([40, 40, 23, 9, 3])  # blocks that fill n, and texts shorter than n
    for choice in CHOICES:
        assert flops(choice, pairs, head_dim, causal=causal) == brute(structure, choice, n, head_dim)
        expected = sum(brute(structure, choice, int(length), head_dim) for length in lengths)
        assert flops_on(choice, pairs, lengths, head_dim, causal=causal) == pytest.approx(expected, rel=1e-12)


def test_the_issues_causal_fractions_at_n_128_and_head_size_256():
    """gemma3-270m's geometry: counted on the causal triangle, not on the n × n square."""
    n, d = 128, 256
    causal, every = pairs_of("causal", n), pairs_of("bidirectional", n)
    for choice, triangle, square in [
        (Choice("partial", 16), 0.643, 0.592),
        (Choice("partial", 32), 0.755, 0.674),
        (Choice("window", 64), 0.756, 0.754),
        (Choice("window", 126), 1.000, 1.000),
    ]:
        ratio = flops(choice, causal, d, causal=True) / flops(EXACT, causal, d, causal=True)
        assert ratio == pytest.approx(brute("causal", choice, n, d) / brute("causal", EXACT, n, d), rel=1e-12)
        assert round(ratio, 3) == triangle
        assert round(flops(choice, every, d, causal=False) / flops(EXACT, every, d, causal=False), 3) == square
    for k in (16, 32):  # the reconstruction's ratio is the same count
        assert partial_ratio(causal[None], d, k) == pytest.approx(
            brute("causal", Choice("partial", k), n, d) / brute("causal", EXACT, n, d)
        )


def test_a_causal_window_wider_than_the_text_is_exact_and_never_offered():
    n, d = 64, 32
    causal = pairs_of("causal", n)
    short = np.array([30, 41])
    assert flops_on(Choice("window", 48), causal, short, d, causal=True) == flops_on(EXACT, causal, short, d, causal=True)
    assert not changes_pairs(Choice("window", 48), causal, short, causal=True)
    assert changes_pairs(Choice("window", 8), causal, short, causal=True)
    offered = [str(choice) for choice in options(causal[None], d, ks=(8, 64), widths=(8, 63, 100), causal=True)]
    # k = n and windows of n − 1 keys or more keep every pair; a causal model's windows also come with its sinks
    assert offered == ["partial(8)", "window(8)", "window(8)+sink(4)"]
    # the sinks' pairs, counted by brute force: the first 4 keys of every query past the window keep 4 more pairs
    extra = sum(min(4, max(0, i - 8)) for i in range(n))
    assert flops(Choice("window", 8, 4), causal, d, causal=True) == pytest.approx(
        flops(Choice("window", 8), causal, d, causal=True) * (1 + extra / sum(min(i + 1, 9) for i in range(n)))
    )


def test_a_sliding_layer_prices_exact_attention_on_its_window():
    """A layer of 8-key windows at n = 64 computes 8 keys per row at most: exact attention there costs an eighth of
    the square's, a window of 8 keeps every pair (no saving), and the model's ratio weights each layer by its own."""
    n, d = 64, 32
    sliding, causal = pairs_of("sliding", n), pairs_of("causal", n)
    assert flops(EXACT, sliding, d, causal=True) == brute("sliding", EXACT, n, d) < flops(EXACT, causal, d, causal=True) / 3
    assert flops(Choice("window", 8), sliding, d, causal=True) == flops(EXACT, sliding, d, causal=True)
    layers = np.stack([sliding, causal])
    k = Choice("partial", 4)
    expected = (brute("sliding", k, n, d) + brute("causal", k, n, d)) / (
        brute("sliding", EXACT, n, d) + brute("causal", EXACT, n, d)
    )
    assert partial_ratio(layers, d, 4) == pytest.approx(expected, rel=1e-12)
