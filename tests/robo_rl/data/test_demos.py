"""Demonstration datasets: motion-planned ManiSkill experts, the robo-rl episode format, and the
official LIBERO hdf5 format (a small file the test writes)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from robo_rl.data.episodes import DatasetError, Episode, load_episodes, read_meta, write_episodes
from robo_rl.data.libero_hdf5 import read_libero_demos
from tests.conftest import cli_in_process, run_cli


def _episode(t=4, seed=1):
    rng = np.random.default_rng(seed)
    return Episode({"state": rng.normal(size=(t + 1, 5)).astype(np.float32),
                    "rgb": rng.integers(0, 255, (t + 1, 2, 8, 8, 3), dtype=np.uint8)},
                   rng.normal(size=(t, 7)).astype(np.float32), np.arange(t, dtype=np.float32),
                   np.array([False] * (t - 1) + [True]), "do the thing", seed)


def test_roundtrip(tmp_path):
    eps = [_episode(4, 1), _episode(6, 2)]
    path = write_episodes(tmp_path / "d.h5", eps, {"task": "X"})
    assert read_meta(path)["num_episodes"] == 2
    back = list(load_episodes(path))
    for a, b in zip(eps, back):
        for k in a.obs:
            np.testing.assert_array_equal(a.obs[k], b.obs[k])
        np.testing.assert_array_equal(a.actions, b.actions)
        assert b.instruction == "do the thing" and b.seed == a.seed and b.succeeded
    assert not list(tmp_path.glob(".*tmp*"))


def _sparse_episode(t=9, every=4, seed=3):
    full = _episode(t, seed)
    steps = np.arange(0, t + 1, every)
    return full, Episode({"state": full.obs["state"], "rgb": full.obs["rgb"][steps]}, full.actions, full.rewards,
                         full.success, full.instruction, full.seed, frame_steps=steps)


def test_episodes_with_every_kth_frame_roundtrip_and_train_on_their_frames(tmp_path):
    """Images recorded at steps 0, 4, 8 of a 9-step episode: the file keeps them with their steps; SFT rows are
    those three steps (each has an action after it), each with its own chunk target."""
    from robo_rl.runners.offline import flatten

    full, sparse = _sparse_episode()
    path = write_episodes(tmp_path / "d.h5", [sparse, _episode(4, 5)], {"task": "X"})
    back = list(load_episodes(path))
    np.testing.assert_array_equal(back[0].frame_steps, [0, 4, 8])
    np.testing.assert_array_equal(back[0].obs["rgb"], full.obs["rgb"][[0, 4, 8]])
    assert back[1].frame_steps is None
    rows = flatten([back[0], back[1]], ["rgb", "state"], horizon=3)
    assert len(rows.instruction) == 3 + 4
    np.testing.assert_array_equal(rows.obs["rgb"][:3], full.obs["rgb"][[0, 4, 8]])
    np.testing.assert_array_equal(rows.obs["state"][:3], full.obs["state"][[0, 4, 8]])
    np.testing.assert_array_equal(rows.actions[1], full.actions[4:7])
    np.testing.assert_array_equal(rows.valid[2], [True, False, False])  # step 8 of 9: one action left
    state_rows = flatten([back[0]], ["state"], horizon=1)  # a state-only policy trains on every step
    assert len(state_rows.instruction) == 9


@pytest.mark.parametrize("steps, msg", [([0, 4, 4], "ascending integer steps within 0..9"),
                                        ([0, 4, 10], "ascending integer steps within 0..9"),
                                        ([0, 4], r"obs/rgb has 3 steps, expected one per frame_steps entry = 2")])
def test_bad_frame_steps_are_one_line_errors(tmp_path, steps, msg):
    _, sparse = _sparse_episode()
    path = write_episodes(tmp_path / "d.h5", [sparse], {})
    with h5py.File(path, "a") as f:
        del f["episode_000000/frame_steps"]
        f.create_dataset("episode_000000/frame_steps", data=np.asarray(steps))
    with pytest.raises(DatasetError, match=msg):
        list(load_episodes(path))
    sparse.frame_steps = np.asarray(steps)
    with pytest.raises(DatasetError, match=msg):  # nothing unreadable is written
        write_episodes(tmp_path / "e.h5", [sparse], {})


def test_malformed_files_are_one_line_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        list(load_episodes(tmp_path / "nope.h5"))
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(DatasetError, match="not a readable HDF5"):
        list(load_episodes(tmp_path / "junk.h5"))
    path = write_episodes(tmp_path / "d.h5", [_episode()], {})
    with h5py.File(path, "a") as f:
        del f["episode_000000/obs/state"]
        f.create_dataset("episode_000000/obs/state", data=np.zeros((2, 5), np.float32))
    with pytest.raises(DatasetError, match=r"episode_000000: obs/state has 2 steps, expected T\+1 = 5"):
        list(load_episodes(path))
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_group("data")
    with pytest.raises(DatasetError, match="read_libero_demos"):
        list(load_episodes(tmp_path / "other.h5"))


def _write_libero(path, demos=2, t=5):
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"language_instruction": "put the bowl on the plate"})
        for i in range(demos):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=np.full((t, 7), i, np.float32))
            img = np.zeros((t, 8, 8, 3), np.uint8)
            img[:, 0, 0] = 255  # top-left pixel in LIBERO's upside-down frame
            g.create_dataset("obs/agentview_rgb", data=img)
            g.create_dataset("obs/eye_in_hand_rgb", data=img)
            g.create_dataset("obs/ee_pos", data=np.ones((t, 3)))
            g.create_dataset("obs/ee_ori", data=np.zeros((t, 3)))
            g.create_dataset("obs/gripper_states", data=np.zeros((t, 2)))
            g.create_dataset("rewards", data=np.r_[np.zeros(t - 1), 1.0])
            g.create_dataset("dones", data=np.r_[np.zeros(t - 1), 1].astype(np.uint8))


def test_official_libero_hdf5(tmp_path):
    _write_libero(tmp_path / "libero.hdf5")
    eps = list(read_libero_demos(tmp_path / "libero.hdf5"))
    assert len(eps) == 2 and eps[1].actions[0, 0] == 1.0
    ep = eps[0]
    assert ep.obs["rgb"].shape == (6, 2, 8, 8, 3) and ep.obs["state"].shape == (6, 8)
    assert ep.obs["rgb"][0, 0, -1, -1, 0] == 255  # turned upright (180 degrees)
    assert ep.instruction == "put the bowl on the plate" and ep.succeeded
    path = write_episodes(tmp_path / "converted.h5", eps, {"source": "libero"})
    assert len(list(load_episodes(path))) == 2
    with h5py.File(tmp_path / "libero.hdf5", "a") as f:
        del f["data/demo_1/obs/ee_pos"]
    with pytest.raises(DatasetError, match="demo_1 lacks 'ee_pos'"):
        list(read_libero_demos(tmp_path / "libero.hdf5"))
    with h5py.File(tmp_path / "libero.hdf5", "a") as f:
        del f["data/demo_0/rewards"]
        f.create_dataset("data/demo_0/rewards", data=np.zeros(3, np.float32))
    with pytest.raises(DatasetError, match=r"demo_0: rewards/dones must be \(5,\), got \(3,\)"):
        next(read_libero_demos(tmp_path / "libero.hdf5"))


@pytest.mark.maniskill
def test_demos_generate_cli_roundtrip(tmp_path, need_maniskill):
    out = tmp_path / "pick.h5"
    proc = run_cli("demos", "generate", "--task", "PickCube-v1", "--episodes", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["episodes"] == 3
    eps = list(load_episodes(out))
    assert len(eps) == 3 and all(e.succeeded for e in eps)  # the planner solves these seeds
    assert read_meta(out)["control_mode"] == "pd_joint_pos"
    for e in eps:
        assert e.obs["state"].shape[0] == e.length + 1 and e.actions.shape[1] == 8

    # converted to joint deltas, the same seeds replayed open loop in a real env still succeed
    delta = tmp_path / "pick_delta.h5"
    proc = run_cli("demos", "convert", str(out), "--control-mode", "pd_joint_delta_pos", "--out", str(delta))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_meta(delta)["control_mode"] == "pd_joint_delta_pos"
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401

    env = gym.make("PickCube-v1", obs_mode="state", control_mode="pd_joint_delta_pos", num_envs=1,
                   sim_backend="physx_cpu", max_episode_steps=200)
    for e, d in zip(eps, load_episodes(delta)):
        assert np.abs(d.actions[:, :7]).max() <= 1.0 and np.array_equal(d.actions[:, 7], e.actions[:, 7])
        env.reset(seed=e.seed)
        success = False
        for a in d.actions:
            obs, _, _, _, info = env.step(a[None])
            success = success or bool(info["success"][0])
        assert success
        np.testing.assert_allclose(np.asarray(obs)[0, :7], e.obs["state"][-1, :7], atol=0.02)
    env.close()


def test_convert_refuses_what_it_cannot_do_exactly():
    from sims.maniskill.convert import convert

    ep = _episode(4, 1)
    ep = Episode({"state": np.zeros((5, 9), np.float32)}, np.zeros((4, 8), np.float32), ep.rewards, ep.success, seed=3)
    assert convert(ep, "pd_joint_pos", "pd_joint_delta_pos").actions.shape == (4, 8)
    ep.actions[2, 1] = 0.5  # a 0.5 rad jump in one control step
    with pytest.raises(DatasetError, match="seed 3.*step 2 moves a joint by 0.500 rad"):
        convert(ep, "pd_joint_pos", "pd_joint_delta_pos")
    with pytest.raises(DatasetError, match="supported: pd_joint_pos -> pd_joint_delta_pos"):
        convert(ep, "pd_ee_delta_pose", "pd_joint_delta_pos")


def test_convert_cli_drops_unconvertible_episodes_only_when_asked(tmp_path):
    base = _episode(4, 1)
    good = Episode({"state": np.zeros((5, 9), np.float32)}, np.zeros((4, 8), np.float32), base.rewards, base.success, seed=1)
    bad = Episode({"state": np.zeros((5, 9), np.float32)}, np.zeros((4, 8), np.float32), base.rewards, base.success, seed=2)
    bad.actions[1, 0] = 0.3
    src = write_episodes(tmp_path / "src.h5", [good, bad], {"control_mode": "pd_joint_pos"})
    proc = cli_in_process("demos", "convert", str(src), "--control-mode", "pd_joint_delta_pos", "--out", str(tmp_path / "a.h5"))
    assert proc.returncode == 2 and "seed 2" in proc.stderr and not (tmp_path / "a.h5").exists()
    proc = run_cli("demos", "convert", str(src), "--control-mode", "pd_joint_delta_pos", "--out", str(tmp_path / "b.h5"),
                   "--drop-unconvertible")
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert json.loads(proc.stdout)["dropped_unconvertible"] == 1
    assert [e.seed for e in load_episodes(tmp_path / "b.h5")] == [1] and read_meta(tmp_path / "b.h5")["dropped_seeds"] == [2]


@pytest.mark.libero
def test_libero_scripted_expert_solves_and_roundtrips(tmp_path, need_libero):
    out = tmp_path / "libero.h5"
    proc = run_cli("demos", "generate", "--sim", "libero", "--task", "libero_object/0", "--episodes", "1",
                   "--image-size", "64", "--out", str(out), env={"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (ep,) = list(load_episodes(out))
    assert ep.succeeded and "basket" in ep.instruction
    assert ep.obs["rgb"].shape == (ep.length + 1, 2, 64, 64, 3) and ep.actions.shape == (ep.length, 7)


def test_bc_pools_several_demo_files_and_refuses_overlap_or_mismatch(tmp_path):
    """algo.dataset may list files: their episodes pool; overlapping seed ranges (the same episodes twice)
    or another control mode are one-line errors naming the files."""
    from robo_rl.algorithms.bc import BCConfig
    from robo_rl.config import from_dict
    from robo_rl.errors import ConfigError
    from robo_rl.runners.offline import load_demos

    meta = {"env": "maniskill", "task": "PushCube-v1", "control_mode": "pd_joint_delta_pos", "obs_mode": "state"}
    a = write_episodes(tmp_path / "a.h5", [_episode(), _episode()], {**meta, "seed": 0, "attempts": 2})
    b = write_episodes(tmp_path / "b.h5", [_episode()] * 3, {**meta, "seed": 100, "attempts": 3})
    overlap = write_episodes(tmp_path / "c.h5", [_episode()], {**meta, "seed": 1, "attempts": 1})
    other = write_episodes(tmp_path / "d.h5", [_episode()], {**meta, "control_mode": "pd_ee_delta_pose", "seed": 200})
    eps, first = load_demos([str(a), str(b)], ["state"], only_success=False, max_episodes=None)
    assert len(eps) == 5 and first["seed"] == 0
    assert len(load_demos(str(b), ["state"], only_success=False, max_episodes=None)[0]) == 3
    with pytest.raises(ConfigError, match="seeds 0..1.*seeds 1..1.*disjoint --seed"):
        load_demos([str(a), str(overlap)], ["state"], only_success=False, max_episodes=None)
    with pytest.raises(ConfigError, match="different control_mode"):
        load_demos([str(a), str(other)], ["state"], only_success=False, max_episodes=None)
    cfg = from_dict(BCConfig, {"dataset": [str(a), str(b)]})
    assert cfg.dataset == [str(a), str(b)]


def test_parallel_expert_workers_give_the_serial_episodes(tmp_path, need_maniskill):
    """``demos generate --workers 2``: the same seeds, in order, with the same actions as one process."""
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    for out, workers in ((one, "1"), (two, "2")):
        proc = run_cli("demos", "generate", "--task", "PushCube-v1", "--episodes", "3", "--seed", "40",
                       "--workers", workers, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = list(load_episodes(one)), list(load_episodes(two))
    assert [e.seed for e in a] == [e.seed for e in b] == [40, 41, 42]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.actions, y.actions, atol=1e-6)
        np.testing.assert_allclose(x.obs["state"], y.obs["state"], atol=1e-5)
    proc = cli_in_process("demos", "generate", "--task", "PushCube-v1", "--episodes", "1", "--workers", "0",
                   "--out", str(tmp_path / "bad.h5"))
    assert proc.returncode != 0 and "--workers 0 must be >= 1" in proc.stderr


@pytest.mark.maniskill
def test_scripted_ee_expert_records_clean_labels_that_replay(tmp_path, need_maniskill):
    """``demos generate --expert scripted``: end-effector-delta demos that succeed; with DART noise the
    recorded labels are the expert's clean actions (step <= 5 cm, i.e. norm <= 0.5), not the perturbed ones
    it executed; and clean demos replayed open loop in a real env succeed again."""
    noisy, clean = tmp_path / "noisy.h5", tmp_path / "clean.h5"
    for out, noise, robot in ((noisy, "0.3", ["--robot", "panda_wristcam"]), (clean, "0", [])):
        proc = run_cli("demos", "generate", "--task", "PickCube-v1", "--expert", "scripted", "--noise", noise,
                       "--episodes", "2", "--seed", "3", "--out", str(out), *robot)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert read_meta(out)["control_mode"] == "pd_ee_delta_pos"
        assert read_meta(out).get("robot_uids") == (robot[1] if robot else None)
    for e in load_episodes(noisy):
        assert e.actions.shape[1] == 4 and set(np.unique(e.actions[:, 3])) <= {-1.0, 1.0}
        assert np.linalg.norm(e.actions[:, :3], axis=1).max() <= 0.5 + 1e-5
    eps = list(load_episodes(clean))
    assert all(e.succeeded for e in eps) and all(e.length <= 50 for e in eps)
    assert [e.seed for e in eps] == [3, 4]
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401

    env = gym.make("PickCube-v1", obs_mode="state", control_mode="pd_ee_delta_pos", num_envs=1,
                   sim_backend="physx_cpu")
    for e in eps:
        env.reset(seed=e.seed, options={"reconfigure": True})
        success = False
        for a in e.actions:
            _, _, _, _, info = env.step(a[None])
            success = success or bool(info["success"][0])
        assert success
    env.close()
    proc = run_cli("demos", "generate", "--task", "PickCube-v1", "--noise", "0.1", "--episodes", "1",
                   "--out", str(tmp_path / "bad.h5"))
    assert proc.returncode != 0 and "only the scripted experts take it" in proc.stderr


def test_libero_only_success_drops_failed_attempts(monkeypatch):
    """Logic only (fake env and expert): failed attempts are reported but not kept, and attempts go on
    (3 x episodes at most) until enough succeed."""
    import sims.libero.experts as ex

    class FakeEnv:
        class task:
            instruction = "put it there"

        def __init__(self, cfg, index):
            self.seed = None

        def reset(self, seed):
            self.seed, self.t = seed, 0
            return {"rgb": np.zeros((2, 4, 4, 3), np.uint8), "state": np.zeros(3, np.float32)}

        def step(self, a):
            self.t += 1
            done = self.t == 2
            obs = {"rgb": np.zeros((2, 4, 4, 3), np.uint8), "state": np.full(3, self.t, np.float32)}
            return obs, 0.0, done and self.seed % 2 == 0, done, {"success": done and self.seed % 2 == 0}

        def close(self):
            pass

    monkeypatch.setattr(ex, "LiberoSingleEnv", FakeEnv)
    monkeypatch.setattr(ex, "PickPlaceExpert", lambda env: type("E", (), {"act": lambda self, s: np.zeros(7, np.float32)})())
    seen = []
    eps = list(ex.generate("libero_object", 0, 2, seed=1, only_success=True, on_episode=lambda ep, k: seen.append((ep.seed, k))))
    assert [e.seed for e in eps] == [2, 4] and all(e.succeeded for e in eps)
    assert seen == [(1, False), (2, True), (3, False), (4, True)]
    assert [e.seed for e in ex.generate("libero_object", 0, 2, seed=1)] == [1, 2]  # without the flag: all kept
    assert [e.seed for e in ex.generate("libero_object", 0, 5, seed=1, only_success=True, max_attempts=3)] == [2]


def test_libero_demos_bad_task_index_and_maniskill_flags_are_one_line_errors(tmp_path):
    out = tmp_path / "x.h5"
    proc = cli_in_process("demos", "generate", "--sim", "libero", "--task", "libero_object/first", "--out", str(out))
    assert proc.returncode == 2 and "integer index, e.g. libero_object/0" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli_in_process("demos", "generate", "--sim", "libero", "--task", "libero_object/0", "--workers", "4",
                   "--noise", "0.1", "--out", str(out))
    assert proc.returncode == 2 and "--workers, --noise apply to --sim maniskill only" in proc.stderr
    assert not out.exists()


def test_more_malformed_files_and_unwritable_episodes_are_one_line_errors(tmp_path):
    path = write_episodes(tmp_path / "d.h5", [_episode(), _episode(seed=2)], {})
    with h5py.File(path, "a") as f:  # a fixed-length bytes tag is still our format
        f.attrs["format"] = np.bytes_(b"robo-rl-episodes")
    assert len(list(load_episodes(path))) == 2
    for attr, value in (("meta", json.dumps([1, 2])), ("meta", np.int64(3))):
        with h5py.File(path, "a") as f:
            f.attrs[attr] = value
        with pytest.raises(DatasetError, match="no readable 'meta' attribute"):
            read_meta(path)
    path = write_episodes(tmp_path / "e.h5", [_episode(), _episode(seed=2)], {})
    with h5py.File(path, "a") as f:
        del f["episode_000001/actions"]
        f.create_dataset("episode_000001/actions", data=np.zeros((4, 2), np.float32))
    with pytest.raises(DatasetError, match=r"episode_000001: actions is \(2,\) per step but the first episode's is \(7,\)"):
        list(load_episodes(path))
    with h5py.File(path, "a") as f:
        del f["episode_000000/obs"]
        f.create_dataset("episode_000000/obs", data=np.zeros(3))
    with pytest.raises(DatasetError, match="obs must be a group"):
        list(load_episodes(path))
    bad = _episode()
    bad.obs["state"] = bad.obs["state"][:, 0]  # (T+1,) instead of (T+1, D)
    with pytest.raises(DatasetError, match=r"episode 0 for .*obs/state must be \(T\+1, D\), got shape \(5,\)"):
        write_episodes(tmp_path / "f.h5", [bad], {})
    short = _episode()
    short.obs["state"] = short.obs["state"][:-1]
    with pytest.raises(DatasetError, match=r"obs/state has 4 steps, expected T\+1 = 5"):
        write_episodes(tmp_path / "f.h5", [short], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5", "e.h5"]  # nothing written, no temp file


def test_demos_that_keep_no_episode_write_nothing_and_say_why(tmp_path, monkeypatch, capsys):
    """Logic only (the expert faked): no episode kept -> one line, no file; the reason depends on --only-success."""
    import sims.maniskill.experts as ex
    from robo_rl.cli import main

    def generate(*a, on_episode=None, only_success=False, **k):
        for seed in range(2):
            ep = _episode(seed=seed)
            ep.success[:] = False
            if on_episode:
                on_episode(ep, not only_success)
            if not only_success:
                yield ep

    monkeypatch.setattr(ex, "generate", lambda *a, **k: iter(()))
    assert main(["demos", "generate", "--episodes", "2", "--out", str(tmp_path / "a.h5")]) == 2
    assert "the expert produced no episode on PickCube-v1" in capsys.readouterr().err
    monkeypatch.setattr(ex, "generate", generate)
    assert main(["demos", "generate", "--episodes", "2", "--only-success", "--out", str(tmp_path / "a.h5")]) == 2
    assert "succeeded in none of 2 attempts on PickCube-v1, so --only-success kept nothing" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _libero_demos(path, task: str, seed: int = 0, image_size: int = 32):
    ep = Episode({"rgb": np.zeros((3, 2, image_size, image_size, 3), np.uint8), "state": np.zeros((3, 8), np.float32)},
                 np.zeros((2, 7), np.float32), np.zeros(2, np.float32), np.array([False, True]), "put the bowl", seed)
    return write_episodes(path, [ep], {"env": "libero", "task": task, "control_mode": "OSC_POSE delta + gripper",
                                       "obs_mode": "rgb", "image_size": image_size, "seed": seed, "num_episodes": 1})


@pytest.mark.parametrize("env,files,msg", [
    ({"suite": "libero_spatial", "task_ids": [0]}, [("libero_object/0", 32)], "outside env.suite='libero_spatial'"),
    ({"suite": "libero_spatial", "task_ids": [1]}, [("libero_spatial/0", 32)], r"task_ids=\[1\]"),
    ({"suite": "libero_spatial", "task_ids": [0], "image_size": 64}, [("libero_spatial/0", 32)],
     "recorded at 32 px but env.image_size is 64"),
    ({"suite": "libero_spatial", "task_ids": [0], "fast_render": True}, [("libero_spatial/0", 32)],
     "recorded with fast_render false but env.fast_render is true .*; set env.fast_render: false"),
])
def test_libero_demos_that_do_not_fit_the_env_are_refused_before_any_env_starts(tmp_path, env, files, msg):
    from robo_rl.config import from_dict
    from robo_rl.errors import ConfigError
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.offline import check_offline_config

    paths = [str(_libero_demos(tmp_path / f"d{i}.h5", task, seed=0, image_size=size))
             for i, (task, size) in enumerate(files)]
    cfg = from_dict(TrainConfig, {"env": {"name": "libero", "image_size": 32, **env},
                                  "policy": {"name": "pi0", "arch": "small"},
                                  "algo": {"name": "bc", "dataset": paths}})
    with pytest.raises(ConfigError, match=msg):
        check_offline_config(cfg)


def test_libero_demos_of_two_suites_do_not_pool(tmp_path):
    from robo_rl.errors import ConfigError
    from robo_rl.runners.offline import load_demos

    paths = [str(_libero_demos(tmp_path / "a.h5", "libero_spatial/0")), str(_libero_demos(tmp_path / "b.h5", "libero_object/1"))]
    with pytest.raises(ConfigError, match="pools LIBERO files of different suites"):
        load_demos(paths, ["rgb", "state"], False, None)


def test_libero_demos_of_several_tasks_pool_into_one_dataset(tmp_path):
    from robo_rl.runners.offline import load_demos

    paths = [str(_libero_demos(tmp_path / f"d{i}.h5", f"libero_spatial/{i}", seed=0)) for i in range(3)]
    eps, meta = load_demos(paths, ["rgb", "state"], False, None)
    assert len(eps) == 3 and meta["env"] == "libero"  # same seeds, different tasks: different episodes


def test_frame_every_is_checked_and_libero_only(tmp_path):
    out = tmp_path / "x.h5"
    proc = cli_in_process("demos", "generate", "--sim", "libero", "--task", "libero_spatial/0", "--frame-every", "0",
                   "--out", str(out))
    assert proc.returncode == 2 and "--frame-every 0 must be >= 1" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli_in_process("demos", "generate", "--task", "PushCube-v1", "--frame-every", "4", "--out", str(out))
    assert proc.returncode == 2 and "--frame-every apply to --sim libero only" in proc.stderr, proc.stderr[-800:]
    assert not out.exists()
