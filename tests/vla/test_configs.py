"""The 7B GPU configs pass a dry run here (real env with one CPU env, the 7B-shaped policy on the meta
device, PPO built on it). (Every shipped config parsing strictly is tests/robo_rl/test_config.py's job.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robo_rl.config import load
from robo_rl.run_config import TrainConfig
from robo_rl.runners.dry_run import dry_run
from tests.conftest import run_cli

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _sim(*args):
    """A parametrization (name, sim, ...) marked with the backend ``sim`` it needs."""
    return pytest.param(*args, marks=getattr(pytest.mark, args[1]))


@pytest.mark.parametrize("name,sim", [_sim("openvla_7b_ppo_maniskill.yaml", "maniskill"), _sim("openvla_7b_ppo_libero.yaml", "libero")])
def test_7b_configs_dry_run(name, sim, request):
    request.getfixturevalue(f"need_{sim}")
    out = dry_run(load(TrainConfig, str(CONFIGS / name), []))
    assert out["dry_run"] == "ok" and out["algo_built"] == "PPO"
    assert 7500 < out["params_millions"] < 7700  # OpenVLA-7B: Llama-2-7B + DINOv2-L + SigLIP-SO400M + projector
    assert out["trainable_millions"] < 300  # LoRA rank 32 + value head
    assert out["env"]["action_spec"] == [7]


@pytest.mark.parametrize("name,sim,cams", [_sim("pi0_ppo_maniskill.yaml", "maniskill", 1), _sim("pi0_ppo_libero.yaml", "libero", 2)])
def test_pi0_configs_dry_run(name, sim, cams, request):
    """Through the CLI: stdout is the one JSON document even where LIBERO print()s its task order on import."""
    request.getfixturevalue(f"need_{sim}")
    proc = run_cli("train", "--json", f"configs/{name}", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["dry_run"] == "ok" and out["algo_built"] == "PPO" and out["policy"] == "pi0"
    assert 3200 < out["params_millions"] < 3700  # pi0: PaliGemma-3B prefix (SigLIP + Gemma 2B) + Gemma 300M expert
    assert out["env"]["obs_spec"]["rgb"][:1] == [cams]


@pytest.mark.parametrize("name,sim,algo", [_sim("opd_openvla_7b_libero.yaml", "libero", "OPD"),
                                          _sim("rpd_pi0_maniskill.yaml", "maniskill", "RPD"),
                                          _sim("opd_pickcube_state.yaml", "maniskill", "OPD"),
                                          _sim("rpd_pickcube_state.yaml", "maniskill", "RPD"),
                                          _sim("grpo_openvla_7b_libero.yaml", "libero", "GRPO"),
                                          *[pytest.param(n, "maniskill", a, marks=[pytest.mark.maniskill, pytest.mark.slow])
                                            for n, a in (("opd_pi0_small_pushcube.yaml", "OPD"),  # ~1.5 min each here
                                                         ("opd_openvla_small_pushcube.yaml", "OPD"),
                                                         ("rpd_vla_teacher_pushcube.yaml", "RPD"),
                                                         ("rpd_vla_teacher_pushcube_gpu.yaml", "RPD"))]])
def test_teacher_guided_gpu_configs_dry_run(name, sim, algo, request):
    request.getfixturevalue(f"need_{sim}")
    out = dry_run(load(TrainConfig, str(CONFIGS / name), []))
    assert out["dry_run"] == "ok" and out["algo_built"] == algo
