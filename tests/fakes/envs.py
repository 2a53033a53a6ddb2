"""Logic-only fake single env for vector-env unit tests (no simulator)."""

from __future__ import annotations

import os
import time

import numpy as np

from robo_rl.contracts import ArraySpec


class CountingEnv:
    """state = [episode step, seed]; episodes last ``horizon`` steps (truncated) unless the action's
    first entry is > 0.5 (terminated, success; > 1.5: and the auto-reset after it raises). Action[0] < -0.5
    raises in step; action[1] > 0.5 hangs; action[2] > 0.5 kills the process."""

    obs_spec = {"state": ArraySpec((2,), "float32")}
    action_spec = ArraySpec((3,), "float32", -1.0, 1.0)

    def __init__(self, horizon: int = 4) -> None:
        self.horizon, self.t, self.seed = horizon, 0, -1

    def _obs(self) -> dict:
        return {"state": np.array([self.t, self.seed], np.float32), "instruction": f"count to {self.horizon}"}

    def reset(self, seed: int | None = None) -> dict:
        if getattr(self, "_reset_raises", False):
            raise RuntimeError("reset failed")
        self.t = 0
        if seed is not None:
            self.seed = seed
        return self._obs()

    def step(self, action: np.ndarray):
        if action[1] > 0.5:
            time.sleep(60)
        if action[2] > 0.5:
            os._exit(1)
        if action[0] < -0.5:
            raise ValueError("simulator blew up")
        self.t += 1
        success = bool(action[0] > 0.5)
        self._reset_raises = bool(action[0] > 1.5)
        return self._obs(), float(self.t), success, self.t >= self.horizon and not success, {"success": success, "t": self.t}

    def render(self) -> np.ndarray:
        return np.full((4, 4, 3), self.t, np.uint8)

    def close(self) -> None:
        pass


class ProcessProbeEnv(CountingEnv):
    """A CountingEnv whose instruction reports the process it runs in: ``ROBO_RL_PROBE`` from its environment
    and its CPU mask, as "value|0,1"."""

    def _obs(self) -> dict:
        cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        return {**super()._obs(), "instruction": f"{os.environ.get('ROBO_RL_PROBE')}|{cpus}"}


class CountingBatch:
    """``num_envs`` CountingEnv rows in one batched "scene" (the BatchEnv protocol, no auto-reset): row j's
    state = [episode step, seed]; a row keeps counting after its episode ended until ``reset_rows``, as a GPU
    scene does. Picklable factory: ``CountingBatchFactory(n)``."""

    obs_spec = CountingEnv.obs_spec
    action_spec = CountingEnv.action_spec

    def __init__(self, num_envs: int, horizon: int = 4) -> None:
        self.num_envs, self.horizon = num_envs, horizon
        self.t = np.zeros(num_envs, np.int64)
        self.seed = np.full(num_envs, -1, np.int64)
        self.row_resets = np.zeros(num_envs, np.int64)

    def _obs(self) -> dict:
        return {"state": np.stack([self.t, self.seed], 1).astype(np.float32),
                "instruction": [f"row {j} at {t}" for j, t in enumerate(self.t)]}

    def reset(self, seeds: list) -> dict:
        self.t[:] = 0
        for j, sd in enumerate(seeds):
            if sd is not None:
                self.seed[j] = sd
        return self._obs()

    def reset_rows(self, rows: np.ndarray) -> dict:
        self.t[rows] = 0
        self.row_resets[rows] += 1
        return self._obs()

    def step(self, actions: np.ndarray):
        if (actions[:, 2] > 0.5).any():
            os._exit(1)
        self.t += 1
        success = actions[:, 0] > 0.5
        trunc = (self.t >= self.horizon) & ~success
        return self._obs(), self.t.astype(np.float32), success, trunc, {"success": success}

    def render(self) -> np.ndarray:
        return np.zeros((self.num_envs, 4, 4, 3), np.uint8)

    def close(self) -> None:
        pass


class CountingBatchFactory:
    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    def __call__(self) -> CountingBatch:
        return CountingBatch(self.num_envs)
