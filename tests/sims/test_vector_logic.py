"""Unit tests of sims.vector's logic on a fake env: shared-memory batching, auto-reset with
final_obs, non-array obs entries, info extras, crash and hang recovery."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sims.vector import SubprocVecEnv
from tests.fakes.envs import CountingEnv, ProcessProbeEnv


@pytest.fixture
def venv():
    env = SubprocVecEnv([CountingEnv, CountingEnv], step_timeout=3.0)
    yield env
    env.close()


def test_forkserver_workers_start_with_the_parents_environment_and_cpu_mask_of_now(monkeypatch):
    """The fork server keeps the environment and CPU mask it started with; a worker forked from it later (and its
    replacement) must see the parent's current ones, as a spawned worker does."""
    SubprocVecEnv([CountingEnv], start_method="forkserver").close()  # the server runs from here on
    monkeypatch.setenv("ROBO_RL_PROBE", "set-after-the-server-started")
    mask = os.sched_getaffinity(0)
    first = min(mask)
    os.sched_setaffinity(0, {first})
    try:
        env = SubprocVecEnv([ProcessProbeEnv], start_method="forkserver", step_timeout=3.0)
    finally:
        os.sched_setaffinity(0, mask)
    try:
        want = [f"set-after-the-server-started|{first}"]
        assert env.reset(seed=0)[0]["instruction"] == want
        res = env.step(np.array([[0, 0, 1]], np.float32))  # kills the worker: its replacement takes the mask of now
        assert res.info["worker_restarted"].tolist() == [True]
        assert res.obs["instruction"] == [f"set-after-the-server-started|{','.join(map(str, sorted(mask)))}"]
    finally:
        env.close()


def test_unknown_start_method_is_refused_in_one_line():
    with pytest.raises(ValueError, match="start method 'fork' is not one of spawn, forkserver"):
        SubprocVecEnv([CountingEnv], start_method="fork")


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


def test_a_replacement_that_hangs_while_starting_is_tried_again(tmp_path):
    """Worker 0 crashes; its first replacement hangs while building its env (past start_timeout), the
    second starts: the step ends the crashed episode and the run goes on. A replacement that never
    starts ends it with a one-line error naming the attempts."""
    import functools

    from robo_rl.errors import SimulatorUnavailable

    hang_once = functools.partial(_hangs_on_replacement, str(tmp_path), 1)
    env = SubprocVecEnv([hang_once, CountingEnv], step_timeout=3.0, start_timeout=60.0)
    try:
        env.start_timeout = 8.0  # the first start may be slow on a loaded machine; replacements get 8 s
        env.reset(seed=0)
        act = np.zeros((2, 3), np.float32)
        act[0, 2] = 1.0  # crash worker 0
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [True, False] and env.restarts == 2
        assert (tmp_path / "hung_1").exists()
        res = env.step(np.zeros((2, 3), np.float32))
        np.testing.assert_array_equal(res.obs["state"][:, 0], [1, 2])
    finally:
        env.close()
    hang_always = functools.partial(_hangs_on_replacement, str(tmp_path / "b"), 99)
    env = SubprocVecEnv([hang_always], step_timeout=3.0, start_timeout=60.0)
    try:
        env.start_timeout = 4.0
        env.reset(seed=0)
        with pytest.raises(SimulatorUnavailable, match=r"^env worker 0 did not start within 4s \(2 replacements tried\)$"):
            env.step(np.array([[0, 0, 1]], np.float32))
    finally:
        env.close()


def _hangs_on_replacement(marker_dir: str, hangs: int) -> CountingEnv:
    """A CountingEnv whose builds after the first hang (sleep) ``hangs`` times, each leaving a marker."""
    import time
    from pathlib import Path

    d = Path(marker_dir)
    d.mkdir(parents=True, exist_ok=True)
    builds = len(list(d.glob("build_*")))
    (d / f"build_{builds}").touch()
    if 1 <= builds <= hangs:
        (d / f"hung_{builds}").touch()
        time.sleep(60)
    return CountingEnv()


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


