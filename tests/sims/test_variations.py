import numpy as np
import pytest

from robo_rl.errors import ConfigError
from sims.variations import VariationConfig, paraphrase


def test_paraphrase_keeps_objects_and_varies():
    rng = np.random.default_rng(0)
    outs = {paraphrase("pick up the black bowl and place it on the plate", rng) for _ in range(30)}
    assert len(outs) > 3 and all("black bowl" in o and "plate" in o for o in outs)


def test_config_validation():
    assert not VariationConfig().active and VariationConfig(paraphrase=True).active
    with pytest.raises(ConfigError, match="light_scale"):
        VariationConfig(light_scale=(2.0, 1.0))
    with pytest.raises(ConfigError, match=">= 0 metres"):
        VariationConfig(camera_jitter=-1.0)
    with pytest.raises(ConfigError, match="camera_offset.*needs 3 numbers"):
        VariationConfig(camera_offset=(0.1, 0.0))
    assert VariationConfig(object_pose_offset=(0.02, 0.0)).active
    assert VariationConfig(object_pose_offset=(0.02, -0.04)).scaled(0.5).object_pose_offset == (0.01, -0.02)
    with pytest.raises(ConfigError, match="offset_prob.*probability in \\[0, 1\\]"):
        VariationConfig(offset_prob=1.5)
    assert VariationConfig(offset_prob=0.3).scaled(0.5).offset_prob == 0.3


def test_offset_prob_draws_per_episode_key():
    """offset_applies is 1 always at p = 1, never at p = 0, a reproducible draw of frequency p in between."""
    keys = [(s, k) for s in range(200) for k in range(3)]
    assert all(VariationConfig().offset_applies(*key) for key in keys)
    assert not any(VariationConfig(offset_prob=0.0).offset_applies(*key) for key in keys)
    half = VariationConfig(offset_prob=0.5)
    draws = [half.offset_applies(*key) for key in keys]
    assert 0.42 < np.mean(draws) < 0.58 and draws == [half.offset_applies(*key) for key in keys]


def test_fixed_offsets_shift_every_episode_the_same(need_maniskill):
    """object_pose_offset moves the cube by exactly the offset on every seed; camera_offset changes the view
    identically on every reset of a seed (no draw involved)."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv

    kw = dict(task="PushCube-v1", obs_mode="rgb", image_size=64, backend="cpu")
    envs = [ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=v)) for v in
            (VariationConfig(), VariationConfig(object_pose_offset=(0.03, -0.02)), VariationConfig(camera_offset=(0.0, 0.05, 0.0)))]
    base, shifted, cam = envs
    try:
        for seed in (1, 2):
            o0, _, o2 = (e.reset(seed=seed) for e in envs)
            p0, p1 = (e.env.unwrapped.obj.pose.p[0].numpy() for e in (base, shifted))
            np.testing.assert_allclose(p1 - p0, [0.03, -0.02, 0.0], atol=1e-5)
            assert not np.array_equal(o2["rgb"], o0["rgb"])
            np.testing.assert_array_equal(o2["rgb"], cam.reset(seed=seed)["rgb"])
    finally:
        for e in envs:
            e.close()


def test_offset_prob_mixes_shifted_and_in_distribution_episodes(need_maniskill):
    """With offset_prob 0.5 each seed's cube sits either where it would without variations or exactly the
    offset away, as offset_applies(seed, 0) says, and both kinds occur."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv

    kw = dict(task="PushCube-v1", obs_mode="state", backend="cpu")
    mixed_cfg = VariationConfig(object_pose_offset=(0.0, 0.04), offset_prob=0.5)
    base, mixed = (ManiSkillSingleEnv(ManiSkillConfig(**kw, variations=v)) for v in (VariationConfig(), mixed_cfg))
    try:
        shifted = []
        for seed in range(8):
            base.reset(seed=seed)
            mixed.reset(seed=seed)
            d = mixed.env.unwrapped.obj.pose.p[0].numpy() - base.env.unwrapped.obj.pose.p[0].numpy()
            expect = mixed_cfg.offset_applies(seed, 0)
            np.testing.assert_allclose(d, [0.0, 0.04 if expect else 0.0, 0.0], atol=1e-5)
            shifted.append(expect)
        assert 0 < sum(shifted) < 8
    finally:
        base.close()
        mixed.close()


def test_mid_episode_push_moves_the_object_at_its_step_only(need_maniskill):
    """perturb_distance displaces the cube at perturb_step (not before, not after), reproducibly per seed."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv
    from sims.variations import VariationConfig

    def cube_track(v):
        env = ManiSkillSingleEnv(ManiSkillConfig(task="PushCube-v1", num_envs=1, obs_mode="state", variations=v))
        try:
            env.reset(seed=4)
            track = []
            for _ in range(6):
                env.step(np.zeros(env.action_spec.shape, np.float32))
                track.append(env.env.unwrapped.obj.pose.p[0, :2].numpy().copy())
            return np.array(track)
        finally:
            env.close()

    still = cube_track(VariationConfig(perturb_step=3, perturb_distance=0.0))
    pushed = cube_track(VariationConfig(perturb_step=3, perturb_distance=0.05))
    again = cube_track(VariationConfig(perturb_step=3, perturb_distance=0.05))
    np.testing.assert_allclose(pushed[:3], still[:3], atol=1e-5)  # untouched before step 3
    jump = np.abs(pushed[3] - still[3])
    assert jump.max() > 1e-3 and jump.max() <= 0.05 + 1e-4
    np.testing.assert_allclose(pushed[5] - still[5], pushed[3] - still[3], atol=2e-3)  # one push, then it rests
    np.testing.assert_array_equal(pushed, again)


def test_evaluation_tags_episodes_of_a_mixed_split(need_maniskill):
    """evaluate_policy on a mixed split (subprocess VecEnv) reports, per env and episode, whether the offset
    applied: env i's k-th episode is seeded seed + i + k*B, so the tags are offset_applies(that seed, 0)."""
    import torch

    from robo_rl.contracts import PolicyOutput
    from robo_rl.runners.evaluate import evaluate_policy
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    class Still:  # holds the arm: outcomes do not matter here, only which episodes were shifted
        def reset(self, env_ids=None):
            pass

        def act(self, obs, deterministic=True):
            return PolicyOutput(actions=torch.zeros(len(obs["state"]), *env.action_spec.shape))

    mixed = VariationConfig(object_pose_offset=(0.0, 0.04), offset_prob=0.5)
    env = ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", num_envs=2, max_episode_steps=2, variations=mixed))
    try:
        res = evaluate_policy(env, Still(), episodes=8, seed=40)
    finally:
        env.close()
    expect = [[mixed.offset_applies(40 + i + 2 * k, 0) for k in range(4)] for i in range(2)]
    assert res.episode_offset == expect and 0 < sum(map(sum, expect)) < 8
    assert res.as_dict()["episode_offset"] == [[int(x) for x in e] for e in expect]


def test_gpu_backend_refuses_per_env_variations():
    """The GPU batch does not apply per-env variations: asking for both is a one-line error (distractors,
    built into the task, are fine); backend=auto would pick the CPU backend instead."""
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    with pytest.raises(ConfigError, match="CPU backend only; set env.backend=cpu"):
        ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", backend="gpu",
                                        variations=VariationConfig(object_pose_offset=(0.0, 0.04), offset_prob=0.5)))
    assert VariationConfig(distractors=2).distractors_only and not VariationConfig(distractors=2, paraphrase=True).distractors_only
    assert not VariationConfig().distractors_only
