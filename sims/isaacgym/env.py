"""Isaac Gym adapter: all envs in one GPU-batched sim, partial resets by env index.

Isaac Gym is not on PyPI (NVIDIA distributes it by download); this adapter is written against the
``isaacgym-stubs`` signatures and raises a clear error where Isaac Gym is absent. A task supplies
the scene and the math through the ``IsaacGymTask`` protocol; the adapter owns the sim, batching,
time limits, auto-reset with ``final_obs`` and the conversion to the VecEnv contract.

Shapes: obs ``state`` (B, D) float32, actions (B, A) in [-1, 1], reward (B,), terminated /
truncated / success (B,) bool.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec, Observation, StepResult
from robo_rl.errors import ConfigError, SimulatorUnavailable

INSTALL_HINT = ("NVIDIA Isaac Gym is not installed; download Isaac Gym Preview 4 from NVIDIA, then "
                "'pip install -e isaacgym/python' in this environment (it is not on PyPI)")


class IsaacGymTask(Protocol):
    """A user's task: builds actors in each env and computes everything on the sim's tensors."""

    num_obs: int
    num_actions: int
    max_episode_steps: int

    def create_envs(self, gym: Any, sim: Any, num_envs: int) -> None:
        """Load assets and create ``num_envs`` envs with their actors."""
        ...

    def apply_actions(self, gym: Any, sim: Any, actions: Any) -> None:
        """actions: (B, A) torch tensor on the sim device, in [-1, 1]."""
        ...

    def compute(self, gym: Any, sim: Any) -> tuple[Any, Any, Any, Any]:
        """After a physics step: (obs (B, D), reward (B,), terminated (B,) bool, success (B,) bool)."""
        ...

    def reset_envs(self, gym: Any, sim: Any, env_ids: Any, seed: int | None) -> None:
        """Reset the envs in ``env_ids`` (1-D long tensor) to new initial states."""
        ...

    def observe(self, gym: Any, sim: Any) -> Any:
        """(B, D) observations of the current state (after resets)."""
        ...


@dataclass(frozen=True)
class IsaacGymConfig:
    """Settings of the Isaac Gym adapter."""

    name: str = "isaacgym"
    """Registry name of the simulator."""
    task: str = ""
    """Import string of the IsaacGymTask class, 'package.module:Class'."""
    task_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the task class."""
    num_envs: int = ranged(256, ge=1, le=2**31 - 1)
    """Envs batched in the one sim (Isaac Gym counts envs in a C int). Range: in [1, 2**31 - 1]."""
    device: int = ranged(0, ge=0, le=2**31 - 1)
    """CUDA device for physics. Range: in [0, 2**31 - 1]."""
    graphics_device: int = ranged(-1, ge=-1, le=2**31 - 1)
    """Graphics device for cameras (-1 = headless, no rendering). Range: in [-1, 2**31 - 1]."""
    dt: float = ranged(1.0 / 60.0, gt=0, unit="seconds")
    """Physics step (seconds). Range: > 0 seconds."""
    substeps: int = ranged(2, ge=1, le=2**31 - 1)
    """Physics substeps per step. Range: in [1, 2**31 - 1]."""

    def __post_init__(self) -> None:
        check_ranges(self, "env")
        if ":" not in self.task:
            raise ConfigError(f"config key 'env.task' = {self.task!r} must name the task class as 'package.module:Class'")


def _task_class(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"config key 'env.task' = {spec!r} cannot be imported ({err})") from None


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


