"""Running mean/std normalizers (observations inside policies; rewards by return scale)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Tracks mean/var of (N, *shape) samples with the parallel-variance update; a module so its
    statistics travel with the policy weights into checkpoints and onto robots."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.eps = clip, eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        self._combine(x.mean(0), x.var(0, unbiased=False), torch.tensor(float(x.shape[0]), dtype=torch.float64))

    @torch.no_grad()
    def merge(self, other: RunningMeanStd) -> None:
        """Fold another tracker's statistics in (as if its samples had been seen here too)."""
        self._combine(other.mean, other.var, other.count)

    def _combine(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """Chan et al.'s parallel update with a batch of ``count`` samples of ``mean`` / ``var``."""
        delta = mean - self.mean
        tot = self.count + count
        m2 = self.var * self.count + var * count + delta.pow(2) * self.count * count / tot
        self.mean += delta * count / tot
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.eps)
        return out.clamp(-self.clip, self.clip)


class ReturnScaler:
    """Scales rewards by the running std of the discounted return (as in SB3's VecNormalize)."""

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0) -> None:
        self.stats = RunningMeanStd(())
        self.ret = np.zeros(num_envs, np.float64)
        self.gamma, self.clip = gamma, clip

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.ret = self.ret * self.gamma + reward
        self.stats.update(torch.as_tensor(self.ret))
        self.ret[done] = 0.0
        scale = float(np.sqrt(self.stats.var.item() + 1e-8))
        return np.clip(reward / scale, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict:
        return {k: v.clone() for k, v in self.stats.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        """Its own ``state_dict()``, or a Ray run's ``{"workers": [...]}`` (merged into one)."""
        if "workers" not in state:
            self.stats.load_state_dict(state)
            return
        parts = [w for w in state["workers"] if w is not None]
        if not parts:
            return
        self.stats.load_state_dict(parts[0])
        for w in parts[1:]:
            other = RunningMeanStd(())
            other.load_state_dict(w)
            self.stats.merge(other)
