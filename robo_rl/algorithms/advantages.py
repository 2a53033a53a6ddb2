"""Advantage estimators: an algorithm turns collected ``Trajectories`` into the ``RolloutBatch`` it
trains on with one of these (registered in ``ADVANTAGES``; the algorithm's config names it).

GAE with correct handling of the two ways an episode ends:
* terminated: the next state's value is 0 (no bootstrap);
* truncated (time limit, worker restart): bootstrap from V(final_obs), the episode's true last state,
  not from the first obs of the next episode.
In both cases the recursion does not carry advantages across the episode boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from robo_rl.batch import RolloutBatch, Trajectories


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
        truncated: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a (T, B) rollout.

    Args:
        rewards: (T, B) reward received after the action at step t.
        values: (T, B) V(s_t).
        next_values: (T, B) V(s_{t+1}) of the *same* episode: V(final_obs) where the episode ended at t,
            else V(obs_{t+1}) (for t = T-1 the value of the obs after the rollout).
        terminated, truncated: (T, B) bool flags of the step at t.
        gamma: discount; lam: GAE lambda.
    Returns:
        (advantages, returns), both (T, B); returns = advantages + values.
    """
    term = terminated.to(values.dtype)
    done = (terminated | truncated).to(values.dtype)
    deltas = rewards + gamma * next_values * (1.0 - term) - values
    adv = torch.zeros_like(values)
    running = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * lam * (1.0 - done[t]) * running
        adv[t] = running
    return adv, adv + values


@runtime_checkable
class AdvantageEstimator(Protocol):
    """Turns (T, B) trajectories into the flat batch an update consumes (advantages and returns (N,))."""

    def __call__(self, traj: Trajectories) -> RolloutBatch: ...

    @classmethod
    def from_config(cls, cfg: Any) -> AdvantageEstimator:
        """The estimator an algorithm config (``cfg.gamma``, ``cfg.gae_lambda``, ...) asks for."""
        ...


@dataclass(frozen=True)
class GAE:
    """Generalized advantage estimation with a critic (``gae`` above).

    gamma: discount in (0, 1]; lam: GAE lambda in [0, 1]; bootstrap_on_terminated: a terminated step
    bootstraps from V(final_obs) like a truncated one (the recursion is still cut at the boundary).
    """

    gamma: float
    lam: float
    bootstrap_on_terminated: bool = False

    @classmethod
    def from_config(cls, cfg: Any) -> GAE:
        return cls(cfg.gamma, cfg.gae_lambda, cfg.bootstrap_on_terminated)

    def __call__(self, traj: Trajectories) -> RolloutBatch:
        term, trunc = traj.terminated, traj.truncated
        if self.bootstrap_on_terminated:
            term, trunc = torch.zeros_like(term), term | trunc
        adv, ret = gae(traj.rewards, traj.values, traj.next_values, term, trunc, self.gamma, self.lam)
        return traj.flatten(adv, ret)



@dataclass(frozen=True)
class GroupRelative:
    """Group-relative advantages (GRPO): each env ran one episode from its group's initial state; its
    advantage is (R - mean of its group's R) / (std of the group's R + eps), or without the division
    (``scale_std`` false: Dr. GRPO), broadcast to every valid step of the episode. R is the episode's
    success (1/0) or its return (``group_return``). Returns equal the advantages (there is no critic).
    """

    group_return: str = "success"
    scale_std: bool = True
    eps: float = 1e-6

    @classmethod
    def from_config(cls, cfg: Any) -> GroupRelative:
        return cls(cfg.group_return, cfg.scale_std)

    def episode_advantages(self, traj: Trajectories) -> torch.Tensor:
        """(B,) one advantage per env's episode."""
        if traj.group is None:
            raise ValueError("group-relative advantages need group rollouts (Trajectories.group); "
                             "collect them with robo_rl.rollout.groups.GroupCollector")
        ret, success = traj.episode_outcomes()
        r = success.float() if self.group_return == "success" else ret.float()
        adv = torch.zeros_like(r)
        for g in torch.unique(traj.group):
            rows = traj.group == g
            centred = r[rows] - r[rows].mean()
            adv[rows] = centred / (r[rows].std(unbiased=False) + self.eps) if self.scale_std else centred
        return adv

    def __call__(self, traj: Trajectories) -> RolloutBatch:
        adv = self.episode_advantages(traj).expand(traj.steps, -1)
        return traj.flatten(adv, adv)
