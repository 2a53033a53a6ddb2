"""Logic-only fake single env for vector-env unit tests (no simulator)."""

from __future__ import annotations

import os
import time

import numpy as np

from robo_rl.contracts import ArraySpec


class CountingEnv:
    """state = [episode step, seed]; episodes last ``horizon`` steps (truncated) unless the action's
    first entry is > 0.5 (terminated, success). Action[1] > 0.5 hangs; action[2] > 0.5 kills the process."""

    obs_spec = {"state": ArraySpec((2,), "float32")}
    action_spec = ArraySpec((3,), "float32", -1.0, 1.0)

    def __init__(self, horizon: int = 4) -> None:
        self.horizon, self.t, self.seed = horizon, 0, -1

    def _obs(self) -> dict:
        return {"state": np.array([self.t, self.seed], np.float32), "instruction": f"count to {self.horizon}"}

    def reset(self, seed: int | None = None) -> dict:
        self.t = 0
        if seed is not None:
            self.seed = seed
        return self._obs()

    def step(self, action: np.ndarray):
        if action[1] > 0.5:
            time.sleep(60)
        if action[2] > 0.5:
            os._exit(1)
        self.t += 1
        success = bool(action[0] > 0.5)
        return self._obs(), float(self.t), success, self.t >= self.horizon and not success, {"success": success, "t": self.t}

    def render(self) -> np.ndarray:
        return np.full((4, 4, 3), self.t, np.uint8)

    def close(self) -> None:
        pass
