"""Episode statistics over the last K finished episodes."""

from __future__ import annotations

from collections import deque

import numpy as np


class EpisodeStats:
    """Accumulates per-env returns/lengths; records success at episode end."""

    def __init__(self, num_envs: int, window: int = 40) -> None:
        self.ret = np.zeros(num_envs, np.float64)
        self.len = np.zeros(num_envs, np.int64)
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.successes: deque[float] = deque(maxlen=window)
        self.episodes = 0

    def update(self, reward: np.ndarray, done: np.ndarray, success: np.ndarray, steps: np.ndarray | None = None) -> None:
        """reward, done, success: (B,) of one vectorized step (success read at episode end); steps: (B,)
        env steps each row executed (an action chunk's length; default 1), so lengths count env steps."""
        self.ret += reward
        self.len += 1 if steps is None else np.asarray(steps, np.int64)
        for i in np.flatnonzero(done):
            self.returns.append(float(self.ret[i]))
            self.lengths.append(int(self.len[i]))
            self.successes.append(float(success[i]))
            self.episodes += 1
        self.ret[done] = 0.0
        self.len[done] = 0

    def add(self, ret: float, length: int, success: float) -> None:
        """Record an episode finished elsewhere (a rollout worker's)."""
        self.returns.append(float(ret))
        self.lengths.append(int(length))
        self.successes.append(float(success))
        self.episodes += 1

    def summary(self) -> dict[str, float]:
        if not self.returns:
            return {}
        return {"success_rate": float(np.mean(self.successes)), "return": float(np.mean(self.returns)),
                "episode_length": float(np.mean(self.lengths)), "episodes": float(self.episodes)}
