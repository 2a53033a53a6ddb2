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

from tests.conftest import REPO, cli_in_process, run_cli

pytestmark = pytest.mark.maniskill


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = run_cli("train", "--json", "configs/quickstart.yaml", "env.num_envs=2", "policy.hidden=[32,32]", "run.total_env_steps=64",
                   "run.rollout_steps=16", "run.eval_every_steps=0", "run.final_eval_episodes=0", "run.progress=false",
                   "run.video=false", f"run.out_dir={out}", "run.name=policy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "policy"


def test_bad_benchmark_requests_fail_before_any_episode(need_maniskill, run_dir, tmp_path):
    proc = cli_in_process("eval", str(run_dir), "--benchmark", "maniskill-vison", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "did you mean maniskill-vision" in proc.stderr
    proc = cli_in_process("eval", str(run_dir), "--benchmark", "maniskill-vision", "--out", str(tmp_path / "r.json"))
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


def test_placement_overrides_change_where_envs_run_not_the_episodes(need_maniskill, run_dir, tmp_path):
    """env.envs_per_worker (a placement key) packs 2 envs into one worker: the same results file content
    as one env per worker; a key that decides the episodes is refused before any env starts."""
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark

    a = evaluate_benchmark(str(run_dir), "maniskill-execution", 2, str(tmp_path / "a.json"), num_envs=2, block=2)
    b = evaluate_benchmark(str(run_dir), "maniskill-execution", 2, str(tmp_path / "b.json"), num_envs=2, block=2,
                           env_overrides=["env.envs_per_worker=2"])
    assert a == b
    with pytest.raises(ConfigError, match="may only say where the envs run.*got env.max_episode_steps=5"):
        evaluate_benchmark(str(run_dir), "maniskill-execution", 2, str(tmp_path / "c.json"),
                           env_overrides=["env.max_episode_steps=5"])
    assert not (tmp_path / "c.json").exists()


def test_policy_settings_are_part_of_the_evaluation_and_bad_ones_fail_before_the_file(need_maniskill, run_dir, tmp_path):
    """policy.KEY=VALUE changes how the checkpoint acts (here the MLP's activation; a pi0 sampler in use):
    recorded as policy_settings, so a file made without it is not resumed with it; an unknown key or one
    the weights cannot take is a one-line error before the results file exists."""
    from robo_rl.errors import ConfigError, RoboRLError
    from robo_rl.eval.benchmark import evaluate_benchmark

    a = evaluate_benchmark(str(run_dir), "maniskill-id", 2, str(tmp_path / "a.json"), num_envs=2, block=2)
    b = evaluate_benchmark(str(run_dir), "maniskill-id", 2, str(tmp_path / "b.json"), num_envs=2, block=2,
                           env_overrides=["policy.activation=relu"])
    assert "policy_settings" not in a and b["policy_settings"] == {"activation": "relu"}
    with pytest.raises(ConfigError, match="holds another evaluation"):
        evaluate_benchmark(str(run_dir), "maniskill-id", 2, str(tmp_path / "a.json"), num_envs=2, block=2,
                           env_overrides=["policy.activation=relu"])
    for bad, fragment in (("policy.activaton=relu", "activaton"), ("policy.hidden=[8]", "does not match this model"),
                          ("policy.activation.x=1", "may only say where the envs run")):
        with pytest.raises(RoboRLError, match=fragment) as err:
            evaluate_benchmark(str(run_dir), "maniskill-id", 2, str(tmp_path / "c.json"), env_overrides=[bad])
        assert "\n" not in str(err.value)
    assert not (tmp_path / "c.json").exists()


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


# --- resumption identity, output paths, simulator mismatches, LIBERO --task, the report's writes, video paths:
# the benchmark logic on a fake simulator (no episodes run; what evaluate_policy would return is made up)


@pytest.fixture
def fake_sim(monkeypatch):
    """build_env / evaluate_policy replaced by fakes; returns the (env task, seed, episodes) of every block run."""
    from types import SimpleNamespace

    import robo_rl.build as build
    import robo_rl.eval.benchmark as bm
    import robo_rl.runners.evaluate as ev
    from robo_rl.contracts import ArraySpec

    calls = []

    class Env:
        def __init__(self, cfg):
            self.cfg, self.action_spec = cfg, ArraySpec((2,), "float32", -1.0, 1.0)

        def close(self):
            pass

    def evaluate_policy(env, policy, n, seed, deterministic):
        calls.append((getattr(env.cfg, "task", None) or env.cfg.task_ids, seed, n))
        ok = [int(j < seed % 2) for j in range(n)]
        return SimpleNamespace(episodes=n, successes=seed % 2, mean_return=1.0, episode_success=[ok])

    monkeypatch.setattr(build, "build_env", lambda cfg, **kw: Env(cfg))
    monkeypatch.setattr(ev, "evaluate_policy", evaluate_policy)
    monkeypatch.setattr(bm, "_environment", lambda sim, cfg: {"physics": "fake"})
    return calls


def test_resume_refuses_another_task_set_and_allows_another_env_count(fake_sim, tmp_path):
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark

    out = str(tmp_path / "r.json")
    a = evaluate_benchmark("random", "maniskill-id", 4, out, num_envs=1, block=2, task="PushCube-v1")
    assert list(a["tasks"]) == ["PushCube-v1"] and a["task_set"] == ["PushCube-v1"] and a["env"]["task"] == "PushCube-v1"
    assert "num_envs" not in a["env"]
    with pytest.raises(ConfigError, match=r"holds another evaluation .*task_set \['PushCube-v1'\] vs \['PickCube-v1'\]"):
        evaluate_benchmark("random", "maniskill-id", 4, out, num_envs=1, block=2, task="PickCube-v1")
    assert list(json.loads((tmp_path / "r.json").read_text())["tasks"]) == ["PushCube-v1"]
    n = len(fake_sim)
    assert evaluate_benchmark("random", "maniskill-id", 4, out, num_envs=2, block=2, task="PushCube-v1") == a
    assert len(fake_sim) == n  # everything was resumed
    # a file without the identity keys (an older robo-rl) resumes on its other keys and records them on rewrite
    old = json.loads((tmp_path / "r.json").read_text())
    (tmp_path / "old.json").write_text(json.dumps({k: v for k, v in old.items() if k not in ("task_set", "env")}))
    assert evaluate_benchmark("random", "maniskill-id", 4, str(tmp_path / "old.json"), num_envs=1, block=2,
                              task="PushCube-v1") == a
    assert len(fake_sim) == n and json.loads((tmp_path / "old.json").read_text())["task_set"] == ["PushCube-v1"]
    with pytest.raises(ConfigError, match="holds another evaluation"):  # its other keys still decide
        evaluate_benchmark("random", "maniskill-id", 4, str(tmp_path / "old.json"), num_envs=1, block=2, seed=7,
                           task="PushCube-v1")
    # the same task in an env configured otherwise: the differing key is named
    old = json.loads((tmp_path / "r.json").read_text())
    old["env"]["max_episode_steps"] = 50
    (tmp_path / "r.json").write_text(json.dumps(old))
    with pytest.raises(ConfigError, match=r"env\.max_episode_steps 50 vs 100"):
        evaluate_benchmark("random", "maniskill-id", 4, out, num_envs=1, block=2, task="PushCube-v1")


def test_out_in_a_missing_directory_is_created_and_an_unwritable_one_fails_in_one_line(fake_sim, tmp_path):
    from robo_rl.errors import RoboRLError
    from robo_rl.eval.benchmark import evaluate_benchmark

    out = tmp_path / "new" / "dir" / "r.json"
    res = evaluate_benchmark("random", "maniskill-id", 4, str(out), num_envs=1, block=2, task="PushCube-v1")
    assert json.loads(out.read_text()) == res and res["tasks"]["PushCube-v1"]["episodes"] == 4
    (tmp_path / "afile").write_text("")
    fake_sim.clear()
    with pytest.raises(RoboRLError, match=r"cannot create the directory of --out '.*afile/r\.json'"):
        evaluate_benchmark("random", "maniskill-id", 2, str(tmp_path / "afile" / "r.json"), num_envs=1)
    assert fake_sim == []  # before any episode


@pytest.mark.parametrize("content", ["not json", "[1, 2]", "\xff"])
def test_a_corrupt_results_file_is_refused_in_one_line(fake_sim, tmp_path, content):
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark

    bad = tmp_path / "bad.json"
    bad.write_bytes(content.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"'.*bad\.json' exists but is not a .*results file.*delete it or pick another --out") as err:
        evaluate_benchmark("random", "maniskill-id", 2, str(bad), num_envs=1, task="PushCube-v1")
    assert "\n" not in str(err.value) and fake_sim == []


def test_a_maniskill_policy_on_a_libero_suite_is_refused_before_the_policy_loads(monkeypatch, tmp_path):
    import robo_rl.build as build
    import robo_rl.checkpoint as ckpt_io
    from robo_rl.config import load, to_dict
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark, get_benchmark, task_env_configs
    from robo_rl.run_config import TrainConfig
    from sims.maniskill.env import ManiSkillConfig

    with pytest.raises(ConfigError, match="LIBERO suite but the policy was trained in 'maniskill'"):
        task_env_configs(get_benchmark("libero-object"), ManiSkillConfig(), None)
    cfg = to_dict(load(TrainConfig, str(REPO / "configs" / "quickstart.yaml")))
    monkeypatch.setattr(ckpt_io, "resolve", lambda c: tmp_path)
    monkeypatch.setattr(ckpt_io, "read_meta", lambda c: {"config": cfg, "obs_spec": {"state": [25]},
                                                      "action_spec": {"shape": [8], "low": -1.0, "high": 1.0}})

    def no_load(*a, **k):
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr(build, "policy_from_checkpoint", no_load)
    with pytest.raises(ConfigError, match="LIBERO suite but the policy was trained in 'maniskill'"):
        evaluate_benchmark("somerun", "libero-object", 1, str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists()


def test_task_picks_one_task_of_a_libero_suite_for_a_reference_policy(fake_sim, tmp_path):
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark

    res = evaluate_benchmark("random", "libero-object", 2, str(tmp_path / "r.json"), num_envs=1, task="libero_object/3")
    assert list(res["tasks"]) == res["task_set"] == ["libero_object/3"]
    assert fake_sim == [((3,), 10_000 + 3000, 2)]  # the seeds task 3 gets in the whole suite
    with pytest.raises(ConfigError, match=r"--task 'libero_object/10' is not a task of benchmark 'libero-object': "
                                          r"use libero_object/N with N in 0\.\.9"):
        evaluate_benchmark("random", "libero-object", 2, str(tmp_path / "x.json"), task="libero_object/10")
    with pytest.raises(ConfigError, match=r"--task 'libero_goal/3' is not a task of benchmark 'libero-object'"):
        evaluate_benchmark("random", "libero-object", 2, str(tmp_path / "x.json"), task="libero_goal/3")
    with pytest.raises(ConfigError, match=r"--task 'PickCube-v1' on a LIBERO benchmark must be SUITE/INDEX"):
        evaluate_benchmark("random", "libero-object", 2, str(tmp_path / "x.json"), task="PickCube-v1")


def test_report_refuses_a_json_list_creates_its_directory_and_writes_atomically(fake_sim, tmp_path, monkeypatch):
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark
    from robo_rl.eval.report import write_report

    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"'.*list\.json' is not a finished robo-rl benchmark results file \(a JSON list"):
        write_report(str(tmp_path / "list.json"))
    evaluate_benchmark("random", "maniskill-id", 2, str(tmp_path / "a.json"), num_envs=1, task="PushCube-v1")
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((os.fspath(src), os.fspath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    md = write_report(str(tmp_path / "a.json"), out=str(tmp_path / "new" / "dir" / "r.md"))
    assert md == tmp_path / "new" / "dir" / "r.md" and "PushCube-v1" in md.read_text()
    assert sorted(os.path.basename(d) for _, d in replaced) == ["r.md", "r.png"]
    assert all(os.path.dirname(s) == os.path.dirname(d) and s != d for s, d in replaced)
    assert sorted(os.listdir(md.parent)) == ["r.md", "r.png"]  # no temp files left


def test_video_path_is_checked_before_writing(tmp_path):
    import numpy as np

    from robo_rl.errors import ConfigError
    from robo_rl.eval.plots import check_video_path, write_video

    assert check_video_path(str(tmp_path / "v.mp4")) == tmp_path / "v.mp4"
    check_video_path("v.GIF")
    for bad, what in (("ev", "no suffix"), ("ev.json", "suffix '.json'")):
        with pytest.raises(ConfigError, match=f"video path '.*{bad}' has {what}; name it \\*\\.mp4"):
            check_video_path(tmp_path / bad)
    with pytest.raises(ConfigError, match="has no suffix"):
        write_video([np.zeros((16, 16, 3), np.uint8)] * 2, tmp_path / "ev")
    assert os.listdir(tmp_path) == []
    write_video([np.zeros((16, 16, 3), np.uint8)] * 2, tmp_path / "ev.mp4")
    assert (tmp_path / "ev.mp4").stat().st_size > 0


def test_a_libero_checkpoint_runs_its_tasks_on_the_official_states_greedy_or_sampled(fake_sim, monkeypatch, tmp_path):
    from types import SimpleNamespace

    import robo_rl.build as build
    import robo_rl.runners.evaluate as ev
    from robo_rl.contracts import ArraySpec
    from robo_rl.errors import ConfigError
    from robo_rl.eval.benchmark import evaluate_benchmark
    from robo_rl.eval.paired import compare
    from sims.libero.env import LiberoConfig

    trained = LiberoConfig(suite="libero_spatial", task_ids=(0, 2), init_states="sampled", max_episode_steps=99)
    monkeypatch.setattr(build, "load_run", lambda c: SimpleNamespace(ckpt=c, config=SimpleNamespace(env=trained)))
    monkeypatch.setattr(build, "policy_from_checkpoint",
                        lambda run, *a, **k: (object(), {"rgb": ArraySpec((2, 8, 8, 3), "uint8")},
                                              ArraySpec((7,), "float32")))
    modes, envs = [], []
    fake = ev.evaluate_policy

    def spy(env, policy, n, seed, deterministic):
        modes.append(deterministic)
        envs.append(env.cfg)
        return fake(env, policy, n, seed, deterministic)

    monkeypatch.setattr(ev, "evaluate_policy", spy)
    greedy = evaluate_benchmark("run", "libero-spatial", 4, str(tmp_path / "g.json"), num_envs=1, block=2,
                                task="libero_spatial/0,libero_spatial/2")
    assert greedy["task_set"] == ["libero_spatial/0", "libero_spatial/2"] and modes == [True] * 4
    assert all(c.init_states == "official" and c.max_episode_steps is None for c in envs)
    assert [c.task_ids for c in envs] == [(0,), (0,), (2,), (2,)]
    sampled = evaluate_benchmark("run", "libero-spatial", 4, str(tmp_path / "s.json"), num_envs=1, block=2,
                                 task="libero_spatial/0,libero_spatial/2", stochastic=True)
    assert modes[4:] == [False] * 4 and sampled["actions"] == "sampled" and "actions" not in greedy
    res = compare([str(tmp_path / "g.json")], [str(tmp_path / "s.json")])  # same seeds: 8 paired episodes
    assert res["episodes"] == 8
    envs.clear()
    evaluate_benchmark("run", "libero-spatial-vision", 2, str(tmp_path / "v.json"), num_envs=1, task="libero_spatial/2")
    assert envs[0].variations.camera_jitter == 0.03 and envs[0].init_states == "official"
    with pytest.raises(ConfigError, match=r"--task 'libero_spatial/12' is not a task of "
                                          r"benchmark 'libero-spatial'"):
        evaluate_benchmark("run", "libero-spatial", 2, str(tmp_path / "x.json"), task="libero_spatial/0,libero_spatial/12")
    with pytest.raises(ConfigError, match="--stochastic applies to checkpoints"):
        evaluate_benchmark("random", "libero-spatial", 2, str(tmp_path / "x.json"), task="libero_spatial/0",
                           stochastic=True)
