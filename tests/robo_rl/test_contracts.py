"""Every registered env, policy and algorithm keeps its contract (``robo_rl.contracts``), on tiny presets.

Envs: batched observations matching ``obs_spec``, ``StepResult`` shapes, ``info["success"]``, auto-reset
with ``final_obs``, seeding. Policies: ``act``/``evaluate``/``value`` shapes and action bounds, and one
PPO update from a real collection on a registered, simulator-free env (``tests/fakes/vec.py``), so the
collector and the algorithm are exercised without a simulator. Algorithms: one update each with the MLP
policy, finite losses, and a state round trip. A newly registered name without a preset here fails, so
whoever adds one adds its contract test."""

from __future__ import annotations

import math
import re
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch

from robo_rl.build import build_algorithm, build_policy
from robo_rl.capabilities import GroupRollouts, TeacherGuided
from robo_rl.contracts import Algorithm, OnPolicyAlgorithm, Policy, StepResult, VecEnv
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES
from robo_rl.rollout.collector import Collector
from robo_rl.rollout.groups import GroupCollector
from tests.conftest import FAKE_ENV, REPO

FAKE = FAKE_ENV


@pytest.fixture(autouse=True)
def _registered(fake_env):
    """The simulator-free env, registered for this module's tests."""


ENV_PRESETS = {
    FAKE: ({"num_envs": 2, "max_episode_steps": 3}, ()),
    "maniskill": ({"task": "PushCube-v1", "num_envs": 2, "max_episode_steps": 3, "backend": "cpu"},
                  (pytest.mark.maniskill,)),
    "libero": ({"num_envs": 2, "task_ids": (0,), "max_episode_steps": 3, "image_size": 64},
               (pytest.mark.libero,)),
    "isaacgym": (None, ()),  # needs an NVIDIA GPU and the Isaac Gym preview; tested with a fake gymapi
}
# policy config, and the fake env's image size the policy takes
POLICY_PRESETS = {"mlp": ({"hidden": (32, 32)}, 40), "cnn": ({"hidden": (32,)}, 40), "openvla": ({}, 40),
                  "pi0": ({"exec_steps": 2}, 32)}
ALGO_PRESETS = {"ppo": {"epochs": 1, "minibatches": 1}, "rpd": {"epochs": 1, "minibatches": 1, "teacher": "teacher"},
                "opd": {"epochs": 1, "minibatches": 1, "teacher": "teacher"}, "bc": {"dataset": "demos.h5"},
                "grpo": {"group_size": 2, "max_rounds": 1, "minibatches": 1}}


def _env_params() -> list:
    out = []
    for name in [*ENVS.names(), FAKE]:
        preset, marks = ENV_PRESETS.get(name, (None, ()))
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _env_params())
def test_env_contract(name, request):
    assert name in ENV_PRESETS, f"env {name!r} is registered but has no tiny preset in this test"
    preset = ENV_PRESETS[name][0]
    if preset is None:
        pytest.skip(f"{name}: no simulator on this machine (see its own tests)")
    if name in ("maniskill", "libero"):
        request.getfixturevalue(f"need_{name}")
    cls = ENVS.get(name)
    env = cls(cls.Config(**preset))
    try:
        assert isinstance(env, VecEnv)
        b = env.num_envs
        obs, _ = env.reset(seed=5)
        for key, spec in env.obs_spec.items():
            assert obs[key].shape == (b, *spec.shape) and obs[key].dtype == np.dtype(spec.dtype), key
        zero = np.zeros((b, *env.action_spec.shape), np.float32)
        ended = np.zeros(b, bool)
        for _ in range(preset["max_episode_steps"]):
            res = env.step(zero)
            assert isinstance(res, StepResult)
            assert res.reward.shape == res.terminated.shape == res.truncated.shape == (b,)
            assert res.info["success"].shape == (b,) and res.info["success"].dtype == bool
            done = res.terminated | res.truncated
            if done.any():
                assert all(res.info["final_obs"][k].shape == obs[k].shape for k in env.obs_spec)
            ended |= done
        assert ended.all(), "every episode ends by max_episode_steps"
        again, _ = env.reset(seed=5)
        # seeded: env i gets seed + i (LIBERO's settle steps after a reset differ by ~2e-4 between resets)
        np.testing.assert_allclose(again["state"], obs["state"], atol=1e-3)
    finally:
        env.close()


