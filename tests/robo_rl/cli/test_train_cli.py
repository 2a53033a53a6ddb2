"""End-to-end `robo-rl train/eval` on real ManiSkill3 PickCube-v1 (state obs), kill-and-resume, and
one-line errors for bad input."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, cli_in_process, interrupt_cli_after_rows, run_cli

pytestmark = pytest.mark.maniskill

SMALL = ["env.task=PickCube-v1", "env.num_envs=2", "run.rollout_steps=16", "run.eval_every_steps=32",
         "run.eval_episodes=2", "run.eval_num_envs=1", "run.final_eval_episodes=2", "run.progress=false",
         "env.max_episode_steps=20", "policy.hidden=[64,64]"]


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("robo-rl: error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    cpus = sorted(os.sched_getaffinity(0))  # pinned and pipelined: env workers on one core, the trainer on another
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *SMALL, "run.total_env_steps=64", f"run.out_dir={out}",
                   "run.name=two-iters", f"env.worker_cpus=[{cpus[0]}]", f"run.policy_cpus=[{cpus[-1]}]",
                   "run.pipeline=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "two-iters"


def test_two_iteration_train_writes_a_complete_run_dir(trained_run, need_maniskill):
    run = trained_run
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["env_steps"]) for r in rows] == [32, 64]
    assert rows[0]["eval/success_rate"] != "" and float(rows[0]["steps_per_s"]) > 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["env"]["task"] == "PickCube-v1" and cfg["run"]["total_env_steps"] == 64
    assert cfg["run"]["pipeline"] and cfg["run"]["policy_cpus"] == [sorted(os.sched_getaffinity(0))[-1]]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 64 and summary["final_eval"]["episodes"] == 2
    assert (run / "learning_curve.png").stat().st_size > 1000
    assert (run / "final_policy.mp4").stat().st_size > 1000
    assert any((run / "tb").iterdir())
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000000064"


def test_eval_cli_reports_ci_and_video(trained_run, need_maniskill, tmp_path):
    video = tmp_path / "e.mp4"
    proc = run_cli("eval", str(trained_run), "--episodes", "3", "--num-envs", "1", "--video", str(video))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["episodes"] == 3 and 0.0 <= out["ci95_low"] <= out["success_rate"] <= out["ci95_high"] <= 1.0
    assert len(out["episode_success"]) == 1 and len(out["episode_success"][0]) == 3  # one env, its 3 episodes
    assert sum(out["episode_success"][0]) == out["successes"]
    assert video.stat().st_size > 1000
    assert "95% CI" in proc.stderr


def test_eval_overrides_change_the_env_and_are_checked(trained_run, need_maniskill):
    """env.* / policy.* overrides reach the evaluated config (3-step episodes: a normalized dense return
    of at most 3); other sections and unknown keys are one-line errors."""
    proc = run_cli("eval", str(trained_run), "--episodes", "2", "--num-envs", "1", "--no-video", "env.max_episode_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["episodes"] == 2 and 0.0 < out["mean_return"] <= 3.0
    assert "env.* and policy.*" in _one_line_error(cli_in_process("eval", str(trained_run), "--no-video", "algo.lr=1"))
    assert "bogus" in _one_line_error(cli_in_process("eval", str(trained_run), "--no-video", "env.bogus=1"))


def test_kill_and_resume_keeps_config_and_continues_steps(tmp_path, need_maniskill):
    args = [sys.executable, "-m", "robo_rl.cli", "train", "--json", "configs/quickstart.yaml", *SMALL,
            "run.total_env_steps=640", "run.checkpoint_every_steps=32", "run.eval_every_steps=0",
            "run.final_eval_episodes=0", f"run.out_dir={tmp_path}", "run.name=victim"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    run = tmp_path / "victim"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if (run / "checkpoints" / "latest").exists() and proc.poll() is None:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its env workers, mid-run
        proc.wait()
    cfg_before = (run / "config.yaml").read_text()
    ckpt_step = int((run / "checkpoints" / "latest").read_text().strip().split("_")[1])
    rows_before = list(csv.DictReader(open(run / "metrics.csv")))
    assert 0 < ckpt_step < 640
    res = run_cli("train", "--json", "--resume", str(run))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run / "config.yaml").read_text() == cfg_before
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    kept = [r for r in rows_before if int(r["env_steps"]) <= ckpt_step]
    assert kept and rows[: len(kept)] == kept  # everything up to the checkpoint is kept as written
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(set(steps))  # rows logged after the checkpoint were redone, not duplicated
    resumed = steps[len(kept):]
    assert resumed[0] == ckpt_step + 32 and resumed[-1] == 640
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 640
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts[-1] == "step_0000000640" and not [c for c in ckpts if c.startswith(".")]
    # a resume whose overrides do not fit the checkpoint fails and leaves config.yaml as it was
    assert "shape" in _one_line_error(run_cli("train", "--json", "--resume", str(run), "policy.hidden=[16,16]"))
    assert (run / "config.yaml").read_text() == cfg_before
    # a learning-rate override takes effect (the optimizer's saved lr does not win) and is recorded
    res = run_cli("train", "--json", "--resume", str(run), "run.total_env_steps=704", "algo.lr=1.0e-5")
    assert res.returncode == 0, res.stderr[-3000:]
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["env_steps"]) for r in rows[-2:]] == [672, 704]
    assert [float(r["loss/lr"]) for r in rows[-2:]] == [1e-5, 1e-5] and float(rows[-3]["loss/lr"]) == 3e-4
    assert "lr: 1.0e-05" in (run / "config.yaml").read_text()


@pytest.mark.parametrize("extra, fragment", [
    (["algo.lrr=0.1"], "unknown config key 'algo.lrr'"),
    (["env.num_envs=two"], "'env.num_envs' = 'two' has the wrong type"),
    (["env.name=manyskill"], "unknown env 'manyskill': did you mean 'maniskill'"),
    (["policy.name=mpl"], "unknown policy 'mpl': did you mean 'mlp'"),
    (["env.control_mode=pd_joint_bogus", "env.num_envs=1"], "'env.control_mode' = 'pd_joint_bogus' is not a controller of PushCube-v1's robot: ["),
])
def test_bad_config_is_one_line(extra, fragment, tmp_path):
    err = _one_line_error(cli_in_process("train", "--json", "configs/quickstart.yaml", *extra, f"run.out_dir={tmp_path}"))
    assert fragment in err
    assert not any(tmp_path.iterdir())  # no run dir created for a bad config


def test_unwritable_run_dir_is_one_line():
    err = _one_line_error(cli_in_process("train", "--json", "configs/quickstart.yaml", "run.out_dir=/proc/robo-rl-nope"))
    assert "cannot write run directory" in err


def test_missing_config_file_is_one_line(tmp_path):
    err = _one_line_error(run_cli("train", "--json", str(tmp_path / "missing.yaml"), timeout=120))
    assert "does not exist" in err


def test_corrupt_checkpoint_on_eval_and_resume(trained_run, tmp_path, need_maniskill):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(trained_run, run)
    ckpt = run / "checkpoints" / "step_0000000064"
    (ckpt / "model.safetensors").write_bytes(b"\x01\x02corrupt")
    metrics_before = (run / "metrics.csv").read_bytes()
    err = _one_line_error(cli_in_process("eval", str(run), "--episodes", "1", "--no-video"))
    assert "corrupt" in err
    mask = os.sched_getaffinity(0)
    err = _one_line_error(cli_in_process("train", "--json", "--resume", str(run)))
    assert "corrupt" in err
    assert (run / "metrics.csv").read_bytes() == metrics_before
    assert os.sched_getaffinity(0) == mask  # the run pinned this process (run.policy_cpus) and gave it back


def test_mismatched_checkpoint_is_one_line(trained_run, tmp_path, need_maniskill):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(trained_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["policy"]["hidden"] = [32]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    err = _one_line_error(cli_in_process("train", "--json", "--resume", str(run)))
    assert "does not match this model" in err


def test_overrides_may_follow_options(tmp_path):
    """KEY=VALUE words after options reach the command's overrides; other stray words are refused."""
    proc = cli_in_process("steer", "collect", str(tmp_path / "nowhere"), "--episodes", "1", "--out", str(tmp_path / "x.npz"),
                   "env.variations.object_pose_jitter=0.05")
    assert proc.returncode == 2 and "unrecognized arguments" not in proc.stderr and "nowhere" in proc.stderr, proc.stderr
    proc = cli_in_process("steer", "collect", str(tmp_path / "nowhere"), "--episodes", "1", "--out", str(tmp_path / "x.npz"),
                   "--bogus")
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr


