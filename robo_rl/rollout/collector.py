"""On-policy collection: T vectorized steps of B envs with a policy, finished into a ``RolloutBatch``.

One plain object used by the single-process trainer and, unchanged, inside each Ray rollout worker
(``robo_rl.distributed.rollout``): the worker's batch is finished (GAE) where it was collected, so
the learner only concatenates batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robo_rl.rollout.buffer import RolloutBatch, RolloutBuffer, obs_to_torch
from robo_rl.rollout.normalize import ReturnScaler
from robo_rl.rollout.stats import EpisodeStats


class Collector:
    """Keeps the env's current observation between calls; ``stats`` sees every finished episode."""

    def __init__(self, env: Any, policy: Any, steps: int, gamma: float, lam: float,
                 bootstrap_on_terminated: bool = False, reward_norm: bool = False) -> None:
        from robo_rl.runners.build import to_env_actions

        self._to_env = to_env_actions
        self.env, self.policy = env, policy
        self.steps, self.gamma, self.lam, self.bootstrap = steps, gamma, lam, bootstrap_on_terminated
        self.buffer = RolloutBuffer(steps, env.num_envs)
        self.stats = EpisodeStats(env.num_envs)
        self.reward_scaler = ReturnScaler(env.num_envs, gamma) if reward_norm else None
        self.tobs: dict[str, Any] | None = None

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def reset(self, seed: int) -> dict[str, Any]:
        """Reset every env (env i seeded ``seed + i``); returns the first observation (torch)."""
        obs, _ = self.env.reset(seed=seed)
        self.policy.reset()
        self.tobs = obs_to_torch(obs)
        return self.tobs

    def sync(self, policy: Any) -> None:
        """Nothing to send: the collector acts with the learner's own policy object."""

    @torch.no_grad()
    def collect(self) -> tuple[RolloutBatch, int]:
        """(batch of T*B transitions with advantages and returns, env steps taken: chunk steps count)."""
        if self.tobs is None:
            raise RuntimeError("Collector.collect() before reset()")
        env, policy = self.env, self.policy
        policy.eval()
        steps = 0
        tobs = self.tobs
        for _ in range(self.steps):
            out = policy.act(tobs)
            res = env.step(self._to_env(out.actions, env.action_spec))
            done = res.terminated | res.truncated
            final_v = None
            if "final_obs" in res.info and done.any():
                final_v = policy.value(obs_to_torch(res.info["final_obs"]))
            reward = res.reward
            self.stats.update(reward, done, res.info["success"])
            if self.reward_scaler is not None:
                reward = self.reward_scaler(reward, done)
            self.buffer.add(tobs, out.extras, out.log_prob, out.value, reward, res.terminated, res.truncated,
                            final_v, done)
            if done.any():
                policy.reset(np.flatnonzero(done))
            tobs = obs_to_torch(res.obs)
            steps += int(res.info["chunk_steps"].sum()) if "chunk_steps" in res.info else env.num_envs
        self.tobs = tobs
        return self.buffer.finish(policy.value(tobs), self.gamma, self.lam, self.bootstrap), steps


def concat_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """One batch from several workers' batches (all flat (N_k, ...))."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    return RolloutBatch({k: torch.cat([b.obs[k] for b in batches]) for k in first.obs},
                        {k: torch.cat([b.extras[k] for b in batches]) for k in first.extras},
                        torch.cat([b.log_prob for b in batches]), torch.cat([b.values for b in batches]),
                        torch.cat([b.advantages for b in batches]), torch.cat([b.returns for b in batches]))
