"""Benchmarks on a real ManiSkill env with a (briefly trained) state policy: unknown names suggest close
matches, a vision split refuses a state policy before any episode, results are identical on re-run,
a resumed evaluation equals an uninterrupted one (also after a SIGKILL), results do not depend on the
number of envs, the reference policies (scripted expert, random) run, and the report renders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.maniskill


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = run_cli("train", "configs/quickstart.yaml", "env.num_envs=2", "policy.hidden=[32,32]", "run.total_env_steps=64",
                   "run.rollout_steps=16", "run.eval_every_steps=0", "run.final_eval_episodes=0", "run.progress=false",
                   "run.video=false", f"run.out_dir={out}", "run.name=policy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "policy"


def test_bad_benchmark_requests_fail_before_any_episode(need_maniskill, run_dir, tmp_path):
    proc = run_cli("eval", str(run_dir), "--benchmark", "maniskill-vison", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "did you mean maniskill-vision" in proc.stderr
    proc = run_cli("eval", str(run_dir), "--benchmark", "maniskill-vision", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "observes only state" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_rerun_and_resume_give_identical_results_and_the_report_renders(need_maniskill, run_dir, tmp_path):
    from robo_rl.eval.benchmark import evaluate_benchmark

    a = evaluate_benchmark(str(run_dir), "maniskill-execution", 4, str(tmp_path / "a.json"), num_envs=2, block=2)
    b = evaluate_benchmark(str(run_dir), "maniskill-execution", 4, str(tmp_path / "b.json"), num_envs=2, block=2)
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    (task,) = a["tasks"]
    assert a["tasks"][task]["episodes"] == 4 and a["aggregate"]["tasks"] == 1
    # a run killed after its first block: the file holds block 0 only (it is rewritten after every block)
    partial = json.loads((tmp_path / "b.json").read_text())
    del partial["tasks"][task]["blocks"]["1"]
    (tmp_path / "c.json").write_text(json.dumps(partial))
    c = evaluate_benchmark(str(run_dir), "maniskill-execution", 4, str(tmp_path / "c.json"), num_envs=2, block=2)
    assert c == b
    proc = run_cli("eval", "--report", str(tmp_path / "a.json"), "--compare", str(tmp_path / "b.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = (tmp_path / "a.md").read_text()
    assert "initial object positions" in md and "mean over tasks" in md and "(95% bootstrap over episodes)" in md
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_results_do_not_depend_on_the_number_of_envs(need_maniskill, run_dir, tmp_path):
    from robo_rl.eval.benchmark import evaluate_benchmark

    one = evaluate_benchmark(str(run_dir), "maniskill-execution", 4, str(tmp_path / "a.json"), num_envs=1, block=4)
    three = evaluate_benchmark(str(run_dir), "maniskill-execution", 4, str(tmp_path / "b.json"), num_envs=3, block=4)
    (task,) = one["tasks"]
    assert one["tasks"][task]["successes"] == three["tasks"][task]["successes"]
    assert one["tasks"][task]["mean_return"] == pytest.approx(three["tasks"][task]["mean_return"], rel=1e-4)


def test_scripted_expert_and_random_reference_policies(need_maniskill, tmp_path):
    from robo_rl.eval.benchmark import evaluate_benchmark

    exp = evaluate_benchmark("expert", "maniskill-execution", 2, str(tmp_path / "e.json"), task="PickCube-v1")
    rnd = evaluate_benchmark("random", "maniskill-execution", 2, str(tmp_path / "r.json"), num_envs=2, task="PickCube-v1")
    assert exp["checkpoint"] == "expert" and exp["tasks"]["PickCube-v1"]["successes"] == 2  # the planner sees the moved cube
    assert rnd["tasks"]["PickCube-v1"]["successes"] == 0 and rnd["tasks"]["PickCube-v1"]["episodes"] == 2
    assert exp["tasks"]["PickCube-v1"]["mean_return"] > rnd["tasks"]["PickCube-v1"]["mean_return"]
    with pytest.raises(Exception, match="no scripted expert for 'PushT-v1'"):
        evaluate_benchmark("expert", "maniskill-id", 1, str(tmp_path / "x.json"), task="PushT-v1")


def test_evaluation_killed_mid_run_resumes_to_the_uninterrupted_result(need_maniskill, tmp_path):
    args = ["random", "--benchmark", "maniskill-id", "--episodes", "6", "--block", "2", "--num-envs", "2"]
    full = run_cli("eval", *args, "--out", str(tmp_path / "full.json"))
    assert full.returncode == 0, full.stderr[-2000:]
    out = tmp_path / "killed.json"
    proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli", "eval", *args, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_file() and json.loads(out.read_text())["tasks"].get("PickCube-v1", {}).get("blocks"):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the evaluation finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = json.loads(out.read_text())["tasks"]["PickCube-v1"]["blocks"]
    assert 1 <= len(done) < 3
    resumed = run_cli("eval", *args, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert out.read_text() == (tmp_path / "full.json").read_text()


def test_strength_sweep_media_and_the_comparison_report(need_maniskill, tmp_path):
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark

    rnd = evaluate_benchmark("random", "maniskill-execution", 2, str(tmp_path / "r.json"), num_envs=2,
                             strengths=(0.0, 2.0), media=True)
    assert list(rnd["tasks"]) == ["PickCube-v1 x0", "PickCube-v1 x2"]
    thumbs = sorted(p.name for p in (tmp_path / "r.media").glob("*.png"))
    assert thumbs == [f"PickCube-v1_x{s}_env{i}_failure.png" for s in (0, 2) for i in (0, 1)]
    exp = evaluate_benchmark("expert", "maniskill-execution", 2, str(tmp_path / "e.json"), strengths=(0.0, 2.0))
    assert [t["successes"] for t in exp["tasks"].values()] == [2, 2]
    with pytest.raises(ConfigError, match="--strengths needs a split with variations"):
        evaluate_benchmark("random", "maniskill-id", 2, str(tmp_path / "x.json"), strengths=(0.0, 1.0))
    proc = run_cli("eval", "--compare", str(tmp_path / "e.json"), str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = (tmp_path / "e.md").read_text()
    assert "| expert success [95% CI] | random success [95% CI] |" in md and "Success expert - random (mean over tasks): +1.000 [+1.000, +1.000]" in md
    assert "e_strength.png" in md and "r.media/PickCube-v1_x2_env1_failure.png" in md
    assert (tmp_path / "e_strength.png").stat().st_size > 1000
