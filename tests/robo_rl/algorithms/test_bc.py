"""SFT/BC end to end on real ManiSkill3 PickCube demos: `robo-rl train` with algo bc writes a run
directory and checkpoint; PPO starts from it with run.init_from; a demos/env mismatch is one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.conftest import cli_in_process, interrupt_cli_after_rows, run_cli

pytestmark = pytest.mark.maniskill

BC_CONFIG = {
    "env": {"name": "maniskill", "task": "PickCube-v1", "num_envs": 1, "control_mode": "pd_joint_pos", "max_episode_steps": 20},
    "policy": {"name": "mlp", "hidden": [64, 64]},
    "algo": {"name": "bc", "dataset": "DEMOS", "batch_size": 16, "epochs": 2, "log_every": 5, "lr": 1e-3, "val_fraction": 0.34},
    "run": {"eval_num_envs": 1, "final_eval_episodes": 1, "progress": False, "video": False},
}


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demos") / "pick.h5"
    proc = run_cli("demos", "generate", "--task", "PickCube-v1", "--episodes", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture
def bc_config(demos, tmp_path) -> str:
    cfg = yaml.safe_load(yaml.safe_dump(BC_CONFIG))
    cfg["algo"]["dataset"] = str(demos)
    path = tmp_path / "bc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_bc_then_ppo_from_it(bc_config, tmp_path, need_maniskill):
    proc = run_cli("train", "--json", bc_config, f"run.out_dir={tmp_path}", "run.name=sft")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["gradient_steps"] > 5 and Path(summary["checkpoint"], "model.safetensors").is_file()
    rows = list(csv.DictReader(open(tmp_path / "sft" / "metrics.csv")))
    nll = [float(r["loss/nll"]) for r in rows]
    assert nll[-1] < nll[0] and rows[-1]["loss/val_nll"] != ""
    assert summary["final_eval"]["episodes"] == 1
    proc = run_cli("train", "--json", "configs/quickstart.yaml", "env.task=PickCube-v1", "env.num_envs=2",
                   "env.control_mode=pd_joint_pos", "env.max_episode_steps=20", "policy.hidden=[64,64]",
                   "run.total_env_steps=32", "run.rollout_steps=16", "run.eval_every_steps=0", "run.final_eval_episodes=0",
                   "run.progress=false", "run.video=false", f"run.init_from={tmp_path / 'sft'}",
                   f"run.out_dir={tmp_path}", "run.name=ppo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy initialised from" in proc.stderr
    # the input statistics the SFT'd weights were fit to: updated by rollouts unless run.freeze_obs_stats
    proc = run_cli("train", "--json", str(tmp_path / "ppo" / "config.yaml"), "run.name=ppo_frozen", "run.freeze_obs_stats=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = {name: _obs_stats(tmp_path / name) for name in ("sft", "ppo", "ppo_frozen")}
    assert stats["ppo"]["obs_norm.count"] > stats["sft"]["obs_norm.count"]
    assert all(torch.equal(stats["sft"][k], v) for k, v in stats["ppo_frozen"].items()) and len(stats["sft"]) == 3


def _obs_stats(run_dir: Path) -> dict:
    """The running observation statistics in a run's latest checkpoint."""
    from robo_rl.checkpoint import load_model_state, resolve

    return {k: v for k, v in load_model_state(resolve(run_dir)).items() if k.startswith("obs_norm.")}


def test_bc_control_mode_mismatch_is_one_line(bc_config, tmp_path, need_maniskill):
    proc = cli_in_process("train", "--json", bc_config, "env.control_mode=pd_joint_delta_pos", f"run.out_dir={tmp_path}")
    assert proc.returncode == 2
    assert "robo-rl: error: the demonstrations' actions are 'pd_joint_pos' but env.control_mode is 'pd_joint_delta_pos'" in proc.stderr
    # demos of the task's own robot, trained on the wrist-camera Panda: the other cameras, refused
    proc = cli_in_process("train", "--json", bc_config, "env.extra={robot_uids: panda_wristcam}", f"run.out_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("robo-rl: error: the demonstrations were recorded with robot the task default but env.extra.robot_uids "
            "is panda_wristcam; remove env.extra.robot_uids") in proc.stderr


