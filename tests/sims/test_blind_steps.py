"""Blind chunk steps on real ManiSkill rgb envs: inside an action chunk only the last observation is
rendered, and everything the policy and the algorithms see (rewards, ends, success, the chunk's last
observation, the final observation of an episode that ends mid-chunk) equals rendering every step."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.maniskill


def test_blind_steps_equal_plain_steps_and_skip_the_render(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv

    cfg = ManiSkillConfig(task="PushCube-v1", obs_mode="rgb", image_size=32, max_episode_steps=10)
    plain, blind = ManiSkillSingleEnv(cfg), ManiSkillSingleEnv(cfg)
    try:
        base = blind.env.unwrapped
        renders = []
        capture = base.capture_sensor_data
        base.capture_sensor_data = lambda *a, **k: renders.append(1) or capture(*a, **k)
        plain.reset(seed=3)
        blind.reset(seed=3)
        renders.clear()
        rng = np.random.default_rng(0)
        for t in range(10):  # chunks of 4: steps 3 and 7 observe, step 9 ends the episode blind
            act = rng.uniform(-1, 1, plain.action_spec.shape).astype(np.float32)
            obs, *outcome = plain.step(act)
            if t % 4 == 3:
                obs_b, *outcome_b = blind.step(act)
            else:
                outcome_b, obs_b = list(blind.step_blind(act)), None
            assert outcome_b == outcome, t
            if obs_b is None and outcome[2]:  # truncated on a blind step: the final observation on demand
                obs_b = blind.observe()
            if obs_b is not None:
                np.testing.assert_array_equal(obs_b["rgb"], obs["rgb"])
                np.testing.assert_array_equal(obs_b["state"], obs["state"])
        assert outcome[2] and renders == [1, 1, 1]  # steps 3 and 7, then observe(); none for the 7 blind steps
    finally:
        plain.close()
        blind.close()


def test_vec_env_chunks_give_the_same_data_blind_or_rendering_every_step(need_maniskill):
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    def make(blind: bool) -> ManiSkillVecEnv:
        return ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", num_envs=2, obs_mode="rgb", image_size=32,
                                               backend="cpu", max_episode_steps=6, blind_chunk_steps=blind))

    fast, slow = make(True), make(False)
    try:
        oa, _ = fast.reset(seed=5)
        ob, _ = slow.reset(seed=5)
        np.testing.assert_array_equal(oa["rgb"], ob["rgb"])
        rng = np.random.default_rng(1)
        ended = 0
        for _ in range(4):  # 6-step episodes in chunks of 4: the second chunk ends each episode on a blind step
            chunk = rng.uniform(-1, 1, (2, 4, *fast.action_spec.shape)).astype(np.float32)
            ra, rb = fast.step(chunk), slow.step(chunk)
            for key in ("rgb", "state"):
                np.testing.assert_array_equal(ra.obs[key], rb.obs[key])
            np.testing.assert_array_equal(ra.reward, rb.reward)
            np.testing.assert_array_equal(ra.truncated, rb.truncated)
            np.testing.assert_array_equal(ra.terminated, rb.terminated)
            np.testing.assert_array_equal(ra.info["success"], rb.info["success"])
            np.testing.assert_array_equal(ra.info["chunk_steps"], rb.info["chunk_steps"])
            done = ra.terminated | ra.truncated
            if done.any():
                ended += int(done.sum())
                np.testing.assert_array_equal(ra.info["final_obs"]["rgb"][done], rb.info["final_obs"]["rgb"][done])
        assert ended >= 2
    finally:
        fast.close()
        slow.close()


def test_bench_chunks_prints_both_rates_and_the_ratio(need_maniskill, tmp_path):
    import json

    from tests.conftest import cli_in_process, run_cli

    out = tmp_path / "chunks.json"
    proc = run_cli("bench", "chunks", "--workers", "1", "--chunk", "3", "--calls", "2", "--rounds", "1",
                   "--image-size", "32", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["chunk"] == 3 and row["blind"] > 0 and row["every-step"] > 0
    assert row["ratio"] == row["blind"] / row["every-step"] and "blind/every" in proc.stdout
    proc = cli_in_process("bench", "chunks", "--chunk", "0")
    assert proc.returncode == 2 and "--chunk" in proc.stderr
