"""The gate and the verifier of `robo-rl steer fit`: the conformal failure gate (``--gate conformal``: held-out
episodes split into a calibration half, the band's offset, and a test half, where the realized false-alarm
rate, detection rate and lead time are reported; ``robo_rl.algorithms.conformal`` has the math) and the
chunk scorer that picks the best of N composed samples at test time; and the gate monitor of `steer eval
--mode off` (the fitted gate watched on the base's own episodes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robo_rl.algorithms.conformal import (
    ConformalBands,
    calibrate,
    check_alpha,
    gate_report,
    min_calibration_episodes,
    running_scores,
)
from robo_rl.errors import ConfigError


def fit_on_features(net: torch.nn.Module, idx: np.ndarray, batch_loss: Any, steps: int, lr: float,
                  rng: np.random.Generator, batch_size: int = 256) -> None:
    """Minibatch Adam on ``net``'s parameters over rows ``idx`` of cached features: ``batch_loss(rows)``
    is the loss of one minibatch of row indices."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        loss = batch_loss(torch.from_numpy(rng.choice(idx, size=min(batch_size, len(idx)), replace=False)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def split_heldout(episode: np.ndarray, failed: np.ndarray, heldout_rows: np.ndarray, alpha: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(calibration rows, test rows): the held-out episodes halved at random. One-line error, before any
    fitting, when the calibration half would hold too few successful episodes for ``alpha``."""
    alpha = check_alpha(alpha)
    eps = rng.permutation(np.unique(episode[heldout_rows]))
    calib_eps = set(eps[: (len(eps) + 1) // 2].tolist())
    in_calib = np.array([episode[r] in calib_eps for r in heldout_rows], bool)
    calib, test = heldout_rows[in_calib], heldout_rows[~in_calib]
    ok = {int(e) for e, f in zip(episode[calib], failed[calib]) if not f}
    need = min_calibration_episodes(alpha)
    if len(ok) < need:
        total = len(np.unique(episode))
        raise ConfigError(f"steer fit --gate conformal --alpha {alpha:g} needs >= {need} successful calibration "
                          f"episodes; the log's held-out half of {len(eps)} of its {total} episodes holds {len(ok)}: "
                          f"log about {int(np.ceil(total * need / max(len(ok), 1)))} episodes, raise --alpha or "
                          "--val-fraction")
    return calib, test


def fit_conformal(logits: torch.Tensor, episode: np.ndarray, failed: np.ndarray, train_rows: np.ndarray,
                  calib_rows: np.ndarray, test_rows: np.ndarray, alpha: float, steps_per_call: int,
                  bin_calls: int = 5) -> tuple[ConformalBands, dict[str, Any]]:
    """Bands from the failure predictor's ``logits`` (N,) of the logged calls: the shape from the training
    episodes that succeeded, the offset from the calibration ones; and the gate's report on the test rows."""
    s = running_scores(logits.detach().double().numpy(), episode)
    failed = np.asarray(failed, bool)

    def successes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = rows[~failed[rows]]
        return s[keep], episode[keep]

    bands = calibrate(successes(train_rows), successes(calib_rows), alpha, bin_calls=bin_calls)
    report = gate_report(bands, s[test_rows], episode[test_rows], failed[test_rows], steps_per_call)
    return bands, report


def fit_scorer(model: Any, data: dict[str, np.ndarray], pooled: torch.Tensor, train_rows: np.ndarray,
               val_rows: np.ndarray, steps: int, lr: float, rng: np.random.Generator) -> dict[str, float]:
    """Fit ``model.scorer`` (BCE on the episode's success) on the logged calls' pooled prefixes (N, F) and
    normalized executed chunks; returns its train / held-out AUROC."""
    from robo_rl.algorithms.rl2 import auroc

    base = model.base
    target, _ = model.normalized_chunks(torch.as_tensor(data["actions"], dtype=torch.float32))
    chunks = target[:, : base.exec_steps, : base.action_dim]
    success = torch.from_numpy(1.0 - data["failed"].astype(np.float32))
    bce = torch.nn.BCEWithLogitsLoss()
    fit_on_features(model.scorer, train_rows, lambda b: bce(model.scorer(pooled[b], chunks[b]), success[b]), steps, lr, rng)
    with torch.no_grad():
        scores = model.scorer(pooled, chunks)
    return {"scorer_auroc_train": auroc(scores[train_rows], success[train_rows]),
            "scorer_auroc_val": auroc(scores[val_rows], success[val_rows]) if len(val_rows) else float("nan")}


def gate_monitor(success: list[list[bool]], opened: list[list[bool]], excursion: list[list[float]]) -> dict[str, Any]:
    """The fitted gate watched on the base's own episodes (``--mode off``): the realized false-alarm rate
    (opened in an episode that succeeded), the detection rate (opened in one that failed) and, for the
    conformal gate, each episode's largest band excursion per env (a band of the same shape with lam L
    fires in exactly the episodes whose excursion exceeds L)."""
    pairs = [(bool(ok), bool(op)) for ok_env, op_env in zip(success, opened) for ok, op in zip(ok_env, op_env)]
    succ = [op for ok, op in pairs if ok]
    fail = [op for ok, op in pairs if not ok]
    return {"false_alarm_rate": (sum(succ) / len(succ)) if succ else None, "successful_episodes": len(succ),
            "detection_rate": (sum(fail) / len(fail)) if fail else None, "failed_episodes": len(fail),
            "episode_excursion": [[float(x) for x in env[: len(ok_env)]] for ok_env, env in zip(success, excursion)]
            if any(excursion) else None}
