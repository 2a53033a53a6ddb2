"""On-policy collection: T vectorized steps of B envs with a policy, returned as ``Trajectories``.

One plain object used by the single-process trainer and, unchanged, inside each Ray rollout worker
(``robo_rl.distributed.rollout``); the algorithm turns the trajectories into advantages.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from robo_rl.batch import Trajectories
from robo_rl.boundary import obs_to_torch, to_env_actions
from robo_rl.contracts import Policy, VecEnv
from robo_rl.rollout.buffer import RolloutBuffer
from robo_rl.rollout.normalize import ReturnScaler
from robo_rl.rollout.stats import EpisodeStats

log = logging.getLogger(__name__)


class Collector:
    """Keeps the env's current observation between calls; ``stats`` sees every finished episode."""

    def __init__(self, env: VecEnv, policy: Policy, steps: int, reward_norm: bool = False, gamma: float = 0.99,
                 pipeline: bool = False) -> None:
        """steps: T vectorized steps per ``collect``; reward_norm: scale rewards by a running std of the
        ``gamma``-discounted return; pipeline: overlap two groups of env workers with the policy."""
        self._to_env = to_env_actions
        self.env, self.policy = env, policy
        self.steps = steps
        self.buffer = RolloutBuffer(steps, env.num_envs)
        self.stats = EpisodeStats(env.num_envs)
        self.reward_scaler = ReturnScaler(env.num_envs, gamma) if reward_norm else None
        self.report: dict[str, float] = {}  # what the last collect saw beyond episode statistics (none here)
        self.tobs: dict[str, Any] | None = None
        # pipelined collection needs >= 2 worker processes to split (a single-process env has nothing to overlap)
        self.pipeline = pipeline and getattr(env, "num_workers", 1) >= 2
        if pipeline and not self.pipeline:
            log.warning("run.pipeline needs >= 2 env worker processes and this env has %d; collecting serially "
                        "(GPU backend: set env.scene_workers >= 2)", getattr(env, "num_workers", 1))

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
    def collect(self) -> tuple[Trajectories, int]:
        """(T x B trajectories, env steps taken: chunk steps count)."""
        if self.tobs is None:
            raise RuntimeError("Collector.collect() before reset()")
        if self.pipeline:
            return self._collect_pipelined()
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
            steps += self._record(tobs, out, res, final_v)
            tobs = obs_to_torch(res.obs)
        self.tobs = tobs
        return self.buffer.finish(policy.value(tobs)), steps

    def _record(self, tobs: dict[str, Any], out: Any, res: Any, final_v: Any) -> int:
        """Store one vectorized step (all B rows); returns its env steps."""
        done = res.terminated | res.truncated
        reward = res.reward
        self.stats.update(reward, done, res.info["success"], res.info.get("chunk_steps"))
        if self.reward_scaler is not None:
            reward = self.reward_scaler(reward, done)
        self.buffer.add(tobs, out.extras, out.log_prob, out.value, reward, res.terminated, res.truncated, final_v, done,
                        res.info["success"])
        if done.any():
            self.policy.reset(np.flatnonzero(done))
        return int(res.info["chunk_steps"].sum()) if "chunk_steps" in res.info else self.env.num_envs

    def _collect_pipelined(self) -> tuple[Trajectories, int]:
        """Two groups of env workers step in turn while the policy acts for the other group (double
        buffering); every env sees the same sequence of (obs, action) as in the serial loop, so the
        batch has the serial loop's distribution. Policies act on row subsets: all our policies are
        stateless per env (chunks are executed by the VecEnv)."""
        from robo_rl.contracts import PolicyOutput, StepResult

        env, policy, n = self.env, self.policy, self.env.num_workers
        groups = [list(range(n // 2)), list(range(n // 2, n))]
        rows = [np.array([r for w in g for r in env.worker_rows[w]]) for g in groups]
        b = env.num_envs

        def sub(o: dict[str, Any], r: np.ndarray) -> dict[str, Any]:
            return {k: v[torch.as_tensor(r)] if isinstance(v, torch.Tensor) else [v[i] for i in r] for k, v in o.items()}

        def merge_t(parts: list[Any], like: Any) -> Any:
            full = torch.zeros((b, *like.shape[1:]), dtype=like.dtype)
            for g, x in enumerate(parts):
                full[torch.as_tensor(rows[g])] = x
            return full

        def merge_out(o: list[Any]) -> Any:
            return PolicyOutput(merge_t([x.actions for x in o], o[0].actions),
                                None if o[0].log_prob is None else merge_t([x.log_prob for x in o], o[0].log_prob),
                                None if o[0].value is None else merge_t([x.value for x in o], o[0].value),
                                {k: merge_t([x.extras[k] for x in o], o[0].extras[k]) for k in o[0].extras})

        def merge_np(parts: list[np.ndarray]) -> np.ndarray:
            full = np.zeros((b, *parts[0].shape[1:]), parts[0].dtype)
            for g, x in enumerate(parts):
                full[rows[g]] = x
            return full

        actions: np.ndarray | None = None

        def launch(g: int, out: Any) -> None:
            nonlocal actions
            a = self._to_env(out.actions, env.action_spec)
            if actions is None:
                actions = np.zeros((b, *a.shape[1:]), np.float32)
            actions[rows[g]] = a
            env.step_async(actions, groups[g])

        def final_values(res: Any) -> Any:
            done = res.terminated | res.truncated
            if "final_obs" in res.info and done.any():
                return policy.value(obs_to_torch(res.info["final_obs"]))
            return torch.zeros(len(done))

        policy.eval()
        tobs = self.tobs
        assert tobs is not None
        steps = 0
        out = [policy.act(sub(tobs, rows[0]))]
        launch(0, out[0])
        out.append(policy.act(sub(tobs, rows[1])))  # overlaps group 0 stepping
        for t in range(self.steps):
            res0 = env.step_wait()
            launch(1, out[1])
            next0 = obs_to_torch(res0.obs)
            fv0 = final_values(res0)
            nxt0 = policy.act(next0) if t < self.steps - 1 else None  # overlaps group 1 stepping
            res1 = env.step_wait()
            if nxt0 is not None:
                launch(0, nxt0)
            next1 = obs_to_torch(res1.obs)
            fv1 = final_values(res1)
            res = StepResult({}, merge_np([res0.reward, res1.reward]), merge_np([res0.terminated, res1.terminated]),
                             merge_np([res0.truncated, res1.truncated]),
                             {"success": merge_np([res0.info["success"], res1.info["success"]]),
                              **({"chunk_steps": merge_np([res0.info["chunk_steps"], res1.info["chunk_steps"]])}
                                 if "chunk_steps" in res0.info else {})})
            steps += self._record(tobs, merge_out(out), res, merge_t([fv0, fv1], fv0))
            tobs = {k: merge_t([next0[k], next1[k]], next0[k]) if isinstance(next0[k], torch.Tensor)
                    else [(next0[k] + next1[k])[j] for j in np.argsort(np.r_[rows[0], rows[1]])] for k in next0}
            if nxt0 is not None:
                out = [nxt0, policy.act(next1)]  # group 1's next actions overlap group 0 stepping
        self.tobs = tobs
        return self.buffer.finish(policy.value(tobs)), steps

