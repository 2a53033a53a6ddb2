"""Our VecEnv (crash-proof subprocess workers, shared memory, seeded auto-reset) for other RL libraries:
a ``gymnasium.vector.VectorEnv`` and a stable-baselines3 ``VecEnv``.

Both expose one observation entry (``obs_key``, default ``state``: (B, D) float32; ``rgb`` gives
(B, V, H, W, 3) uint8) as a Box, and the action Box of ``action_spec`` (per-dimension bounds where the
env has them). Finished envs auto-reset in the same step, as ours do: the observation returned is the
new episode's first, the last one of the old episode is in the info (gymnasium: ``final_obs`` with the
``_final_obs`` mask, ``AutoresetMode.SAME_STEP``; SB3: ``terminal_observation`` per env). Usage::

    from robo_rl.build import build_env
    from sims.external import GymVectorEnv, sb3_vec_env

    venv = sb3_vec_env(build_env(cfg.env))       # stable_baselines3.PPO("MlpPolicy", venv)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from robo_rl.contracts import ArraySpec, VecEnv
from robo_rl.errors import ConfigError


def box(spec: ArraySpec) -> gym.spaces.Box:
    """The gymnasium Box of one entry (unbounded where the spec has no bounds; uint8 images 0..255)."""
    if spec.dtype == "uint8":
        return gym.spaces.Box(0, 255, spec.shape, np.uint8)
    low = -np.inf if spec.low is None else np.asarray(spec.low, np.float32)
    high = np.inf if spec.high is None else np.asarray(spec.high, np.float32)
    return gym.spaces.Box(np.broadcast_to(low, spec.shape).astype(np.float32),
                          np.broadcast_to(high, spec.shape).astype(np.float32), dtype=np.float32)


def _entry(env: VecEnv, obs_key: str) -> ArraySpec:
    if obs_key not in env.obs_spec:
        raise ConfigError(f"obs_key {obs_key!r}: this env observes {', '.join(sorted(env.obs_spec))}")
    return env.obs_spec[obs_key]


class GymVectorEnv(gym.vector.VectorEnv):
    """``env`` as a gymnasium vector env over the observation entry ``obs_key``."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env: VecEnv, obs_key: str = "state") -> None:
        self.env, self.obs_key = env, obs_key
        self.num_envs = env.num_envs
        self.single_observation_space = box(_entry(env, obs_key))
        self.single_action_space = box(env.action_spec)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Env i is seeded ``seed + i`` (a list: its first entry)."""
        first = seed[0] if isinstance(seed, (list, tuple)) else seed
        obs, info = self.env.reset(seed=first)
        return obs[self.obs_key], dict(info)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict]:
        res = self.env.step(np.asarray(actions, dtype=np.float32))
        info = {k: v for k, v in res.info.items() if k != "final_obs"}
        if "final_obs" in res.info:
            info["final_obs"] = res.info["final_obs"][self.obs_key]
            info["_final_obs"] = res.terminated | res.truncated
        return res.obs[self.obs_key], res.reward, res.terminated, res.truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


def sb3_vec_env(env: VecEnv, obs_key: str = "state") -> Any:
    """``env`` as a stable-baselines3 ``VecEnv`` (stable-baselines3 imported here, not a dependency)."""
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv as SB3VecEnv

    class OurVecEnv(SB3VecEnv):
        def __init__(self) -> None:
            super().__init__(env.num_envs, box(_entry(env, obs_key)), box(env.action_spec))
            self.env = env
            self._actions: np.ndarray | None = None

        def reset(self) -> np.ndarray:
            obs, _ = env.reset(seed=self._seeds[0] if self._seeds else None)
            self._reset_seeds()
            return obs[obs_key]

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = np.asarray(actions, dtype=np.float32)

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
            res = env.step(self._actions)
            done = res.terminated | res.truncated
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(done):
                infos[i]["terminal_observation"] = res.info["final_obs"][obs_key][i]
                infos[i]["TimeLimit.truncated"] = bool(res.truncated[i] and not res.terminated[i])
                infos[i]["is_success"] = bool(res.info["success"][i])
            return res.obs[obs_key], res.reward, done, infos

        def close(self) -> None:
            env.close()

        def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
            return [getattr(env, attr_name, None)] * len(self._get_indices(indices))

        def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
            raise NotImplementedError("the envs run in worker processes; configure them through the env config")

        def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
            raise NotImplementedError("the envs run in worker processes; their methods are not reachable from here")

        def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
            return [False] * len(self._get_indices(indices))

    return OurVecEnv()
