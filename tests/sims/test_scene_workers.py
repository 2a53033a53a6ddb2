"""Batched-scene env workers (the path ManiSkill's GPU backend takes: one ``physx_cuda`` scene of n
envs per worker process), run here on ``physx_cpu`` scenes of one env. They must give the single-env
workers' data through the first episodes (same seeds, same actions), end chunks per row, replace a
killed worker, and pipeline like any SubprocVecEnv."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from robo_rl.errors import ConfigError

pytestmark = pytest.mark.maniskill


def _env(**kw):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    return ManiSkillVecEnv(ManiSkillConfig(**{"task": "PushCube-v1", "num_envs": 2, "backend": "cpu",
                                              "max_episode_steps": 5, **kw}))


def test_scene_workers_match_single_env_workers_and_end_chunks_per_row(need_maniskill):
    scenes, singles = _env(scene_workers=2), _env()
    try:
        assert scenes._impl.batched and scenes.num_workers == 2 and not singles._impl.batched
        assert scenes.obs_spec == singles.obs_spec and scenes.action_spec == singles.action_spec
        oa, _ = scenes.reset(seed=3)
        ob, _ = singles.reset(seed=3)
        np.testing.assert_array_equal(oa["state"], ob["state"])
        assert oa["instruction"] == ob["instruction"]
        rng = np.random.default_rng(0)
        for _ in range(5):
            act = rng.uniform(-1, 1, (2, *scenes.action_spec.shape)).astype(np.float32)
            ra, rb = scenes.step(act), singles.step(act)
            np.testing.assert_allclose(ra.reward, rb.reward, rtol=1e-6)
            np.testing.assert_array_equal(ra.truncated, rb.truncated)
            np.testing.assert_array_equal(ra.info["success"], rb.info["success"])
        assert ra.truncated.all() and "final_obs" in ra.info  # the 5-step limit, auto-reset by row
        np.testing.assert_allclose(ra.info["final_obs"]["state"], rb.info["final_obs"]["state"], rtol=1e-6)
        assert not np.allclose(ra.obs["state"], ra.info["final_obs"]["state"])  # a new episode began
        chunk = rng.uniform(-1, 1, (2, 7, *scenes.action_spec.shape)).astype(np.float32)
        res = scenes.step(chunk)  # 7 actions, but the episode ends after 5: the rest is dropped
        assert res.info["chunk_steps"].tolist() == [5, 5] and res.truncated.all() and "final_obs" in res.info
        short = scenes.step(chunk[:, :2])
        assert short.info["chunk_steps"].tolist() == [2, 2] and not short.truncated.any()
    finally:
        scenes.close()
        singles.close()


def test_killed_scene_worker_is_replaced(need_maniskill):
    env = _env(scene_workers=2)
    try:
        env.reset(seed=0)
        victim = env.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        res = env.step(np.zeros((2, *env.action_spec.shape), np.float32))
        assert res.info["worker_restarted"].tolist() == [False, True] and res.truncated.tolist() == [False, True]
        assert env.restarts == 1 and env.worker_pids[1] != victim
        assert env.step(np.zeros((2, *env.action_spec.shape), np.float32)).obs["state"].shape == (2, 35)
    finally:
        env.close()


def test_later_episodes_differ_by_row_and_reproduce_from_the_seed(need_maniskill):
    """After the first episodes, partial resets draw new initial states: distinct per row and per episode,
    and the same in a second run from the same seed."""

    def starts():
        env = _env(num_envs=2, scene_workers=2, max_episode_steps=2)
        try:
            env.reset(seed=5)
            out = []
            for _ in range(6):  # three episodes of two steps each
                res = env.step(np.zeros((2, *env.action_spec.shape), np.float32))
                if "final_obs" in res.info:
                    out.append(res.obs["state"].copy())
            return np.stack(out)
        finally:
            env.close()

    a, b = starts(), starts()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[0], a[1]) and not np.allclose(a[:, 0], a[:, 1])


def test_scene_worker_config_errors_name_the_key(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig

    with pytest.raises(ConfigError, match="env.scene_workers"):
        _env(scene_workers=1)  # physx_cpu: one env per scene
    with pytest.raises(ConfigError, match="env.scene_workers"):
        ManiSkillConfig(num_envs=2, scene_workers=3)
    env = _env(scene_workers=1, backend="auto")  # a GPU config on a CPU machine: single-env workers
    try:
        assert not env._impl.batched and env.num_workers == 2
    finally:
        env.close()


def test_num_env_overrides_keep_a_valid_scene_count():
    from robo_rl.build import with_num_envs
    from sims.maniskill.env import ManiSkillConfig

    cpu = ManiSkillConfig(num_envs=4, scene_workers=4, backend="cpu")
    assert with_num_envs(cpu, 2).scene_workers == 2 and with_num_envs(cpu, 8).scene_workers == 8
    gpu = ManiSkillConfig(num_envs=64, scene_workers=2, backend="gpu")
    assert with_num_envs(gpu, 1).scene_workers == 1 and with_num_envs(gpu, 16).scene_workers == 2
    assert with_num_envs(gpu, 16).num_envs == 16
    assert with_num_envs(ManiSkillConfig(num_envs=4), 2).scene_workers is None
