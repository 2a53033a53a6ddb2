"""Our VecEnv offered to other RL libraries, on real ManiSkill envs: the gymnasium vector env passes
gymnasium's space checks with same-step auto-reset, and stable-baselines3's PPO trains on the SB3 view
for a few iterations (its rollouts see our episode ends, with terminal observations)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.maniskill


def _env():
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    return ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", num_envs=2, backend="cpu", max_episode_steps=5))


def test_gymnasium_vector_env_same_step_autoreset(need_maniskill):
    from sims.external import GymVectorEnv

    venv = GymVectorEnv(_env())
    try:
        obs, _ = venv.reset(seed=3)
        assert obs.shape == (2, *venv.single_observation_space.shape) and venv.observation_space.contains(obs)
        assert venv.single_action_space.shape == (8,)
        for _ in range(5):
            obs, rew, term, trunc, info = venv.step(venv.action_space.sample())
            assert venv.observation_space.contains(obs) and rew.shape == (2,)
        assert trunc.all() and info["_final_obs"].all() and info["final_obs"].shape == obs.shape
        assert not np.array_equal(info["final_obs"], obs)  # the new episodes' first observations are returned
    finally:
        venv.close()


def test_stable_baselines3_ppo_trains_on_our_vec_env(need_maniskill):
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.callbacks import BaseCallback

    from sims.external import sb3_vec_env

    venv = sb3_vec_env(_env())
    ends: list[dict] = []

    class Ends(BaseCallback):
        def _on_step(self) -> bool:
            ends.extend(i for i, d in zip(self.locals["infos"], self.locals["dones"]) if d)
            return True

    try:
        model = sb3.PPO("MlpPolicy", venv, n_steps=16, batch_size=16, n_epochs=2, seed=0, device="cpu")
        model.learn(total_timesteps=64, callback=Ends())
        assert model.num_timesteps == 64 and model._n_updates == 4  # 2 rollouts x 2 epochs
        assert len(ends) == 2 * (64 // 2 // 5)  # 5-step episodes in each of the 2 envs
        assert all(e["TimeLimit.truncated"] and e["terminal_observation"].shape == venv.observation_space.shape
                   for e in ends)
    finally:
        venv.close()