def test_several_envs_per_worker_crash_restarts_the_group():
    env = SubprocVecEnv([CountingEnv] * 5, envs_per_worker=2, step_timeout=3.0)
    try:
        assert env.num_workers == 3
        pids = env.worker_pids()
        assert len(pids) == 5 and pids[0] == pids[1] and pids[2] == pids[3] and pids[4] not in pids[:4]
        obs, _ = env.reset(seed=100)
        np.testing.assert_array_equal(obs["state"][:, 1], [100, 101, 102, 103, 104])
        act = np.zeros((5, 3), np.float32)
        env.step(act)
        act[3, 2] = 1.0  # env 3 kills its worker, which also hosts env 2
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [False, False, True, True, False]
        assert res.truncated.tolist() == [False, False, True, True, False]
        np.testing.assert_array_equal(res.obs["state"][:, 0], [2, 2, 0, 0, 2])
        assert env.worker_pids()[2] not in pids
    finally:
        env.close()


def test_action_chunks_run_in_the_worker_and_stop_at_the_episode_end(venv):
    venv.reset(seed=0)
    chunk = np.zeros((2, 3, 3), np.float32)
    chunk[0, 1, 0] = 1.0  # env 0 succeeds at the chunk's 2nd step: its 3rd action is dropped
    res = venv.step(chunk)
    assert res.info["chunk_steps"].tolist() == [2, 3]
    np.testing.assert_array_equal(res.reward, [1 + 2, 1 + 2 + 3])  # summed over executed steps (reward = t)
    assert res.terminated.tolist() == [True, False] and res.info["success"].tolist() == [True, False]
    np.testing.assert_array_equal(res.info["final_obs"]["state"][0, 0], 2)
    np.testing.assert_array_equal(res.obs["state"][:, 0], [0, 3])  # env 0 restarted, env 1 at step 3
    res = venv.step(np.zeros((2, 4, 3), np.float32))  # env 1 hits its horizon after one step
    assert res.info["chunk_steps"].tolist() == [4, 1] and res.truncated.tolist() == [True, True]
    with pytest.raises(Exception, match=r"expected \(2, 3\) or chunks \(2, H, 3\)"):
        venv.step(np.zeros((2, 0, 3), np.float32))


def test_step_async_on_worker_subsets_for_pipelining(venv):
    venv.reset(seed=0)
    act = np.zeros((2, 3), np.float32)
    venv.step_async(act, workers=[0])  # only env 0 steps
    with pytest.raises(Exception, match="called again before step_wait"):
        venv.step_async(act)
    res = venv.step_wait()
    assert res.obs["state"].shape == (1, 2) and res.info["rows"].tolist() == [0]
    np.testing.assert_array_equal(res.obs["state"][:, 0], [1])
    venv.step_async(act, workers=[1])
    res = venv.step_wait()
    np.testing.assert_array_equal(res.obs["state"][:, 0], [1])  # env 1 caught up
    res = venv.step(act)  # the full step still works and reports all envs
    np.testing.assert_array_equal(res.obs["state"][:, 0], [2, 2])
    assert "rows" not in res.info
    with pytest.raises(Exception, match="without a pending step_async"):
        venv.step_wait()


def test_worker_whose_parent_is_gone_exits_quietly(capfd):
    """A worker started by a parent that then stopped (closed pipe) returns without a BrokenPipeError traceback."""
    import multiprocessing as mp

    from sims.worker import _worker

    parent, child = mp.Pipe()
    parent.close()
    _worker(child, [CountingEnv], [0], {})  # the spec reply finds the pipe closed
    assert "Traceback" not in capfd.readouterr().err


