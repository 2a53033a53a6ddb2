"""What evaluation and benchmarks need from ManiSkill beyond its VecEnv: the scripted expert (ManiSkill's
own motion-planning solutions), the reference env of a benchmark, and the physics/render backend a run
used. Reached through ``robo_rl.registry.SIMULATORS`` ("maniskill")."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

from robo_rl.errors import ConfigError


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


class ManiSkillSupport:
    name = "maniskill"
    packages = ("mani-skill", "sapien")

    def expert_block(self, env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
        """(episodes, successes, return sum) of the motion-planning expert (``pd_joint_pos``, state, CPU)."""
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

    def reference_env(self, task: str | None) -> Any:
        """``task`` (default PickCube-v1) with 100 steps, as our PickCube configs: the motion planner needs
        64-86 steps on PickCube/PushCube, past ManiSkill's default limit of 50."""
        from sims.maniskill.env import ManiSkillConfig

        return ManiSkillConfig(task=task or "PickCube-v1", num_envs=2, obs_mode="state", max_episode_steps=100)

    def backend(self, env_cfg: Any) -> dict[str, str]:
        from sims.maniskill.env import cuda_available

        gpu = env_cfg.backend == "gpu" or (env_cfg.backend == "auto" and cuda_available())
        return {"physics": "physx_cuda" if gpu else "physx_cpu",
                "render": "cpu (lavapipe)" if env_cfg.render_device == "cpu" or not cuda_available()
                else f"gpu {env_cfg.render_device}"}

    def suite_size(self, suite: str) -> int:
        raise ConfigError("ManiSkill benchmarks are splits of one task, not suites")


SUPPORT = ManiSkillSupport()