class IsaacGymVecEnv:
    """VecEnv over one Isaac Gym sim (see module docstring)."""

    Config = IsaacGymConfig

    def __init__(self, cfg: IsaacGymConfig, render: bool = False) -> None:
        try:
            from isaacgym import gymapi  # typed by the isaacgym-stubs package
        except ImportError:
            raise SimulatorUnavailable(INSTALL_HINT) from None
        import torch

        self.cfg = cfg
        self.num_envs = cfg.num_envs
        self.task: IsaacGymTask = _task_class(cfg.task)(**cfg.task_kwargs)
        self.gym: gymapi.Gym = gymapi.acquire_gym()
        params = gymapi.SimParams()
        params.dt = cfg.dt
        params.substeps = cfg.substeps
        params.up_axis = gymapi.UP_AXIS_Z
        params.gravity = gymapi.Vec3(0.0, 0.0, -9.81)
        params.use_gpu_pipeline = True
        params.physx.use_gpu = True
        self.sim: gymapi.Sim = self.gym.create_sim(cfg.device, cfg.graphics_device if render else -1,
                                                    gymapi.SIM_PHYSX, params)
        if self.sim is None:
            raise SimulatorUnavailable(f"Isaac Gym could not create a PhysX sim on CUDA device {cfg.device}")
        self.task.create_envs(self.gym, self.sim, cfg.num_envs)
        if not self.gym.prepare_sim(self.sim):
            raise SimulatorUnavailable("Isaac Gym prepare_sim failed (check the task's assets and the GPU pipeline)")
        self.device = torch.device(f"cuda:{cfg.device}") if torch.cuda.is_available() else torch.device("cpu")
        self.elapsed = torch.zeros(cfg.num_envs, dtype=torch.long, device=self.device)
        self.obs_spec = {"state": ArraySpec((self.task.num_obs,), "float32")}
        self.action_spec = ArraySpec((self.task.num_actions,), "float32", -1.0, 1.0, "task-defined, normalized")

    def _step_physics(self) -> None:
        self.gym.simulate(self.sim)
        self.gym.fetch_results(self.sim, True)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        import torch

        ids = torch.arange(self.num_envs, device=self.device)
        self.task.reset_envs(self.gym, self.sim, ids, seed)
        self.elapsed.zero_()
        return {"state": _np(self.task.observe(self.gym, self.sim)).astype(np.float32)}, {}

    def step(self, actions: np.ndarray) -> StepResult:
        """``actions`` (B, A), or chunks (B, H, A) with the VecEnv contract's semantics: every env runs
        its chunk's steps and stops counting at its episode's end (``reward`` summed over the executed
        steps, ``success`` if any step succeeded, ``info["chunk_steps"]``); finished envs reset after
        the chunk (the batched sim steps all envs together)."""
        import torch

        if np.ndim(actions) == 3:
            return self._step_chunk(np.asarray(actions, np.float32))
        act = torch.as_tensor(np.asarray(actions, np.float32), device=self.device).clamp(-1.0, 1.0)
        if tuple(act.shape) != (self.num_envs, self.task.num_actions):
            raise ConfigError(f"step() got actions of shape {tuple(act.shape)}; expected {(self.num_envs, self.task.num_actions)}")
        self.task.apply_actions(self.gym, self.sim, act)
        self._step_physics()
        self.elapsed += 1
        obs, reward, terminated, success = self.task.compute(self.gym, self.sim)
        terminated = terminated.bool()
        truncated = (self.elapsed >= self.task.max_episode_steps) & ~terminated
        done = terminated | truncated
        info: dict[str, Any] = {"success": _np(success).astype(bool)}
        if bool(done.any()):
            info["final_obs"] = {"state": _np(obs).astype(np.float32).copy()}
            ids = done.nonzero().flatten()
            self.task.reset_envs(self.gym, self.sim, ids, None)
            self.elapsed[ids] = 0
            obs = obs.clone()
            obs[ids] = self.task.observe(self.gym, self.sim)[ids]
        return StepResult({"state": _np(obs).astype(np.float32)}, _np(reward).astype(np.float32),
                          _np(terminated).astype(bool), _np(truncated).astype(bool), info)

    def _step_chunk(self, chunks: np.ndarray) -> StepResult:
        import torch

        b, h = chunks.shape[:2]
        if (b, *chunks.shape[2:]) != (self.num_envs, self.task.num_actions) or h < 1:
            raise ConfigError(f"step() got action chunks of shape {chunks.shape}; expected "
                              f"({self.num_envs}, H, {self.task.num_actions}) with H >= 1")
        reward = np.zeros(b, np.float64)
        steps = np.zeros(b, np.int64)
        term, trunc, success, done = (np.zeros(b, bool) for _ in range(4))
        final: np.ndarray | None = None
        for k in range(h):
            act = torch.as_tensor(chunks[:, k], device=self.device).clamp(-1.0, 1.0)
            self.task.apply_actions(self.gym, self.sim, act)
            self._step_physics()
            self.elapsed += 1
            obs, r, te, ok = self.task.compute(self.gym, self.sim)
            live = ~done
            te_np = _np(te).astype(bool)
            tr_np = (_np(self.elapsed) >= self.task.max_episode_steps) & ~te_np
            reward[live] += _np(r).astype(np.float64)[live]
            steps[live] += 1
            success[live] |= _np(ok).astype(bool)[live]
            ended = live & (te_np | tr_np)
            term[ended], trunc[ended] = te_np[ended], tr_np[ended]
            if ended.any():
                final = _np(obs).astype(np.float32).copy() if final is None else final
                final[ended] = _np(obs).astype(np.float32)[ended]
            done |= ended
            if done.all():
                break
        info: dict[str, Any] = {"success": success, "chunk_steps": steps}
        obs = obs.clone()
        if done.any():
            info["final_obs"] = {"state": final}
            ids = torch.as_tensor(np.flatnonzero(done), device=self.device)
            self.task.reset_envs(self.gym, self.sim, ids, None)
            self.elapsed[ids] = 0
            obs[ids] = self.task.observe(self.gym, self.sim)[ids]
        return StepResult({"state": _np(obs).astype(np.float32)}, reward.astype(np.float32), term, trunc, info)

    def render(self) -> np.ndarray | None:
        return None

    def close(self) -> None:
        self.gym.destroy_sim(self.sim)
