"""The subprocess VecEnv on real ManiSkill envs: batching, auto-reset with final_obs, seeding,
and replacement of a SIGKILLed worker."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

pytestmark = pytest.mark.maniskill


def _env(**kw):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    cfg = ManiSkillConfig(**{"task": "PushCube-v1", "num_envs": 2, "backend": "cpu", "max_episode_steps": 5, **kw})
    return ManiSkillVecEnv(cfg)


def test_batched_shapes_autoreset_and_final_obs(need_maniskill):
    env = _env()
    try:
        assert env.num_envs == 2 and env.action_spec.shape == (8,)
        obs, _ = env.reset(seed=7)
        assert obs["state"].shape == (2, *env.obs_spec["state"].shape) and obs["state"].dtype == np.float32
        zeros = np.zeros((2, 8), np.float32)
        for t in range(5):
            res = env.step(zeros)
            assert res.reward.shape == (2,) and res.info["success"].shape == (2,)
            assert not res.terminated.any()
            if t < 4:
                assert not res.truncated.any() and "final_obs" not in res.info
        assert res.truncated.all()  # time limit -> truncated, never terminated
        final = res.info["final_obs"]["state"]
        assert final.shape == obs["state"].shape
        # auto-reset: the returned obs starts a new episode, different from the final one
        assert not np.array_equal(final, res.obs["state"])
    finally:
        env.close()


def test_per_env_seeds_are_deterministic_and_distinct(need_maniskill):
    a, b = _env(), _env()
    try:
        oa, _ = a.reset(seed=3)
        ob, _ = b.reset(seed=3)
        np.testing.assert_array_equal(oa["state"], ob["state"])
        assert not np.array_equal(oa["state"][0], oa["state"][1])  # env i gets seed + i
    finally:
        a.close()
        b.close()


def test_later_episodes_continue_each_envs_seed_sequence(need_maniskill):
    """Env i of B runs seeds seed + i, seed + i + B, ...: episode 2 of env 0 starts exactly as a
    fresh env reset with seed + 2 (so evaluations do not depend on which worker runs an episode)."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv

    env = _env()
    try:
        env.reset(seed=3)
        for _ in range(5):
            res = env.step(np.zeros((2, 8), np.float32))
        assert res.truncated.all()
        single = ManiSkillSingleEnv(ManiSkillConfig(task="PushCube-v1", num_envs=1, max_episode_steps=5))
        try:
            for i in range(2):
                np.testing.assert_array_equal(res.obs["state"][i], single.reset(seed=3 + 2 + i)["state"])
        finally:
            single.close()
    finally:
        env.close()


def test_killed_worker_is_replaced_and_episode_truncated(need_maniskill):
    env = _env(max_episode_steps=50)
    try:
        env.reset(seed=0)
        act = np.zeros((2, 8), np.float32)
        env.step(act)
        victim = env.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        res = env.step(act)
        assert res.truncated[1] and not res.terminated[1]
        assert res.info["worker_restarted"].tolist() == [False, True]
        assert "final_obs" in res.info
        assert env.restarts == 1 and env.worker_pids[1] != victim
        # the replacement starts env 1's next seeded episode (seed 0 + 1 + B), as an uninterrupted env would
        from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv

        single = ManiSkillSingleEnv(ManiSkillConfig(task="PushCube-v1", num_envs=1, max_episode_steps=50))
        try:
            np.testing.assert_array_equal(res.obs["state"][1], single.reset(seed=0 + 1 + 2)["state"])
        finally:
            single.close()
        for _ in range(3):  # the run goes on
            res = env.step(act)
            assert not res.info["worker_restarted"].any()
    finally:
        env.close()


def test_rgb_observations_feed_the_cnn_policy(need_maniskill):
    import torch

    from policies.cnn import CNNActorCritic, CNNConfig
    from robo_rl.boundary import obs_to_torch

    env = _env(obs_mode="rgb", image_size=64, num_envs=1)
    try:
        obs, _ = env.reset(seed=0)
        rgb = obs["rgb"]
        assert rgb.dtype == np.uint8 and rgb.shape[0] == 1 and rgb.shape[2:] == (64, 64, 3)
        assert rgb.shape[1:] == env.obs_spec["rgb"].shape and rgb.std() > 0  # a real rendered image
        assert obs["state"].shape == (1, *env.obs_spec["state"].shape)
        pol = CNNActorCritic(CNNConfig(), env.obs_spec, env.action_spec)
        out = pol.act(obs_to_torch(obs))
        assert out.actions.shape == (1, 8)
        lp, ent, v = pol.evaluate(obs_to_torch(obs), out.extras)
        assert torch.allclose(lp, out.log_prob) and v.shape == (1,)
        res = env.step(out.actions.detach().numpy().clip(-1, 1))
        assert res.obs["rgb"].shape == rgb.shape
    finally:
        env.close()


