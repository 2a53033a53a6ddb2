"""Unit tests of sims.vector's logic on a fake env: shared-memory batching, auto-reset with
final_obs, non-array obs entries, info extras, crash and hang recovery."""

from __future__ import annotations

import numpy as np
import pytest

from sims.vector import SubprocVecEnv
from tests.fakes.envs import CountingEnv


@pytest.fixture
def venv():
    env = SubprocVecEnv([CountingEnv, CountingEnv], step_timeout=3.0)
    yield env
    env.close()


def test_reset_seeds_and_strings(venv):
    obs, _ = venv.reset(seed=10)
    np.testing.assert_array_equal(obs["state"], [[0, 10], [0, 11]])
    assert obs["instruction"] == ["count to 4", "count to 4"]


def test_autoreset_truncation_termination_and_final_obs(venv):
    venv.reset(seed=0)
    act = np.zeros((2, 3), np.float32)
    for _ in range(3):
        res = venv.step(act)
        assert "final_obs" not in res.info
    np.testing.assert_array_equal(res.info["t"], [3, 3])
    act[0, 0] = 1.0  # env 0 succeeds (terminated); env 1 reaches its time limit (truncated)
    res = venv.step(act)
    assert res.terminated.tolist() == [True, False] and res.truncated.tolist() == [False, True]
    assert res.info["success"].tolist() == [True, False]
    np.testing.assert_array_equal(res.info["final_obs"]["state"][:, 0], [4, 4])
    np.testing.assert_array_equal(res.obs["state"][:, 0], [0, 0])  # new episodes already started
    obs_copy = res.obs["state"].copy()
    venv.step(np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(res.obs["state"], obs_copy)  # returned arrays are not shared buffers


def test_crashed_and_hung_workers_are_replaced(venv):
    venv.reset(seed=0)
    venv.step(np.zeros((2, 3), np.float32))
    act = np.zeros((2, 3), np.float32)
    act[0, 2] = 1.0  # crash worker 0
    act[1, 1] = 1.0  # hang worker 1 past step_timeout
    res = venv.step(act)
    assert res.info["worker_restarted"].tolist() == [True, True]
    assert res.truncated.all() and not res.terminated.any()
    np.testing.assert_array_equal(res.info["final_obs"]["state"][:, 0], [1, 1])  # last good obs
    assert venv.restarts == 2
    res = venv.step(np.zeros((2, 3), np.float32))
    assert not res.info["worker_restarted"].any()
    np.testing.assert_array_equal(res.obs["state"][:, 0], [1, 1])


def test_bad_action_shape_is_one_line(venv):
    from robo_rl.errors import RoboRLError

    venv.reset(seed=0)
    with pytest.raises(RoboRLError, match=r"expected \(2, 3\)"):
        venv.step(np.zeros((3, 3), np.float32))


def test_factory_failure_is_reported():
    from robo_rl.errors import SimulatorUnavailable

    with pytest.raises(SimulatorUnavailable, match="ZeroDivisionError"):
        SubprocVecEnv([_broken])


def _broken():
    return 1 / 0
