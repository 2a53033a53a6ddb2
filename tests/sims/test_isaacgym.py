"""Isaac Gym adapter: calls checked against the isaacgym-stubs signatures; batching, time limits and
partial resets checked with a fake gymapi (Isaac Gym itself is not installable here)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from robo_rl.errors import ConfigError, SimulatorUnavailable
from sims.isaacgym.env import IsaacGymConfig, IsaacGymVecEnv
from tests.fakes import isaacgym as fake

# Gym methods the adapter calls, with the number of positional arguments it passes.
CALLS = {"create_sim": 4, "prepare_sim": 1, "simulate": 1, "fetch_results": 2, "destroy_sim": 1}
SIM_PARAMS = ("dt", "substeps", "up_axis", "gravity", "use_gpu_pipeline", "physx")
MODULE_NAMES = ("acquire_gym", "SimParams", "Vec3", "SIM_PHYSX", "UP_AXIS_Z", "Gym", "Sim")


def _stub_text() -> str:
    """The stub file (a stub-only package has no importable module, so search sys.path)."""
    for root in (Path(p) for p in sys.path if p):
        f = root / "isaacgym-stubs" / "gymapi.pyi"
        if f.is_file():
            return f.read_text()
    pytest.fail("isaacgym-stubs is not installed (pip install isaacgym-stubs==1.1rc4, part of the dev extra)")


def _class_body(text: str, name: str) -> str:
    start = text.index(f"\nclass {name}")
    nxt = re.search(r"\nclass \w", text[start + 1:])
    return text[start: start + 1 + nxt.start()] if nxt else text[start:]


def test_calls_match_the_isaacgym_stub_signatures():
    text = _stub_text()
    gym = _class_body(text, "Gym")
    for method, passed in CALLS.items():
        m = re.search(rf"def {method}\(self(.*?)\)\s*->", gym, re.S)
        assert m, f"Gym.{method} is not in the stubs"
        params = [p.strip() for p in m.group(1).split(",") if p.strip()]
        required = [p for p in params if "=" not in p]
        assert len(required) <= passed <= len(params), f"Gym.{method}{m.group(1)} vs {passed} positional args"
    sim_params = _class_body(text, "SimParams")
    for attr in SIM_PARAMS:
        assert re.search(rf"\n\s+{attr}: ", sim_params), f"SimParams.{attr} is not in the stubs"
    assert re.search(r"\n\s+use_gpu: ", _class_body(text, "PhysXParams"))
    for name in MODULE_NAMES:
        assert re.search(rf"(\nclass {name}\b|\ndef {name}\(|\n{name}: )", text), f"gymapi.{name} is not in the stubs"


def test_clear_error_without_isaacgym(monkeypatch):
    monkeypatch.setitem(sys.modules, "isaacgym", None)
    with pytest.raises(SimulatorUnavailable, match="Isaac Gym is not installed"):
        IsaacGymVecEnv(IsaacGymConfig(task="tests.fakes.isaacgym:CounterTask", num_envs=2))


def test_bad_task_string():
    with pytest.raises(ConfigError, match="package.module:Class"):
        IsaacGymConfig(task="CounterTask")


def test_batching_time_limit_and_partial_reset(monkeypatch):
    pkg, gymapi = fake.make_module()
    monkeypatch.setitem(sys.modules, "isaacgym", pkg)
    monkeypatch.setitem(sys.modules, "isaacgym.gymapi", gymapi)
    env = IsaacGymVecEnv(IsaacGymConfig(task="tests.fakes.isaacgym:CounterTask", num_envs=3))
    task = env.task
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs["state"][:, 1], [0, 1, 2])
    act = np.zeros((3, 1), np.float32)
    act[1, 0] = 1.0  # env 1 succeeds at once
    res = env.step(act)
    assert res.terminated.tolist() == [False, True, False] and res.info["success"].tolist() == [False, True, False]
    assert res.info["final_obs"]["state"][1, 0] == 1 and res.obs["state"][1, 0] == 0  # reset only env 1
    assert task.resets[-1] == [1]
    act[:] = 0
    env.step(act)
    res = env.step(act)  # envs 0 and 2 reach max_episode_steps = 3
    assert res.truncated.tolist() == [True, False, True] and not res.terminated.any()
    assert task.resets[-1] == [0, 2]
    np.testing.assert_array_equal(res.info["final_obs"]["state"][:, 0], [3, 2, 3])
    np.testing.assert_array_equal(res.obs["state"][:, 0], [0, 2, 0])
    with pytest.raises(ConfigError, match="expected"):
        env.step(np.zeros((2, 1), np.float32))
    env.close()
    assert fake.CALLS[-1] == "destroy_sim"


def test_action_chunks_follow_the_vecenv_contract(monkeypatch):
    """(B, H, A) chunks: each env stops counting at its episode's end (reward summed over the executed
    steps, success if any step succeeded, chunk_steps), final obs at that step, resets after the chunk."""
    pkg, gymapi = fake.make_module()
    monkeypatch.setitem(sys.modules, "isaacgym", pkg)
    monkeypatch.setitem(sys.modules, "isaacgym.gymapi", gymapi)
    env = IsaacGymVecEnv(IsaacGymConfig(task="tests.fakes.isaacgym:CounterTask", num_envs=3))
    env.reset(seed=0)
    chunk = np.zeros((3, 4, 1), np.float32)
    chunk[1, 1, 0] = 1.0  # env 1 succeeds on its 2nd step; envs 0 and 2 hit the 3-step limit
    res = env.step(chunk)
    assert res.info["chunk_steps"].tolist() == [3, 2, 3]
    assert res.reward.tolist() == [6.0, 3.0, 6.0]  # CounterTask's reward is the step count: 1+2+3, 1+2
    assert res.terminated.tolist() == [False, True, False] and res.truncated.tolist() == [True, False, True]
    assert res.info["success"].tolist() == [False, True, False]
    np.testing.assert_array_equal(res.info["final_obs"]["state"][:, 0], [3, 2, 3])
    np.testing.assert_array_equal(res.obs["state"][:, 0], [0, 0, 0])
    assert env.task.resets[-1] == [0, 1, 2]
    res = env.step(np.zeros((3, 2, 1), np.float32))  # a short chunk inside the episode
    assert res.info["chunk_steps"].tolist() == [2, 2, 2] and "final_obs" not in res.info
    with pytest.raises(ConfigError, match=r"expected \(3, H, 1\)"):
        env.step(np.zeros((3, 2, 2), np.float32))
    env.close()
