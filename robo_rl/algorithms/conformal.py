"""A failure gate with a false-alarm guarantee: time-indexed conformal bands on an episode-so-far score.

The detector's per-call logits l_t of one episode become its running score S_t = mean(l_0..l_t) (the
evidence of the episode so far, steadier than one call's). A gate that opens at the first call where
S_t > c(t) should open on few episodes that would have succeeded. With time bins b(t) = min(t // bin_calls,
bins - 1), the band is c(t) = center[b] + lam * scale[b]:

- center / scale: per-bin mean and std of S over successful episodes of a *shape* set;
- lam: split conformal over n held-out successful episodes (the *calibration* set): m_j = max_t
  (S_t - center[b]) / scale[b] per episode, lam = the ceil((n + 1)(1 - alpha))-th smallest m_j.

For a new episode that succeeds, exchangeable with the calibration ones, P(the gate ever opens) <= alpha
(and > alpha - 1 / (n + 1) without ties): the finite-sample split-conformal bound. It needs n >=
ceil((1 - alpha) / alpha) calibration successes (9 for alpha = 0.1). Shapes: logits, episode, t (N,).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from robo_rl.errors import ConfigError


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float in (0, 1); a one-line error otherwise."""
    if not (isinstance(alpha, (int, float)) and 0.0 < float(alpha) < 1.0):
        raise ConfigError(f"--alpha {alpha!r}: the false-alarm rate on successful episodes is in (0, 1), e.g. 0.1")
    return float(alpha)


def min_calibration_episodes(alpha: float) -> int:
    """Fewest successful calibration episodes for which the conformal quantile exists at ``alpha``."""
    return math.ceil((1.0 - alpha) / alpha - 1e-9)


def call_index(episode: np.ndarray) -> np.ndarray:
    """(N,) each row's call index t within its episode (rows of an episode in time order)."""
    episode = np.asarray(episode)
    t = np.zeros(len(episode), np.int64)
    seen: dict[int, int] = {}
    for i, e in enumerate(episode.tolist()):
        t[i] = seen.get(e, 0)
        seen[e] = t[i] + 1
    return t


def running_scores(logits: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """(N,) S_t = mean of the episode's logits up to and including row t."""
    logits = np.asarray(logits, np.float64)
    out = np.empty_like(logits)
    total: dict[int, tuple[float, int]] = {}
    for i, e in enumerate(np.asarray(episode).tolist()):
        s, n = total.get(e, (0.0, 0))
        s, n = s + float(logits[i]), n + 1
        total[e] = (s, n)
        out[i] = s / n
    return out


@dataclass(frozen=True)
class ConformalBands:
    """c(t) = center[b(t)] + lam * scale[b(t)] on the running score (see the module docstring)."""

    alpha: float
    bin_calls: int
    center: tuple[float, ...]
    scale: tuple[float, ...]
    lam: float
    calibration_episodes: int

    def excursion(self, scores: np.ndarray, t: np.ndarray) -> np.ndarray:
        """(N,) (S_t - center[b(t)]) / scale[b(t)]: the gate fires where this exceeds ``lam``, so an episode's
        largest excursion says whether a band of any other ``lam`` (same center and scale) would have fired."""
        b = np.minimum(np.asarray(t) // self.bin_calls, len(self.center) - 1)
        return (np.asarray(scores) - np.asarray(self.center)[b]) / np.asarray(self.scale)[b]

    def fires(self, scores: np.ndarray, t: np.ndarray) -> np.ndarray:
        """(N,) bool: the running score is above the band (its excursion above ``lam``)."""
        return self.excursion(scores, t) > self.lam

    def to_dict(self) -> dict[str, object]:
        return {"alpha": self.alpha, "bin_calls": self.bin_calls, "center": list(self.center),
                "scale": list(self.scale), "lam": self.lam, "calibration_episodes": self.calibration_episodes}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> ConformalBands:
        bands = cls(float(d["alpha"]), int(d["bin_calls"]), tuple(float(x) for x in d["center"]),  # type: ignore[arg-type]
                    tuple(float(x) for x in d["scale"]), float(d["lam"]), int(d["calibration_episodes"]))  # type: ignore[arg-type]
        if not bands.center or len(bands.center) != len(bands.scale) or bands.bin_calls < 1:
            raise ValueError("conformal bands need bin_calls >= 1 and as many centers as scales (at least one)")
        return bands


def _per_episode(values: np.ndarray, episode: np.ndarray) -> list[np.ndarray]:
    order = np.unique(np.asarray(episode))
    return [values[np.asarray(episode) == e] for e in order]


def calibrate(shape: tuple[np.ndarray, np.ndarray], calib: tuple[np.ndarray, np.ndarray], alpha: float,
              bin_calls: int = 5, bins: int = 8) -> ConformalBands:
    """Bands from successful episodes only: ``shape`` and ``calib`` are (running scores (N,), episode ids
    (N,)) of two disjoint sets of them. One-line error when ``calib`` has too few episodes for ``alpha``."""
    alpha = check_alpha(alpha)
    need = min_calibration_episodes(alpha)
    calib_eps = _per_episode(*calib)
    if len(calib_eps) < need:
        raise ConfigError(f"conformal gate at alpha {alpha:g} needs >= {need} successful calibration episodes; "
                          f"the held-out set has {len(calib_eps)}: log more episodes or raise --alpha")
    s_shape, e_shape = (np.asarray(x) for x in shape)
    t_shape = call_index(e_shape)
    b_shape = np.minimum(t_shape // bin_calls, bins - 1)
    used = int(b_shape.max()) + 1 if len(b_shape) else 1
    overall = float(s_shape.std()) if len(s_shape) > 1 else 1.0
    floor = max(1e-3, 0.05 * overall)
    center, scale = [], []
    for b in range(used):
        vals = s_shape[b_shape == b]
        center.append(float(vals.mean()) if len(vals) else (center[-1] if center else 0.0))
        scale.append(max(float(vals.std()) if len(vals) > 1 else overall, floor))
    shape_only = ConformalBands(alpha, bin_calls, tuple(center), tuple(scale), 0.0, len(calib_eps))
    maxima = [float(np.max(shape_only.excursion(scores, np.arange(len(scores))))) for scores in calib_eps]
    k = math.ceil((len(maxima) + 1) * (1.0 - alpha))
    return dataclasses.replace(shape_only, lam=sorted(maxima)[k - 1])


def gate_report(bands: ConformalBands, scores: np.ndarray, episode: np.ndarray, failed: np.ndarray,
                steps_per_call: int = 1) -> dict[str, float]:
    """On held-out episodes (rows (N,) in time order per episode): the realized false-alarm rate (gate
    opened on a successful episode), the detection rate (opened on a failure) and the median lead time
    of detected failures in control steps (calls from the first alarm to the episode's end x
    ``steps_per_call``)."""
    scores, episode, failed = np.asarray(scores), np.asarray(episode), np.asarray(failed, bool)
    t = call_index(episode)
    fired = bands.fires(scores, t)
    false_alarms, succ, detected, fails, leads = 0, 0, 0, 0, []
    for e in np.unique(episode):
        rows = episode == e
        f = fired[rows]
        if bool(failed[rows][0]):
            fails += 1
            if f.any():
                detected += 1
                leads.append((len(f) - int(np.argmax(f))) * steps_per_call)
        else:
            succ += 1
            false_alarms += int(f.any())
    return {"false_alarm_rate": false_alarms / succ if succ else float("nan"), "successful_episodes": succ,
            "detection_rate": detected / fails if fails else float("nan"), "failed_episodes": fails,
            "median_lead_steps": float(np.median(leads)) if leads else float("nan")}
