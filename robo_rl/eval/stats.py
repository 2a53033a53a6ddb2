"""Evaluation statistics (as in Agarwal et al., "Deep RL at the edge of the statistical precipice"),
computed with ``rliable``'s stratified bootstrap.

- ``success_ci``: one task's success rate over its episodes with a 95% percentile-bootstrap CI.
- ``aggregate``: mean and IQM (interquartile mean) over tasks, with stratified-bootstrap CIs; scores
  are (runs, tasks) success rates, bootstrapping runs within each task (one evaluation seed gives one
  run; several seeds or checkpoints give more).
- ``improvement``: probability that policy X beats Y on a random task (P(X > Y) with ties halved, the
  Mann-Whitney statistic averaged over tasks), with its CI.

All take a seed, so the same inputs give the same numbers. (rliable 1.2's ``StratifiedBootstrap``
draws its indices from numpy's global RNG and ignores the ``random_state`` it is given, so the
global state is seeded for the call and restored afterwards.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def _rliable() -> tuple[Any, Any]:
    from rliable import library, metrics

    return library, metrics


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed numpy's global RNG for rliable, restore it afterwards; hush arch's deprecation of the
    ``random_state`` argument rliable still passes."""
    import warnings

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        np.random.set_state(state)


def success_ci(outcomes: Any, reps: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(rate, low, high) of binary episode outcomes (N,) with a percentile bootstrap CI."""
    x = np.asarray(outcomes, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("success_ci needs at least one episode")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (reps, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(x.mean()), float(lo), float(hi)


def aggregate(scores: dict[str, Any], reps: int = 2000, seed: int = 0) -> dict[str, dict[str, float]]:
    """name -> {mean, mean_low, mean_high, iqm, iqm_low, iqm_high} for (runs, tasks) score arrays."""
    library, metrics = _rliable()
    data = {k: np.asarray(v, dtype=np.float64).reshape(np.shape(v)[0], -1) for k, v in scores.items()}

    def both(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_mean(x), metrics.aggregate_iqm(x)])

    with _seeded(seed):
        point, interval = library.get_interval_estimates(data, both, reps=reps, random_state=np.random.RandomState(seed))
    return {k: {"mean": float(point[k][0]), "mean_low": float(interval[k][0, 0]), "mean_high": float(interval[k][1, 0]),
                "iqm": float(point[k][1]), "iqm_low": float(interval[k][0, 1]), "iqm_high": float(interval[k][1, 1])}
            for k in data}


def improvement(x: Any, y: Any, reps: int = 2000, seed: int = 0) -> dict[str, float]:
    """P(X > Y) over tasks for (runs, tasks) scores of two policies, with a stratified-bootstrap CI."""
    library, metrics = _rliable()
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.shape[1:] != ys.shape[1:]:
        raise ValueError(f"the two policies were scored on different task sets: {xs.shape[1:]} vs {ys.shape[1:]}")
    with _seeded(seed):
        point, interval = library.get_interval_estimates(
            {"x,y": (xs, ys)}, lambda a, b: np.array([metrics.probability_of_improvement(a, b)]), reps=reps,
            random_state=np.random.RandomState(seed))
    return {"p_improvement": float(point["x,y"][0]), "low": float(interval["x,y"][0, 0]), "high": float(interval["x,y"][1, 0])}


def success_difference(succ_a: Any, n_a: Any, succ_b: Any, n_b: Any, reps: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float, float]:
    """Mean-over-tasks success of A minus B with a percentile bootstrap CI that resamples each task's
    episodes of each policy (binomial draws from the observed rates); inputs are per-task counts (T,).
    Meaningful with a single task, unlike the probability of improvement over tasks."""
    sa, na, sb, nb = (np.asarray(v, np.int64) for v in (succ_a, n_a, succ_b, n_b))
    rng = np.random.default_rng(seed)
    pa, pb = sa / np.maximum(na, 1), sb / np.maximum(nb, 1)
    da = rng.binomial(na, pa, size=(reps, len(na))) / np.maximum(na, 1)
    db = rng.binomial(nb, pb, size=(reps, len(nb))) / np.maximum(nb, 1)
    diffs = (da - db).mean(1)
    alpha = (1 - level) / 2
    return float((pa - pb).mean()), float(np.quantile(diffs, alpha)), float(np.quantile(diffs, 1 - alpha))


def paired_difference(a: Any, b: Any, reps: int = 10_000, seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """Success of A minus B over paired episodes (N,) each (episode i of both started from the same
    initial state, e.g. one seed and env count): the difference, a percentile bootstrap CI that resamples
    the pairs, and the exact two-sided McNemar p-value from the discordant pairs (A-only successes
    ``a_only``, B-only ``b_only``). Pairing removes the initial state's share of the variance, so the CI is
    narrower than the unpaired one when the two policies tend to succeed on the same starts."""
    from math import comb

    xa, xb = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (a, b))
    if xa.size != xb.size or xa.size == 0:
        raise ValueError(f"paired outcomes need equal, non-zero lengths; got {xa.size} and {xb.size}")
    d = xa - xb
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, (reps, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    a_only, b_only = int((d > 0).sum()), int((d < 0).sum())
    n, k = a_only + b_only, min(a_only, b_only)
    p = min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return {"difference": float(d.mean()), "low": float(lo), "high": float(hi), "a_only": a_only, "b_only": b_only,
            "mcnemar_p": float(p)}
