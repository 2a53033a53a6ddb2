"""A registered, simulator-free VecEnv for contract tests of the trainer, collector, policies and
algorithms: B point masses reaching goals in numpy, with a rendered image and an instruction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec, StepResult


@dataclass(frozen=True)
class PointReachConfig:
    name: str = "fake_reach"
    """Registry name of the env."""
    num_envs: int = ranged(2, ge=1)
    """Envs in the batch (B)."""
    max_episode_steps: int = ranged(6, ge=1)
    """Steps before an episode is truncated."""
    image_size: int = ranged(40, ge=8, unit="pixels")
    """Side of the square camera image."""

    def __post_init__(self) -> None:
        check_ranges(self, "env")

    def with_num_envs(self, n: int) -> PointReachConfig:
        return PointReachConfig(num_envs=n, max_episode_steps=self.max_episode_steps, image_size=self.image_size)


class PointReachVecEnv:
    """state (B, 5) = [pos (2), goal (2), t / T]; rgb (B, 1, S, S, 3) with the point drawn; action (B, 7)
    in [-1, 1] (the first two move the point by 0.2 x action); reward -distance; success (terminated)
    within 0.15 of the goal; truncated after ``max_episode_steps``; same-step auto-reset with final_obs."""

    Config = PointReachConfig

    def __init__(self, cfg: PointReachConfig, render: bool = False) -> None:
        self.cfg = cfg
        self.num_envs = cfg.num_envs
        self.obs_spec = {"state": ArraySpec((5,), "float32"), "rgb": ArraySpec((1, cfg.image_size, cfg.image_size, 3), "uint8")}
        self.action_spec = ArraySpec((7,), "float32", -1.0, 1.0)
        b = cfg.num_envs
        self.pos, self.goal, self.t = np.zeros((b, 2)), np.zeros((b, 2)), np.zeros(b, int)
        self.rngs = [np.random.default_rng(i) for i in range(b)]

    def _reset_row(self, i: int) -> None:
        self.pos[i], self.goal[i], self.t[i] = self.rngs[i].uniform(-1, 1, 2), self.rngs[i].uniform(-1, 1, 2), 0

    def _obs(self) -> dict[str, Any]:
        b = self.num_envs
        state = np.concatenate([self.pos, self.goal, (self.t / self.cfg.max_episode_steps)[:, None]], 1)
        n = self.cfg.image_size
        rgb = np.zeros((b, 1, n, n, 3), np.uint8)
        px = np.clip(((self.pos + 1) * (n - 1) / 2).astype(int), 0, n - 1)
        rgb[np.arange(b), 0, px[:, 1], px[:, 0]] = 255
        return {"state": state.astype(np.float32), "rgb": rgb, "instruction": ["reach the goal"] * b}

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.reset_each([None if seed is None else seed + i for i in range(self.num_envs)])

    def reset_each(self, seeds: list[int | None]) -> tuple[dict[str, Any], dict[str, Any]]:
        for i, s in enumerate(seeds):
            if s is not None:
                self.rngs[i] = np.random.default_rng(s)
            self._reset_row(i)
        return self._obs(), {}

    def step(self, actions: np.ndarray) -> StepResult:
        a = np.asarray(actions, np.float64)
        if a.ndim == 3:  # a chunk: its first action
            a = a[:, 0]
        self.pos = np.clip(self.pos + 0.2 * np.clip(a[:, :2], -1, 1), -1, 1)
        self.t += 1
        dist = np.linalg.norm(self.pos - self.goal, axis=1)
        term = dist < 0.15
        trunc = ~term & (self.t >= self.cfg.max_episode_steps)
        info: dict[str, Any] = {"success": term.copy()}
        done = term | trunc
        if done.any():
            info["final_obs"] = self._obs()
            for i in np.flatnonzero(done):
                self._reset_row(i)
        return StepResult(self._obs(), (-dist).astype(np.float32), term, trunc, info)

    def render(self) -> np.ndarray:
        return self._obs()["rgb"][:, 0]

    def close(self) -> None:
        return None