def test_batched_scene_workers_reset_rows_and_end_chunks_per_row():
    """Batched-scene workers (GPU scenes of n rows): rows end at different steps of one chunk; each row's
    reward, success and chunk_steps stop at its own end, its final obs is the step it ended on, and only
    the finished rows are reset, together, at the chunk's end."""
    from tests.fakes.envs import CountingBatchFactory

    env = SubprocVecEnv([CountingBatchFactory(3), CountingBatchFactory(2)], step_timeout=5.0)
    try:
        assert env.num_envs == 5 and env.worker_rows == [[0, 1, 2], [3, 4]]
        obs, _ = env.reset(seed=10)
        np.testing.assert_array_equal(obs["state"][:, 1], [10, 11, 12, 13, 14])
        assert obs["instruction"] == ["row 0 at 0", "row 1 at 0", "row 2 at 0", "row 0 at 0", "row 1 at 0"]
        res = env.step(np.zeros((5, 3), np.float32))  # t = 1 everywhere
        chunk = np.zeros((5, 6, 3), np.float32)
        chunk[0, 1, 0] = 1.0  # row 0 succeeds on the chunk's 2nd step (episode step 3)
        res = env.step(chunk)  # rows 1-4 reach the 4-step limit on the chunk's 3rd step
        assert res.info["chunk_steps"].tolist() == [2, 3, 3, 3, 3]
        assert res.terminated.tolist() == [True, False, False, False, False]
        assert res.truncated.tolist() == [False, True, True, True, True]
        assert res.info["success"].tolist() == [True, False, False, False, False]
        np.testing.assert_array_equal(res.reward, [2 + 3, 2 + 3 + 4, 9, 9, 9])  # rewards = t, summed per row
        np.testing.assert_array_equal(res.info["final_obs"]["state"][:, 0], [3, 4, 4, 4, 4])
        # non-array entries of the final obs belong to their own row, from the step the row ended on
        assert res.info["final_obs"]["instruction"] == ["row 0 at 3", "row 1 at 4", "row 2 at 4", "row 0 at 4",
                                                        "row 1 at 4"]
        np.testing.assert_array_equal(res.obs["state"][:, 0], [0, 0, 0, 0, 0])  # reset at the chunk's end
        res = env.step(np.zeros((5, 2, 3), np.float32))  # nobody ends: no final obs, two steps each
        assert res.info["chunk_steps"].tolist() == [2] * 5 and "final_obs" not in res.info
        env.step_async(np.zeros((5, 3), np.float32), [1])  # one worker's rows only (pipelining)
        part = env.step_wait()
        assert part.info["rows"].tolist() == [3, 4] and part.obs["state"].shape == (2, 2)
        np.testing.assert_array_equal(part.obs["state"][:, 0], [3, 3])
        kill = np.zeros((5, 3), np.float32)
        kill[4, 2] = 1.0  # the second scene's process dies
        res = env.step(kill)
        assert res.info["worker_restarted"].tolist() == [False, False, False, True, True]
        assert res.truncated[3:].all() and env.restarts == 1
        np.testing.assert_array_equal(res.info["final_obs"]["state"][3:, 0], [3, 3])  # their last good obs
    finally:
        env.close()


def test_mixed_single_and_batched_factories_are_refused():
    from robo_rl.errors import RoboRLError
    from tests.fakes.envs import CountingBatchFactory

    with pytest.raises(RoboRLError, match="all build single envs or all build batched"):
        SubprocVecEnv([CountingEnv, CountingBatchFactory(2)])


@pytest.mark.parametrize("num_envs, num_tasks", [(16, 10), (10, 10), (20, 10), (8, 1), (3, 2)])
def test_libero_envs_sharing_a_task_cover_its_init_states_without_repeats(num_envs, num_tasks):
    """Over episodes k, the envs of one task take consecutive init states, never the same one twice
    (before: env i took seed + i + kB, so with 10 tasks and 16 envs a task saw 1 residue of 16)."""
    from sims.libero.env import init_state_index

    for base in (0, 7, 1000):
        for task in range(num_tasks):
            envs = range(task, num_envs, num_tasks)
            seen = [init_state_index(base + i + k * num_envs, i, num_envs, num_tasks) for k in range(25) for i in envs]
            assert len(set(seen)) == len(seen)
            lo = min(seen)
            assert sorted(seen) == list(range(lo, lo + len(seen)))  # consecutive: all 50 states get used
    # one task: exactly the old seed + i + kB
    assert [init_state_index(5 + 1 + 2 * k, 1, 2, 1) for k in range(3)] == [6, 8, 10]


