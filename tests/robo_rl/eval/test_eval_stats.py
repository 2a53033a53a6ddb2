"""Evaluation statistics against known values: IQM of a fixed array, bootstrap CI coverage on a
synthetic binomial, probability of improvement on constructed cases, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rliable")

from robo_rl.eval.stats import aggregate, improvement, success_ci  # noqa: E402


def test_iqm_and_mean_of_a_fixed_array():
    scores = np.arange(40, dtype=float).reshape(10, 4) / 40.0  # 40 values 0 .. 0.975
    out = aggregate({"p": scores}, reps=200)["p"]
    # IQM: mean of the middle 50% (values 10 .. 29) / 40
    assert out["iqm"] == pytest.approx(np.arange(10, 30).mean() / 40.0)
    assert out["mean"] == pytest.approx(scores.mean())
    assert out["iqm_low"] <= out["iqm"] <= out["iqm_high"]
    assert aggregate({"p": scores}, reps=200) == aggregate({"p": scores}, reps=200)  # seeded: identical


def test_bootstrap_ci_covers_the_true_rate_about_95_percent():
    rng = np.random.default_rng(0)
    p, n, trials = 0.3, 100, 300
    hits = 0
    for i in range(trials):
        _, lo, hi = success_ci(rng.random(n) < p, reps=400, seed=i)
        hits += lo <= p <= hi
    assert 0.90 <= hits / trials <= 0.99


def test_probability_of_improvement():
    better = np.full((5, 3), 0.9)
    worse = np.full((5, 3), 0.1)
    assert improvement(better, worse, reps=100)["p_improvement"] == 1.0
    assert improvement(worse, better, reps=100)["p_improvement"] == 0.0
    assert improvement(better, better, reps=100)["p_improvement"] == 0.5
    with pytest.raises(ValueError, match="different task sets"):
        improvement(np.zeros((5, 3)), np.zeros((5, 4)))


def test_success_difference_bootstrap_over_episodes():
    from robo_rl.eval.stats import success_difference

    d, lo, hi = success_difference([100], [100], [0], [100])
    assert (d, lo, hi) == (1.0, 1.0, 1.0)
    d, lo, hi = success_difference([50], [100], [50], [100], seed=3)
    assert d == 0.0 and lo < -0.08 and hi > 0.08 and abs(lo + hi) < 0.03  # ~ +-1.96 * sqrt(2 * 0.25 / 100) = 0.139
    d, lo, hi = success_difference([89, 10], [100, 10], [84, 10], [100, 10], seed=0)
    assert abs(d - 0.025) < 1e-12 and lo < d < hi
