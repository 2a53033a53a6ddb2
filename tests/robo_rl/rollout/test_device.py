"""run.device: the parse-time and machine checks, the OnDevice view the rollout loops use (it must not
change a single rollout), device-free checkpoints. The CUDA runs themselves are checked on a GPU
machine by scripts/device/gpu_train_check.py."""

from __future__ import annotations

import pytest
import torch

from robo_rl.config import from_dict
from robo_rl.contracts import PolicyOutput
from robo_rl.errors import ConfigError
from robo_rl.registry import ENVS
from robo_rl.rollout.device import OnDevice, on_device, resolve_device, to_device
from robo_rl.run_config import TrainConfig
from tests.conftest import FAKE_ENV


@pytest.fixture(autouse=True)
def _registered(fake_env):
    """The simulator-free env, registered for this module's tests."""


def _cfg(tmp_path, **run):
    return from_dict(TrainConfig, {
        "env": {"name": FAKE_ENV, "num_envs": 4, "max_episode_steps": 6},
        "policy": {"name": "mlp", "hidden": [16]},
        "algo": {"name": "ppo", "epochs": 1, "minibatches": 1},
        "run": {"total_env_steps": 48, "rollout_steps": 6, "eval_every_steps": 0, "final_eval_episodes": 0,
                "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": "d",
                **run}})


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CPU", "mps", "cuda:0 "])
def test_device_names_are_checked_when_parsed(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"'run.device' = .* is not a device; use cpu, cuda or cuda:N"):
        _cfg(tmp_path, device=bad)
    for good in ("cpu", "cuda", "cuda:1"):
        assert _cfg(tmp_path, device=good).run.device == good


def test_device_with_ray_points_at_the_learner_gpus(tmp_path):
    with pytest.raises(ConfigError, match="cluster.gpus_per_learner"):
        from_dict(TrainConfig, {"env": {"name": FAKE_ENV}, "run": {"device": "cuda"}, "cluster": {"address": "local"}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_gpu_this_machine_lacks_fails_before_the_run_directory(tmp_path):
    from robo_rl.runners.train import train

    with pytest.raises(ConfigError, match=r"run.device 'cuda:0' but this machine has no CUDA device.*use run.device cpu"):
        train(_cfg(tmp_path, device="cuda:0"))
    assert not (tmp_path / "d").exists()
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--device 'gpu' is not a device; use cpu, cuda or cuda:N"):
        resolve_device("gpu", "--device")


def test_to_device_moves_tensors_and_keeps_the_rest():
    x = {"rgb": torch.zeros(2, 3), "instruction": ["a", "b"], "pair": (torch.ones(1), 3), "ts": [torch.ones(2)]}
    y = to_device(x, torch.device("cpu"))
    assert y["instruction"] == ["a", "b"] and y["pair"][1] == 3 and torch.equal(y["ts"][0], torch.ones(2))
    assert to_device(None, torch.device("cpu")) is None


class _Recorder:
    """A policy that records the devices it was called with (and returns tensors on its own device)."""

    action_horizon = 4

    def __init__(self):
        self.seen = []
        self.resets = []

    def act(self, obs, deterministic=False):
        self.seen.append((obs["state"].device, obs["instruction"], deterministic))
        b = obs["state"].shape[0]
        return PolicyOutput(torch.ones(b, 7), torch.zeros(b), None, {"tokens": torch.zeros(b, 3, dtype=torch.long)})

    def value(self, obs):
        return torch.zeros(obs["state"].shape[0])

    def reset(self, env_ids=None):
        self.resets.append(env_ids)


def test_on_device_view_passes_everything_through():
    inner = _Recorder()
    view = OnDevice(inner, torch.device("cpu"))
    out = view.act({"state": torch.zeros(2, 5), "instruction": ["x", "y"]}, deterministic=True)
    assert inner.seen == [(torch.device("cpu"), ["x", "y"], True)]
    assert out.value is None and out.extras["tokens"].dtype == torch.long and out.actions.shape == (2, 7)
    view.reset([1])
    assert inner.resets == [[1]] and view.action_horizon == 4  # attributes are the policy's
    assert on_device(inner, torch.device("cpu")) is inner  # on the CPU: the policy itself, no wrapper


def test_rollouts_through_the_device_view_are_the_policys_own():
    """The view must not change a rollout: same seeds -> the same trajectories, bit for bit."""
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.rollout.collector import Collector

    def collect(wrap):
        env = ENVS.get(FAKE_ENV)(ENVS.get(FAKE_ENV).Config(num_envs=3, max_episode_steps=4))
        torch.manual_seed(0)
        policy = MLPActorCritic(MLPConfig(hidden=(8,)), env.obs_spec, env.action_spec)
        col = Collector(env, OnDevice(policy, torch.device("cpu")) if wrap else policy, steps=10)
        col.reset(seed=5)
        torch.manual_seed(1)
        traj, steps = col.collect()
        env.close()
        return traj, steps

    (a, na), (b, nb) = collect(False), collect(True)
    assert na == nb
    for name in ("log_prob", "values", "rewards", "terminated", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)


def test_checkpoints_hold_cpu_tensors(tmp_path):
    from robo_rl.runners.weights import cpu_state

    lin = torch.nn.Linear(2, 2)
    state = cpu_state(lin)
    assert set(state) == {"weight", "bias"} and all(v.device.type == "cpu" and not v.requires_grad for v in state.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_dry_run_lists_a_gpu_this_machine_lacks(tmp_path):
    from robo_rl.runners.dry_run import dry_run

    out = dry_run(_cfg(tmp_path, device="cuda"))
    assert out["dry_run"] == "ok" and "no CUDA device" in out["device_missing_here"]
    assert "device_missing_here" not in dry_run(_cfg(tmp_path))
