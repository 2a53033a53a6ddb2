"""Fixed-size (T, B) rollout storage and the flat batch algorithms consume."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from robo_rl.algorithms.advantages import gae


@dataclass
class RolloutBatch:
    """A flat batch of N = T*B transitions (all tensors lead with N).

    obs: dict of (N, ...) tensors; extras: what ``Policy.evaluate`` needs, (N, ...);
    log_prob, values, advantages, returns: (N,).
    """

    obs: dict[str, torch.Tensor]
    extras: dict[str, torch.Tensor]
    log_prob: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.log_prob.shape[0])

    def index(self, idx: torch.Tensor) -> RolloutBatch:
        return RolloutBatch({k: v[idx] for k, v in self.obs.items()}, {k: v[idx] for k, v in self.extras.items()},
                            self.log_prob[idx], self.values[idx], self.advantages[idx], self.returns[idx])

    def shards(self, n: int) -> list[RolloutBatch]:
        """``n`` contiguous shards of equal size N // n (data-parallel learners must all take the same
        number of minibatch steps; the last N % n < n transitions are left out)."""
        m = self.size // n
        if m < 1:
            raise ValueError(f"a batch of {self.size} transitions cannot be split over {n} learners")
        return [self.index(torch.arange(r * m, (r + 1) * m)) for r in range(n)]

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch({k: v.to(device) for k, v in self.obs.items()}, {k: v.to(device) for k, v in self.extras.items()},
                            self.log_prob.to(device), self.values.to(device), self.advantages.to(device),
                            self.returns.to(device))


class RolloutBuffer:
    """Stores T steps of B envs; ``finish`` computes GAE and returns a flat ``RolloutBatch``."""

    def __init__(self, steps: int, num_envs: int) -> None:
        self.T, self.B = steps, num_envs
        self.t = 0
        self.obs: dict[str, torch.Tensor] = {}
        self.extras: dict[str, torch.Tensor] = {}
        self.log_prob = torch.zeros(steps, num_envs)
        self.values = torch.zeros(steps, num_envs)
        self.next_values = torch.zeros(steps, num_envs)
        self.rewards = torch.zeros(steps, num_envs)
        self.terminated = torch.zeros(steps, num_envs, dtype=torch.bool)
        self.truncated = torch.zeros(steps, num_envs, dtype=torch.bool)
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
            final_values: torch.Tensor | None = None, done_mask: np.ndarray | None = None) -> None:
        """Add step t. ``final_values`` (B,) = V(final_obs), used where ``done_mask`` (B,) is set."""
        t = self.t
        self._store(self.obs, obs, t, (self.T, self.B))
        self._store(self.extras, extras, t, (self.T, self.B))
        self.log_prob[t] = log_prob
        self.values[t] = value
        self.rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
        self.terminated[t] = torch.as_tensor(terminated)
        self.truncated[t] = torch.as_tensor(truncated)
        if final_values is not None and done_mask is not None and done_mask.any():
            self._final_values[t] = (torch.as_tensor(done_mask), final_values)
        self.t += 1

    @property
    def full(self) -> bool:
        return self.t >= self.T

    def finish(self, last_value: torch.Tensor, gamma: float, lam: float,
               bootstrap_on_terminated: bool = False) -> RolloutBatch:
        """last_value: (B,) V of the obs after the last stored step. With ``bootstrap_on_terminated``
        a terminated step bootstraps from V(final_obs) like a truncated one (the recursion is still cut)."""
        nv = torch.cat([self.values[1:], last_value[None]], dim=0)
        for t, (mask, fv) in self._final_values.items():
            nv[t] = torch.where(mask, fv, nv[t])
        self.next_values = nv
        term, trunc = self.terminated, self.truncated
        if bootstrap_on_terminated:
            term, trunc = torch.zeros_like(term), term | trunc
        adv, ret = gae(self.rewards, self.values, nv, term, trunc, gamma, lam)
        n = self.T * self.B
        batch = RolloutBatch({k: v.reshape((n,) + v.shape[2:]) for k, v in self.obs.items()},
                             {k: v.reshape((n,) + v.shape[2:]) for k, v in self.extras.items()},
                             self.log_prob.reshape(n), self.values.reshape(n), adv.reshape(n), ret.reshape(n))
        self.t = 0
        self._final_values = {}
        return batch
