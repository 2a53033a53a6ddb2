"""Advantage estimators.

GAE with correct handling of the two ways an episode ends:
* terminated: the next state's value is 0 (no bootstrap);
* truncated (time limit, worker restart): bootstrap from V(final_obs), the episode's true last state,
  not from the first obs of the next episode.
In both cases the recursion does not carry advantages across the episode boundary.
"""

from __future__ import annotations

import torch


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
