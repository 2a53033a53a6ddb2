"""Gaussian MLP actor-critic for state observations.

Input: ``obs["state"]`` (B, D) float32. Output actions (B, A): a diagonal Gaussian sample (state-
independent log-std); the env adapter's bounds are applied by the runner when stepping (PPO sees the
unclipped sample, stored in ``extras["action"]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec, PolicyOutput
from robo_rl.errors import ConfigError
from robo_rl.rollout.normalize import RunningMeanStd

_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


@dataclass(frozen=True)
class MLPConfig:
    """Gaussian MLP actor-critic."""

    name: str = "mlp"
    """Registry name of the policy."""
    hidden: tuple[int, ...] = ranged((256, 256, 256), ge=1)
    """Hidden layer widths (shared by actor and critic, separate weights); at least one layer. Range: each
    >= 1."""
    activation: Literal["tanh", "relu", "elu", "gelu"] = "tanh"
    """Hidden activation."""
    init_log_std: float = ranged(-0.5, ge=-20, le=20)
    """Initial log standard deviation of the action Gaussian (its exp stays a normal float32). Range: in
    [-20, 20]."""
    normalize_obs: bool = True
    """Keep running mean/std of the state and normalize inputs (saved with the weights)."""

    def __post_init__(self) -> None:
        check_ranges(self, "policy")
        if not self.hidden:
            raise ConfigError(f"config key 'policy.hidden' = {list(self.hidden)} must be a non-empty list of positive ints")


def mlp(sizes: list[int], activation: type[nn.Module], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class GaussianActorCritic(nn.Module):
    """Shared Gaussian actor-critic logic over a feature trunk. Subclasses define ``_features(obs)``
    -> (B, F), ``actor`` (F -> A), ``critic`` (F -> 1) and ``log_std`` (A,)."""

    log_std: nn.Parameter
    actor: nn.Module
    critic: nn.Module

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def _dist(self, mean: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> PolicyOutput:
        x = self._features(obs)
        mean = self.actor(x)
        dist = self._dist(mean)
        action = mean if deterministic else dist.sample()
        return PolicyOutput(actions=action, log_prob=dist.log_prob(action).sum(-1), value=self.critic(x).squeeze(-1),
                            extras={"action": action})

    def evaluate(self, obs: dict[str, torch.Tensor], extras: dict[str, Any]) -> tuple:
        x = self._features(obs)
        dist = self._dist(self.actor(x))
        return dist.log_prob(extras["action"]).sum(-1), dist.entropy().sum(-1), self.critic(x).squeeze(-1)

    def action_distribution(self, obs: dict[str, torch.Tensor]) -> torch.distributions.Normal:
        """The Gaussian over actions (B, A) on ``obs`` (mean from the actor, std from ``log_std``)."""
        return self._dist(self.actor(self._features(obs)))

    def token_log_probs(self, obs: dict[str, torch.Tensor], extras: dict[str, Any]) -> torch.Tensor:
        """(B, A) per-dimension log-probs of stored actions (their sum is ``evaluate``'s log-prob)."""
        return self._dist(self.actor(self._features(obs))).log_prob(extras["action"])

    def token_distributions(self, obs: dict[str, torch.Tensor], extras: dict[str, Any]) -> torch.distributions.Normal:
        """The Gaussian of each action dimension (batch shape (B, A), as ``token_log_probs``)."""
        return self.action_distribution(obs)

    def token_space(self) -> dict[str, Any]:
        """What an action dimension means (a teacher scoring this policy's actions must agree)."""
        return {"kind": "gaussian", "action_dim": int(self.log_std.shape[0])}

    def value_parameters(self) -> list[nn.Parameter]:
        """Parameters of the critic (PPO may give them their own learning rate)."""
        return list(self.critic.parameters())

    def extras_for_actions(self, obs: dict[str, torch.Tensor], actions: Any) -> dict[str, torch.Tensor]:
        """What ``evaluate`` needs to score given actions (B, A) (behaviour cloning targets)."""
        return {"action": torch.as_tensor(actions, dtype=torch.float32)}

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.critic(self._features(obs)).squeeze(-1)

    def reset(self, env_ids: Any = None) -> None:
        """Stateless policy: nothing to clear."""


class MLPActorCritic(GaussianActorCritic):
    """``Policy`` for state observations; see module docstring for shapes."""

    Config = MLPConfig

    def __init__(self, cfg: MLPConfig, obs_spec: dict[str, ArraySpec], action_spec: ArraySpec) -> None:
        super().__init__()
        if "state" not in obs_spec:
            raise ConfigError(f"policy 'mlp' needs a 'state' observation; the env gives {sorted(obs_spec)}")
        self.cfg = cfg
        d = int(obs_spec["state"].shape[-1])
        a = int(action_spec.shape[-1])
        act = _ACT[cfg.activation]
        self.obs_norm = RunningMeanStd((d,)) if cfg.normalize_obs else None
        self.actor = mlp([d, *cfg.hidden, a], act, 0.01)
        self.critic = mlp([d, *cfg.hidden, 1], act, 1.0)
        self.log_std = nn.Parameter(torch.full((a,), cfg.init_log_std))

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.as_tensor(obs["state"], dtype=torch.float32)
        return self.obs_norm(x) if self.obs_norm is not None else x

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if self.obs_norm is not None:
            self.obs_norm.update(torch.as_tensor(obs["state"], dtype=torch.float32))
