"""Motion-planned experts for ManiSkill3 tasks (ManiSkill's own mplib solutions), recorded as
robo-rl episodes.

The solutions drive the env in ``pd_joint_pos`` control; a recording wrapper captures every
observation, action, reward and success flag as they happen, so the dataset holds exactly what the
expert did (actions are absolute joint targets; ``meta.control_mode`` says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from robo_rl.data.episodes import Episode
from robo_rl.errors import ConfigError
from sims.maniskill.env import _split_obs, _to_numpy
from sims.maniskill.tasks import INSTRUCTIONS


def solutions() -> dict[str, Callable[..., Any]]:
    from mani_skill.examples.motionplanning.panda import solutions as s

    return {"PickCube-v1": s.solvePickCube, "PushCube-v1": s.solvePushCube, "PullCube-v1": s.solvePullCube,
            "StackCube-v1": s.solveStackCube, "LiftPegUpright-v1": s.solveLiftPegUpright,
            "PegInsertionSide-v1": s.solvePegInsertionSide, "PlaceSphere-v1": s.solvePlaceSphere}


class Recorder(gym.Wrapper):
    """Records obs/actions/rewards/success of the current episode of a 1-env CPU ManiSkill env."""

    def __init__(self, env: Any, obs_mode: str) -> None:
        super().__init__(env)
        self.obs_mode = obs_mode
        self.clear()

    def clear(self) -> None:
        self.obs: list[dict[str, np.ndarray]] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.success: list[bool] = []

    def _keep(self, raw: Any) -> None:
        self.obs.append({k: v[0] for k, v in _split_obs(raw, self.obs_mode).items()})

    def reset(self, **kw: Any) -> Any:
        out = self.env.reset(**kw)
        self.clear()
        self._keep(out[0])
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        raw, rew, _, _, info = out
        self._keep(raw)
        self.actions.append(np.asarray(_to_numpy(action), np.float32).reshape(-1))
        self.rewards.append(float(_to_numpy(rew).reshape(-1)[0]))
        self.success.append(bool(_to_numpy(info.get("success", False)).reshape(-1)[0]))
        return out


def generate(task: str, episodes: int, seed: int = 0, obs_mode: str = "state", image_size: int = 128,
             only_success: bool = False, max_attempts: int | None = None,
             on_episode: Callable[[Episode, bool], None] | None = None) -> Iterator[Episode]:
    """Yield expert episodes for ``task`` with seeds seed, seed+1, ...

    With ``only_success`` failed attempts are dropped (up to ``max_attempts`` seeds in all).
    ``on_episode(ep, kept)`` is called after every attempt (progress reporting).
    """
    from sims.maniskill.env import ManiSkillConfig, _make_gym_env

    table = solutions()
    if task not in table:
        raise ConfigError(f"no motion-planned expert for {task!r}; available: {', '.join(sorted(table))}")
    cfg = ManiSkillConfig(task=task, num_envs=1, obs_mode=obs_mode, control_mode="pd_joint_pos",
                          reward_mode="normalized_dense", backend="cpu", image_size=image_size)
    env = Recorder(_make_gym_env(cfg, "physx_cpu", 1, render=False), obs_mode)
    solve = table[task]
    kept, attempt = 0, 0
    limit = max_attempts or (episodes * 3 if only_success else episodes)
    try:
        while kept < episodes and attempt < limit:
            s = seed + attempt
            attempt += 1
            try:
                solve(env, seed=s, debug=False, vis=False)
            except Exception:  # the planner raises when it finds no plan: a failed attempt
                pass
            if not env.actions:
                continue
            ep = Episode({k: np.stack([o[k] for o in env.obs]) for k in env.obs[0]}, np.stack(env.actions),
                         np.asarray(env.rewards, np.float32), np.asarray(env.success, bool),
                         INSTRUCTIONS.get(task, task), s)
            keep = ep.succeeded or not only_success
            if on_episode is not None:
                on_episode(ep, keep)
            if keep:
                kept += 1
                yield ep
    finally:
        env.close()