def test_two_maniskill_envs_in_one_worker(need_maniskill):
    env = _env(envs_per_worker=2)
    try:
        assert len(set(env.worker_pids)) == 1
        obs, _ = env.reset(seed=3)
        ref = _env()
        try:
            np.testing.assert_array_equal(obs["state"], ref.reset(seed=3)[0]["state"])
        finally:
            ref.close()
        res = env.step(np.zeros((2, 8), np.float32))
        assert res.obs["state"].shape == obs["state"].shape
    finally:
        env.close()


def test_maniskill_variations_change_images_and_poses(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv
    from sims.variations import VariationConfig

    kw = dict(task="PickCube-v1", obs_mode="rgb", image_size=64, backend="cpu")
    base = ManiSkillSingleEnv(ManiSkillConfig(**kw))
    varied = ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=VariationConfig(
        camera_jitter=0.05, light_scale=(0.2, 0.4), object_pose_jitter=0.02)))
    try:
        o0, o1 = base.reset(seed=5), varied.reset(seed=5)
        assert o1["rgb"].mean() < o0["rgb"].mean()  # dimmer
        p0 = base.env.unwrapped.scene.actors["cube"].pose.p.numpy()
        p1 = varied.env.unwrapped.scene.actors["cube"].pose.p.numpy()
        assert 0 < np.abs(p1 - p0)[..., :2].max() <= 0.02 + 1e-6 and np.allclose(p1[..., 2], p0[..., 2])  # moved in xy
        np.testing.assert_array_equal(o1["rgb"], varied.reset(seed=5)["rgb"])  # reproducible per seed
        cam = ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=VariationConfig(camera_jitter=0.05)))
        try:
            o2 = cam.reset(seed=5)
            assert not np.array_equal(o2["rgb"], base.reset(seed=5)["rgb"])  # the camera moved
        finally:
            cam.close()
    finally:
        base.close()
        varied.close()


def test_distractor_boxes_are_scattered_clear_of_the_cube(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv
    from sims.variations import VariationConfig

    kw = dict(task="PickCube-v1", obs_mode="rgb", image_size=64, backend="cpu")
    base = ManiSkillSingleEnv(ManiSkillConfig(**kw))
    env = ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=VariationConfig(distractors=2)))
    try:
        assert env.obs_spec == base.obs_spec and env.action_spec == base.action_spec  # same task interface
        u = env.env.unwrapped
        places = []
        for seed in (3, 3, 4):
            o = env.reset(seed=seed)
            boxes = [u.scene.actors[f"distractor_{i}"].pose.p[0, :2].numpy() for i in range(2)]
            cube = u.cube.pose.p[0, :2].numpy()
            assert all(np.linalg.norm(b - cube) >= 0.06 for b in boxes)
            places.append((np.stack(boxes), o["rgb"]))
        np.testing.assert_array_equal(places[0][0], places[1][0])  # reproducible per seed
        np.testing.assert_array_equal(places[0][1], places[1][1])
        assert not np.allclose(places[0][0], places[2][0])  # another seed, other places
        assert not np.array_equal(places[0][1], base.reset(seed=3)["rgb"])  # and they show in the image
    finally:
        base.close()
        env.close()


def test_retexture_swaps_table_and_floor_for_plain_colours_and_back(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv
    from sims.variations import VariationConfig

    kw = dict(task="PickCube-v1", obs_mode="rgb", image_size=64, backend="cpu")
    base = ManiSkillSingleEnv(ManiSkillConfig(**kw))
    always = ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=VariationConfig(retexture=1.0)))
    half = ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=VariationConfig(retexture=0.5)))
    try:
        plain = base.reset(seed=5)["rgb"].astype(float)
        swapped = always.reset(seed=5)["rgb"].astype(float)
        assert (np.abs(swapped - plain).max(-1) > 20).mean() > 0.5  # most of the image is table and floor
        np.testing.assert_array_equal(swapped, always.reset(seed=5)["rgb"])  # reproducible per seed
        changed = [(np.abs(half.reset(seed=s)["rgb"].astype(float) - base.reset(seed=s)["rgb"]).max(-1) > 20).mean() > 0.5
                   for s in range(8)]
        assert 0 < sum(changed) < 8  # some episodes keep the textures (restored after a swap), some lose them
    finally:
        for e in (base, always, half):
            e.close()


def test_object_recolor_changes_only_the_cube(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv
    from sims.variations import VariationConfig

    kw = dict(task="PickCube-v1", obs_mode="rgb", image_size=128, backend="cpu")
    base = ManiSkillSingleEnv(ManiSkillConfig(**kw))
    env = ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=VariationConfig(object_recolor=1.0)))
    try:
        plain = base.reset(seed=5)["rgb"].astype(float)
        recol = env.reset(seed=5)["rgb"].astype(float)
        red = (plain[..., 0] > 120) & (plain[..., 1] < 60) & (plain[..., 2] < 60)
        diff = np.abs(recol - plain).max(-1) > 20
        assert red.sum() > 5 and diff[red].mean() > 0.8 and diff[~red].mean() < 0.01
    finally:
        base.close()
        env.close()