def test_a_crash_keeps_the_results_its_sibling_envs_already_produced():
    """Worker 1 hosts envs 2 and 3; in one step env 2 succeeds (its step finished) and env 3 kills the
    worker. Env 2 keeps its success, reward, termination and real final obs; env 3's episode is cut."""
    env = SubprocVecEnv([CountingEnv] * 4, envs_per_worker=2, step_timeout=3.0)
    try:
        env.reset(seed=0)
        for _ in range(2):
            env.step(np.zeros((4, 3), np.float32))
        act = np.zeros((4, 3), np.float32)
        act[2, 0] = 1.0  # success
        act[3, 2] = 1.0  # crash
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [False, False, True, True]
        assert res.terminated.tolist() == [False, False, True, False]
        assert res.truncated.tolist() == [False, False, False, True]
        assert res.info["success"].tolist() == [False, False, True, False]
        assert res.reward.tolist() == [3.0, 3.0, 3.0, 0.0]
        np.testing.assert_array_equal(res.info["final_obs"]["state"][2:, 0], [3, 2])  # env 2's real last obs
        act = np.zeros((4, 3), np.float32)
        act[0, 0] = 2.0  # env 0 succeeds, then its auto-reset raises: the success still counts
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [True, True, False, False]
        assert res.terminated[0] and res.info["success"][0] and res.reward[0] == 4.0
        assert res.truncated[1] and not res.info["success"][1]  # env 1 (same worker) was cut there
    finally:
        env.close()


def test_replaced_workers_continue_each_envs_seed_sequence():
    """Env i of B runs episodes seeded seed + i + kB; a worker replaced mid-episode starts the next
    one with the next seed of that sequence (not unseeded), after a step crash or a death between resets."""
    env = SubprocVecEnv([CountingEnv, CountingEnv], step_timeout=3.0)
    try:
        env.reset(seed=10)
        act = np.zeros((2, 3), np.float32)
        act[0, 2] = 1.0
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [True, False]
        np.testing.assert_array_equal(res.obs["state"][:, 1], [12, 11])  # env 0: 10 -> 12; env 1 untouched
        for _ in range(4):
            res = env.step(np.zeros((2, 3), np.float32))  # env 0's episode (seed 12) ends by time limit
        act[0, 2] = 1.0
        res = env.step(act)  # crash in the episode seeded 14: the new one is 16
        np.testing.assert_array_equal(res.obs["state"][0, 1], 16)
        import os
        import signal

        os.kill(env.worker_pids()[1], signal.SIGKILL)  # dies between episodes
        obs, _ = env.reset(seed=50)
        np.testing.assert_array_equal(obs["state"][:, 1], [50, 51])
        assert env.restarts == 3
    finally:
        env.close()


def test_an_env_that_raises_is_replaced_and_a_repeating_error_ends_cleanly():
    from robo_rl.errors import RoboRLError

    env = SubprocVecEnv([CountingEnv, CountingEnv], step_timeout=3.0)
    try:
        env.reset(seed=0)
        env.step(np.zeros((2, 3), np.float32))
        act = np.zeros((2, 3), np.float32)
        act[1, 0] = -1.0  # env 1 raises
        res = env.step(act)
        assert res.info["worker_restarted"].tolist() == [False, True] and res.truncated.tolist() == [False, True]
        np.testing.assert_array_equal(res.obs["state"][:, 0], [2, 0])
        env.step(act)
        with pytest.raises(RoboRLError, match="env worker 1: ValueError: simulator blew up .3 times in a row"):
            env.step(act)
        res = env.step(np.zeros((2, 3), np.float32))  # still in step: env 0 continues its episode
        assert res.info["t"][0] == 1 and env.restarts == 2  # (env 0 ended by time limit at step 4)
        os_pids = env.worker_pids()
        import os
        import signal

        os.kill(os_pids[0], signal.SIGKILL)
        with pytest.raises(RoboRLError, match=r"env worker\(s\) \[0\] died or hung while rendering"):
            env.render()
        res = env.step(np.zeros((2, 3), np.float32))  # worker 1's frame was read: no reply is left over
        assert res.info["worker_restarted"].tolist() == [True, False] and res.info["t"][1] == 2
        assert res.obs["state"][0, 1] == 4  # seeds 0 -> 2 (time limit inside the failing step) -> 4 (replaced)
        assert env.render().shape[0] == 2
    finally:
        env.close()
