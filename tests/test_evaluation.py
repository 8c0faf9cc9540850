"""The interval over blocks every verdict of a change rests on: it covers at the few blocks a budget may leave."""

from __future__ import annotations

import numpy as np
import pytest

from attnlens.analysis.evaluation import bootstrap_interval, bootstrap_weights, expansion


@pytest.mark.parametrize(("blocks", "plain_at_most"), [(4, 0.84), (8, 0.91), (32, 0.95)])
def test_the_interval_covers_the_mean_at_few_blocks_where_the_plain_percentile_one_does_not(blocks, plain_at_most):
    """4,000 samples of normal data (mean 0): the expanded interval holds 0 about 95% of the time at every number of
    blocks; the plain percentile interval, recomputed here from the same resamples, falls short at few."""
    values = np.random.default_rng(1).standard_normal((4000, blocks))
    mean, low, high = bootstrap_interval(values, 1000, 0)
    covered = np.mean((low <= 0) & (0 <= high))
    assert 0.935 <= covered <= 0.965, covered
    means = values @ bootstrap_weights(blocks, 1000, 0)
    plain_low, plain_high = np.percentile(means, [2.5, 97.5], axis=-1)
    assert np.mean((plain_low <= 0) & (0 <= plain_high)) <= plain_at_most
    assert np.allclose(high - mean, expansion(blocks) * (plain_high - mean))  # each arm widened, the asymmetry kept
    assert np.allclose(mean - low, expansion(blocks) * (mean - plain_low))


def test_the_expansion_is_the_t_intervals_over_the_normal_ones():
    """sqrt(n / (n - 1)) · t(0.975, n - 1) / z(0.975), from the t table: 3.182 at 3 degrees of freedom, 2.040 at 31."""
    assert expansion(4) == pytest.approx(np.sqrt(4 / 3) * 3.1824 / 1.95996, rel=1e-4)
    assert expansion(32) == pytest.approx(np.sqrt(32 / 31) * 2.0395 / 1.95996, rel=1e-4)
    assert expansion(1) == 1.0 and expansion(10_000) == pytest.approx(1.0, abs=1e-3)
