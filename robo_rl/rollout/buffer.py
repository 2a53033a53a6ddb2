"""Fixed-size (T, B) rollout storage, finished into ``Trajectories``."""

from __future__ import annotations

import numpy as np
import torch

from robo_rl.batch import Trajectories


class RolloutBuffer:
    """Stores T steps of B envs; ``finish`` returns them as ``Trajectories`` (the algorithm's estimator
    computes advantages from those)."""

    def __init__(self, steps: int, num_envs: int) -> None:
        self.T, self.B = steps, num_envs
        self._clear()

    def _clear(self) -> None:
        """Fresh storage (the previous tensors were handed out with ``finish``)."""
        steps, num_envs = self.T, self.B
        self.t = 0
        self.obs: dict[str, torch.Tensor] = {}
        self.extras: dict[str, torch.Tensor] = {}
        self.log_prob = torch.zeros(steps, num_envs)
        self.values = torch.zeros(steps, num_envs)
        self.rewards = torch.zeros(steps, num_envs)
        self.terminated = torch.zeros(steps, num_envs, dtype=torch.bool)
        self.truncated = torch.zeros(steps, num_envs, dtype=torch.bool)
        self.success = torch.zeros(steps, num_envs, dtype=torch.bool)
        self._final_values: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _store(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor], t: int, shape: tuple[int, int]) -> None:
        for k, v in src.items():
            if not isinstance(v, torch.Tensor):
                continue
            if k not in dst:
                dst[k] = torch.zeros(shape + tuple(v.shape[1:]), dtype=v.dtype)
            dst[k][t] = v

    def add(self, obs: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], log_prob: torch.Tensor,
            value: torch.Tensor, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
            final_values: torch.Tensor | None = None, done_mask: np.ndarray | None = None,
            success: np.ndarray | None = None) -> None:
        """Add step t. ``final_values`` (B,) = V(final_obs), used where ``done_mask`` (B,) is set;
        ``success`` (B,) bool the env's success flag after the step."""
        t = self.t
        self._store(self.obs, obs, t, (self.T, self.B))
        self._store(self.extras, extras, t, (self.T, self.B))
        self.log_prob[t] = log_prob
        self.values[t] = value
        self.rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
        self.terminated[t] = torch.as_tensor(terminated)
        self.truncated[t] = torch.as_tensor(truncated)
        self.success[t] = torch.as_tensor(success) if success is not None else False
        if final_values is not None and done_mask is not None and done_mask.any():
            self._final_values[t] = (torch.as_tensor(done_mask), final_values)
        self.t += 1

    @property
    def full(self) -> bool:
        return self.t >= self.T

    def finish(self, last_value: torch.Tensor) -> Trajectories:
        """The T stored steps; ``last_value`` (B,) is V of the obs after the last stored step. The buffer
        is empty afterwards (its tensors now belong to the returned trajectories)."""
        nv = torch.cat([self.values[1:], last_value[None]], dim=0)
        for t, (mask, fv) in self._final_values.items():
            nv[t] = torch.where(mask, fv, nv[t])
        traj = Trajectories(self.obs, self.extras, self.log_prob, self.values, nv, self.rewards,
                            self.terminated, self.truncated, self.success)
        self._clear()
        return traj
