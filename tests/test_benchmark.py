"""Benchmarks on a real ManiSkill env with a (briefly trained) state policy: unknown names suggest close
matches, a vision split refuses a state policy before any episode, results are identical on re-run,
a resumed evaluation equals an uninterrupted one, and the report renders (also side by side)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

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
    assert "initial object positions" in md and "mean over tasks" in md and "P(" in md
    assert (tmp_path / "a.png").stat().st_size > 1000
