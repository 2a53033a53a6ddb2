"""Running statistics: batched updates equal the whole-sample moments, merging two trackers equals one
tracker over both samples, and a Ray run's per-worker reward scalers load into one scaler."""

from __future__ import annotations

import numpy as np
import torch

from robo_rl.rollout.normalize import ReturnScaler, RunningMeanStd


def _tracker(x: np.ndarray, chunks: int) -> RunningMeanStd:
    r = RunningMeanStd((x.shape[1],))
    for part in np.array_split(x, chunks):
        r.update(torch.from_numpy(part))
    return r


def test_batched_updates_and_merge_match_the_whole_sample():
    rng = np.random.default_rng(0)
    a, b = rng.normal(3.0, 2.0, (500, 3)), rng.normal(-1.0, 0.5, (300, 3))
    one = _tracker(np.concatenate([a, b]), chunks=7)
    both = np.concatenate([a, b])
    np.testing.assert_allclose(one.mean.numpy(), both.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(one.var.numpy(), both.var(0), rtol=1e-4)
    merged = _tracker(a, chunks=3)
    merged.merge(_tracker(b, chunks=2))
    for k in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(merged, k), getattr(one, k), rtol=1e-6, atol=1e-6)


def test_return_scaler_loads_its_own_state_and_merged_worker_states():
    rng = np.random.default_rng(1)
    workers = []
    for w in range(2):
        s = ReturnScaler(num_envs=2, gamma=0.9)
        for _ in range(50):
            s(rng.normal(w * 5.0, 1.0 + w, 2), np.zeros(2, bool))
        workers.append(s)
    copy = ReturnScaler(2, 0.9)
    copy.load_state_dict(workers[0].state_dict())
    assert torch.equal(copy.stats.var, workers[0].stats.var)
    merged = ReturnScaler(2, 0.9)
    merged.load_state_dict({"workers": [w.state_dict() for w in workers]})
    expect = RunningMeanStd(())
    expect.load_state_dict(workers[0].state_dict())
    expect.merge(workers[1].stats)
    assert torch.equal(merged.stats.var, expect.var) and float(merged.stats.count) == float(expect.count)
    lo, hi = sorted(float(w.stats.var) for w in workers)
    assert lo < float(merged.stats.var)  # the merged spread covers both workers' returns
