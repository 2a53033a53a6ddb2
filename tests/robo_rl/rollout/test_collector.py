"""Pipelined collection on real ManiSkill envs gives the serial loop's data: with a deterministic
policy every env sees the same observations, actions and rewards (two worker groups stepping in turn
while the policy acts for the other group)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.maniskill


class _Deterministic:
    """The MLP policy acting with its mean (so serial and pipelined runs choose the same actions)."""

    def __init__(self, policy):
        self.p = policy

    def act(self, obs, deterministic=False):
        out = self.p.act(obs, deterministic=True)
        out.log_prob = torch.zeros(out.actions.shape[0]) if out.log_prob is None else out.log_prob
        return out

    def __getattr__(self, name):
        return getattr(self.p, name)


def _collect(pipeline: bool, **env_kw):
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.algorithms.advantages import GAE
    from robo_rl.rollout.collector import Collector
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    env = ManiSkillVecEnv(ManiSkillConfig(task="PushCube-v1", num_envs=4, max_episode_steps=6, **env_kw))
    try:
        torch.manual_seed(0)
        policy = MLPActorCritic(MLPConfig(hidden=(32, 32)), env.obs_spec, env.action_spec)
        col = Collector(env, _Deterministic(policy), 8, pipeline=pipeline)
        assert col.pipeline == pipeline and env.num_workers == 4
        col.reset(seed=11)
        batches = [(GAE(0.9, 0.9)(traj), n) for traj, n in (col.collect() for _ in range(2))]
        return batches, col.stats.episodes
    finally:
        env.close()


@pytest.mark.parametrize("env_kw", [{}, {"scene_workers": 4, "backend": "cpu"}], ids=["single-env", "scene-workers"])
def test_pipelined_collection_equals_the_serial_loop(need_maniskill, env_kw):
    """Both worker kinds: single-env workers, and batched-scene workers (the GPU backend's path)."""
    serial, eps_s = _collect(False, **env_kw)
    piped, eps_p = _collect(True, **env_kw)
    assert eps_s == eps_p == 4 * 2  # 16 steps of 4 envs with a 6-step limit: two episodes each
    for (a, na), (b, nb) in zip(serial, piped):
        assert na == nb == 32
        torch.testing.assert_close(a.obs["state"], b.obs["state"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.extras["action"], b.extras["action"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.returns, b.returns, atol=1e-4, rtol=1e-4)
        assert np.isfinite(b.advantages.numpy()).all()


# over batched-scene workers with -m slow: their collection is checked against the serial loop below, and
# test_bench_scale_drives_envs_with_the_vla benches them with the VLA
@pytest.mark.parametrize("scenes", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["single-env", "scene-workers"])
def test_bench_rollout_prints_both_ratios(need_maniskill, scenes):
    import os

    from tests.conftest import run_cli

    cpus = sorted(os.sched_getaffinity(0))  # env workers on the first core, the policy on the last
    proc = run_cli("bench", "rollout", "--steps", "3", "--rounds", "1", "--hidden", "32",
                   "--env-cpus", str(cpus[0]), "--policy-cpus", str(cpus[-1]), *(["--scene-workers", "4"] if scenes else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("4 batched-scene workers" if scenes else "4 single-env workers") in proc.stdout
    assert "pipelined / serial = " in proc.stdout and "limit" in proc.stdout
    assert f"env workers on CPUs [{cpus[0]}], policy on CPUs [{cpus[-1]}]" in proc.stdout


def test_bench_scale_drives_envs_with_the_vla(need_maniskill, tmp_path):
    """The GPU scale check's bench on CPU: a tiny OpenVLA-style model decodes actions for a real
    ManiSkill rgb batch in batched-scene workers (the GPU backend's worker kind); rates, the time split
    and the rollout loop serial vs pipelined are measured, the GPU is reported as absent."""
    import json

    from tests.conftest import run_cli

    out = tmp_path / "scale.json"
    proc = run_cli("bench", "scale", "--arch", "tiny", "--num-envs", "2", "--steps", "3", "--scene-workers", "2",
                   "--pipeline", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["num_envs"] == 2 and row["env_backend"] == "cpu" and row["env_steps_per_s"] > 0
    assert row["t_env_ms"] > 0 and row["t_policy_ms"] > 0 and 0 < row["policy_share"] < 1 and row["gpu"] is None
    assert row["serial_steps_per_s"] > 0 and row["pipelined_over_serial"] > 0
    assert "GPU: n/a" in proc.stdout and "pipelined / serial = " in proc.stdout
