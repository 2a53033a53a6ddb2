"""The conformal failure gate on synthetic scores: the false-alarm rate it promises holds over many draws
(and is not wasted: it stays within 1 / (n + 1) below alpha), the bands follow the score's drift in time,
and bad alphas or too few calibration episodes are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from robo_rl.algorithms.conformal import (
    ConformalBands,
    calibrate,
    call_index,
    gate_report,
    min_calibration_episodes,
    running_scores,
)
from robo_rl.errors import ConfigError


def _episodes(rng, n, failing=False, length=(20, 40)):
    """Per-call logits of n episodes: noise around a mean that drifts up with time (more for failures)."""
    logits, ep = [], []
    for j in range(n):
        t = np.arange(rng.integers(*length))
        drift = (0.2 if failing else 0.02) * t
        logits.append(drift + rng.normal(0.0, 1.0, len(t)) + rng.normal(0.0, 0.5))  # + a per-episode offset
        ep.append(np.full(len(t), j))
    return np.concatenate(logits), np.concatenate(ep)


def test_running_scores_and_call_indices():
    ep = np.array([0, 0, 1, 0, 1])
    np.testing.assert_array_equal(call_index(ep), [0, 1, 0, 2, 1])
    np.testing.assert_allclose(running_scores(np.array([1.0, 3.0, -2.0, 5.0, 0.0]), ep), [1.0, 2.0, -2.0, 3.0, -1.0])


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_the_false_alarm_rate_on_new_successes_is_at_most_alpha_over_many_draws(alpha):
    rng = np.random.default_rng(int(alpha * 1000))
    n_cal, rates = 40, []
    for _ in range(150):
        shape = _episodes(rng, 30)
        calib = _episodes(rng, n_cal)
        bands = calibrate((running_scores(*shape), shape[1]), (running_scores(*calib), calib[1]), alpha)
        test = _episodes(rng, 200)
        rep = gate_report(bands, running_scores(*test), test[1], np.zeros(len(test[1]), bool))
        rates.append(rep["false_alarm_rate"])
    mean = float(np.mean(rates))
    # E[rate] is in [alpha - 1/(n+1), alpha]; the mean of 150 draws of 200 episodes is within ~0.01 of it
    assert alpha - 1.0 / (n_cal + 1) - 0.015 <= mean <= alpha + 0.015, (alpha, mean)


def test_failures_are_detected_with_a_lead_and_the_bands_follow_time():
    rng = np.random.default_rng(0)
    shape, calib = _episodes(rng, 60), _episodes(rng, 60)
    bands = calibrate((running_scores(*shape), shape[1]), (running_scores(*calib), calib[1]), 0.1, bin_calls=5)
    assert bands.center[-1] > bands.center[0]  # the successful episodes' score drifts up: so does the band
    ok, bad = _episodes(rng, 100), _episodes(rng, 100, failing=True)
    logits = np.concatenate([ok[0], bad[0]])
    ep = np.concatenate([ok[1], bad[1] + 1000])
    failed = np.concatenate([np.zeros(len(ok[1]), bool), np.ones(len(bad[1]), bool)])
    rep = gate_report(bands, running_scores(logits, ep), ep, failed, steps_per_call=4)
    assert rep["false_alarm_rate"] <= 0.2 and rep["detection_rate"] > 0.5
    assert rep["median_lead_steps"] > 0 and rep["median_lead_steps"] % 4 == 0


def test_gate_report_counts_by_hand():
    bands = ConformalBands(0.1, 2, (0.0, 1.0), (1.0, 1.0), 0.5, 9)  # thresholds 0.5, 0.5, 1.5, 1.5, ...
    scores = np.array([0.0, 0.6, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0])
    ep = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    failed = np.array([0, 0, 0, 0, 1, 1, 1, 1], bool)
    rep = gate_report(bands, scores, ep, failed, steps_per_call=10)
    # episode 0 fires at t = 1 (a false alarm), episode 1 never; failure 2 fires at t = 0 (4 calls before its end)
    assert rep["false_alarm_rate"] == 0.5 and rep["detection_rate"] == 1.0 and rep["median_lead_steps"] == 40.0
    assert ConformalBands.from_dict(bands.to_dict()) == bands


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan"), "0.1"])
def test_alpha_outside_the_open_unit_interval_is_refused(alpha):
    s = (np.zeros(20), np.repeat(np.arange(20), 1))
    with pytest.raises(ConfigError, match=r"--alpha .* is in \(0, 1\)"):
        calibrate(s, s, alpha)


def test_too_few_calibration_episodes_names_how_many_are_needed():
    assert [min_calibration_episodes(a) for a in (0.05, 0.1, 0.2, 0.5)] == [19, 9, 4, 1]
    rng = np.random.default_rng(1)
    shape, calib = _episodes(rng, 20), _episodes(rng, 8)
    with pytest.raises(ConfigError, match=r"alpha 0\.1 needs >= 9 successful calibration episodes; the held-out set "
                                          r"has 8: log more episodes or raise --alpha") as err:
        calibrate((running_scores(*shape), shape[1]), (running_scores(*calib), calib[1]), 0.1)
    assert "\n" not in str(err.value)
