"""Small CNN actor-critic for rgb (+ state) observations.

Input: ``obs["rgb"]`` (B, V, H, W, 3) uint8, V cameras stacked on channels; optional ``obs["state"]``
(B, D). A NatureCNN-style encoder (3 conv layers) -> 256-d feature, concatenated with the
normalized state, feeds Gaussian actor and critic MLP heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from policies.mlp import _ACT, GaussianActorCritic, mlp
from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError
from robo_rl.rollout.normalize import RunningMeanStd


@dataclass(frozen=True)
class CNNConfig:
    """CNN encoder + MLP heads."""

    name: str = "cnn"
    """Registry name of the policy."""
    feature_dim: int = ranged(256, ge=1)
    """Width of the image feature. Range: >= 1."""
    hidden: tuple[int, ...] = ranged((256, 256), ge=1)
    """Head MLP widths. Range: each >= 1."""
    activation: Literal["tanh", "relu", "elu", "gelu"] = "relu"
    """Head activation."""
    use_state: bool = True
    """Concatenate the proprioceptive state to the image feature."""
    init_log_std: float = ranged(-0.5, ge=-20, le=20)
    """Initial log standard deviation of the action Gaussian (its exp stays a normal float32). Range: in
    [-20, 20]."""

    def __post_init__(self) -> None:
        check_ranges(self, "policy")


class CNNEncoder(nn.Module):
    """(B, V, H, W, 3) uint8 -> (B, feature_dim) float."""

    def __init__(self, views: int, size: tuple[int, int], feature_dim: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(3 * views, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, 3 * views, *size)).shape[-1]
        self.proj = nn.Sequential(nn.Linear(n, feature_dim), nn.ReLU())

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        b, v, h, w, c = rgb.shape
        x = rgb.permute(0, 1, 4, 2, 3).reshape(b, v * c, h, w).float() / 255.0
        return self.proj(self.conv(x))


class CNNActorCritic(GaussianActorCritic):
    """``Policy`` for rgb observations; shapes in the module docstring."""

    Config = CNNConfig

    def __init__(self, cfg: CNNConfig, obs_spec: dict[str, ArraySpec], action_spec: ArraySpec) -> None:
        super().__init__()
        if "rgb" not in obs_spec:
            raise ConfigError(f"policy 'cnn' needs an 'rgb' observation (env.obs_mode=rgb); the env gives {sorted(obs_spec)}")
        self.cfg = cfg
        v, h, w, _ = obs_spec["rgb"].shape
        if min(h, w) < 36:  # the three NatureCNN convolutions (8/4, 4/2, 3/1) need 36 px to leave one pixel
            raise ConfigError(f"policy 'cnn' needs images of at least 36x36 px; the env gives {h}x{w}: set env.image_size >= 36")
        a = int(action_spec.shape[-1])
        self.encoder = CNNEncoder(v, (h, w), cfg.feature_dim)
        d = int(obs_spec["state"].shape[-1]) if cfg.use_state and "state" in obs_spec else 0
        self.state_norm = RunningMeanStd((d,)) if d else None
        act = _ACT[cfg.activation]
        self.actor = mlp([cfg.feature_dim + d, *cfg.hidden, a], act, 0.01)
        self.critic = mlp([cfg.feature_dim + d, *cfg.hidden, 1], act, 1.0)
        self.log_std = nn.Parameter(torch.full((a,), cfg.init_log_std))

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        feat = self.encoder(torch.as_tensor(obs["rgb"]))
        if self.state_norm is not None:
            feat = torch.cat([feat, self.state_norm(torch.as_tensor(obs["state"], dtype=torch.float32))], -1)
        return feat

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if self.state_norm is not None:
            self.state_norm.update(torch.as_tensor(obs["state"], dtype=torch.float32))