def _fake_env(n: int = 2, image_size: int = 40):
    cls = ENVS.get(FAKE)
    return cls(cls.Config(num_envs=n, max_episode_steps=4, image_size=image_size))


@pytest.mark.parametrize("name", POLICIES.names())
def test_policy_contract_and_one_ppo_update(name):
    assert name in POLICY_PRESETS, f"policy {name!r} is registered but has no tiny preset in this test"
    _check_policy(name, *POLICY_PRESETS[name])


def _check_policy(name: str, kwargs: dict, image_size: int) -> None:
    env = _fake_env(image_size=image_size)
    torch.manual_seed(0)
    policy = build_policy(POLICIES.get(name).Config(**kwargs), env.obs_spec, env.action_spec)
    assert isinstance(policy, Policy)
    col = Collector(env, policy, steps=4)
    tobs = col.reset(seed=1)
    with torch.no_grad():
        out = policy.act(tobs)
        a = out.actions
        assert a.shape[0] == 2 and a.shape[-1] == 7 and a.ndim in (2, 3)
        lp, ent, v = policy.evaluate(tobs, out.extras)
        assert lp.shape == (2,) and ent.shape[0] == 2 and policy.value(tobs).shape == (2,)
    traj, steps = col.collect()
    assert traj.values.shape == traj.rewards.shape == traj.success.shape == (4, 2)
    algo = build_algorithm(ALGORITHMS.get("ppo").Config(**ALGO_PRESETS["ppo"]), policy)
    batch = algo.prepare(traj)
    assert steps >= 8 and batch.advantages.shape == batch.returns.shape == (8,) and torch.isfinite(batch.advantages).all()
    losses = algo.update(batch)
    assert all(math.isfinite(v) for v in losses.values()), losses


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_algorithm_contract_with_the_mlp_policy(name):
    assert name in ALGO_PRESETS, f"algorithm {name!r} is registered but has no tiny preset in this test"
    _check_algorithm(name, ALGO_PRESETS[name])


def _check_algorithm(name: str, kwargs: dict) -> None:
    env = _fake_env()
    torch.manual_seed(0)
    mlp = POLICIES.get("mlp").Config(hidden=(16,))
    policy = build_policy(mlp, env.obs_spec, env.action_spec)
    algo = build_algorithm(ALGORITHMS.get(name).Config(**kwargs), policy)
    assert isinstance(algo, Algorithm)
    if isinstance(algo, TeacherGuided):
        teacher = build_policy(mlp, env.obs_spec, env.action_spec)
        algo.set_teacher(teacher, env.action_spec.shape, env.action_spec.shape)
    col: Any = GroupCollector(env, policy, **algo.rollout_groups()) if isinstance(algo, GroupRollouts) \
        else Collector(env, policy, steps=4)
    col.reset(seed=1)
    traj, _ = col.collect()
    # an offline algorithm (BC) takes (observations, actions) batches; the others prepare their rollout batch
    if getattr(algo, "offline", False):
        losses = algo.update((dict(traj.flatten().obs), traj.flatten().extras["action"]))
    else:
        assert isinstance(algo, OnPolicyAlgorithm)
        losses = algo.update(algo.prepare(traj))
    assert losses and all(math.isfinite(v) for v in losses.values()), losses
    state = algo.state_dict()
    algo.load_state_dict(state)


def _template(page: str, index: int) -> types.ModuleType:
    """The ``index``-th python block of ``docs/extending/<page>``, run as a module of its own."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending" / page).read_text(), re.S)
    mod = types.ModuleType(f"extending_{page.removesuffix('.md')}")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(blocks[index], f"docs/extending/{page}", "exec"), mod.__dict__)
    return mod


def test_the_extending_templates_keep_the_contracts():
    """The policy and algorithm a reader copies from the extending pages register and pass the same checks."""
    POLICIES.register("linear", _template("policy.md", 1).LinearPolicy)
    ALGORITHMS.register("entropy_floor", _template("algorithm.md", 1).EntropyFloor)
    try:
        _check_policy("linear", {}, 40)
        _check_algorithm("entropy_floor", {"epochs": 1, "minibatches": 1})
    finally:
        POLICIES.unregister("linear")
        ALGORITHMS.unregister("entropy_floor")
