"""LIBERO on real robosuite/MuJoCo (headless osmesa): suites, official init states, success predicate,
the VecEnv contract. Full-length episodes per suite run with `pytest -m slow`."""

from __future__ import annotations

import os

import numpy as np
import pytest

from robo_rl.errors import ConfigError

pytestmark = pytest.mark.libero


@pytest.fixture(scope="module", autouse=True)
def _headless_gl():
    old = {k: os.environ.get(k) for k in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    os.environ["MUJOCO_GL"] = os.environ["PYOPENGL_PLATFORM"] = "osmesa"
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_every_suite_task_list_loads(need_libero):
    from sims.libero.suites import SUITES, suite_tasks

    counts = {s: len(suite_tasks(s)) for s in SUITES}
    assert counts == {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
    for s in SUITES:
        for t in suite_tasks(s):
            assert t.instruction and os.path.isfile(t.bddl_file) and os.path.isfile(t.init_states_file)


def test_unknown_suite_and_task_are_one_line_errors(need_libero):
    from sims.libero.env import LiberoConfig, LiberoSingleEnv

    with pytest.raises(ConfigError, match="did you mean 'libero_goal'"):
        LiberoConfig(suite="libero_gaol")
    with pytest.raises(ConfigError, match="has tasks 0..9"):
        LiberoSingleEnv(LiberoConfig(suite="libero_10"), 12)


def _place_on(env, top: str, base: str) -> None:
    """Teleport object ``top`` just above ``base`` (as LIBERO's On(top, base) predicate wants)."""
    inner = env.env.env
    sim = inner.sim
    obj = inner.objects_dict[top]
    base_pos = sim.data.body_xpos[sim.model.body_name2id(inner.objects_dict[base].root_body)].copy()
    joint = obj.joints[-1]
    qpos = sim.data.get_joint_qpos(joint).copy()
    qpos[:3] = base_pos + np.array([0.0, 0.0, 0.05])
    sim.data.set_joint_qpos(joint, qpos)
    sim.data.set_joint_qvel(joint, np.zeros(6))
    sim.forward()


def test_official_init_state_and_success_predicate(need_libero):
    from sims.libero.env import LiberoConfig, LiberoSingleEnv

    env = LiberoSingleEnv(LiberoConfig(suite="libero_spatial", image_size=64, settle_steps=0), 0)
    try:
        obs = env.reset(seed=3)
        # the official init state #3 is what the sim holds after reset (no settle steps)
        np.testing.assert_allclose(env.env.get_sim_state(), env.init_states[3], atol=1e-6)
        assert obs["rgb"].shape == (2, 64, 64, 3) and obs["rgb"].dtype == np.uint8 and obs["rgb"].std() > 0
        assert obs["state"].shape == (8,) and obs["state"].dtype == np.float32
        assert "bowl" in obs["instruction"] and "plate" in obs["instruction"]
        goal = env.env.env.parsed_problem["goal_state"]
        assert goal[0][0].lower() == "on"
        noop = np.array([0, 0, 0, 0, 0, 0, -1], np.float32)
        _, _, terminated, _, info = env.step(noop)
        assert not info["success"] and not terminated
        _place_on(env, goal[0][1], goal[0][2])
        for _ in range(15):
            _, _, terminated, truncated, info = env.step(noop)
            if info["success"]:
                break
        assert info["success"] and terminated and not truncated
    finally:
        env.close()


def test_envs_sharing_a_task_take_disjoint_init_states(need_libero):
    """Env i of B loads init states seed + i, seed + i + B, ... (no two envs repeat an init state)."""
    from sims.libero.env import LiberoConfig, LiberoSingleEnv

    env = LiberoSingleEnv(LiberoConfig(suite="libero_spatial", image_size=64, settle_steps=0), 0, init_stride=2)
    try:
        env.reset(seed=5)
        np.testing.assert_allclose(env.env.get_sim_state(), env.init_states[5], atol=1e-6)
        env.reset()
        np.testing.assert_allclose(env.env.get_sim_state(), env.init_states[7], atol=1e-6)
    finally:
        env.close()


def test_vec_env_contract_two_suites(need_libero):
    from sims.libero.env import LiberoConfig, LiberoVecEnv

    env = LiberoVecEnv(LiberoConfig(suite="libero_object", task_ids=(0, 1), num_envs=2, image_size=64,
                                    max_episode_steps=3, settle_steps=2))
    try:
        assert env.action_spec.shape == (7,) and env.obs_spec["rgb"].shape == (2, 64, 64, 3)
        obs, _ = env.reset(seed=0)
        assert obs["rgb"].shape == (2, 2, 64, 64, 3) and obs["state"].shape == (2, 8)
        assert len(obs["instruction"]) == 2 and obs["instruction"][0] != obs["instruction"][1]
        act = np.zeros((2, 7), np.float32)
        for _ in range(3):
            res = env.step(act)
        assert res.truncated.all() and not res.terminated.any() and "final_obs" in res.info
        assert res.info["success"].dtype == bool
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"])
def test_one_full_episode_per_suite(suite, need_libero):
    from sims.libero.env import LiberoConfig, LiberoSingleEnv
    from sims.libero.suites import MAX_STEPS

    env = LiberoSingleEnv(LiberoConfig(suite=suite, image_size=64, fast_render=True), 0)
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, info = env.step(rng.uniform(-0.3, 0.3, 7).astype(np.float32))
            steps += 1
            done = terminated or truncated
        assert truncated and steps == MAX_STEPS[suite] and not info["success"]
    finally:
        env.close()


def test_variations_change_what_they_name_and_nothing_when_off(need_libero):
    from sims.libero.env import LiberoConfig, LiberoSingleEnv
    from sims.variations import VariationConfig

    base_cfg = LiberoConfig(suite="libero_spatial", image_size=64, settle_steps=0)
    base = LiberoSingleEnv(base_cfg, 0)
    varied = LiberoSingleEnv(LiberoConfig(suite="libero_spatial", image_size=64, settle_steps=0,
                                          variations=VariationConfig(camera_jitter=0.05, light_scale=(0.3, 0.5),
                                                                     object_pose_jitter=0.03, paraphrase=True,
                                                                     camera_offset=(0.0, 0.02, 0.0),
                                                                     object_pose_offset=(0.01, 0.0))), 0)
    try:
        o0, o0b = base.reset(seed=1), base.reset(seed=1)
        np.testing.assert_array_equal(o0["rgb"], o0b["rgb"])  # off: deterministic, untouched
        o1 = varied.reset(seed=1)
        assert o1["rgb"][0].mean() < o0["rgb"][0].mean()  # dimmer lights
        assert not np.array_equal(o1["rgb"][0], o0["rgb"][0])
        assert o1["instruction"] != o0["instruction"] and "plate" in o1["instruction"]
        sim_b, sim_v = base.env.get_sim_state(), varied.env.get_sim_state()
        assert not np.allclose(sim_b, sim_v)  # object poses moved
        o1b = varied.reset(seed=1)
        np.testing.assert_array_equal(o1["rgb"], o1b["rgb"])  # same seed, same variation
    finally:
        base.close()
        varied.close()


def test_blind_chunk_steps_equal_rendering_every_step(need_libero):
    """Steps inside a chunk skip the camera renders; rewards, ends, the chunk's last observation and the
    observation of a step asked for afterwards (an episode ending mid-chunk) equal plain steps, bit for bit."""
    from sims.libero.env import LiberoConfig, LiberoSingleEnv
    from sims.worker import BlindStepEnv

    cfg = LiberoConfig(suite="libero_spatial", image_size=64, settle_steps=2, max_episode_steps=9)
    plain, blind = LiberoSingleEnv(cfg, 0), LiberoSingleEnv(cfg, 0)
    try:
        assert isinstance(blind, BlindStepEnv)
        renders = []
        render = blind.env.sim.render
        blind.env.sim.render = lambda *a, **k: renders.append(1) or render(*a, **k)
        o_p, o_b = plain.reset(seed=4), blind.reset(seed=4)
        np.testing.assert_array_equal(o_p["rgb"], o_b["rgb"])
        renders.clear()
        rng = np.random.default_rng(0)
        for t in range(9):  # chunks of 4: steps 3 and 7 observe; step 5 is observed on demand after a blind step
            act = rng.uniform(-1, 1, 7).astype(np.float32)
            obs, *outcome = plain.step(act)
            if t % 4 == 3:
                obs_b, *outcome_b = blind.step(act)
            else:
                outcome_b, obs_b = list(blind.step_blind(act)), None
                np.testing.assert_array_equal(blind.state_now(), obs["state"])  # what a state-only expert reads
                if t in (5, 8):  # as the worker does when an episode ends on a blind step
                    obs_b = blind.observe()
            assert outcome_b[:3] == outcome[:3], t
            if obs_b is not None:
                np.testing.assert_array_equal(obs_b["rgb"], obs["rgb"])
                np.testing.assert_array_equal(obs_b["state"], obs["state"])
        assert outcome[2]  # truncated at 9 steps
        # 2 cameras rendered for steps 3 and 7 and for the two observe() calls; none for the other 5 steps
        assert len(renders) == 2 * 4, len(renders)
        np.testing.assert_array_equal(plain.env.get_sim_state(), blind.env.get_sim_state())
    finally:
        plain.close()
        blind.close()


@pytest.mark.slow  # ~1 min here; the bench's ManiSkill run (test_blind_steps.py) and LIBERO's blind steps stay in the default run
def test_bench_chunks_on_libero_prints_blind_every_step_and_raw(need_libero, tmp_path):
    import json

    from tests.conftest import run_cli

    out = tmp_path / "chunks.json"
    proc = run_cli("bench", "chunks", "--sim", "libero", "--task", "libero_spatial/0", "--workers", "1",
                   "--chunk", "4", "--calls", "2", "--rounds", "1", "--image-size", "32", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["sim"] == "libero" and row["chunk"] == 4 and min(row["blind"], row["every-step"], row["raw"]) > 0


def test_init_state_sequences_invert():
    """``sequence_for_init_state`` is the inverse of ``init_state_index`` for every env of every layout."""
    from sims.libero.env import init_state_index, sequence_for_init_state

    for b in (1, 2, 3, 5, 8):
        for tasks in (1, 2, 3):
            for i in range(b):
                for k in range(40):
                    assert init_state_index(sequence_for_init_state(k, i, b, tasks), i, b, tasks) == k


def test_sampled_layouts_are_seeded_and_apart_from_the_official_states(need_libero):
    """init_states: sampled draws each episode's layout from the task's placement regions, one layout per
    seed, none of them an official evaluation state."""
    from sims.libero.env import LiberoConfig, LiberoSingleEnv

    env = LiberoSingleEnv(LiberoConfig(suite="libero_spatial", image_size=32, settle_steps=0, init_states="sampled"), 0)
    try:
        objects = slice(9, None)  # the arm's 7 joints and 2 fingers first, then the objects' free joints
        layouts = [env.env.get_sim_state().copy() for s in (0, 1, 0) if env.reset(seed=s) is not None]
        official = np.stack(env.init_states)
        qpos = [x[1:1 + env.env.sim.model.nq][objects] for x in layouts]
        assert np.abs(qpos[0] - qpos[1]).max() > 5e-3  # another seed, another layout
        np.testing.assert_allclose(qpos[0], qpos[2], atol=1e-3)  # the same seed, the same layout
        dist = np.abs(official[:, 1:1 + env.env.sim.model.nq][:, objects] - qpos[0]).max(axis=1)
        assert dist.min() > 1e-3  # not one of the 50 official states
    finally:
        env.close()


def test_reset_each_puts_a_group_on_one_init_state(need_libero):
    from sims.libero.env import LiberoConfig, LiberoVecEnv

    env = LiberoVecEnv(LiberoConfig(suite="libero_spatial", num_envs=3, image_size=32, settle_steps=0))
    try:
        obs, _ = env.reset_each([7, 7, 9])
        np.testing.assert_array_equal(obs["state"][0], obs["state"][1])
        np.testing.assert_array_equal(obs["rgb"][0], obs["rgb"][1])
        assert not np.array_equal(obs["rgb"][0], obs["rgb"][2])
    finally:
        env.close()


def test_reset_each_groups_of_two_tasks_on_sampled_layouts(need_libero):
    """Two tasks, 4 envs (env i runs task i % 2), groups of 2 from state 0: the sequences of the second
    rank are negative, and each group (envs 0 and 2, envs 1 and 3) still starts from one layout."""
    from sims.libero.env import LiberoConfig, LiberoVecEnv

    env = LiberoVecEnv(LiberoConfig(suite="libero_spatial", task_ids=(0, 2), num_envs=4, envs_per_worker=4,
                                    image_size=32, settle_steps=0, init_states="sampled"))
    try:
        obs, _ = env.reset_each([0, 0, 0, 0])
        for a, b in ((0, 2), (1, 3)):
            np.testing.assert_array_equal(obs["rgb"][a], obs["rgb"][b])
        assert not np.array_equal(obs["rgb"][0], obs["rgb"][1])
    finally:
        env.close()


@pytest.mark.parametrize("task", ["libero_spatial/0", "libero_object/4"], ids=["bowl-rim", "tall-bottle"])
def test_scripted_expert_grasps_from_the_objects_geometry(need_libero, task):
    """A bowl (hollow: pinched at its rim) and a tall bottle (at its neck) from official init state 0."""
    from sims.libero.env import LiberoConfig
    from sims.libero.support import SUPPORT

    suite, _, idx = task.partition("/")
    episodes, successes, _ = SUPPORT.expert_block(LiberoConfig(suite=suite, task_ids=(int(idx),), image_size=32), 1, 0)
    assert (episodes, successes) == (1, 1)


def test_demos_with_a_frame_every_k_steps_equal_every_frame_at_those_steps(need_libero):
    """`--frame-every 4`: the expert's episode (actions, states, rewards) is the one it records rendering every
    step, and the frames kept are those of steps 0, 4, 8, ... bit for bit; SFT rows are exactly those steps."""
    from robo_rl.runners.offline import flatten
    from sims.libero.experts import generate

    kw = dict(seed=5, image_size=32, fast_render=True, init_states="sampled", max_steps=62)
    every = next(generate("libero_spatial", 0, 1, **kw))
    sparse = next(generate("libero_spatial", 0, 1, frame_every=4, **kw))
    np.testing.assert_array_equal(sparse.actions, every.actions)
    np.testing.assert_array_equal(sparse.obs["state"], every.obs["state"])
    np.testing.assert_array_equal(sparse.rewards, every.rewards)
    assert sparse.succeeded == every.succeeded and every.length == 62  # cut by the time limit
    steps = np.arange(0, every.length + 1, 4)
    np.testing.assert_array_equal(sparse.frame_steps, steps)
    np.testing.assert_array_equal(sparse.obs["rgb"], every.obs["rgb"][steps])
    rows = flatten([sparse], ["rgb", "state"], horizon=8)
    kept = steps[steps < every.length]
    np.testing.assert_array_equal(rows.obs["rgb"], every.obs["rgb"][kept])
    np.testing.assert_array_equal(rows.actions[:, 0], every.actions[kept])