def test_eval_over_ros2_matches_direct_eval(bc_config, tmp_path, need_maniskill):
    """The same checkpoint evaluated in sim and through the ROS 2 bridge against the simulated robot
    process: one episode from the same seed, same success and (deterministic sim) the same return."""
    proc = run_cli("train", "--json", bc_config, f"run.out_dir={tmp_path}", "run.name=bc", "run.final_eval_episodes=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "bc"
    direct = run_cli("eval", str(run), "--episodes", "1", "--num-envs", "1", "--seed", "7", "--no-video",
                     "--out", str(tmp_path / "evals" / "direct.json"))
    assert direct.returncode == 0, direct.stderr[-3000:]
    # a shell's CYCLONEDDS_URI (here: multicast on) must not split the node from the simulated robot
    shell = '<CycloneDDS><Domain><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces></General></Domain></CycloneDDS>'
    ros = run_cli("eval", str(run), "--episodes", "1", "--seed", "7", "--via-ros", "configs/robots/panda_sim_state.yaml",
                  "--out", str(tmp_path / "evals" / "ros.json"), env={"CYCLONEDDS_URI": shell})
    assert ros.returncode == 0, ros.stderr[-3000:]
    d, r = json.loads(direct.stdout), json.loads(ros.stdout)
    # --out holds the same JSON, and the two files pair up in robo-rl compare
    assert json.loads((tmp_path / "evals" / "direct.json").read_text()) == d
    assert json.loads((tmp_path / "evals" / "ros.json").read_text()) == r
    cmp = run_cli("compare", "--a", str(tmp_path / "evals" / "direct.json"), "--b", str(tmp_path / "evals" / "ros.json"))
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert json.loads(cmp.stdout)["paired"]["difference"] == 0
    assert r["episodes"] == 1 and r["via"].startswith("ros2") and not r["rejected"]
    assert r["successes"] == d["successes"] and r["episode_success"] == d["episode_success"]  # pairs in compare
    assert abs(r["mean_return"] - d["mean_return"]) < 1e-3 * max(1.0, abs(d["mean_return"])), (d, r)


def test_demo_chunks_for_chunk_policies():
    from robo_rl.data.episodes import Episode
    from robo_rl.runners.offline import flatten

    acts = np.arange(6, dtype=np.float32).reshape(3, 2)  # 3 steps, 2-D actions
    ep = Episode({"state": np.zeros((4, 1), np.float32)}, acts, np.zeros(3, np.float32), np.array([0, 0, 1], bool))
    d = flatten([ep], ["state"], horizon=2)
    assert d.actions.shape == (3, 2, 2) and d.valid.tolist() == [[True, True], [True, True], [True, False]]
    np.testing.assert_array_equal(d.actions[1], acts[1:3])
    np.testing.assert_array_equal(d.actions[2, 0], acts[2])
    np.testing.assert_array_equal(d.step_actions, acts)
    obs, chunk, valid = d.batch(np.array([2]))
    assert chunk.shape == (1, 2, 2) and valid.tolist() == [[True, False]]


@pytest.fixture(scope="module")
def rgb_demos(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demos") / "pick_rgb.h5"
    proc = run_cli("demos", "generate", "--task", "PickCube-v1", "--episodes", "2", "--obs-mode", "rgb",
                   "--image-size", "32", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    delta = out.with_name("pick_rgb_delta.h5")
    proc = run_cli("demos", "convert", str(out), "--control-mode", "pd_joint_delta_pos", "--out", str(delta))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return delta


@pytest.fixture(scope="module")
def pi0_runs(rgb_demos, tmp_path_factory) -> dict:
    """The pi0 pipeline at toy scale, shared by the tests below: flow-matching SFT on the rgb demo chunks
    (``sft/``), PPO from it (``ppo/``), a 4-episode RL^2 log of the SFT policy (``steer.npz``) and steering
    heads fitted on it (``steering/``). Returns the directory and each command's parsed output."""
    tmp = tmp_path_factory.mktemp("pi0")
    common = ["env.obs_mode=rgb", "env.image_size=32", "env.num_envs=2", "env.max_episode_steps=12",
              "policy.arch=tiny", "policy.exec_steps=3", "policy.max_prompt_tokens=64", f"run.out_dir={tmp}",
              "run.progress=false", "run.video=false", "run.eval_num_envs=2"]
    proc = run_cli("train", "--json", "configs/pi0_small_sft_pickcube.yaml", *common, f"algo.dataset={rgb_demos}",
                   "algo.epochs=1", "algo.batch_size=16", "algo.log_every=2", "algo.image_shift=2", "run.max_minutes=null",
                   "run.final_eval_episodes=2", "run.name=sft")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {"dir": tmp, "sft": json.loads(proc.stdout)}
    proc = run_cli("train", "--json", "configs/pi0_small_ppo_pickcube.yaml", *common, "run.total_env_steps=48",
                   "run.rollout_steps=4", "run.final_eval_episodes=0", "run.eval_every_steps=0",
                   f"run.init_from={tmp / 'sft'}", "run.name=ppo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("steer", "collect", str(tmp / "sft"), "--episodes", "4", "--out", str(tmp / "steer.npz"), "--num-envs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["collect"] = json.loads(proc.stdout)
    proc = run_cli("steer", "fit", str(tmp / "sft"), "--log", str(tmp / "steer.npz"), "--out", str(tmp / "steering"),
                   "--steps", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["fit"] = json.loads(proc.stdout)
    return out


def test_pi0_flow_sft_then_ppo_with_chunks_in_maniskill(pi0_runs, need_maniskill):
    """The pi0 pipeline end to end at toy scale: flow-matching SFT on demo chunks from rgb, then PPO
    (Flow-SDE) whose 3-step chunks run inside the VecEnv workers; then RL^2 on the SFT policy: a rollout
    log, steering heads fitted on it, evaluated steering every call, fine-tuned online; bad steering input
    refused in one line."""
    tmp_path = pi0_runs["dir"]
    assert pi0_runs["sft"]["gradient_steps"] >= 4 and pi0_runs["sft"]["final_eval"]["episodes"] == 2
    rows = list(csv.DictReader(open(tmp_path / "ppo" / "metrics.csv")))
    assert rows and int(rows[-1]["env_steps"]) >= 48  # counted in control steps: 2 envs x 4 chunks x 3 steps per iteration

    # RL^2 offline stage on the SFT policy: log rollouts, fit the steering heads, evaluate them
    log = tmp_path / "steer.npz"
    assert pi0_runs["collect"]["episodes"] == 4 and "auroc_train" in pi0_runs["fit"]
    proc = run_cli("steer", "eval", str(tmp_path / "sft"), "--steering", str(tmp_path / "steering"),
                   "--episodes", "2", "--num-envs", "2", "--mode", "always")
    assert proc.returncode == 0 and json.loads(proc.stdout)["steered_fraction"] == 1.0, proc.stderr[-3000:]
    # 4 episodes: the held-out split is one episode, one class: --tau auto is refused before any training
    for bad, fragment in ((["--tau", "auto"], "held-out episodes"), (["--tau", "1.5"], "not a probability"),
                          (["--temperature", "0"], "temperature must be > 0"), (["--gae-lambda", "2"], "GAE lambda")):
        proc = cli_in_process("steer", "fit", str(tmp_path / "sft"), "--log", str(log), "--out", str(tmp_path / "auto"), *bad)
        assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "auto").exists()
    proc = cli_in_process("steer", "collect", str(tmp_path / "sft"), "--episodes", "2", "--out", str(tmp_path / "e.npz"),
                          "--explore", "-1")
    assert proc.returncode == 2 and "--explore" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]

    # bad steering input: one line each, before any rollout or fitting, and nothing of the user's overwritten
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    small = tmp_path / "small.npz"  # a log of another image size
    np.savez(small, rgb=np.zeros((6, 1, 8, 8, 3), np.uint8), actions=np.zeros((6, 3, 8), np.float32),
             rtg=np.zeros(6, np.float32), failed=np.zeros(6, bool), episode=np.repeat(np.arange(2), 3),
             instruction=np.array(["pick"] * 6))
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "bad_steering").mkdir()
    (tmp_path / "bad_steering" / "steering.json").write_text("{not json")
    sft = str(tmp_path / "sft")
    for argv, fragment in (
            (["fit", sft, "--log", str(log), "--out", str(tmp_path / "mine")], "exists and is not a steering directory"),
            (["fit", sft, "--log", str(log), "--out", str(tmp_path / "b"), "--beta", "-1"], "beta=-1.0: the steering scale"),
            (["fit", sft, "--log", str(log), "--out", str(tmp_path / "b"), "--steps", "0"], "--steps 0 must be >= 1"),
            (["fit", sft, "--log", str(small), "--out", str(tmp_path / "b")], "has images (1, 8, 8, 3) but the base policy takes"),
            (["fit", sft, "--log", str(tmp_path / "broken.npz"), "--out", str(tmp_path / "b")], "is not a readable .npz"),
            (["eval", sft, "--steering", str(tmp_path / "bad_steering"), "--episodes", "1"], "unusable steering.json"),
            (["eval", sft, "--steering", str(tmp_path / "steering"), "--episodes", "0"], "--episodes 0 must be >= 1"),
            (["collect", sft, "--episodes", "0", "--out", str(tmp_path / "c.npz")], "--episodes 0 must be >= 1"),
            (["collect", sft, "--episodes", "1", "--explore", "nan", "--out", str(tmp_path / "c.npz")], "finite number >= 0"),
            (["collect", sft, "--episodes", "1", "--out", str(tmp_path / "mine")], "is a directory; pass a file path"),
            (["fit", sft, "--log", str(log), "--out", str(tmp_path / "b"), "--gate", "conformal", "--alpha", "1.5"],
             "is in (0, 1)"),
            (["fit", sft, "--log", str(log), "--out", str(tmp_path / "b"), "--gate", "conformal", "--alpha", "0.05"],
             "needs >= 19 successful calibration episodes")):
        proc = cli_in_process("steer", *argv)
        assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr[-2000:])
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" and not (tmp_path / "b").exists()
    assert not (tmp_path / "c.npz").exists()
    proc = cli_in_process("steer", "eval", str(tmp_path / "sft"), "--steering", str(tmp_path / "steering"), "--beta", "0")
    assert proc.returncode == 2 and "steering scale" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli_in_process("steer", "fit", str(tmp_path / "ppo"), "--log", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr

    # online RL^2: the steering head fine-tuned in the env; only the head's weights change
    from safetensors.torch import load_file

    proc = run_cli("steer", "online", sft, "--steering", str(tmp_path / "steering"), "--out", str(tmp_path / "online"),
                   "--iterations", "1", "--episodes", "2", "--num-envs", "2", "--epochs", "1", "--lr", "0.01",
                   "--tau", "0")  # p_fail > 0: every call steered
    assert proc.returncode == 0, proc.stderr[-3000:]
    online = json.loads(proc.stdout)["online"]
    assert len(online) == 1 and online[0]["steered_calls"] > 0
    before, after = load_file(str(tmp_path / "steering" / "heads.safetensors")), load_file(str(tmp_path / "online" / "heads.safetensors"))
    assert set(before) == set(after)
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("head."))
    # a log of another base policy (the PPO run's) is refused for this one, in one line
    with np.load(log) as real:
        assert len(set(real["base_id"].tolist())) == 1
    proc = cli_in_process("steer", "fit", str(tmp_path / "ppo"), "--log", str(log), "--out", str(tmp_path / "other"))
    assert proc.returncode == 2 and "was collected with another base policy" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_pi0_steering_variants_end_to_end(pi0_runs, need_maniskill):
    """RL^2's other steering choices through the CLI on the pi0 SFT policy: an exploring log pooled for the
    mean head, the gated / off / forced-open modes and their paired comparison, the conformal gate (fitted,
    steering, and watched with the base alone). Each piece has a unit test in test_rl2.py; this runs them
    against a real env (~2 min more here)."""
    tmp_path = pi0_runs["dir"]
    log = tmp_path / "steer.npz"
    # an exploring log (an action offset redrawn every call), pooled with the first for the mean head; the failure
    # predictor on the plain log
    explored = tmp_path / "explored.npz"
    proc = cli_in_process("steer", "collect", str(tmp_path / "sft"), "--episodes", "2", "--out", str(explored), "--num-envs",
                          "2", "--explore", "0.5", "--explore-per", "call")
    assert proc.returncode == 0 and json.loads(proc.stdout)["explore"] == 0.5, proc.stderr[-3000:]
    proc = cli_in_process("steer", "fit", str(tmp_path / "sft"), "--log", str(log), str(explored), "--out",
                          str(tmp_path / "steering_mean"), "--steps", "10", "--head", "mean", "--advantage", "gae",
                          "--gae-lambda", "0.5", "--returns", "success", "--fail-log", str(log))
    assert proc.returncode == 0, proc.stderr[-3000:]
    fitted = json.loads(proc.stdout)  # the gate learns from the plain log alone
    assert fitted["calls"] > 0 and len(fitted["log"]) == 2 and fitted["fail_log"] == [str(log)]
    assert fitted["config"] | {"head": "mean", "advantage": "gae", "gae_lambda": 0.5, "returns": "success"} == fitted["config"]
    proc = run_cli("steer", "eval", str(tmp_path / "sft"), "--steering", str(tmp_path / "steering_mean"),
                   "--episodes", "2", "--num-envs", "2", "--mode", "always")
    assert proc.returncode == 0 and json.loads(proc.stdout)["steered_fraction"] == 1.0, proc.stderr[-3000:]
    for mode, extra, steered, beta in (("gated", [], None, 1.0), ("off", [], 0.0, 1.0),
                                       ("gated", ["--tau", "0", "--beta", "2.5"], 1.0, 2.5)):
        out = tmp_path / f"steer_{mode}_{beta}.json"
        proc = cli_in_process("steer", "eval", str(tmp_path / "sft"), "--steering", str(tmp_path / "steering"),
                              "--episodes", "2", "--num-envs", "2", "--mode", mode, "--out", str(out), *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        res = json.loads(proc.stdout)
        assert res["episodes"] == 2 and (steered is None or res["steered_fraction"] == steered) and res["beta"] == beta
        assert json.loads(out.read_text()) == res  # --out holds what was printed
    # the written files pair up: same seeds and --num-envs, so gated vs off is a paired comparison
    proc = run_cli("compare", "--a", str(tmp_path / "steer_off_1.0.json"), "--b", str(tmp_path / "steer_gated_1.0.json"))
    assert proc.returncode == 0 and json.loads(proc.stdout)["episodes"] == 2, proc.stderr[-2000:]

    sft = str(tmp_path / "sft")
    # the conformal gate: a log of 36 episodes (the real log's calls re-labelled: every fourth episode failed),
    # bands calibrated on the successes of 9 held-out episodes at alpha 0.25 and reported on the other 9
    with np.load(log) as real:
        calls = {k: real[k] for k in real.files}
    per = len(calls["rtg"])
    many = {k: np.concatenate([v] * 36) for k, v in calls.items()}
    many["episode"] = np.repeat(np.arange(36), per)
    many["failed"] = np.repeat(np.arange(36) % 4 == 0, per)
    np.savez(tmp_path / "many.npz", **many)
    proc = cli_in_process("steer", "fit", sft, "--log", str(tmp_path / "many.npz"), "--out", str(tmp_path / "conformal"),
                   "--steps", "5", "--gate", "conformal", "--alpha", "0.25")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fitted = json.loads(proc.stdout)
    assert fitted["config"]["gate"] == "conformal" and fitted["conformal"]["alpha"] == 0.25
    assert fitted["conformal"]["calibration_episodes"] >= 3 and 0.0 <= fitted["gate_test"]["false_alarm_rate"] <= 1.0
    proc = cli_in_process("steer", "eval", sft, "--steering", str(tmp_path / "conformal"), "--episodes", "2", "--num-envs", "2")
    assert proc.returncode == 0 and json.loads(proc.stdout)["gate"] == "conformal", proc.stderr[-3000:]
    proc = cli_in_process("steer", "eval", sft, "--steering", str(tmp_path / "conformal"), "--episodes", "2",
                          "--num-envs", "2", "--mode", "off")  # the base alone, the conformal gate watched
    assert proc.returncode == 0, proc.stderr[-3000:]
    off = json.loads(proc.stdout)
    assert off["steered_fraction"] == 0.0 and len(sum(off["gate_monitor"]["episode_excursion"], [])) == 2


def test_keep_best_val_saves_the_lowest_validation_nll(bc_config, tmp_path, need_maniskill):
    proc = run_cli("train", "--json", bc_config, f"run.out_dir={tmp_path}", "run.name=sft", "algo.keep_best_val=true",
                   "algo.epochs=6", "algo.log_every=2", "run.final_eval_episodes=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    rows = list(csv.DictReader(open(tmp_path / "sft" / "metrics.csv")))
    vals = {int(r["iteration"]): float(r["loss/val_nll"]) for r in rows}
    best_step = min(vals, key=vals.get)
    assert summary["best_val"]["step"] == best_step
    assert summary["best_val"]["val_nll"] == pytest.approx(vals[best_step], rel=1e-4)
    assert Path(summary["checkpoint"]).name == f"step_{best_step:010d}"
    assert summary["gradient_steps"] >= max(vals)


def test_eval_every_does_not_wait_for_log_every_and_an_empty_train_split_is_one_line(bc_config, tmp_path,
                                                                                      need_maniskill):
    proc = run_cli("train", "--json", bc_config, f"run.out_dir={tmp_path}", "run.name=sft", "algo.epochs=4", "algo.log_every=1000",
                   "algo.eval_every=2", "run.eval_episodes=1", "run.final_eval_episodes=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "sft" / "metrics.csv")))
    evals = [int(r["iteration"]) for r in rows if r["eval/success_rate"]]
    steps = json.loads(proc.stdout)["gradient_steps"]
    assert evals == list(range(2, steps + 1, 2)) and steps >= 4
    proc = cli_in_process("train", "--json", bc_config, f"run.out_dir={tmp_path}", "run.name=sft2", "algo.val_fraction=0.9")
    assert proc.returncode == 2 and "leaves no training episode of the 3" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_image_shift_on_state_observations_is_one_line(bc_config, tmp_path, need_maniskill):
    proc = cli_in_process("train", "--json", bc_config, f"run.out_dir={tmp_path}", "run.name=sft", "algo.image_shift=4")
    assert proc.returncode == 2 and "algo.image_shift" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "sft").exists()


def test_keep_best_val_without_held_out_episodes_is_one_line():
    from robo_rl.algorithms.bc import BCConfig
    from robo_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="val_fraction"):
        BCConfig(dataset="d.h5", keep_best_val=True, val_fraction=0.0)


def test_ctrl_c_keeps_the_sft_run(bc_config, tmp_path, need_maniskill):
    """Ctrl-C during SFT: the weights of the steps taken are saved (best validation kept), no final
    evaluation, exit 130."""
    run = tmp_path / "sft-stopped"
    rc, out, err = interrupt_cli_after_rows(["train", "--json", bc_config, "algo.epochs=100000", f"run.out_dir={tmp_path}",
                                          "run.name=sft-stopped"], run / "metrics.csv", 2)
    assert rc == 130, err[-3000:]
    summary = json.loads(out)
    assert summary["stop_reason"] == "interrupted" and "final_eval" not in summary
    assert 10 <= summary["gradient_steps"] < 100000 and Path(summary["checkpoint"], "model.safetensors").is_file()