def test_resume_dry_run_checks_the_run_and_leaves_it_alone(trained_run, tmp_path, need_maniskill):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(trained_run, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = run_cli("train", "--json", "--resume", str(run), "algo.lr=1e-5", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["dry_run"] == "ok" and out["policy_built_from"] == "config"
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_missing_input_paths_stop_before_a_run_dir_exists(trained_run, tmp_path, need_maniskill):
    """A teacher, dataset or init_from that is not there is named by its key before the run directory is
    made, so fixing the path and rerunning works; --dry-run lists such paths without failing."""
    for cfg, extra, fragment in (
            ("opd_pushcube_state.yaml", [f"algo.teacher={tmp_path / 'no-teacher'}", "run.init_from=null"],
             "config algo.teacher '"),
            ("quickstart.yaml", [f"run.init_from={tmp_path / 'nope'}"], "config run.init_from '"),
            ("bc_mlp_pushcube_few.yaml", [f"algo.dataset={tmp_path / 'no.h5'}"], "config algo.dataset '")):
        err = _one_line_error(cli_in_process("train", "--json", f"configs/{cfg}", *extra,
                                             f"run.out_dir={tmp_path / 'runs'}", "run.name=x"))
        assert fragment in err and "does not exist" in err
        assert not (tmp_path / "runs").exists()
    (tmp_path / "not-a-run").mkdir()
    err = _one_line_error(cli_in_process("train", "--json", "configs/opd_pushcube_state.yaml", f"algo.teacher={tmp_path / 'not-a-run'}",
                                         "run.init_from=null", f"run.out_dir={tmp_path / 'runs'}"))
    assert "config key 'algo.teacher': no checkpoint found" in err and not (tmp_path / "runs").exists()
    proc = run_cli("train", "--json", "configs/opd_pushcube_state.yaml", f"algo.teacher={tmp_path / 'no-teacher'}",
                   "run.init_from=null", "env.worker_cpus=[998]", "run.policy_cpus=[999]", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)  # a config for another machine: what this one lacks is listed, not fatal
    assert out["inputs_missing_here"] == [f"algo.teacher '{tmp_path / 'no-teacher'}'"]
    assert "'env.worker_cpus' = [998] names CPUs [998]" in out["cpus_missing_here"]


def test_offline_runs_refuse_keys_they_would_ignore(tmp_path):
    err = _one_line_error(cli_in_process("train", "--json", "configs/bc_mlp_pushcube_few.yaml", "run.pipeline=true",
                                         f"run.out_dir={tmp_path}"))
    assert "'run.pipeline' does not apply to offline algorithm 'bc'" in err and not any(tmp_path.iterdir())


def test_the_end_of_a_run_is_a_short_summary(tmp_path):
    """Without --json the run ends with a few lines: success with its CI, steps, time, where the files are."""
    from robo_rl.cli.train import summary_lines

    (tmp_path / "learning_curve.png").write_bytes(b"png")
    summary = {"run_dir": str(tmp_path), "env_steps": 300000, "wall_time_min": 9.71, "stop_reason": "total_env_steps",
               "final_eval": {"episodes": 100, "successes": 98, "success_rate": 0.98, "ci95_low": 0.93, "ci95_high": 0.994,
                              "episode_success": [[1] * 98 + [0] * 2]},
               "video": str(tmp_path / "final_policy.mp4")}
    lines = summary_lines(summary)
    assert lines[0] == "[bold]success 0.98[/bold] (95% CI [0.93, 0.99]) over 100 evaluation episodes"
    assert lines[1] == "300,000 env steps, 9.7 min, stopped by total_env_steps"
    assert lines[2:] == [f"run      {tmp_path}", f"curve    {tmp_path / 'learning_curve.png'}",
                         f"video    {tmp_path / 'final_policy.mp4'}",
                         f"summary  {tmp_path / 'summary.json'} (print it with --json)"]
    assert summary_lines({"gradient_steps": 1200, "run_dir": str(tmp_path / "x")})[0] == "1,200 gradient steps"


def test_ctrl_c_ends_the_iteration_saves_and_resumes(tmp_path, need_maniskill):
    """The first Ctrl-C finishes the current iteration, saves a checkpoint of exactly the logged steps (no
    periodic one is due), skips the final evaluation and exits 130; --resume continues from there."""
    run = tmp_path / "stopped"
    rc, out, err = interrupt_cli_after_rows(
        ["train", "--json", "configs/quickstart.yaml", *SMALL, "run.total_env_steps=100000", "run.eval_every_steps=0",
         "run.checkpoint_every_steps=100000", f"run.out_dir={tmp_path}", "run.name=stopped"], run / "metrics.csv", 2)
    assert rc == 130, err[-3000:]
    assert "stopping after the current iteration" in err and f"--resume {run}" in err and "Traceback" not in err
    summary = json.loads(out)
    assert summary["stop_reason"] == "interrupted" and "final_eval" not in summary
    steps = [int(r["env_steps"]) for r in csv.DictReader(open(run / "metrics.csv"))]
    ckpt = (run / "checkpoints" / "latest").read_text().strip()
    assert int(ckpt.split("_")[1]) == steps[-1] == summary["env_steps"] >= 64
    res = run_cli("train", "--json", "--resume", str(run), f"run.total_env_steps={steps[-1] + 64}", "run.final_eval_episodes=0")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["env_steps"] == steps[-1] + 64
