"""Reference policies for benchmarks: ``random`` (a floor) and ``expert`` (a ceiling).

``random`` is a ``Policy``: uniform actions in the env's action box from a seeded generator; it
runs through the vector envs like any trained policy. ``expert`` is the simulators' privileged
scripted expert (ManiSkill's own motion-planning solutions in ``pd_joint_pos``; the LIBERO
pick-and-place expert for In/On goals). Experts read simulator state and drive the env themselves,
so they run in-process, one episode after another, on the same seeds and init states the vector
envs give a policy (episode j of a block with seed S uses seed / init state S + j) and with the
same variations. A privileged expert does not look at images: a vision split cannot hurt it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import torch

from robo_rl.contracts import ArraySpec, PolicyOutput
from robo_rl.errors import ConfigError

REFERENCE_POLICIES = ("random", "expert")


class UniformRandomPolicy:
    """Uniform actions in [low, high]^A (B, A); seeded by ``seed``, stateless across episodes."""

    def __init__(self, action_spec: ArraySpec, seed: int = 0) -> None:
        if action_spec.low is None or action_spec.high is None:
            raise ConfigError("the random policy needs an action space with bounds")
        self.spec = action_spec
        self.gen = torch.Generator().manual_seed(seed)

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        b = len(next(v for v in obs.values() if hasattr(v, "shape")))
        u = torch.rand((b, *self.spec.shape), generator=self.gen)
        return PolicyOutput(self.spec.low + u * (self.spec.high - self.spec.low))

    def evaluate(self, obs: dict[str, Any], extras: dict[str, Any]) -> tuple[Any, Any, Any]:
        raise NotImplementedError("the random reference policy is not trainable")

    def value(self, obs: dict[str, Any]) -> Any:
        raise NotImplementedError("the random reference policy has no critic")

    def reset(self, env_ids: Any = None) -> None:
        return None

    def eval(self) -> UniformRandomPolicy:
        return self


class _Tally(gym.Wrapper):
    """Routes the planner's resets through our single env (seeded variations) and tallies success and
    reward over the first ``max_steps`` steps (the planner itself ignores the time limit)."""

    def __init__(self, single: Any, max_steps: int) -> None:
        super().__init__(single.env)
        self.single, self.max_steps = single, max_steps
        self.steps, self.success, self.ret = 0, False, 0.0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.single.reset(seed=seed)
        self.steps, self.success, self.ret = 0, False, 0.0
        return self.env.unwrapped.get_obs(), {}

    def step(self, action: Any) -> Any:
        from sims.maniskill.env import _to_numpy

        self.single.before_step()  # mid-episode perturbations apply to the planner's episodes too
        out = self.env.step(action)
        self.steps += 1
        if self.steps <= self.max_steps and not self.success:
            self.ret += float(_to_numpy(out[1]).reshape(-1)[0])
            self.success = bool(_to_numpy(out[4].get("success", False)).reshape(-1)[0])
        return out


def _maniskill_expert(env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
    from sims.maniskill.env import ManiSkillSingleEnv
    from sims.maniskill.experts import solutions

    table = solutions()
    if env_cfg.task not in table:
        raise ConfigError(f"no scripted expert for {env_cfg.task!r}; experts exist for {', '.join(sorted(table))}")
    cfg = dataclasses.replace(env_cfg, num_envs=1, obs_mode="state", control_mode="pd_joint_pos", backend="cpu",
                              scene_workers=None)
    single = ManiSkillSingleEnv(cfg)
    try:
        max_steps = cfg.max_episode_steps or getattr(single.env, "_max_episode_steps", None) or 50
        env = _Tally(single, max_steps)
        succ, ret = 0, 0.0
        for j in range(episodes):
            try:
                table[cfg.task](env, seed=seed + j, debug=False, vis=False)
            except Exception:  # no plan found: the episode fails (as a real expert attempt would)
                pass
            succ += int(env.success)
            ret += env.ret
        return episodes, succ, ret
    finally:
        single.close()


def _libero_expert(env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
    from sims.libero.env import LiberoSingleEnv
    from sims.libero.experts import PickPlaceExpert

    env = LiberoSingleEnv(dataclasses.replace(env_cfg, num_envs=1), env_cfg.task_ids[0])
    try:
        succ, ret = 0, 0.0
        for j in range(episodes):
            obs = env.reset(seed=seed + j)
            expert = PickPlaceExpert(env)
            done, info = False, {"success": False}
            while not done:
                obs, r, term, trunc, info = env.step(expert.act(obs["state"]))
                ret += r
                done = term or trunc
            succ += int(info["success"])
        return episodes, succ, ret
    finally:
        env.close()


def expert_block(env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
    """(episodes, successes, return sum) of the scripted expert on ``episodes`` episodes from ``seed``."""
    if env_cfg.name == "maniskill":
        return _maniskill_expert(env_cfg, episodes, seed)
    if env_cfg.name == "libero":
        return _libero_expert(env_cfg, episodes, seed)
    raise ConfigError(f"no scripted expert for simulator {env_cfg.name!r}; experts exist for maniskill and libero")


def libero_task(task: str) -> tuple[str, int]:
    """``--task SUITE/INDEX`` of a LIBERO benchmark (``libero_object/3``) as (suite, task index)."""
    suite, _, idx = task.partition("/")
    if not suite or not idx.isdigit():
        raise ConfigError(f"--task {task!r} on a LIBERO benchmark must be SUITE/INDEX, e.g. libero_object/3 "
                          "(omit --task to evaluate every task of the suite)")
    return suite, int(idx)


def reference_env(sim: str, task: str | None) -> Any:
    """The env a reference policy is evaluated in (ManiSkill: ``task``, default PickCube-v1, 100 steps;
    LIBERO: the benchmark's suite with its standard episode length; ``task`` = ``SUITE/INDEX`` picks one
    task of it, which ``robo_rl.eval.benchmark`` then evaluates alone)."""
    if sim == "maniskill":
        from sims.maniskill.env import ManiSkillConfig

        # 100 steps as our PickCube configs: the motion planner needs 64-86 steps on PickCube/PushCube,
        # past ManiSkill's default limit of 50
        return ManiSkillConfig(task=task or "PickCube-v1", num_envs=2, obs_mode="state", max_episode_steps=100)
    from sims.libero.env import LiberoConfig

    if task is None:
        return LiberoConfig()
    suite, idx = libero_task(task)
    return LiberoConfig(suite=suite, task_ids=(idx,))

