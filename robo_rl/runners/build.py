"""Construct envs, policies and algorithms from config sections through the registries."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robo_rl.contracts import ArraySpec
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES


def build_env(env_cfg: Any, render: bool = False, num_envs: int | None = None) -> Any:
    """VecEnv from an env section; ``num_envs`` overrides the section's count (e.g. for evaluation)."""
    if num_envs is not None and num_envs != env_cfg.num_envs:
        env_cfg = with_num_envs(env_cfg, num_envs)
    return ENVS.get(env_cfg.name)(env_cfg, render=render)


def with_num_envs(env_cfg: Any, n: int) -> Any:
    """An env section for ``n`` envs; a config whose other keys depend on the count (ManiSkill's
    ``scene_workers``) adjusts them in its own ``with_num_envs``."""
    import dataclasses

    resize = getattr(env_cfg, "with_num_envs", None)
    return resize(n) if resize is not None else dataclasses.replace(env_cfg, num_envs=n)


def build_policy(policy_cfg: Any, obs_spec: dict[str, ArraySpec], action_spec: ArraySpec) -> Any:
    return POLICIES.get(policy_cfg.name)(policy_cfg, obs_spec, action_spec)


def build_algorithm(algo_cfg: Any, policy: Any, generator: torch.Generator | None = None) -> Any:
    return ALGORITHMS.get(algo_cfg.name)(algo_cfg, policy, generator=generator)


def policy_from_checkpoint(path: str) -> tuple[Any, dict[str, ArraySpec], ArraySpec]:
    """(policy in eval mode, its obs spec, its action spec) from a run directory or checkpoint: the
    policy is rebuilt from the config and spaces the checkpoint recorded, then its weights loaded."""
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.config import from_dict
    from robo_rl.runners.config import TrainConfig

    ckpt = ckpt_io.resolve(path)
    meta = ckpt_io.read_meta(ckpt)
    cfg = from_dict(TrainConfig, meta["config"])
    obs_spec, action_spec = ckpt_io.specs_from_meta(meta, ckpt)
    ckpt_io.check_model_size(cfg.policy, obs_spec, action_spec, f"checkpoint '{ckpt}'")
    policy = build_policy(cfg.policy, obs_spec, action_spec)
    ckpt_io.load_into(policy, ckpt_io.load_model_state(ckpt), ckpt)
    return policy.eval(), obs_spec, action_spec


def to_env_actions(actions: torch.Tensor, spec: ArraySpec) -> np.ndarray:
    """Policy actions (B, A) -> float32 numpy clipped to the env's bounds."""
    a = actions.detach().cpu().numpy().astype(np.float32)
    if spec.low is not None and spec.high is not None:
        np.clip(a, spec.low, spec.high, out=a)
    return a
