"""Construct envs, policies and algorithms from config sections through the registries."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robo_rl.contracts import ArraySpec
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES


def build_env(env_cfg: Any, render: bool = False, num_envs: int | None = None) -> Any:
    """VecEnv from an env section; ``num_envs`` overrides the section's count (e.g. for evaluation)."""
    import dataclasses

    if num_envs is not None and num_envs != env_cfg.num_envs:
        env_cfg = dataclasses.replace(env_cfg, num_envs=num_envs)
    return ENVS.get(env_cfg.name)(env_cfg, render=render)


def build_policy(policy_cfg: Any, obs_spec: dict[str, ArraySpec], action_spec: ArraySpec) -> Any:
    return POLICIES.get(policy_cfg.name)(policy_cfg, obs_spec, action_spec)


def build_algorithm(algo_cfg: Any, policy: Any, generator: torch.Generator | None = None) -> Any:
    return ALGORITHMS.get(algo_cfg.name)(algo_cfg, policy, generator=generator)


def to_env_actions(actions: torch.Tensor, spec: ArraySpec) -> np.ndarray:
    """Policy actions (B, A) -> float32 numpy clipped to the env's bounds."""
    a = actions.detach().cpu().numpy().astype(np.float32)
    if spec.low is not None and spec.high is not None:
        np.clip(a, spec.low, spec.high, out=a)
    return a
